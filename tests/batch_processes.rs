//! Batches across processes, through SIGKILLs, on every backend: worker
//! processes run the members of many sealed batches at once while the test
//! kills one of them (SIGKILL) every few hundred milliseconds and starts a
//! new one. Killed claims are rescued and run again. At the end every batch
//! must have finished with each of its two callbacks enqueued exactly once:
//! none lost with a killed transaction, none twice from two processes
//! finishing the last members at once.
//!
//! A child is this test binary re-run as `batch_child` with
//! `BACKLOG_BATCHES_ROLE` set and the database in the environment
//! ([`harness::Harness::child_env`]). Size knobs: `BACKLOG_BATCHES_COUNT`
//! batches (default 20) of `BACKLOG_BATCHES_MEMBERS` members (default 40),
//! `BACKLOG_BATCHES_KILLS` kills (default 10).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{NewJob, QueueOptions, Worker};
use serde_json::json;

use harness::{child_queue, Backend, Children, Harness, TestResult};

const ROLE: &str = "BACKLOG_BATCHES_ROLE";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The children's entry point; without a role (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the batch suite"]
fn batch_child() -> TestResult {
    if std::env::var(ROLE).is_err() {
        return Ok(());
    }
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    // Members only: the callbacks stay in their queue to be counted.
    let _worker = Worker::builder(queue)
        .concurrency(4)
        .lease_ttl(Duration::from_secs(2))
        .rescue_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(100))
        .handle_raw("member", |_payload, _ctx| {
            thread::sleep(Duration::from_millis(rand_ms()));
            Ok(())
        })
        .start()?;
    loop {
        thread::sleep(Duration::from_secs(3600)); // until SIGKILL
    }
}

/// 10..30 ms, from the clock: no dependency for a jitter.
fn rand_ms() -> u64 {
    u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()),
    ) % 20
        + 10
}

fn spawn(h: &Harness) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "batch_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE, "worker")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

fn batch_callbacks_fire_exactly_once_through_sigkills(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (count, members, kills) = (
        knob("BACKLOG_BATCHES_COUNT", 20),
        knob("BACKLOG_BATCHES_MEMBERS", 40),
        knob("BACKLOG_BATCHES_KILLS", 10),
    );
    let mut batches = Vec::new();
    for n in 0..count {
        let batch = h
            .queue
            .batch()
            .on_complete(NewJob::new("complete", json!({"n": n})).queue("callbacks"))
            .on_success(NewJob::new("success", json!({"n": n})).queue("callbacks"))
            .create()?;
        h.queue.enqueue_many(
            (0..members).map(|m| NewJob::new("member", json!({"m": m})).batch(batch.id)),
        )?;
        h.queue.seal_batch(batch.id)?;
        batches.push(batch.id);
    }

    let start = Instant::now();
    let mut children = Children((0..3).map(|_| spawn(&h)).collect::<TestResult<_>>()?);
    let mut killed = 0;
    let limit = Duration::from_secs(300);
    loop {
        let mut finished = 0;
        for &id in &batches {
            if h.queue.batch_status(id)?.finished_at.is_some() {
                finished += 1;
            }
        }
        if finished == batches.len() {
            break;
        }
        if start.elapsed() > limit {
            return Err(format!("after {limit:?}: {finished} of {count} batches finished").into());
        }
        if killed < kills {
            thread::sleep(Duration::from_millis(60 + 25 * (killed as u64 % 5)));
            let victim = killed % children.0.len();
            let child = &mut children.0[victim];
            child.kill()?; // SIGKILL
            let status = child.wait()?;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "the kill landed");
            children.0[victim] = spawn(&h)?;
            killed += 1;
        } else {
            thread::sleep(Duration::from_millis(200));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(children);

    for &id in &batches {
        let status = h.queue.batch_status(id)?;
        assert_eq!(
            (status.total, status.completed, status.pending),
            (members as i64, members as i64, 0),
            "batch {id}: {status:?}"
        );
        let fired = h.count(&format!(
            "SELECT count(*) FROM backlog_jobs WHERE queue = 'callbacks' AND id IN ({}, {})",
            status.complete_job_id.ok_or("no complete callback")?,
            status.success_job_id.ok_or("no success callback")?
        ))?;
        assert_eq!(fired, 2, "batch {id}: both callbacks are live jobs");
    }
    let callbacks = h.count("SELECT count(*) FROM backlog_jobs WHERE queue = 'callbacks'")?;
    assert_eq!(callbacks, 2 * count as i64, "no callback twice");
    println!(
        "batches multi-process ({b:?}): processes=3 batches={count} members={} kills={killed} \
         callbacks={callbacks} lost=0 dup=0 secs={secs:.1}",
        count * members
    );
    Ok(())
}

conformance!(batch_callbacks_fire_exactly_once_through_sigkills);
