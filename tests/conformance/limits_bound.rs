//! A concurrency limit reached by many small leases and settles: never
//! exceeded, never stalled. Written for MySQL's running bound (an upper
//! bound of a queue's running jobs kept on its row, so that a lease with
//! room under it skips the count; `src/backend/mysql/limits.rs`): settles
//! leave the bound too high, and a lease it no longer leaves room for must
//! count and find the places they freed. On every backend the same
//! behaviour holds, counted or not.

use backlog::{LeaseRequest, NewJob, Queue, QueueLimits};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

const QUEUE: &str = "bounded";

fn concurrency(n: u32) -> QueueLimits {
    QueueLimits {
        concurrency: Some(n),
        rate: None,
    }
}

fn lease(q: &Queue, n: usize) -> backlog::Result<Vec<backlog::Job>> {
    q.lease(&LeaseRequest::new("w", n).queues([QUEUE]))
}

/// The queue's jobs leased now, as the database holds them.
fn running(h: &Harness) -> TestResult<i64> {
    h.count(&format!(
        "SELECT count(*) FROM backlog_jobs WHERE queue = '{QUEUE}' AND lease_token IS NOT NULL"
    ))
}

fn enqueue(q: &Queue, n: usize) -> backlog::Result<()> {
    q.enqueue_many((0..n).map(|i| NewJob::new("k", json!(i)).queue(QUEUE)))?;
    Ok(())
}

/// One job at a time, each settled before the next: a bound raised by every
/// claim and lowered by none passes the limit many times over, and every
/// lease must still find its one place.
fn a_limit_that_small_leases_and_settles_pass_many_times_never_stalls(b: &Backend) -> TestResult {
    const LIMIT: u32 = 4;
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, 60)?;
    q.set_limits(QUEUE, concurrency(LIMIT))?;
    for i in 0..30 {
        let jobs = lease(q, 1)?;
        assert_eq!(jobs.len(), 1, "lease {i} found no place, with none running");
        match i % 3 {
            0 => q.complete(&jobs[0], None)?,
            1 => q.fail(&jobs[0], "boom")?,
            _ => q.snooze(&jobs[0], std::time::Duration::from_secs(3600))?,
        }
    }
    // With places taken too: three run, and one place is left, also after
    // many leases were made and settled around them.
    let held: Vec<_> = (0..3).map(|_| lease(q, 1)).collect::<Result<_, _>>()?;
    assert!(held.iter().all(|j| j.len() == 1));
    for i in 0..10 {
        let jobs = lease(q, 2)?;
        assert_eq!(jobs.len(), 1, "lease {i}: one place was left");
        assert_eq!(running(&h)?, i64::from(LIMIT));
        q.complete(&jobs[0], None)?;
    }
    Ok(())
}

/// Small leases and settles in turn fill the limit exactly: whatever a
/// lease knew of the running jobs, none admits more than the places left.
fn small_leases_and_settles_in_turn_fill_a_limit_exactly(b: &Backend) -> TestResult {
    const LIMIT: i64 = 6;
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, 60)?;
    q.set_limits(QUEUE, concurrency(LIMIT as u32))?;
    let mut held = Vec::new();
    // Each step: how many to ask for, and how many of the held to settle.
    let steps = [
        (2, 0),
        (2, 1),
        (1, 0),
        (1, 0),
        (3, 2),
        (2, 0),
        (1, 0),
        (4, 3),
    ];
    for _ in 0..3 {
        for (ask, settle) in steps {
            let before = running(&h)?;
            let got = lease(q, ask)?;
            let expect = usize::try_from((LIMIT - before).clamp(0, ask as i64))?;
            assert_eq!(got.len(), expect, "{before} running, asked {ask}");
            held.extend(got);
            assert!(running(&h)? <= LIMIT, "{} running", running(&h)?);
            for job in held.drain(..settle) {
                q.complete(&job, None)?;
            }
        }
    }
    // Full now, for any handle, however it asks.
    while running(&h)? < LIMIT {
        held.extend(lease(q, 1)?);
    }
    let other = h.second_handle()?;
    for ask in [1, 2, 10] {
        assert!(lease(&other, ask)?.is_empty(), "asked {ask} past the limit");
        assert!(lease(q, ask)?.is_empty(), "asked {ask} past the limit");
    }
    Ok(())
}

/// Six handles lease and settle at once, a few jobs at a time: the database
/// never holds more running jobs than the limit, and they drain the queue.
fn handles_leasing_and_settling_at_once_never_exceed_a_limit(b: &Backend) -> TestResult {
    const LIMIT: i64 = 10;
    const JOBS: usize = 240;
    let h = b.harness()?;
    enqueue(&h.queue, JOBS)?;
    h.queue.set_limits(QUEUE, concurrency(LIMIT as u32))?;
    let handles = (0..6)
        .map(|_| h.second_handle())
        .collect::<TestResult<Vec<_>>>()?;
    let start = std::sync::Barrier::new(handles.len());
    let done = std::sync::atomic::AtomicUsize::new(0);
    let most = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, other)| {
                let (start, done, h) = (&start, &done, &h);
                s.spawn(move || -> Result<i64, String> {
                    use std::sync::atomic::Ordering;
                    let e = |e: &dyn std::fmt::Display| e.to_string();
                    start.wait();
                    let mut held = Vec::new();
                    let mut most = 0;
                    let mut idle = 0;
                    while done.load(Ordering::SeqCst) < JOBS && idle < 2000 {
                        let got = lease(other, 1 + i % 3).map_err(|x| e(&x))?;
                        idle = if got.is_empty() { idle + 1 } else { 0 };
                        held.extend(got);
                        most = most.max(running(h).map_err(|x| e(&x))?);
                        // Settle all but one: the places stay partly taken.
                        let keep = usize::from(i % 2 == 0 && held.len() > 1);
                        for job in held.drain(..held.len() - keep) {
                            other.complete(&job, None).map_err(|x| e(&x))?;
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    for job in held {
                        other.complete(&job, None).map_err(|x| e(&x))?;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(most)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| "a leasing thread panicked".to_owned())?
            })
            .collect::<Result<Vec<i64>, String>>()
    })?;
    let most = most.into_iter().max().unwrap_or(0);
    assert!(most <= LIMIT, "{most} running at once");
    assert_eq!(h.history_rows()?, JOBS as i64, "the queue drained");
    Ok(())
}

conformance!(
    a_limit_that_small_leases_and_settles_pass_many_times_never_stalls,
    small_leases_and_settles_in_turn_fill_a_limit_exactly,
    handles_leasing_and_settling_at_once_never_exceed_a_limit,
);
