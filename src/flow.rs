//! Job dependencies and workflows.
//!
//! A job enqueued with [`NewJob::depends_on`] waits as
//! [`JobState::Pending`], in a table of its own outside the lease index (no
//! lease ever walks it), until every job it depends on has finished. The
//! transaction that finishes the last of them (a completion, a failure that
//! ends in `dead`, a discard, an operator's cancel, a rescue, a delete)
//! makes it available, and wakes workers as an enqueue does. A dependency
//! that does not complete cancels what waits on it, and what waits on that
//! in turn, unless the dependent was enqueued with [`NewJob::run_anyway`].
//!
//! A [`Workflow`] is a graph of named steps enqueued in one transaction
//! ([`Queue::enqueue_workflow`], or the `_in` forms of `backlog::sqlite`,
//! `backlog::postgres` and `backlog::mysql` inside the application's own).
//! A step's handler reads what the steps before it returned with
//! [`JobContext::result_of`](crate::JobContext::result_of). An operator sees
//! a workflow's steps with [`Queue::workflow`], stops it with
//! [`Queue::cancel_workflow`], and resumes it after a failed step with
//! [`Queue::retry`] of that step: the steps its failure cancelled wait for
//! it again.
//!
//! Pruning history ([`Retention`](crate::Retention)) deletes a finished
//! job's edges and workflow step with it, and its workflow once no step is
//! left; a finished job that a pending or live job depends on is kept until
//! that job finishes, so its handler can read the result.
//!
//! ```
//! use backlog::{NewJob, Queue, Workflow};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let queue = Queue::open(dir.path().join("flow.db"))?;
//! let flow = queue.enqueue_workflow(
//!     Workflow::new("report")
//!         .step("fetch-a", NewJob::new("fetch", json!({"source": "a"})))
//!         .step("fetch-b", NewJob::new("fetch", json!({"source": "b"})))
//!         .step_after("merge", NewJob::new("merge", json!({})), &["fetch-a", "fetch-b"]),
//! )?;
//! let merge = queue.get(flow.step("merge").unwrap())?;
//! assert_eq!(merge.state, backlog::JobState::Pending);
//! # Ok(())
//! # }
//! ```
//!
//! [`Queue::enqueue_workflow`]: crate::Queue::enqueue_workflow
//! [`Queue::workflow`]: crate::Queue::workflow
//! [`Queue::cancel_workflow`]: crate::Queue::cancel_workflow
//! [`Queue::retry`]: crate::Queue::retry

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use serde::de::DeserializeOwned;

use crate::action;
use crate::backend::params::{Acted, DependsOn, Edge, Found};
use crate::error::{Error, Result};
use crate::inspect::JobState;
use crate::job::{Enqueued, NewJob};
use crate::outcome::{AttemptError, FinalStatus};
use crate::validate;

/// A graph of named steps, each a job, enqueued in one transaction by
/// [`Queue::enqueue_workflow`]. A step runs once the steps it comes after
/// have finished; one that did not complete cancels it (and what comes after
/// it), unless it was added with [`Workflow::step_after_anyway`].
///
/// [`Queue::enqueue_workflow`]: crate::Queue::enqueue_workflow
#[derive(Debug, Clone)]
pub struct Workflow {
    name: String,
    steps: Vec<Step>,
}

#[derive(Debug, Clone)]
struct Step {
    name: String,
    job: NewJob,
    after: Vec<String>,
    run_anyway: bool,
}

impl Workflow {
    /// An empty workflow named `name` (a name like a queue's; several
    /// workflows may share one, [`Queue::workflow`] finds the newest).
    ///
    /// [`Queue::workflow`]: crate::Queue::workflow
    pub fn new(name: impl Into<String>) -> Workflow {
        Workflow {
            name: name.into(),
            steps: Vec::new(),
        }
    }

    /// Adds a step that runs at once.
    pub fn step(self, name: impl Into<String>, job: NewJob) -> Workflow {
        self.add(name.into(), job, &[], false)
    }

    /// Adds a step that runs once every step of `after` has completed, and
    /// is cancelled when one of them ends otherwise.
    pub fn step_after(self, name: impl Into<String>, job: NewJob, after: &[&str]) -> Workflow {
        self.add(name.into(), job, after, false)
    }

    /// Adds a step that runs once every step of `after` has finished,
    /// however it ended (a clean-up, a report of failures).
    pub fn step_after_anyway(
        self,
        name: impl Into<String>,
        job: NewJob,
        after: &[&str],
    ) -> Workflow {
        self.add(name.into(), job, after, true)
    }

    fn add(mut self, name: String, job: NewJob, after: &[&str], run_anyway: bool) -> Workflow {
        self.steps.push(Step {
            name,
            job,
            after: after.iter().map(|s| (*s).to_owned()).collect(),
            run_anyway,
        });
        self
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The steps in an order where each comes after what it depends on,
    /// each job with its edges to the earlier ones. Rejects a duplicate or
    /// unknown step name and a cycle.
    pub(crate) fn plan(self) -> Result<(String, Vec<String>, Vec<NewJob>)> {
        let workflow = self.name.clone();
        let invalid = |reason: String| Error::InvalidWorkflow {
            workflow: workflow.clone(),
            reason,
        };
        validate::name("workflow", &self.name)?;
        if self.steps.is_empty() {
            return Err(invalid("it has no steps".into()));
        }
        let mut index = HashMap::new();
        for (i, step) in self.steps.iter().enumerate() {
            validate::name("step", &step.name)?;
            if index.insert(step.name.as_str(), i).is_some() {
                return Err(invalid(format!("step {:?} is added twice", step.name)));
            }
            if step.job.unique_key.is_some() || step.job.group.is_some() {
                return Err(invalid(format!(
                    "step {:?} has a unique key or a group: a step is one job of its workflow",
                    step.name
                )));
            }
        }
        for step in &self.steps {
            if let Some(missing) = step.after.iter().find(|a| !index.contains_key(a.as_str())) {
                return Err(invalid(format!(
                    "step {:?} comes after {missing:?}, which it does not have",
                    step.name
                )));
            }
        }
        let order = topological(&self.steps, &index)
            .map_err(|cycle| invalid(format!("cycle: {}", cycle.join(" -> "))))?;
        let mut position = vec![0; self.steps.len()];
        for (at, &i) in order.iter().enumerate() {
            position[i] = at;
        }
        let after: Vec<Vec<usize>> = self
            .steps
            .iter()
            .map(|s| {
                s.after
                    .iter()
                    .map(|a| position[index[a.as_str()]])
                    .collect()
            })
            .collect();
        let mut steps: Vec<Option<Step>> = self.steps.into_iter().map(Some).collect();
        let mut names = Vec::with_capacity(order.len());
        let mut jobs = Vec::with_capacity(order.len());
        for &i in &order {
            let Some(step) = steps[i].take() else {
                continue;
            };
            let mut job = step.job;
            job.depends_on.extend(after[i].iter().map(|&at| Edge {
                on: DependsOn::Earlier(at),
                run_anyway: step.run_anyway,
            }));
            names.push(step.name);
            jobs.push(job);
        }
        Ok((self.name, names, jobs))
    }
}

/// Kahn's order of `steps` (indexes), or the names around a cycle.
fn topological(
    steps: &[Step],
    index: &HashMap<&str, usize>,
) -> std::result::Result<Vec<usize>, Vec<String>> {
    let n = steps.len();
    let mut waiting: Vec<usize> = vec![0; n];
    let mut after: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, step) in steps.iter().enumerate() {
        let deps: HashSet<usize> = step.after.iter().map(|a| index[a.as_str()]).collect();
        waiting[i] = deps.len();
        for d in deps {
            after[d].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..n).rev().filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop() {
        order.push(i);
        for &j in after[i].iter().rev() {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.push(j);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every step left waits on another left: walk back until one repeats.
    let mut at = (0..n).find(|&i| waiting[i] > 0).unwrap_or(0);
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    while seen[at] == usize::MAX {
        seen[at] = path.len();
        path.push(at);
        at = steps[at]
            .after
            .iter()
            .map(|a| index[a.as_str()])
            .find(|&d| waiting[d] > 0)
            .unwrap_or(at);
    }
    let mut cycle: Vec<String> = path[seen[at]..]
        .iter()
        .rev()
        .map(|&i| steps[i].name.clone())
        .collect();
    cycle.push(steps[at].name.clone());
    Err(cycle)
}

/// A workflow just enqueued: its id and each step's job id, in the order
/// they were enqueued (each after what it depends on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueuedWorkflow {
    /// The workflow's id.
    pub id: i64,
    /// Each step's name and job id.
    pub steps: Vec<(String, i64)>,
}

impl EnqueuedWorkflow {
    /// The job id of step `name`.
    pub fn step(&self, name: &str) -> Option<i64> {
        self.steps.iter().find(|(n, _)| n == name).map(|s| s.1)
    }
}

/// A workflow as [`Queue::workflow`] sees it.
///
/// [`Queue::workflow`]: crate::Queue::workflow
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowInfo {
    /// The workflow's id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// When it was enqueued.
    pub created_at: SystemTime,
    /// Its steps, in the order they were enqueued.
    pub steps: Vec<WorkflowStep>,
}

impl WorkflowInfo {
    /// Step `name`.
    pub fn step(&self, name: &str) -> Option<&WorkflowStep> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// True when every step has finished.
    pub fn is_finished(&self) -> bool {
        self.steps.iter().all(|s| s.state.is_finished())
    }
}

/// One step of a workflow and where its job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowStep {
    /// The step's name.
    pub name: String,
    /// Its job's id.
    pub job_id: i64,
    /// Its job's state.
    pub state: JobState,
}

/// Which workflow: by id, or the newest of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkflowRef {
    /// The workflow with this id.
    Id(i64),
    /// The newest workflow of this name.
    Name(String),
}

impl From<i64> for WorkflowRef {
    fn from(id: i64) -> Self {
        WorkflowRef::Id(id)
    }
}

impl From<&str> for WorkflowRef {
    fn from(name: &str) -> Self {
        WorkflowRef::Name(name.to_owned())
    }
}

impl From<String> for WorkflowRef {
    fn from(name: String) -> Self {
        WorkflowRef::Name(name)
    }
}

/// A job's dependency, as its handler reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The job depended on.
    pub job_id: i64,
    /// Its step name, when it is a workflow's step.
    pub step: Option<String>,
    /// How it ended; `None` while it has not (every dependency has ended by
    /// the time its dependent runs, unless an operator retried it since).
    pub status: Option<FinalStatus>,
    /// What it returned (JSON text), when it completed with a result.
    pub result: Option<String>,
}

impl Dependency {
    /// Its result decoded as `T`; `None` when it has none.
    pub fn result<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.result
            .as_deref()
            .map(crate::job::decode_args)
            .transpose()
    }
}

// ---- what every backend's `flows.rs` shares --------------------------------

/// What [`Queue::cancel_workflow`] does to the steps `ids`, inside each
/// backend's one transaction `tx`: `look` at every step first (on a server
/// this locks each one's row), and only then cancel. A step finished or
/// gone by then is not the cancel's (`None`); each other one is cancelled
/// by `cancel`, in order (it may have been finished since by an earlier
/// step's cascade; its [`Acted`] says so).
///
/// [`Queue::cancel_workflow`]: crate::Queue::cancel_workflow
pub(crate) fn cancel_unfinished<T>(
    tx: &mut T,
    ids: &[i64],
    mut look: impl FnMut(&mut T, i64) -> Result<Found>,
    mut cancel: impl FnMut(&mut T, i64) -> Result<Acted>,
) -> Result<Vec<Option<Acted>>> {
    let found = ids
        .iter()
        .map(|id| look(tx, *id))
        .collect::<Result<Vec<_>>>()?;
    ids.iter()
        .zip(found)
        .map(|(id, found)| match found {
            Found::Finished(_) | Found::Nothing => Ok(None),
            Found::Running | Found::Waiting => cancel(tx, *id).map(Some),
        })
        .collect()
}

/// A job's edges as given, checked: none on a grouped or unique job, each
/// dependency once, the job's own policy applied.
pub(crate) fn check_edges(job: &NewJob) -> Result<Vec<Edge>> {
    if job.depends_on.is_empty() {
        return Ok(Vec::new());
    }
    if job.group.is_some() || job.unique_key.is_some() {
        return Err(Error::InvalidArgument(
            "a job with dependencies can have neither a group nor a unique key: it waits \
             outside the live jobs their rules apply to"
                .into(),
        ));
    }
    let mut seen = HashSet::new();
    Ok(job
        .depends_on
        .iter()
        .filter(|e| seen.insert(e.on))
        .map(|e| Edge {
            on: e.on,
            run_anyway: e.run_anyway || job.run_anyway,
        })
        .collect())
}

/// Each edge's job id and policy; an `Earlier` edge names a job of the same
/// batch enqueued before this one.
fn resolve(edges: &[Edge], earlier: &[Enqueued]) -> Result<Vec<(i64, bool)>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(edges.len());
    for e in edges {
        let id = match e.on {
            DependsOn::Job(id) => id,
            DependsOn::Earlier(i) => earlier
                .get(i)
                .map(|e| e.id)
                .ok_or_else(|| Error::InvalidArgument(format!("step {i} is not enqueued yet")))?,
        };
        if seen.insert(id) {
            out.push((id, e.run_anyway));
        }
    }
    Ok(out)
}

/// When a dependency counts for its dependent, given where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Counts {
    /// When it finishes: it is pending or live.
    Later,
    /// Already: it completed, or ended otherwise on a run-anyway edge.
    Now,
    /// It ended with this status, which cancels the dependent.
    Cancels(String),
}

/// Where dependency `id` is (`pending`, `live`, a history status, or
/// nowhere) and what that means for its dependent.
fn counts(state: Option<&str>, run_anyway: bool, id: i64) -> Result<Counts> {
    Ok(match state {
        None => return Err(Error::UnknownDependency { job_id: id }),
        Some("pending" | "live") => Counts::Later,
        Some("completed") => Counts::Now,
        Some(_) if run_anyway => Counts::Now,
        Some(status) => Counts::Cancels(status.to_owned()),
    })
}

/// How a newly enqueued dependent stands, decided once from where each of
/// its dependencies is: the edges to write, how many dependencies it still
/// waits for, and the first whose end cancels it.
#[derive(Debug)]
pub(crate) struct Waiting {
    /// Each dependency once: its id, the edge's run-anyway policy, and
    /// whether the edge cancelled the dependent.
    pub edges: Vec<(i64, bool, bool)>,
    /// The dependencies not finished yet: the pending row's counter.
    pub remaining: i64,
    /// The dependency that cancels the dependent now, and how it ended.
    pub cancelled_by: Option<(i64, String)>,
    /// The previous job of its sequence, when that one has not finished:
    /// the sequence's edge to write (counted in `remaining`).
    pub tail: Option<i64>,
}

impl Waiting {
    /// The error the dependent is cancelled with, when a dependency's end
    /// cancels it.
    pub(crate) fn cancelled_error(&self, now: i64) -> Option<AttemptError> {
        let (dependency, status) = self.cancelled_by.as_ref()?;
        Some(cancelled_error(*dependency, status, now))
    }
}

/// [`Waiting`] for a job with `edges` and `tail`, the job of its sequence
/// it waits on and whether that one has not finished (read by
/// `sequence::wait_on`), reading each dependency's place (`pending`,
/// `live`, a history status, or `None`) with `state_of`, which a server
/// backend share-locks. An id no job has is [`Error::UnknownDependency`];
/// a tail that is gone or finished counts at once, one that holds gets a
/// run-anyway edge (unless the job depends on it already: that edge's
/// policy rules, and it is marked as the sequence's).
pub(crate) fn waiting(
    edges: &[Edge],
    earlier: &[Enqueued],
    tail: Option<(i64, bool)>,
    mut state_of: impl FnMut(i64) -> Result<Option<String>>,
) -> Result<Waiting> {
    let mut waiting = Waiting {
        edges: Vec::with_capacity(edges.len()),
        remaining: 0,
        cancelled_by: None,
        tail: None,
    };
    for (dependency, run_anyway) in resolve(edges, earlier)? {
        let state = state_of(dependency)?;
        let cancels = match counts(state.as_deref(), run_anyway, dependency)? {
            Counts::Later => {
                waiting.remaining += 1;
                false
            }
            Counts::Now => false,
            Counts::Cancels(status) => {
                waiting.cancelled_by.get_or_insert((dependency, status));
                true
            }
        };
        waiting.edges.push((dependency, run_anyway, cancels));
    }
    if let Some((tail, holds)) = tail {
        match waiting.edges.iter().find(|e| e.0 == tail) {
            // Counted already, if it holds; the edge is marked as the
            // sequence's.
            Some(&(_, _, cancels)) => waiting.tail = (!cancels).then_some(tail),
            None if holds => {
                waiting.remaining += 1;
                waiting.tail = Some(tail);
            }
            None => {}
        }
    }
    Ok(waiting)
}

/// The error a job cancelled by its dependency's end carries.
pub(crate) fn cancelled_error(dependency: i64, status: &str, now: i64) -> AttemptError {
    action::operator_error(&format!("dependency {dependency} ended {status}"), now)
}

// ---- where a job stands, for operators -------------------------------------

/// Where a job stands among others, as an operator's tools show it
/// ([`Queue::job_links`]): its workflow and step, its batch, and the jobs
/// that wait on it.
///
/// [`Queue::job_links`]: crate::Queue::job_links
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct JobLinks {
    /// Its workflow and step, when it is a workflow's step.
    pub workflow: Option<StepOf>,
    /// The batch it is a member of, while it has not finished: a member
    /// leaves its batch's list when it finishes (it is counted then), so a
    /// finished job shows none.
    pub batch: Option<i64>,
    /// The jobs enqueued to depend on it, by id (whatever their states now).
    pub dependents: Vec<i64>,
}

/// A job's place in a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepOf {
    /// The workflow's id.
    pub workflow_id: i64,
    /// The workflow's name.
    pub workflow: String,
    /// The job's step name.
    pub step: String,
}
