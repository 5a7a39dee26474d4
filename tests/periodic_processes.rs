//! Three processes run the same periodic schedules on one database, on every
//! backend (SQLite file; PostgreSQL and MySQL when their URL is set, else
//! `SKIPPED`), and every tick in the window is enqueued exactly once: no
//! gap, no tick twice, and each tick claimed by exactly one process (their
//! own counts add up to the ticks, with no tick caught only by the unique
//! key). A gap is allowed only where a process reports that it passed over
//! ticks: a claim that comes after two or more ticks are due (the machine
//! held the scheduler's thread up) enqueues the latest one only, by design,
//! and counts the others in `SchedulerStats::passed_over`. Every missing
//! tick must be one of those.
//!
//! The processes overlap and come and go: the first stops early, the third
//! starts late, so ticks pass from one to another. Schedules: an interval
//! of 200 ms and a cron expression with a seconds field (every second).
//!
//! Runs ~`BACKLOG_PERIODIC_SECS` (default 12) seconds per backend, so
//! `#[ignore]`d: `cargo test --all-features --test periodic_processes --
//! --ignored`. A child is this test binary re-run as `periodic_child`.

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use backlog::{JobFilter, JobState, NewJob, Queue, QueueOptions, Schedule, Scheduler};
use serde_json::json;

use harness::{child_queue, Backend, Harness, TestResult};

const ROLE: &str = "BACKLOG_PERIODIC_ROLE";
const RUN_MS: &str = "BACKLOG_PERIODIC_RUN_MS";

const INTERVAL: Duration = Duration::from_millis(200);

fn schedules() -> backlog::Result<Vec<Schedule>> {
    Ok(vec![
        Schedule::every("fast", INTERVAL, NewJob::new("fast", json!({})))?,
        Schedule::cron("seconds", "* * * * * *", NewJob::new("second", json!({})))?,
    ])
}

/// The children's entry point: runs a scheduler for `RUN_MS`, then prints
/// its counts (`STATS enqueued duplicates lost errors passed_over`).
#[test]
#[ignore = "a child process of periodic_processes"]
fn periodic_child() -> TestResult {
    if std::env::var(ROLE).is_err() {
        return Ok(());
    }
    let run = Duration::from_millis(std::env::var(RUN_MS)?.parse()?);
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    let scheduler = Scheduler::start(queue)?;
    for schedule in schedules()? {
        scheduler.add(schedule)?;
    }
    std::thread::sleep(run);
    // Counted after the thread stopped: no claim after the count.
    let stats = scheduler.shutdown();
    println!(
        "STATS {} {} {} {} {}",
        stats.enqueued, stats.duplicates, stats.lost, stats.errors, stats.passed_over
    );
    Ok(())
}

#[test]
#[ignore = "runs ~12 s per backend; CI runs it with --ignored"]
fn three_processes_enqueue_every_tick_exactly_once() -> TestResult {
    for backend in [Backend::Sqlite, Backend::Postgres, Backend::Mysql] {
        backend.run(|b| {
            let secs: u64 = std::env::var("BACKLOG_PERIODIC_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(12);
            let h = b.harness_on_real_time(QueueOptions::new())?;
            check(&h, Duration::from_secs(secs), b)
        })?;
    }
    Ok(())
}

fn spawn(h: &Harness, run: Duration) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "periodic_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE, "scheduler")
        .env(RUN_MS, run.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

/// A child's counts: (enqueued, duplicates, lost, errors, passed over).
fn wait_stats(child: Child) -> TestResult<(u64, u64, u64, u64, u64)> {
    let output = child.wait_with_output()?;
    if !output.status.success() {
        return Err(format!("child failed: {:?}", output.status).into());
    }
    for line in BufReader::new(&output.stdout[..]).lines() {
        let line = line?;
        // libtest may print `test periodic_child ... ` before it.
        if let Some((_, rest)) = line.split_once("STATS ") {
            let n: Vec<u64> = rest.split(' ').map(str::parse).collect::<Result<_, _>>()?;
            return Ok((n[0], n[1], n[2], n[3], n[4]));
        }
    }
    Err("child printed no STATS".into())
}

fn check(h: &Harness, window: Duration, backend: &Backend) -> TestResult {
    let started = Instant::now();
    // 0 ..... 40% ; 20% ........ 100% ; 50% ....... 100%
    let first = spawn(h, window * 2 / 5)?;
    std::thread::sleep(window / 5);
    let second = spawn(h, window * 4 / 5)?;
    std::thread::sleep(window * 3 / 10);
    let third = spawn(h, window / 2)?;
    let stats = [wait_stats(first)?, wait_stats(second)?, wait_stats(third)?];
    let elapsed = started.elapsed();

    let ticks = ticks_by_schedule(&h.queue)?;
    let passed_over: u64 = stats.iter().map(|s| s.4).sum();
    let mut missing = 0;
    let mut report = Vec::new();
    for (name, every) in [("fast", INTERVAL), ("seconds", Duration::from_secs(1))] {
        let ticks = ticks.get(name).cloned().unwrap_or_default();
        let every = i64::try_from(every.as_micros())?;
        let gaps: Vec<i64> = ticks
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&d| d != every)
            .collect();
        assert!(
            gaps.iter().all(|d| d % every == 0 && *d > 0),
            "{name}: ticks off the schedule's grid of {every} µs: {gaps:?}"
        );
        let passed: i64 = gaps.iter().map(|d| d / every - 1).sum();
        missing += passed;
        // Every tick of the window, less up to a second for the first
        // process to start and the last to exit.
        let expected = elapsed.as_micros() as i64 / every;
        let slack = 1_000_000 / every + 2;
        let covered = ticks.len() as i64 + passed;
        assert!(
            covered >= expected - slack && covered <= expected + 1,
            "{name}: {} ticks and {passed} passed over in {elapsed:?}",
            ticks.len()
        );
        report.push(format!("{name}={}", ticks.len()));
    }
    let total: usize = ticks.values().map(Vec::len).sum();
    let enqueued: u64 = stats.iter().map(|s| s.0).sum();
    let duplicates: u64 = stats.iter().map(|s| s.1).sum();
    let lost: u64 = stats.iter().map(|s| s.2).sum();
    let errors: u64 = stats.iter().map(|s| s.3).sum();
    assert_eq!(
        enqueued, total as u64,
        "each tick claimed by exactly one process"
    );
    assert_eq!(duplicates, 0, "no tick claimed twice");
    assert_eq!(
        u64::try_from(missing)?,
        passed_over,
        "every missing tick was passed over by a late claim, and counted"
    );
    assert_eq!(errors, 0);
    assert!(
        stats.iter().all(|s| s.0 > 0),
        "every process claimed some ticks: {stats:?}"
    );
    let claims: Vec<String> = stats.iter().map(|s| s.0.to_string()).collect();
    println!(
        "periodic processes ({backend:?}): {} secs={:.1} claims_per_process={} lost_races={lost} duplicates=0 \
         passed_over={passed_over} (each a gap, accounted for)",
        report.join(" "),
        elapsed.as_secs_f64(),
        claims.join(",")
    );
    Ok(())
}

/// The ticks (µs) enqueued per schedule, from the jobs' unique keys, sorted;
/// a tick enqueued twice would appear twice.
fn ticks_by_schedule(queue: &Queue) -> TestResult<BTreeMap<String, Vec<i64>>> {
    let mut ticks: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut filter = JobFilter::new(JobState::Available).limit(500);
    loop {
        let page = queue.list(&filter)?;
        for job in &page.jobs {
            let key = job.unique_key.as_deref().ok_or("a job without a key")?;
            let mut parts = key.splitn(3, ':');
            let (Some("periodic"), Some(name), Some(tick)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("not a tick's key: {key}").into());
            };
            ticks
                .entry(name.to_owned())
                .or_default()
                .push(tick.parse()?);
        }
        match page.next_after {
            Some(after) => filter = filter.after(after),
            None => break,
        }
    }
    for list in ticks.values_mut() {
        list.sort_unstable();
    }
    Ok(ticks)
}
