//! The live-worker registry across processes, on every backend: a worker
//! process killed with SIGKILL (no shutdown, no goodbye) ages out of
//! `Queue::workers` once [`EXPIRY_HEARTBEATS`] of its heartbeat intervals
//! pass without a heartbeat, and then the jobs only it handled are flagged
//! as unhandled. The workers conformance scenarios check the same rules
//! with a manual clock and a stalled worker in one process; this one uses a
//! real process, real time and a real kill.
//!
//! A child is this test binary re-run as `registry_child` with the database
//! in the environment ([`harness::Harness::child_env`]).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::worker::registry::EXPIRY_HEARTBEATS;
use backlog::{NewJob, Queue, QueueOptions, Worker};
use serde_json::json;

use harness::{child_queue, Backend, Children, Harness, TestResult};

/// The child's heartbeat interval: short, so its row expires in well under
/// a second after its last heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(200);

/// The only kind the child handles.
const KIND: &str = "registry_probe";

conformance!(a_killed_worker_process_ages_out_and_its_kinds_are_flagged);

/// The child's entry point; without a database (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the registry suite"]
fn registry_child() -> TestResult {
    let Some((queue, _)) = child_queue(QueueOptions::new())? else {
        return Ok(());
    };
    let _worker = Worker::builder(queue)
        .worker_id("registry-child")
        .heartbeat_interval(HEARTBEAT)
        .lease_ttl(Duration::from_secs(2))
        .handle_raw(KIND, |_payload, _ctx| Ok(()))
        .start()?;
    // Until the parent kills this process.
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

fn spawn(h: &Harness) -> TestResult<std::process::Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "registry_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

/// Whether a live worker with process id `pid` is listed.
fn listed(queue: &Queue, pid: u32) -> TestResult<bool> {
    Ok(queue.workers()?.iter().any(|w| w.pid == pid))
}

/// Polls `done` every 20 ms for at most `limit`; how long it took.
fn wait_for(limit: Duration, mut done: impl FnMut() -> TestResult<bool>) -> TestResult<Duration> {
    let start = Instant::now();
    loop {
        if done()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!("not within {limit:?}").into());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn a_killed_worker_process_ages_out_and_its_kinds_are_flagged(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let mut children = Children(vec![spawn(&h)?]);
    let pid = children.0[0].id();
    wait_for(Duration::from_secs(30), || listed(&h.queue, pid))
        .map_err(|e| format!("the child worker never registered: {e}"))?;
    let info = h
        .queue
        .workers()?
        .into_iter()
        .find(|w| w.pid == pid)
        .ok_or("no row")?;
    assert!(info.kinds.iter().any(|k| k == KIND), "{info:?}");

    children.0[0].kill()?;
    children.0[0].wait()?;
    // A job only the dead worker handled.
    h.queue.enqueue(NewJob::new(KIND, json!({})))?;

    // Its row outlives its last heartbeat by the expiry; the slack beyond
    // it is for a loaded machine's clocks and polls.
    let expiry = HEARTBEAT * EXPIRY_HEARTBEATS;
    let gone = wait_for(expiry + Duration::from_secs(10), || {
        Ok(!listed(&h.queue, pid)?)
    })
    .map_err(|e| format!("the killed worker is still listed: {e}"))?;
    let flagged = h.queue.unhandled()?;
    assert!(
        flagged.iter().any(|u| u.kind == KIND && u.due == 1),
        "the dead worker's kind is not flagged: {flagged:?}"
    );
    println!(
        "registry age-out ({b:?}): heartbeat={HEARTBEAT:?} expiry={expiry:?} gone_after_kill={gone:?}"
    );
    Ok(())
}
