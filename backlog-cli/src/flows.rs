//! `backlog workflow`, `backlog batch`, and what `backlog show` adds about a
//! job's dependencies, dependents, workflow and batch: the library's
//! `Queue::workflow`, `cancel_workflow`, `dependencies`, `job_links` and
//! `batch_status`, printed. The dashboard serves the same JSON
//! (`/api/workflows/ID`, `/api/batches/ID`).

use std::time::SystemTime;

use backlog::{BatchStatus, Dependency, JobLinks, JobRecord, Queue, WorkflowInfo, WorkflowRef};
use serde_json::{json, Value};

use crate::fail::{Code, Failure};
use crate::output::{self, Table};

/// A workflow's id or name as typed: digits are an id, anything else the
/// name of the newest workflow so named.
pub fn which(text: &str) -> WorkflowRef {
    match text.parse::<i64>() {
        Ok(id) => WorkflowRef::Id(id),
        Err(_) => WorkflowRef::Name(text.to_owned()),
    }
}

/// The workflow `which` names, or `NotFound`.
pub fn find(queue: &Queue, which: &WorkflowRef) -> Result<WorkflowInfo, Failure> {
    queue.workflow(which.clone())?.ok_or_else(|| {
        let what = match which {
            WorkflowRef::Id(id) => format!("no workflow has id {id}"),
            WorkflowRef::Name(name) => format!("no workflow is named {name:?}"),
        };
        Failure::new(Code::NotFound, what)
    })
}

/// One step with what the table and the JSON show of it: its job (`None`
/// when deleted meanwhile) and its dependencies.
struct StepView {
    name: String,
    job_id: i64,
    record: Option<JobRecord>,
    after: Vec<Dependency>,
}

fn steps(queue: &Queue, info: &WorkflowInfo) -> Result<Vec<StepView>, Failure> {
    let mut out = Vec::with_capacity(info.steps.len());
    for s in &info.steps {
        let record = match queue.get(s.job_id) {
            Ok(r) => Some(r),
            Err(backlog::Error::NotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        out.push(StepView {
            name: s.name.clone(),
            job_id: s.job_id,
            record,
            after: queue.dependencies(s.job_id)?,
        });
    }
    Ok(out)
}

/// A dependency as a person reads it: its step name, or `job N`.
fn dependency_name(d: &Dependency) -> String {
    d.step
        .clone()
        .unwrap_or_else(|| format!("job {}", d.job_id))
}

fn dependency_json(d: &Dependency) -> Value {
    json!({
        "job_id": d.job_id,
        "step": d.step,
        "status": d.status.map(|s| s.as_str()),
    })
}

/// What cancelling a workflow did, step by step.
pub struct Cancelled {
    /// Steps not finished before that are cancelled now (those the cancel
    /// reached, and those cancelled with a step they come after).
    pub cancelled: usize,
    /// Running steps whose handlers are asked to stop.
    pub asked_to_stop: u64,
    /// Steps that finished otherwise meanwhile (completed by their worker).
    pub finished_meanwhile: usize,
}

impl Cancelled {
    /// `workflow 7 report: 2 step(s) cancelled (1 running, asked to stop)`.
    pub fn message(&self, info: &WorkflowInfo) -> String {
        let mut text = format!(
            "workflow {} {}: {} step(s) cancelled",
            info.id, info.name, self.cancelled
        );
        if self.asked_to_stop > 0 {
            text.push_str(&format!(" ({} running, asked to stop)", self.asked_to_stop));
        }
        if self.finished_meanwhile > 0 {
            text.push_str(&format!(", {} finished meanwhile", self.finished_meanwhile));
        }
        text
    }

    pub fn json(&self, info: &WorkflowInfo) -> Value {
        json!({
            "workflow": info.id,
            "name": info.name,
            "cancelled": self.cancelled,
            "asked_to_stop": self.asked_to_stop,
            "finished_meanwhile": self.finished_meanwhile,
        })
    }
}

/// Cancels `info`'s steps not finished (`Queue::cancel_workflow`), then
/// reads where each of them ended up.
pub fn cancel(queue: &Queue, info: &WorkflowInfo) -> Result<Cancelled, Failure> {
    let report = queue.cancel_workflow(info.id)?;
    let after = queue.workflow(info.id)?;
    let now = |job_id: i64| {
        after
            .as_ref()
            .and_then(|a| a.steps.iter().find(|s| s.job_id == job_id))
            .map(|s| s.state)
    };
    let mut out = Cancelled {
        cancelled: 0,
        asked_to_stop: report.requested,
        finished_meanwhile: 0,
    };
    for step in info.steps.iter().filter(|s| !s.state.is_finished()) {
        match now(step.job_id) {
            Some(state) if state == backlog::JobState::CANCELLED => out.cancelled += 1,
            Some(state) if state.is_finished() => out.finished_meanwhile += 1,
            // Running, asked to stop; or deleted meanwhile.
            _ => {}
        }
    }
    Ok(out)
}

/// `backlog --json workflow` and `GET /api/workflows/ID`: the workflow and
/// each step's job, state, and the steps it comes after (`waiting_on`: those
/// not finished yet).
pub fn workflow_json(queue: &Queue, info: &WorkflowInfo) -> Result<Value, Failure> {
    let steps: Vec<Value> = steps(queue, info)?
        .iter()
        .map(|s| {
            json!({
                "step": s.name,
                "job_id": s.job_id,
                "kind": s.record.as_ref().map(|r| r.kind.as_str()),
                "queue": s.record.as_ref().map(|r| r.queue.as_str()),
                "state": s.record.as_ref().map(|r| r.state.as_str()),
                "attempts": s.record.as_ref().map(|r| r.attempts),
                "after": s.after.iter().map(dependency_json).collect::<Vec<_>>(),
                "waiting_on": s.after.iter().filter(|d| d.status.is_none())
                    .map(dependency_name).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({
        "id": info.id,
        "name": info.name,
        "created_at": output::time_json(Some(info.created_at)),
        "finished": info.is_finished(),
        "steps": steps,
    }))
}

/// `backlog workflow ID|NAME`: a heading, then one row per step.
pub fn workflow_text(queue: &Queue, info: &WorkflowInfo) -> Result<String, Failure> {
    let views = steps(queue, info)?;
    let mut table = Table::new(&[
        ("STEP", false),
        ("JOB", true),
        ("KIND", false),
        ("STATE", false),
        ("AFTER", false),
        ("WAITING ON", false),
    ]);
    for s in &views {
        let after: Vec<String> = s.after.iter().map(dependency_name).collect();
        let waiting: Vec<String> = s
            .after
            .iter()
            .filter(|d| d.status.is_none())
            .map(dependency_name)
            .collect();
        table.row(vec![
            s.name.clone(),
            s.job_id.to_string(),
            s.record.as_ref().map_or("-".into(), |r| r.kind.clone()),
            s.record
                .as_ref()
                .map_or("deleted", |r| r.state.as_str())
                .to_owned(),
            or_dash(after.join(", ")),
            or_dash(waiting.join(", ")),
        ]);
    }
    let done = info.steps.iter().filter(|s| s.state.is_finished()).count();
    let mut text = format!(
        "workflow {} {} ({}), created {}: {done} of {} step(s) finished\n",
        info.id,
        output::safe(&info.name),
        if info.is_finished() {
            "finished"
        } else {
            "running"
        },
        output::time(info.created_at),
        info.steps.len(),
    );
    text.push_str(&table.render());
    Ok(text)
}

fn or_dash(text: String) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text
    }
}

/// `backlog batch ID`'s JSON and `GET /api/batches/ID`: counts per state,
/// sealed or open, and each callback: its job once enqueued (with its state),
/// else why not.
pub fn batch_json(queue: &Queue, s: &BatchStatus) -> Result<Value, Failure> {
    let (complete, success) = callbacks(queue, s)?;
    Ok(json!({
        "id": s.id,
        "sealed": s.sealed,
        "finished": s.finished_at.is_some(),
        "total": s.total,
        "pending": s.pending,
        "completed": s.completed,
        "discarded": s.discarded,
        "cancelled": s.cancelled,
        "dead": s.dead,
        "created_at": output::time_json(Some(s.created_at)),
        "finished_at": output::time_json(s.finished_at),
        "on_complete": complete.json(),
        "on_success": success.json(),
    }))
}

/// The batch `id`; `NotFound` when there is none.
pub fn batch(queue: &Queue, id: i64) -> Result<BatchStatus, Failure> {
    match queue.batch_status(id) {
        Ok(s) => Ok(s),
        // The id is a number already: the one invalid argument left is an
        // id no batch has.
        Err(backlog::Error::InvalidArgument(m)) => Err(Failure::new(Code::NotFound, m)),
        Err(e) => Err(e.into()),
    }
}

/// Where a batch's callback stands.
enum Callback {
    /// Enqueued when the batch finished: its job, and that job's state now
    /// (`None` once deleted or pruned).
    Enqueued(i64, Option<&'static str>),
    /// The batch has not finished (open, or members pending).
    NotYet,
    /// The batch finished without enqueueing it: none was set, or (for
    /// *success*) a member did not complete.
    Never(&'static str),
}

impl Callback {
    fn json(&self) -> Value {
        match self {
            Callback::Enqueued(id, state) => {
                json!({"enqueued": true, "job_id": id, "state": state})
            }
            Callback::NotYet => {
                json!({"enqueued": false, "job_id": null, "why": "the batch has not finished"})
            }
            Callback::Never(why) => json!({"enqueued": false, "job_id": null, "why": why}),
        }
    }

    fn text(&self) -> String {
        match self {
            Callback::Enqueued(id, Some(state)) => format!("job {id} enqueued ({state} now)"),
            Callback::Enqueued(id, None) => format!("job {id} enqueued (deleted since)"),
            Callback::NotYet => "not enqueued yet: the batch has not finished".into(),
            Callback::Never(why) => format!("not enqueued: {why}"),
        }
    }
}

fn callbacks(queue: &Queue, s: &BatchStatus) -> Result<(Callback, Callback), Failure> {
    let one = |id: Option<i64>, never: &'static str| -> Result<Callback, Failure> {
        match id {
            Some(id) => {
                let state = match queue.get(id) {
                    Ok(r) => Some(r.state.as_str()),
                    Err(backlog::Error::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                Ok(Callback::Enqueued(id, state))
            }
            None if s.finished_at.is_none() => Ok(Callback::NotYet),
            None => Ok(Callback::Never(never)),
        }
    };
    let success_never = if s.completed < s.total {
        "not every member completed"
    } else {
        "none was set"
    };
    Ok((
        one(s.complete_job_id, "none was set")?,
        one(s.success_job_id, success_never)?,
    ))
}

/// `backlog batch ID`.
pub fn batch_text(queue: &Queue, s: &BatchStatus, now: SystemTime) -> Result<String, Failure> {
    let (complete, success) = callbacks(queue, s)?;
    let mut out = format!(
        "batch {}: {}, {}\n",
        s.id,
        if s.sealed {
            "sealed"
        } else {
            "open (members may join; it cannot finish until sealed)"
        },
        match s.finished_at {
            Some(at) => format!("finished {}", output::relative(at, now)),
            None => "not finished".into(),
        }
    );
    let mut table = Table::new(&[("MEMBERS", false), ("JOBS", true)]);
    for (name, n) in [
        ("total", s.total),
        ("pending", s.pending),
        ("completed", s.completed),
        ("discarded", s.discarded),
        ("cancelled", s.cancelled),
        ("dead", s.dead),
    ] {
        table.row(vec![name.into(), n.to_string()]);
    }
    out.push_str(&table.render());
    out.push_str(&format!("created       {}\n", output::time(s.created_at)));
    out.push_str(&format!("on complete   {}\n", complete.text()));
    out.push_str(&format!("on success    {}\n", success.text()));
    Ok(out)
}

/// What `backlog show` adds about a job: its workflow and step, its batch,
/// what it depends on and what depends on it.
pub struct Links {
    pub links: JobLinks,
    pub dependencies: Vec<Dependency>,
}

impl Links {
    pub fn read(queue: &Queue, id: i64) -> Result<Links, Failure> {
        Ok(Links {
            links: queue.job_links(id)?,
            dependencies: queue.dependencies(id)?,
        })
    }

    /// Added to the job's JSON: `workflow` (`{id, name, step}` or null),
    /// `batch` (an id or null), `dependencies`, `dependents` (ids).
    pub fn add_to(&self, value: &mut Value) {
        value["workflow"] = match &self.links.workflow {
            Some(w) => json!({"id": w.workflow_id, "name": w.workflow, "step": w.step}),
            None => Value::Null,
        };
        value["batch"] = json!(self.links.batch);
        value["dependencies"] = self.dependencies.iter().map(dependency_json).collect();
        value["dependents"] = json!(self.links.dependents);
    }

    /// The lines `backlog show` prints after the job's own fields (none
    /// for a job outside any workflow, batch or dependency).
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut field = |name: &str, value: String| {
            out.push_str(&format!("{name:<14}{}\n", output::safe(&value)));
        };
        if let Some(w) = &self.links.workflow {
            field(
                "workflow",
                format!("{} (id {}), step {}", w.workflow, w.workflow_id, w.step),
            );
        }
        if let Some(batch) = self.links.batch {
            field("batch", batch.to_string());
        }
        if !self.dependencies.is_empty() {
            let deps: Vec<String> = self
                .dependencies
                .iter()
                .map(|d| {
                    let name = match &d.step {
                        Some(step) => format!("{} ({step})", d.job_id),
                        None => d.job_id.to_string(),
                    };
                    let status = d.status.map_or("not finished", |s| s.as_str());
                    format!("{name} {status}")
                })
                .collect();
            field("depends on", deps.join(", "));
        }
        if !self.links.dependents.is_empty() {
            let ids: Vec<String> = self.links.dependents.iter().map(i64::to_string).collect();
            field("dependents", ids.join(", "));
        }
        out
    }
}
