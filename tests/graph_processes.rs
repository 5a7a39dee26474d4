//! The cluster target of issue 23, on every backend: a seeded random graph
//! of 1,000 workflow steps (fan-out, fan-in, steps after others *anyway*,
//! steps that fail once and retry, a few that are discarded), run by three
//! worker processes while the test SIGKILLs one of them ten times and starts
//! a new one. Two batches over some of the steps carry callbacks.
//!
//! Each handler works in transactional mode: it reads its dependencies'
//! effect rows and writes its own in the transaction that completes its job
//! (`ctx.transaction`). So the checks need no clock:
//!
//! - a step that started before one of its dependencies committed finds
//!   that dependency's effect row missing (the row commits with the
//!   dependency's completion, which is what releases the step) and records
//!   its own effect as `early`;
//! - every completed step has exactly one effect row (a killed attempt's
//!   transaction rolled back with its effect), no discarded one has any;
//! - each batch's callbacks were enqueued once each (none lost with a killed
//!   transaction, none twice).
//!
//! It prints one line, `graph processes (Backend): ... lost=0 dup=0
//! early=0 ...`. A child is this test binary re-run as `graph_child` with
//! `BACKLOG_GRAPH_CHILD` set and the database in the environment
//! ([`harness::Harness::child_env`]). Size knobs: `BACKLOG_GRAPH_STEPS`
//! (default 1,000) and `BACKLOG_GRAPH_KILLS` (default 10).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{FinalStatus, JobArgs, JobContext, JobError, NewJob, QueueOptions, Worker, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::json;

use harness::{child_queue, Backend, Children, Harness, TestResult};

const CHILD: &str = "BACKLOG_GRAPH_CHILD";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One step of the graph, as its handler reads it from its payload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Plan {
    /// The steps it comes after, by name.
    after: Vec<String>,
    /// Of them, those that are discarded (it comes after them anyway).
    doomed_after: Vec<String>,
    /// Added with `step_after_anyway`.
    anyway: bool,
    /// Its first attempt fails (a retry, after 20 ms).
    flaky: bool,
    /// It is discarded, at every attempt.
    doomed: bool,
}

impl JobArgs for Plan {
    const KIND: &'static str = "step";
}

/// The children's entry point; without [`CHILD`] it returns at once.
#[test]
#[ignore = "a child process of the graph suite"]
fn graph_child() -> TestResult {
    if std::env::var(CHILD).is_err() {
        return Ok(());
    }
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    let backend = match std::env::var("BACKLOG_TEST_CHILD_BACKEND")?.as_str() {
        "Postgres" => Backend::Postgres,
        "Mysql" => Backend::Mysql,
        _ => Backend::Sqlite,
    };
    let schema = std::env::var("BACKLOG_TEST_CHILD_SCHEMA").unwrap_or_default();
    let effects = if schema.is_empty() {
        "effects".to_owned()
    } else {
        format!("{schema}.effects")
    };
    let _worker = Worker::builder(queue)
        .concurrency(4)
        .lease_ttl(Duration::from_secs(2))
        .heartbeat_interval(Duration::from_millis(400))
        .rescue_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(200))
        .handle(move |plan: Plan, ctx| run_step(backend, &effects, &plan, ctx))
        .start()?;
    loop {
        thread::sleep(Duration::from_secs(3600)); // until SIGKILL
    }
}

/// A step's handler: checks what the queue says of its dependencies, then,
/// in the transaction that completes it, that each completed dependency's
/// effect is committed, and writes its own effect (`ran`, or `early: why`).
fn run_step(
    backend: Backend,
    effects: &str,
    plan: &Plan,
    ctx: &JobContext,
) -> Result<(), JobError> {
    if plan.doomed {
        return Err(JobError::discard("a doomed step"));
    }
    if plan.flaky && ctx.attempt() == 1 {
        return Err(JobError::retry_after(
            Duration::from_millis(20),
            "a flaky step's first attempt",
        ));
    }
    thread::sleep(Duration::from_millis(
        u64::try_from(ctx.id() % 4).unwrap_or(0),
    ));
    let deps = ctx.dependencies()?;
    let mut early = Vec::new();
    if deps.len() != plan.after.len() {
        early.push(format!(
            "{} dependencies, {} planned",
            deps.len(),
            plan.after.len()
        ));
    }
    let mut completed = Vec::new();
    for dep in &deps {
        let name = dep.step.clone().unwrap_or_default();
        let doomed = plan.doomed_after.contains(&name);
        let want = if doomed {
            FinalStatus::Discarded
        } else {
            FinalStatus::Completed
        };
        if dep.status != Some(want) {
            early.push(format!("{name} is {:?}", dep.status));
        }
        if !doomed {
            completed.push(dep.job_id);
        }
    }
    let id = ctx.id();
    let ids = if completed.is_empty() {
        "NULL".to_owned()
    } else {
        completed
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let seen_sql = format!("SELECT count(DISTINCT job_id) FROM {effects} WHERE job_id IN ({ids})");
    let note = |seen: i64| {
        let mut early = early.clone();
        if seen != completed.len() as i64 {
            early.push(format!(
                "{seen} of {} dependencies' effects committed",
                completed.len()
            ));
        }
        if early.is_empty() {
            return "ran".to_owned();
        }
        let note = format!("early: {}", early.join("; "));
        eprintln!("graph step {id}: {note}");
        note
    };
    match backend {
        Backend::Sqlite => {
            use backlog::sqlite::JobContextExt;
            ctx.transaction(|tx| {
                let seen: i64 = tx.query_row(&seen_sql, [], |r| r.get(0))?;
                let sql = format!("INSERT INTO {effects} (job_id, note) VALUES (?1, ?2)");
                tx.execute(&sql, rusqlite::params![id, note(seen)])?;
                Ok(())
            })
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            use backlog::postgres::JobContextExt;
            ctx.transaction(|tx| {
                let seen: i64 = tx.query_one(seen_sql.as_str(), &[])?.get(0);
                let sql = format!("INSERT INTO {effects} (job_id, note) VALUES ($1, $2)");
                tx.execute(sql.as_str(), &[&id, &note(seen)])?;
                Ok(())
            })
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            use backlog::mysql::mysql::prelude::Queryable;
            use backlog::mysql::JobContextExt;
            ctx.transaction(|tx| {
                let seen: Option<i64> = tx.query_first(seen_sql.as_str())?;
                let sql = format!("INSERT INTO {effects} (job_id, note) VALUES (?, ?)");
                tx.exec_drop(sql, (id, note(seen.unwrap_or(0))))?;
                Ok(())
            })
        }
        #[allow(unreachable_patterns)]
        _ => Err(JobError::retry("backend not built")),
    }
}

fn spawn(h: &Harness) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "graph_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

/// A fixed pseudo-random graph of `n` steps (so a failure replays): step
/// `i` comes after up to three of the hundred steps before it; every 50th
/// is a fan-in after 12, every 97th (from 13) is a doomed root, every 23rd
/// (from 5) flaky, every 31st (from 7) after its steps anyway, and so is
/// every step after a doomed one.
fn graph(n: usize) -> Vec<Plan> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut plans: Vec<Plan> = Vec::with_capacity(n);
    for i in 0..n {
        let doomed = i % 97 == 13;
        let fan_in = i > 0 && i % 50 == 0;
        let count = match (doomed, fan_in) {
            (true, _) => 0,
            (_, true) => 12,
            _ => (next() % 4) as usize,
        };
        let window = i.min(100) as u64;
        let mut after: Vec<usize> = (0..count)
            .filter(|_| window > 0)
            .map(|_| i - 1 - (next() % window) as usize)
            .collect();
        after.sort_unstable();
        after.dedup();
        let doomed_after: Vec<String> = after
            .iter()
            .filter(|&&d| plans[d].doomed)
            .map(|&d| name(d))
            .collect();
        plans.push(Plan {
            anyway: i % 31 == 7 || !doomed_after.is_empty(),
            after: after.into_iter().map(name).collect(),
            doomed_after,
            flaky: i % 23 == 5,
            doomed,
        });
    }
    plans
}

fn name(i: usize) -> String {
    format!("s{i}")
}

/// The batch a step joins: a job with dependencies cannot join one, so
/// only the graph's roots do, the even ones the batch with both callbacks
/// (every one completes), the odd and the doomed ones the batch whose
/// success callback never comes.
fn in_batch(i: usize, plan: &Plan) -> Option<usize> {
    match (plan.after.is_empty(), plan.doomed) {
        (false, _) => None,
        (true, true) => Some(1),
        (true, false) => Some(i % 2),
    }
}

fn a_graph_of_steps_runs_each_once_after_its_dependencies_through_sigkills(
    b: &Backend,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (n, kills) = (
        knob("BACKLOG_GRAPH_STEPS", 1_000),
        knob("BACKLOG_GRAPH_KILLS", 10),
    );
    let plans = graph(n);
    let batches: Vec<i64> = (0..2)
        .map(|k| {
            let batch = h
                .queue
                .batch()
                .on_complete(NewJob::new("complete", json!({ "batch": k })).queue("callbacks"))
                .on_success(NewJob::new("success", json!({ "batch": k })).queue("callbacks"))
                .create()?;
            Ok(batch.id)
        })
        .collect::<TestResult<_>>()?;
    let mut workflow = Workflow::new("graph");
    for (i, plan) in plans.iter().enumerate() {
        let mut job = NewJob::new("step", serde_json::to_value(plan)?);
        if let Some(k) = in_batch(i, plan) {
            job = job.batch(batches[k]);
        }
        let after: Vec<&str> = plan.after.iter().map(String::as_str).collect();
        workflow = if plan.anyway {
            workflow.step_after_anyway(name(i), job, &after)
        } else {
            workflow.step_after(name(i), job, &after)
        };
    }
    let flow = h.queue.enqueue_workflow(workflow)?;
    for &batch in &batches {
        h.queue.seal_batch(batch)?;
    }

    let start = Instant::now();
    let mut children = Children((0..3).map(|_| spawn(&h)).collect::<TestResult<_>>()?);
    let mut killed = 0;
    let limit = Duration::from_secs(300);
    loop {
        // Two counts, not `Queue::workflow` (a read per step).
        let left = h.count(
            "SELECT (SELECT count(*) FROM backlog_jobs WHERE kind = 'step') \
             + (SELECT count(*) FROM backlog_pending)",
        )?;
        if left == 0 {
            break;
        }
        if start.elapsed() > limit {
            return Err(format!("after {limit:?}: {left} of {n} steps not finished").into());
        }
        if killed < kills {
            thread::sleep(Duration::from_millis(150 + 50 * (killed as u64 % 4)));
            let victim = killed % children.0.len();
            let child = &mut children.0[victim];
            child.kill()?; // SIGKILL, wherever it is: often inside a transaction
            let status = child.wait()?;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "the kill landed");
            children.0[victim] = spawn(&h)?;
            killed += 1;
        } else {
            thread::sleep(Duration::from_millis(100));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(children);

    // Every step's end; then its effect rows, counted in the database.
    let (mut ran, mut doomed, mut retried) = (Vec::new(), Vec::new(), 0);
    for (i, plan) in plans.iter().enumerate() {
        let id = flow.step(&name(i)).ok_or("no step")?;
        let record = h.record(id)?;
        let want = if plan.doomed {
            FinalStatus::Discarded
        } else {
            FinalStatus::Completed
        };
        assert_eq!(
            record.state.final_status(),
            Some(want),
            "step {i} (job {id}): {:?}",
            record.errors
        );
        if record.attempts > 1 {
            retried += 1;
        }
        if plan.doomed {
            doomed.push(id);
        } else {
            ran.push(id);
        }
    }
    let list = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let effects = h.count("SELECT count(*) FROM effects")?;
    let distinct = h.count(&format!(
        "SELECT count(DISTINCT job_id) FROM effects WHERE job_id IN ({})",
        list(&ran)
    ))?;
    let (lost, dup) = (ran.len() as i64 - distinct, effects - distinct);
    let early = h.count("SELECT count(*) FROM effects WHERE note <> 'ran'")?;
    let of_doomed = h.count(&format!(
        "SELECT count(*) FROM effects WHERE job_id IN ({})",
        list(&doomed)
    ))?;

    let mut callbacks = 0;
    for (k, &batch) in batches.iter().enumerate() {
        let status = h.queue.batch_status(batch)?;
        assert!(status.finished_at.is_some(), "batch {k}: {status:?}");
        let complete = status.complete_job_id.ok_or("no complete callback")?;
        assert!(h.record(complete).is_ok(), "batch {k}'s complete callback");
        callbacks += 1;
        match (k, status.success_job_id) {
            (0, Some(success)) => {
                assert!(h.record(success).is_ok(), "batch 0's success callback");
                callbacks += 1;
            }
            (0, None) => return Err(format!("batch 0 has no success callback: {status:?}").into()),
            (_, None) => assert_eq!(
                status.discarded,
                plans.iter().filter(|p| p.doomed).count() as i64
            ),
            (_, Some(_)) => return Err(format!("batch {k} succeeded with a doomed member").into()),
        }
    }
    let fired = h.count("SELECT count(*) FROM backlog_jobs WHERE queue = 'callbacks'")?;
    let edges: usize = plans.iter().map(|p| p.after.len()).sum();
    println!(
        "graph processes ({b:?}): processes=3 steps={n} edges={edges} kills={killed} \
         retried={retried} discarded={} callbacks={fired} lost={lost} dup={dup} early={early} \
         secs={secs:.1}",
        doomed.len()
    );
    assert_eq!(
        early, 0,
        "steps started before a dependency committed (see the children's stderr)"
    );
    assert_eq!((lost, dup, of_doomed), (0, 0, 0));
    assert_eq!(fired, callbacks, "each callback once");
    assert_eq!(killed, kills, "the graph finished before every kill");
    Ok(())
}

conformance!(a_graph_of_steps_runs_each_once_after_its_dependencies_through_sigkills);
