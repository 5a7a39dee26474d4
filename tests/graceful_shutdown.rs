//! Graceful shutdown at process level (reliability suite 9).
//!
//! Two worker processes share one file. W1 runs two long jobs (they run until
//! their cancellation flag is set) and short ones (300 ms); W2 works short
//! jobs. W1 gets SIGTERM; its signal handler makes it call
//! `worker.shutdown(grace)`. Pass:
//!
//! - the short jobs W1 was running when the signal came finish, completed by
//!   W1 on their first attempt;
//! - W1 starts no handler after it saw the signal, and no lease of W1's
//!   commits later than one lease statement after it (100 ms);
//! - the long jobs are flagged (`CancelReason::Shutdown`) at the end of the
//!   grace period and released without using an attempt: W2 picks them up
//!   at once (within a second, against a 10 s lease TTL) on attempt 1;
//! - every job completes, each on its first attempt, and W1 exits cleanly.
//!
//! Children report through a side file: `lease`, `start`, `done`,
//! `cancelled` lines with their times, and W1's `signal` and `stopped`.
//!
//! Ignored by default (a few seconds); run by `.ci/run`.

mod chaos_common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use backlog::{Event, JobError, NewJob, Queue, Worker};
use chaos_common::*;
use serde_json::{json, Value};

const TEST: &str = "sigterm_finishes_short_jobs_leases_nothing_more_and_hands_long_jobs_over";
const GRACE: Duration = Duration::from_secs(1);
const LEASE_TTL: Duration = Duration::from_secs(10);
const SHORT_JOB: Duration = Duration::from_millis(300);
const SHORT_JOBS: usize = 30;
const LONG_JOBS: usize = 2;
/// A lease statement already running when the signal came may commit after.
const IN_FLIGHT_LEASE: i64 = 100_000;
const PATIENCE: Duration = Duration::from_secs(30);

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

fn reports_path(db: &Path) -> PathBuf {
    db.with_extension("reports")
}

/// A worker process, `w1` or `w2`. W1 shuts down gracefully on SIGTERM; W2
/// runs until it is killed.
fn worker(role: &str, db: &Path) -> TestResult {
    if role == "w1" {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe {
            libc::signal(libc::SIGTERM, on_sigterm as *const () as libc::sighandler_t);
        }
    }
    let who: &'static str = if role == "w1" { "w1" } else { "w2" };
    let queue = Queue::open(db)?;
    let reports = Arc::new(SideFile::open(&reports_path(db))?);

    // Leases, as this process's queue reports them, with their times.
    let events = queue.subscribe();
    let lease_reports = reports.clone();
    thread::spawn(move || {
        for event in events.iter() {
            if let Event::Leased {
                job_id, attempt, ..
            } = event
            {
                let _ = lease_reports.line(format!("lease {who} {job_id} {attempt} {}", now_us()));
            }
        }
    });

    let (short_reports, long_reports) = (reports.clone(), reports.clone());
    let worker = Worker::builder(queue)
        .worker_id(format!("graceful-{who}"))
        .concurrency(4)
        .lease_ttl(LEASE_TTL)
        .handle_raw(
            "short",
            move |_: Value, ctx| -> Result<&'static str, JobError> {
                let r = &short_reports;
                r.line(format!(
                    "start {who} {} {} {}",
                    ctx.id(),
                    ctx.attempt(),
                    now_us()
                ))?;
                thread::sleep(SHORT_JOB);
                r.line(format!(
                    "done {who} {} {} {}",
                    ctx.id(),
                    ctx.attempt(),
                    now_us()
                ))?;
                Ok(who)
            },
        )
        .handle_raw(
            "long",
            move |_: Value, ctx| -> Result<&'static str, JobError> {
                let r = &long_reports;
                r.line(format!(
                    "start {who} {} {} {}",
                    ctx.id(),
                    ctx.attempt(),
                    now_us()
                ))?;
                if who == "w2" {
                    return Ok(who);
                }
                let until = Instant::now() + PATIENCE;
                while !ctx.is_cancelled() && Instant::now() < until {
                    thread::sleep(Duration::from_millis(2));
                }
                r.line(format!(
                    "cancelled {who} {} {:?} {}",
                    ctx.id(),
                    ctx.cancel_reason(),
                    now_us()
                ))?;
                Ok("w1, too late: must not be applied")
            },
        )
        .start()?;

    if who == "w2" {
        loop {
            thread::sleep(Duration::from_secs(3600)); // until the parent kills it
        }
    }
    while !TERMINATE.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(1));
    }
    reports.line(format!("signal w1 0 0 {}", now_us()))?;
    worker.shutdown(GRACE)?;
    reports.line(format!("stopped w1 0 0 {}", now_us()))?;
    Ok(())
}

/// One report line: `tag who job attempt-or-reason time`.
struct Report {
    tag: String,
    who: String,
    job: i64,
    detail: String,
    at: i64,
}

fn reports(db: &Path) -> TestResult<Vec<Report>> {
    read_side_file(&reports_path(db))
        .into_iter()
        .filter(|l| l.len() == 5)
        .map(|l| {
            Ok(Report {
                tag: l[0].clone(),
                who: l[1].clone(),
                job: l[2].parse()?,
                detail: l[3].clone(),
                at: l[4].parse()?,
            })
        })
        .collect()
}

fn find<'a>(reports: &'a [Report], tag: &str, who: &str) -> impl Iterator<Item = &'a Report> {
    let (tag, who) = (tag.to_owned(), who.to_owned());
    reports.iter().filter(move |r| r.tag == tag && r.who == who)
}

#[test]
#[ignore = "SIGTERMs a worker process, a few seconds; run by .ci/run"]
fn sigterm_finishes_short_jobs_leases_nothing_more_and_hands_long_jobs_over() -> TestResult {
    if let Some((role, db)) = child_role() {
        return worker(&role, &db);
    }
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("graceful.db");
    let queue = Queue::open(&db)?;
    // Long jobs first in line, so W1 holds both before W2 starts.
    let long: Vec<i64> = queue
        .enqueue_many((0..LONG_JOBS).map(|n| NewJob::new("long", json!(n)).priority(10)))?
        .into_iter()
        .map(|e| e.id)
        .collect();
    queue.enqueue_many((0..SHORT_JOBS).map(|n| NewJob::new("short", json!(n))))?;

    let mut children = Reaper::default();
    children.0.push(spawn_child(TEST, "w1", &db)?);
    wait_until(PATIENCE, "W1 to start the long jobs", || {
        Ok(find(&reports(&db)?, "start", "w1").count() >= 4)
    })?;
    children.0.push(spawn_child(TEST, "w2", &db)?);
    wait_until(PATIENCE, "W2 to start a job", || {
        Ok(find(&reports(&db)?, "start", "w2").count() >= 1)
    })?;

    let signalled_at = now_us();
    send_signal(children.0[0].id(), libc::SIGTERM)?;
    let status = children.0[0].wait()?;
    assert!(status.success(), "W1 exits cleanly after SIGTERM: {status}");
    let conn = connect(&db)?;
    wait_until(PATIENCE, "W2 to finish every job", || {
        Ok(count(&conn, "SELECT count(*) FROM backlog_jobs")? == 0)
    })?;
    kill_child(&mut children.0[1]);

    let all = reports(&db)?;
    let seen = find(&all, "signal", "w1")
        .next()
        .ok_or("W1 saw no signal")?
        .at;
    let stopped = find(&all, "stopped", "w1")
        .next()
        .ok_or("W1 never stopped")?
        .at;
    let started_before: Vec<&Report> = find(&all, "start", "w1").filter(|r| r.at < seen).collect();
    let in_flight: Vec<i64> = started_before
        .iter()
        .filter(|s| !long.contains(&s.job))
        .filter(|s| !find(&all, "done", "w1").any(|d| d.job == s.job && d.at < signalled_at))
        .map(|s| s.job)
        .collect();
    let finished = in_flight
        .iter()
        .filter(|job| find(&all, "done", "w1").any(|d| d.job == **job))
        .count();
    let starts_after_signal = find(&all, "start", "w1").filter(|r| r.at >= seen).count();
    let leases_after_signal = find(&all, "lease", "w1").filter(|r| r.at > seen).count();
    let late_leases = find(&all, "lease", "w1")
        .filter(|r| r.at > seen + IN_FLIGHT_LEASE)
        .count();
    let flagged: Vec<&Report> = find(&all, "cancelled", "w1").collect();
    let mut pickup_ms = 0;
    for id in &long {
        let released = flagged
            .iter()
            .find(|r| r.job == *id)
            .ok_or(format!("long job {id} was not flagged"))?;
        assert_eq!(released.detail, "Some(Shutdown)");
        let picked = find(&all, "start", "w2")
            .find(|r| r.job == *id)
            .ok_or(format!("W2 never started long job {id}"))?;
        assert_eq!(picked.detail, "1", "long job {id} ran again as attempt 1");
        pickup_ms = pickup_ms.max((picked.at - released.at) / 1000);
    }

    // Every job completed once, on its first attempt.
    let mut stmt =
        conn.prepare("SELECT id, status, attempts, processed_by, result FROM backlog_history")?;
    let history: Vec<(i64, String, i64, String, Option<String>)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<Result<_, _>>()?;
    let extra_attempts: i64 = history.iter().map(|h| h.2 - 1).sum();
    println!(
        "graceful shutdown: grace_ms={} shutdown_ms={} in_flight_short={} finished={finished} \
         starts_after_signal={starts_after_signal} leases_after_signal={leases_after_signal} \
         long_released={} extra_attempts={extra_attempts} pickup_ms={pickup_ms} ttl_ms={} \
         completed={}",
        GRACE.as_millis(),
        (stopped - seen) / 1000,
        in_flight.len(),
        flagged.len(),
        LEASE_TTL.as_millis(),
        history.iter().filter(|h| h.1 == "completed").count(),
    );

    assert!(
        !in_flight.is_empty(),
        "W1 was running short jobs at the signal"
    );
    assert_eq!(finished, in_flight.len(), "W1's short jobs finished");
    for (id, _, _, by, _) in history.iter().filter(|h| in_flight.contains(&h.0)) {
        assert_eq!(by, "graceful-w1", "job {id} was completed by W1");
    }
    assert_eq!(starts_after_signal, 0, "W1 started a job after the signal");
    assert_eq!(late_leases, 0, "W1 leased after the signal");
    assert_eq!(flagged.len(), LONG_JOBS);
    assert!(
        pickup_ms < 1000 && pickup_ms * 10 < LEASE_TTL.as_millis() as i64,
        "released long jobs waited {pickup_ms} ms"
    );
    assert_eq!(history.len(), LONG_JOBS + SHORT_JOBS);
    assert!(history.iter().all(|h| h.1 == "completed"));
    assert_eq!(extra_attempts, 0, "no job used more than one attempt");
    for (id, _, _, by, result) in history.iter().filter(|h| long.contains(&h.0)) {
        assert_eq!(by, "graceful-w2", "long job {id}");
        assert_eq!(
            result.as_deref(),
            Some("\"w2\""),
            "W1's late result was not applied"
        );
    }
    let shutdown = Duration::from_micros((stopped - seen) as u64);
    assert!(
        shutdown >= GRACE && shutdown < GRACE + Duration::from_secs(2),
        "shutdown took {shutdown:?}"
    );
    assert_eq!(integrity(&db)?, "ok");
    Ok(())
}
