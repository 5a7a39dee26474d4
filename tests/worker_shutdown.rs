//! Graceful shutdown: short jobs finish within the grace period; long ones
//! are flagged, released with their attempts unchanged, and picked up at
//! once by the next worker.

mod worker_common;

use std::thread;
use std::time::{Duration, Instant};

use backlog::{CancelReason, JobState, NewJob, Worker};
use crossbeam_channel::bounded;
use serde_json::json;
use worker_common::*;

#[test]
fn shutdown_lets_short_jobs_finish_and_releases_long_ones_to_the_next_worker() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let short: Vec<i64> = (0..2)
        .map(|n| Ok(queue.enqueue(NewJob::new("short", json!(n)))?.id))
        .collect::<TestResult<_>>()?;
    let long: Vec<i64> = (0..2)
        .map(|n| Ok(queue.enqueue(NewJob::new("long", json!(n)))?.id))
        .collect::<TestResult<_>>()?;

    // Short jobs wait for the test's go (the channel closing); long jobs run
    // until their cancellation flag is set.
    let (go, wait_for_go) = bounded::<()>(0);
    let (flagged_tx, flagged) = crossbeam_channel::unbounded();
    let worker = Worker::builder(queue.clone())
        .concurrency(4)
        .handle_raw("short", move |_, _| {
            let _ = wait_for_go.recv();
            Ok("done")
        })
        .handle_raw("long", move |_, ctx| {
            while !ctx.is_cancelled() {
                thread::sleep(Duration::from_millis(5));
            }
            let _ = flagged_tx.send((ctx.id(), ctx.cancel_reason()));
            Ok("finished too late: must not be applied")
        })
        .start()?;
    wait_count(&events, 4, PATIENCE, "starts", started)?;

    let grace = Duration::from_millis(500);
    let began = Instant::now();
    let stopping = thread::spawn(move || worker.shutdown(grace));
    drop(go);
    let done = wait_count(&events, 2, PATIENCE, "short completions", completed)?;
    stopping.join().map_err(|_| "shutdown panicked")??;
    let took = began.elapsed();
    println!("shutdown with a {grace:?} grace took {took:?}");
    assert!(took >= grace, "the long jobs were given the grace period");

    for id in &short {
        assert_eq!(done.get(id), Some(&1));
        expect_state(&queue, *id, "completed")?;
    }
    let mut flagged: Vec<_> = flagged.try_iter().collect();
    flagged.sort_by_key(|(id, _)| *id);
    assert_eq!(
        flagged,
        long.iter()
            .map(|id| (*id, Some(CancelReason::Shutdown)))
            .collect::<Vec<_>>()
    );
    for id in &long {
        let record = queue.get(*id)?;
        assert_eq!(record.state, JobState::Available, "released, due now");
        assert_eq!(record.attempts, 0, "the release gave the attempt back");
        assert!(record.errors.is_empty());
    }

    // The next worker takes them at once, on their first attempt.
    let next = Worker::builder(queue.clone())
        .poll_interval(Duration::from_secs(60))
        .handle_raw("long", |_, ctx| Ok(ctx.attempt()))
        .start()?;
    let picked = wait_count(
        &events,
        2,
        Duration::from_secs(5),
        "long completions",
        completed,
    )?;
    next.shutdown(PATIENCE)?;
    for id in &long {
        assert_eq!(picked.get(id), Some(&1));
        let record = expect_state(&queue, *id, "completed")?;
        assert_eq!(record.result.as_deref(), Some("1"), "ran as attempt 1");
    }
    Ok(())
}

/// How another process holds the file's write lock for 10 s: `Ok` once it
/// holds it, then it lets go.
type Hog = fn(std::path::PathBuf, std::sync::mpsc::Sender<()>) -> TestResult;

/// An application's own connection (it does not take turns): `BEGIN
/// IMMEDIATE`, held.
fn plain_connection_hog(
    path: std::path::PathBuf,
    locked: std::sync::mpsc::Sender<()>,
) -> TestResult {
    let mut conn = rusqlite::Connection::open(path)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let _ = locked.send(());
    std::thread::sleep(Duration::from_secs(10));
    tx.rollback()?;
    Ok(())
}

/// Another queue on the file (its own turnstile, as another process has)
/// holding its turn and the lock in `Queue::transaction`.
fn queue_transaction_hog(
    path: std::path::PathBuf,
    locked: std::sync::mpsc::Sender<()>,
) -> TestResult {
    use backlog::sqlite::QueueExt;
    let queue = backlog::Queue::open(path)?;
    queue.transaction(|tx| -> Result<(), backlog::Error> {
        tx.execute_batch("CREATE TABLE hog (x INTEGER)")?;
        let _ = locked.send(());
        std::thread::sleep(Duration::from_secs(10));
        Ok(())
    })?;
    Ok(())
}

/// `shutdown(grace)` is bounded: with another process holding the file's
/// write lock for 10 s, it returns within grace + SHUTDOWN_MARGIN, and says
/// that the running job's release could not be committed (its lease expires
/// and the rescuer frees it instead).
#[test]
fn shutdown_returns_within_its_bound_while_another_process_holds_the_write_lock() -> TestResult {
    shutdown_under(plain_connection_hog)
}

/// The same, with the lock held by another queue in its turn: the worker's
/// threads wait at the turnstile, not in SQLite's busy handler.
#[test]
fn shutdown_returns_within_its_bound_while_another_queue_holds_its_turn() -> TestResult {
    shutdown_under(queue_transaction_hog)
}

fn shutdown_under(hog: Hog) -> TestResult {
    use backlog::{Event, SHUTDOWN_MARGIN};
    use std::sync::mpsc;
    use std::time::Instant;

    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let job = queue.enqueue(NewJob::new("slow", json!(1)))?;
    let worker = Worker::builder(queue.clone())
        .handle_raw("slow", |_, ctx| {
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
        .start()?;
    while !matches!(
        events.recv_timeout(Duration::from_secs(10))?,
        Event::Started { job_id, .. } if job_id == job.id
    ) {}

    // Another connection (another process, for SQLite's locks) takes the
    // write lock and keeps it for 10 seconds.
    let (locked, is_locked) = mpsc::channel();
    let path = db.path.clone();
    let hog = std::thread::spawn(move || hog(path, locked).map_err(|e| e.to_string()));
    is_locked.recv_timeout(Duration::from_secs(10))?;

    let grace = Duration::from_millis(500);
    let start = Instant::now();
    let report = worker.shutdown(grace)?;
    let took = start.elapsed();
    println!(
        "shutdown under a held write lock: took_ms={} unsettled={}",
        took.as_millis(),
        report.unsettled
    );
    // Some slack for a loaded machine, far below the 10 s hold.
    assert!(
        took < grace + SHUTDOWN_MARGIN + Duration::from_millis(500),
        "shutdown took {took:?}"
    );
    assert_eq!(report.unsettled, 1, "the release could not commit");
    hog.join().map_err(|_| "hog panicked")??;
    Ok(())
}
