//! A workflow across processes, on every backend: the parent enqueues a
//! graph of steps (each after up to three earlier ones), three worker
//! processes run it. Every step must run once, and none may start before
//! all its dependencies committed: each handler reads its dependencies from
//! the database (committed rows only) and fails its job when one has not
//! completed; after the run, each step's start is checked against its
//! dependencies' finish times.
//!
//! A child is this test binary re-run as `flow_child` with
//! `BACKLOG_FLOW_CHILD` set and the database in the environment
//! ([`harness::Harness::child_env`]). Size knob: `BACKLOG_FLOW_STEPS`
//! (default 200).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{FinalStatus, JobError, NewJob, QueueOptions, Worker, Workflow};
use serde_json::{json, Value};

use harness::{child_queue, Backend, Children, Harness, TestResult};

const CHILD: &str = "BACKLOG_FLOW_CHILD";
const STEPS: &str = "BACKLOG_FLOW_STEPS";

/// The children's entry point; without [`CHILD`] it returns at once.
#[test]
#[ignore = "a child process of the workflow suite"]
fn flow_child() -> TestResult {
    if std::env::var(CHILD).is_err() {
        return Ok(());
    }
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    let _worker = Worker::builder(queue.clone())
        .concurrency(4)
        .poll_interval(Duration::from_millis(200))
        .handle_raw("step", |args: Value, ctx| {
            let deps = ctx.dependencies()?;
            let expected = args["deps"].as_u64().unwrap_or(0) as usize;
            if deps.len() != expected {
                return Err(JobError::discard(format!(
                    "{} dependencies seen, {expected} expected",
                    deps.len()
                )));
            }
            if let Some(early) = deps
                .iter()
                .find(|d| d.status != Some(FinalStatus::Completed))
            {
                return Err(JobError::discard(format!(
                    "started before dependency {} committed ({:?})",
                    early.job_id, early.status
                )));
            }
            thread::sleep(Duration::from_millis(u64::try_from(ctx.id() % 3)?));
            Ok(ctx.id())
        })
        .start()?;
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

fn spawn(h: &Harness) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "flow_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .env(CHILD, "1");
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

/// Step `i` comes after up to three of the steps before it (a fixed
/// pseudo-random choice, so a failure can be replayed).
fn graph(n: usize) -> Vec<Vec<usize>> {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..n)
        .map(|i| {
            let mut after: Vec<usize> = (0..(next() % 4) as usize)
                .filter(|_| i > 0)
                .map(|_| (next() % i as u64) as usize)
                .collect();
            after.sort_unstable();
            after.dedup();
            after
        })
        .collect()
}

fn a_workflow_run_by_three_processes_runs_each_step_once_after_its_dependencies(
    b: &Backend,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let n: usize = std::env::var(STEPS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let graph = graph(n);
    let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    let mut workflow = Workflow::new("cluster");
    for (i, after) in graph.iter().enumerate() {
        let after: Vec<&str> = after.iter().map(|&d| names[d].as_str()).collect();
        let job = NewJob::new("step", json!({ "deps": after.len() }));
        workflow = workflow.step_after(names[i].clone(), job, &after);
    }
    // The three processes are up before the workflow goes in: started after
    // it, the first could run all 200 steps before the others had opened
    // their queues (CI saw that once on PostgreSQL), and the last assertion
    // would measure process start-up, not sharing.
    let children = Children((0..3).map(|_| spawn(&h)).collect::<TestResult<_>>()?);
    let waiting = Instant::now();
    while h.queue.workers()?.len() < 3 {
        if waiting.elapsed() > Duration::from_secs(60) {
            return Err("the three worker processes did not register in 60 s".into());
        }
        thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    let flow = h.queue.enqueue_workflow(workflow)?;
    loop {
        let info = h.queue.workflow(flow.id)?.ok_or("no workflow")?;
        if info.is_finished() {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            return Err("the workflow did not finish in 300 s".into());
        }
        thread::sleep(Duration::from_millis(100));
    }
    let secs = start.elapsed().as_secs_f64();
    drop(children);
    let mut workers = std::collections::HashSet::new();
    for (i, after) in graph.iter().enumerate() {
        let id = flow.step(&names[i]).ok_or("no step")?;
        let record = h.record(id)?;
        assert_eq!(
            record.state.final_status(),
            Some(FinalStatus::Completed),
            "step {i} (job {id}): {:?}",
            record.errors
        );
        assert_eq!(record.attempts, 1, "step {i} ran once");
        workers.extend(record.worker.clone());
        let started = record.started_at.ok_or("no start")?;
        for &d in after {
            let dep = h.record(flow.step(&names[d]).ok_or("no step")?)?;
            let finished = dep.finished_at.ok_or("no finish")?;
            assert!(
                started + STAMP_SKEW >= finished,
                "step {i} started at {started:?}, before its dependency s{d} finished at \
                 {finished:?}"
            );
        }
    }
    assert!(workers.len() > 1, "the steps ran in one process only");
    let edges: usize = graph.iter().map(Vec::len).sum();
    println!(
        "workflow multi-process ({b:?}): processes=3 steps={n} edges={edges} \
         worker_processes_used={} early_starts=0 secs={secs:.1}",
        workers.len()
    );
    Ok(())
}

conformance!(a_workflow_run_by_three_processes_runs_each_step_once_after_its_dependencies);

/// How much earlier than its dependency's finish a step's recorded start
/// may read. Every backend stamps an operation with a time taken when its
/// transaction began, not when it committed: SQLite with the time its
/// process read before waiting for the write lock, PostgreSQL and MySQL
/// with the transaction's start (`now()`), and a worker's settle-and-lease
/// transaction begins with its settles, so a lease that waited behind the
/// commit releasing its job can carry a time some milliseconds before that
/// commit's. The handler's own read of its dependencies (committed rows
/// only) is the check that no step started early; this one bounds the
/// stamps.
const STAMP_SKEW: Duration = Duration::from_millis(250);
