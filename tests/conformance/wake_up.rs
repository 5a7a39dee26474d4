//! Wake-ups from another process: a producer process enqueues while the
//! workers' idle poll interval is 10 s, and every job starts within a
//! second. The idle poll cannot explain that: the producer enqueues between
//! two idle polls that are 4 s apart, so only a cross-process wake-up can
//! (SQLite's file notifications or `data_version`, PostgreSQL's
//! LISTEN/NOTIFY, MySQL's probe of the newest job).
//!
//! Each job has a queue and a worker of its own, so each is its worker's
//! first job: a lease resets a worker's idle backoff to short polls, which
//! could explain a second job's quick start. The jobs are spread over
//! 1.75 s, so a wake-up that comes only every 2 s (as PostgreSQL's did,
//! with its listener's ping) leaves at least one of them waiting longer
//! than the bound.
//!
//! The producer is this test binary re-run as `wake_up::producer_child`
//! with `BACKLOG_WAKE_UP_AT` set and the database in the environment
//! ([`crate::harness::Harness::child_env`]).

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backlog::{NewJob, QueueOptions, Worker};
use serde_json::{json, Value};

use crate::harness::{child_queue, Backend, TestResult};

/// When the producer starts enqueueing (unix µs, the machine's clock).
const AT: &str = "BACKLOG_WAKE_UP_AT";
const JOBS: usize = 8;
/// The poll interval of the scenario's worker.
const POLL: Duration = Duration::from_secs(10);
/// The worker's idle waits, from its start, are 1 s, 2 s, 4 s, 8 s (a tenth
/// of the poll interval, doubling): it polls at 1 s, 3 s, 7 s, 15 s. The
/// producer enqueues at 3.5 s, so the poll would find the jobs at 7 s.
const ENQUEUE_AFTER: Duration = Duration::from_millis(3_500);
/// The spacing of the producer's enqueues.
const SPACING: Duration = Duration::from_millis(250);
/// The longest a job may wait to start; the next idle poll is 3.5 s away.
const BOUND: Duration = Duration::from_secs(1);

/// The producer's entry point; without [`AT`] (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the wake-up scenario"]
fn producer_child() -> TestResult {
    let Ok(at) = std::env::var(AT) else {
        return Ok(());
    };
    let at = UNIX_EPOCH + Duration::from_micros(at.parse()?);
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        thread::sleep(wait);
    }
    for i in 0..JOBS {
        let before = unix_micros();
        let job = queue.enqueue(NewJob::new("k", json!(i)).queue(queue_name(i)))?;
        println!("enqueued {} {before}", job.id);
        thread::sleep(SPACING);
    }
    Ok(())
}

fn queue_name(i: usize) -> String {
    format!("wake-{i}")
}

fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn a_job_another_process_enqueues_starts_before_the_idle_poll(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (started, starts) = crossbeam_channel::unbounded();
    let workers = (0..JOBS)
        .map(|i| {
            let started = started.clone();
            Worker::builder(h.queue.clone())
                .queues([queue_name(i)])
                .poll_interval(POLL)
                .concurrency(1)
                .handle_raw("k", move |_: Value, ctx| {
                    let _ = started.send((ctx.id(), unix_micros()));
                    Ok(())
                })
                .start()
        })
        .collect::<backlog::Result<Vec<_>>>()?;
    let worker_started = unix_micros();
    let at = worker_started + i64::try_from(ENQUEUE_AFTER.as_micros())?;

    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([
            "--exact",
            "wake_up::producer_child",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(AT, at.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    let output = command.spawn()?.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "producer failed: {stdout}");
    let enqueued: Vec<(i64, i64)> = stdout
        .lines()
        // The test harness's own output may share the first line.
        .filter_map(|l| l.split_once("enqueued ").map(|(_, rest)| rest))
        .map(|l| -> TestResult<(i64, i64)> {
            let (id, at) = l.split_once(' ').ok_or("bad producer line")?;
            Ok((id.parse()?, at.parse()?))
        })
        .collect::<TestResult<_>>()?;
    assert_eq!(enqueued.len(), JOBS, "producer said: {stdout}");
    // The producer must not have been so late that a poll could be next.
    let last = enqueued.iter().map(|e| e.1).max().unwrap_or(0);
    assert!(
        last - worker_started < 6_000_000,
        "the producer enqueued too late; the scenario proves nothing"
    );

    let mut seen = Vec::new();
    while seen.len() < JOBS {
        seen.push(starts.recv_timeout(Duration::from_secs(15))?);
    }
    for worker in workers {
        worker.shutdown(Duration::from_secs(5))?;
    }
    for (id, enqueued_at) in enqueued {
        let (_, started_at) = seen
            .iter()
            .find(|(s, _)| *s == id)
            .ok_or("a job never started")?;
        let waited = Duration::from_micros(u64::try_from(started_at - enqueued_at)?);
        assert!(
            waited < BOUND,
            "job {id} started {waited:?} after another process enqueued it: \
             it waited for the idle poll"
        );
    }
    Ok(())
}

conformance!(a_job_another_process_enqueues_starts_before_the_idle_poll);
