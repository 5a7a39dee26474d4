//! A scheduler process aborted in the middle of claiming a tick: before the
//! claim's transaction commits (`claim-tick-before-commit`: the claim and the
//! enqueue are rolled back together, and the tick is claimed again by the
//! next scheduler), and after it commits (`claim-tick-after-commit`: the job
//! is there and the next scheduler does not enqueue that tick again). Either
//! way the tick's job exists exactly once.
//!
//! Needs the `failpoints` feature; ignored by default:
//! `cargo test --features failpoints --test periodic_crash -- --ignored --nocapture`.

#![cfg(feature = "failpoints")]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use backlog::{JobFilter, JobState, NewJob, Queue, Schedule, Scheduler};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const ROLE: &str = "BACKLOG_TEST_PERIODIC_CRASH_DB";
/// Long enough that the restarted scheduler looks well before the tick
/// after the crashed one.
const EVERY: Duration = Duration::from_secs(2);

fn schedule() -> backlog::Result<Schedule> {
    Schedule::every("crashy", EVERY, NewJob::new("tick", json!({})))
}

/// The child: registers the schedule, waits for its first tick, claims it,
/// and aborts at the armed failpoint.
#[test]
#[ignore = "the child process of periodic_crash"]
fn periodic_crash_child() -> TestResult {
    let Ok(db) = std::env::var(ROLE) else {
        return Ok(());
    };
    let queue = Queue::open(db)?;
    let scheduler = Scheduler::new(queue.clone());
    scheduler.add(schedule()?)?;
    let first = queue.schedules()?[0].next_tick;
    let wait = first
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    std::thread::sleep(wait + Duration::from_millis(20));
    scheduler.run_due()?;
    Err("the failpoint did not fire".into())
}

/// The ticks whose jobs are waiting, from their keys.
fn ticks(queue: &Queue) -> TestResult<Vec<String>> {
    let page = queue.list(&JobFilter::new(JobState::Available).limit(100))?;
    Ok(page.jobs.into_iter().filter_map(|j| j.unique_key).collect())
}

fn crash_at(point: &str, db: &Path) -> TestResult {
    let status = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "periodic_crash_child",
            "--ignored",
            "--nocapture",
        ])
        .env(ROLE, db)
        .env("BACKLOG_FAILPOINT", point)
        .stdout(Stdio::null())
        .status()?;
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{point}: {status:?}");
    Ok(())
}

#[test]
#[ignore = "needs child processes; run with --features failpoints -- --ignored"]
fn a_scheduler_aborted_mid_claim_loses_and_duplicates_no_tick() -> TestResult {
    for point in ["claim-tick-before-commit", "claim-tick-after-commit"] {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("crash.db");
        crash_at(point, &db)?;
        let queue = Queue::open(&db)?;
        let listed = queue.schedules()?;
        assert_eq!(listed.len(), 1, "{point}");
        let after_crash = ticks(&queue)?;
        if point == "claim-tick-before-commit" {
            assert!(
                after_crash.is_empty(),
                "{point}: rolled back: {after_crash:?}"
            );
            assert_eq!(
                listed[0].last_tick, None,
                "{point}: the claim rolled back too"
            );
        } else {
            assert_eq!(after_crash.len(), 1, "{point}: committed: {after_crash:?}");
            assert!(listed[0].last_tick.is_some(), "{point}");
        }
        // The next scheduler, before the next tick: the crashed claim's
        // tick is enqueued once in all.
        let scheduler = Scheduler::new(queue.clone());
        scheduler.add(schedule()?)?;
        scheduler.run_due()?;
        let after = ticks(&queue)?;
        assert_eq!(after.len(), 1, "{point}: {after:?}");
        if let Some(first) = after_crash.first() {
            assert_eq!(&after[0], first, "{point}: the same tick");
        }
        assert_eq!(scheduler.stats().duplicates, 0, "{point}");
        println!(
            "periodic crash {point}: jobs_after_crash={} jobs_after_restart={} duplicates=0",
            after_crash.len(),
            after.len()
        );
    }
    Ok(())
}
