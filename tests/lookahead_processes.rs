//! No hoarding, on every backend: three worker processes with the default
//! worker (its adaptive look-ahead) share 3,000 jobs of 10 ms each. The
//! look-ahead holds no more than 20 ms of such jobs, so each process keeps
//! taking its share: none may run more than 40 % of the jobs.
//!
//! The workers start on an empty queue and report ready; then the parent
//! enqueues every job in one transaction, so no process gets a head start
//! of more than its wake-up. A child is this test binary re-run as
//! `lookahead_child` with `BACKLOG_LOOKAHEAD_ROLE` set and the database in
//! the environment ([`harness::Harness::child_env`]). The servers run when
//! `BACKLOG_TEST_POSTGRES_URL` / `BACKLOG_TEST_MYSQL_URL` are set (and the
//! features built); otherwise they print `SKIPPED`. Size knob:
//! `BACKLOG_LOOKAHEAD_JOBS` (default 3000).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Command, Stdio};
use std::thread;
use std::time::Duration;

use backlog::{JobFilter, JobState, NewJob, QueueOptions, Worker};
use serde_json::{json, Value};

use harness::{child_queue, wait_for_completed, Backend, Children, Harness, TestResult};

const ROLE: &str = "BACKLOG_LOOKAHEAD_ROLE";
const PROCESSES: usize = 3;
const JOB_TIME: Duration = Duration::from_millis(10);
/// The largest share of the jobs one process may run.
const MAX_SHARE: f64 = 0.40;

/// The children's entry point; without a role (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the look-ahead suite"]
fn lookahead_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    if role != "worker" {
        return Err(format!("unknown role {role}").into());
    }
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    // The default worker, but for a short idle poll: on a server without
    // wake-ups from other processes, the poll is how a child finds the jobs.
    let _worker = Worker::builder(queue)
        .poll_interval(Duration::from_millis(50))
        .handle_raw("ten_ms", |_: Value, _| {
            thread::sleep(JOB_TIME);
            Ok(())
        })
        .start()?;
    println!("ready");
    // Until the parent kills this process.
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// Starts `n` worker processes and returns once each has started its worker.
fn spawn_workers(h: &Harness, n: usize) -> TestResult<Children> {
    let mut children = Children(Vec::new());
    let mut outputs: Vec<ChildStdout> = Vec::new();
    for _ in 0..n {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "lookahead_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, "worker")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in h.child_env() {
            command.env(k, v);
        }
        let mut child = command.spawn()?;
        outputs.extend(child.stdout.take());
        children.0.push(child);
    }
    for out in outputs {
        let ready = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("ready"));
        if !ready {
            return Err("a worker process ended before it was ready".into());
        }
    }
    Ok(children)
}

fn no_worker_process_hoards_the_jobs_of_a_shared_queue(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let jobs = std::env::var("BACKLOG_LOOKAHEAD_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000usize);
    let children = spawn_workers(&h, PROCESSES)?;
    h.queue
        .enqueue_many((0..jobs).map(|n| NewJob::new("ten_ms", json!(n))))?;
    let records = wait_for_completed(
        &h,
        JobFilter::new(JobState::COMPLETED).limit(1000),
        jobs,
        Duration::from_secs(300),
    )?;
    drop(children);

    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for record in &records {
        let worker = record
            .worker
            .clone()
            .ok_or("a completed job without a worker")?;
        *per_worker.entry(worker).or_default() += 1;
    }
    let mut shares: Vec<usize> = per_worker.values().copied().collect();
    shares.sort_unstable();
    println!("no hoarding ({b:?}): {jobs} jobs of {JOB_TIME:?}, per process {shares:?}");
    assert_eq!(
        per_worker.len(),
        PROCESSES,
        "a process ran no job: {shares:?}"
    );
    let most = shares.last().copied().unwrap_or(0);
    assert!(
        most as f64 <= MAX_SHARE * jobs as f64,
        "one process ran {most} of {jobs} jobs: {shares:?}"
    );
    Ok(())
}

conformance!(no_worker_process_hoards_the_jobs_of_a_shared_queue);
