//! Queue limits across processes, on every backend: three worker processes
//! (four handler threads each, at most two of the queue's jobs each) lease
//! from one limited queue at once.
//!
//! - Concurrency: each job records when its handler started and ended (the
//!   machine's clock, shared by the processes); at no instant do more jobs
//!   overlap than the limit.
//! - Places handed on: the same with uncapped workers of short jobs, whose
//!   threads would fill the limit, so they hold no look-ahead and each
//!   completer claims in the transaction that frees its places (on the
//!   servers, without the queue's lock: `limits::lease_handing_on`).
//! - Rate: each job's start as the database recorded it (`started_at`, the
//!   clock the limiter's windows are cut from) falls in a fixed window of
//!   the period; no window holds more starts than the limit.
//!
//! A child is this test binary re-run as `limits_child` with
//! `BACKLOG_LIMITS_ROLE` set and the database in the environment
//! ([`harness::Harness::child_env`]). The servers run when
//! `BACKLOG_TEST_POSTGRES_URL` / `BACKLOG_TEST_MYSQL_URL` are set (and the
//! features built); otherwise they print `SKIPPED`.

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backlog::{JobFilter, JobRecord, JobState, NewJob, QueueLimits, QueueOptions, Rate, Worker};
use serde_json::{json, Value};

use harness::{child_queue, wait_for_completed, Backend, Children, Harness, TestResult};

const ROLE: &str = "BACKLOG_LIMITS_ROLE";
/// A child's cap on the limited queue's jobs; `0` for none.
const CAP: &str = "BACKLOG_LIMITS_CAP";
const QUEUE: &str = "limited";

/// The completed jobs of the limited queue, paged.
fn completed() -> JobFilter {
    JobFilter::new(JobState::COMPLETED).queue(QUEUE).limit(500)
}

/// The children's entry point; without a role (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the limits suites"]
fn limits_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    if role != "worker" {
        return Err(format!("unknown role {role}").into());
    }
    let mut builder = Worker::builder(queue).queues([QUEUE]).concurrency(4);
    // A process refills its places in the transaction that frees them
    // (complete-and-lease), so one process could keep the queue's whole
    // limit; capped at 2 here, the limit of 3 takes two processes.
    let cap = std::env::var(CAP).map_or(Ok(2), |v| v.parse())?;
    if cap > 0 {
        builder = builder.queue_concurrency(QUEUE, cap);
    }
    let _worker = builder
        .poll_interval(Duration::from_millis(50))
        .handle_raw("timed", |payload: Value, _| {
            let start = unix_micros();
            thread::sleep(Duration::from_millis(
                payload["sleep_ms"].as_u64().unwrap_or(0),
            ));
            Ok(json!({ "start": start, "end": unix_micros() }))
        })
        .start()?;
    // Until the parent kills this process.
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A record's start time in unix µs: the one place that reads the record's
/// time type.
fn started_micros(record: &JobRecord) -> Option<i64> {
    let since = record
        .started_at?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    i64::try_from(since.as_micros()).ok()
}

fn spawn_workers(h: &Harness, n: usize) -> TestResult<Children> {
    spawn_capped_workers(h, n, 2)
}

fn spawn_capped_workers(h: &Harness, n: usize, cap: usize) -> TestResult<Children> {
    let mut children = Children(Vec::new());
    for _ in 0..n {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "limits_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, "worker")
            .env(CAP, cap.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in h.child_env() {
            command.env(k, v);
        }
        children.0.push(command.spawn()?);
    }
    Ok(children)
}

/// Jobs leased more than once: none should be (no lease expires here).
fn claimed_twice(records: &[JobRecord]) -> usize {
    records.iter().filter(|r| r.attempts != 1).count()
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The handler's (start, end) of a finished job.
fn interval(record: &JobRecord) -> TestResult<(i64, i64)> {
    let result: Value = serde_json::from_str(record.result.as_deref().ok_or("no result")?)?;
    let at = |k: &str| result[k].as_i64().ok_or(format!("no {k} in {result}"));
    Ok((at("start")?, at("end")?))
}

/// The most intervals that overlap at any instant (an end before a start at
/// the same µs: touching intervals do not overlap).
fn max_overlap(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    edges.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        max = max.max(now);
    }
    usize::try_from(max).unwrap_or(0)
}

fn processes_never_run_more_than_the_concurrency_limit(b: &Backend) -> TestResult {
    let h = b.harness()?;
    const LIMIT: u32 = 3;
    let jobs = knob("BACKLOG_LIMITS_JOBS", 60);
    let sleep_ms = knob("BACKLOG_LIMITS_SLEEP_MS", 25);
    h.queue.set_limits(
        QUEUE,
        QueueLimits {
            concurrency: Some(LIMIT),
            rate: None,
        },
    )?;
    h.queue.enqueue_many(
        (0..jobs)
            .map(|i| NewJob::new("timed", json!({ "i": i, "sleep_ms": sleep_ms })).queue(QUEUE)),
    )?;
    let children = spawn_workers(&h, 3)?; // 6 places for a limit of 3
    let workers = never_above(b, &h, "", LIMIT, jobs, children)?;
    // The limit was what held them back, not a lack of contention.
    assert!(workers >= 2, "one process did all the work");
    Ok(())
}

/// Waits for the `jobs`, ends the `children`, and checks that no more than
/// `limit` of them ran at once, none twice, and the limit filled at least
/// to 2; returns how many processes ran them.
fn never_above(
    b: &Backend,
    h: &Harness,
    what: &str,
    limit: u32,
    jobs: usize,
    children: Children,
) -> TestResult<usize> {
    let records = wait_for_completed(h, completed(), jobs, Duration::from_secs(120))?;
    drop(children);
    let intervals = records
        .iter()
        .map(interval)
        .collect::<TestResult<Vec<_>>>()?;
    let overlap = max_overlap(&intervals);
    let workers: std::collections::HashSet<_> =
        records.iter().filter_map(|r| r.worker.clone()).collect();
    println!(
        "limits processes ({b:?}):{what} concurrency limit={limit} jobs={jobs} \
         max_overlap={overlap} workers={} claimed_twice={}",
        workers.len(),
        claimed_twice(&records)
    );
    assert_eq!(claimed_twice(&records), 0, "a job was claimed twice");
    assert!(overlap <= limit as usize, "{overlap} jobs ran at once");
    assert!(
        overlap >= 2,
        "only {overlap} at once: the test proves little"
    );
    Ok(workers.len())
}

fn processes_handing_places_on_never_run_more_than_the_concurrency_limit(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    const LIMIT: u32 = 5;
    let jobs = knob("BACKLOG_LIMITS_HAND_ON_JOBS", 600);
    h.queue.set_limits(
        QUEUE,
        QueueLimits {
            concurrency: Some(LIMIT),
            rate: None,
        },
    )?;
    h.queue.enqueue_many(
        (0..jobs).map(|i| NewJob::new("timed", json!({ "i": i, "sleep_ms": 1 })).queue(QUEUE)),
    )?;
    // 12 uncapped threads for 5 places; jobs short enough for a look-ahead.
    let children = spawn_capped_workers(&h, 3, 0)?;
    never_above(b, &h, " places handed on,", LIMIT, jobs, children)?;
    Ok(())
}

fn processes_never_start_more_than_the_rate_limit_per_window(b: &Backend) -> TestResult {
    let h = b.harness()?;
    const LIMIT: u32 = 8;
    const PERIOD_MS: i64 = 400;
    let jobs = knob("BACKLOG_LIMITS_RATE_JOBS", 40);
    h.queue.set_limits(
        QUEUE,
        QueueLimits {
            concurrency: None,
            rate: Some(Rate::new(LIMIT, Duration::from_millis(PERIOD_MS as u64))),
        },
    )?;
    h.queue.enqueue_many(
        (0..jobs).map(|i| NewJob::new("timed", json!({ "i": i, "sleep_ms": 1 })).queue(QUEUE)),
    )?;
    let children = spawn_workers(&h, 3)?;
    let records = wait_for_completed(&h, completed(), jobs, Duration::from_secs(60))?;
    drop(children);

    let mut per_window = std::collections::BTreeMap::new();
    for record in &records {
        let started = started_micros(record).ok_or("a completed job without a start")?;
        *per_window
            .entry(started.div_euclid(PERIOD_MS * 1000))
            .or_insert(0u32) += 1;
    }
    let busiest = per_window.values().copied().max().unwrap_or(0);
    println!(
        "limits processes ({b:?}): rate limit={LIMIT}/{PERIOD_MS}ms jobs={jobs} windows={} \
         busiest_window={busiest} claimed_twice={}",
        per_window.len(),
        claimed_twice(&records)
    );
    assert_eq!(claimed_twice(&records), 0, "a job was claimed twice");
    assert!(
        busiest <= LIMIT,
        "{busiest} starts in one window: {per_window:?}"
    );
    // 8 a window need at least jobs / 8 windows; contention filled one.
    assert!(per_window.len() >= jobs / LIMIT as usize);
    assert_eq!(busiest, LIMIT, "no window was full: the test proves little");
    Ok(())
}

conformance!(
    processes_never_run_more_than_the_concurrency_limit,
    processes_handing_places_on_never_run_more_than_the_concurrency_limit,
    processes_never_start_more_than_the_rate_limit_per_window,
);
