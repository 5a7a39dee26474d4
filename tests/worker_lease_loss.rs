//! A handler that outlives its lease: it sees its cancellation flag, its
//! transactional completion is refused with `LeaseLost` and rolls back, and
//! the rescued job completes exactly once on another worker.

mod worker_common;

use std::time::Duration;

use backlog::sqlite::JobContextExt;
use backlog::{
    CancelReason, Clock, Event, JobError, ManualClock, NewJob, QueueOptions, SystemClock, Worker,
};
use crossbeam_channel::bounded;
use serde_json::json;
use worker_common::*;

#[test]
fn a_handler_that_outlives_its_lease_cannot_commit_and_the_job_completes_once_elsewhere(
) -> TestResult {
    let db = Db::new()?;
    // The stale worker's clock runs a minute behind: every lease it takes
    // (and every heartbeat it sends) ends in the past for everyone else, so
    // its heartbeats cannot keep the lease. No sleeping for a TTL to pass.
    let behind = ManualClock::at(SystemClock.now() - Duration::from_secs(60));
    let stale_queue = db.queue_with(QueueOptions::new().clock(behind))?;
    let queue = db.queue()?;
    db.connect()?
        .execute_batch("CREATE TABLE charges (job_id INTEGER NOT NULL, worker TEXT NOT NULL)")?;

    let stale_events = stale_queue.subscribe();
    let events = queue.subscribe();
    let id = stale_queue
        .enqueue(NewJob::new("work", json!({"n": 7})))?
        .id;

    let (verdict_tx, verdict) = bounded(1);
    let stale = Worker::builder(stale_queue.clone())
        .worker_id("stale")
        // One slot, held by the handler below until its lease is lost, so the
        // stale worker cannot claim the rescued job (which keeps its place in
        // line, due a minute ago on the stale clock) before the fresh one does.
        .concurrency(1)
        .lease_ttl(Duration::from_secs(30))
        .heartbeat_interval(Duration::from_millis(50))
        .handle(move |args: Work, ctx| -> Result<(), JobError> {
            // A long job that checks its flag, then tries to commit its effect.
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let committed = ctx.transaction(|tx| {
                tx.execute(
                    "INSERT INTO charges (job_id, worker) VALUES (?1, 'stale')",
                    [ctx.id()],
                )?;
                Ok(args.n)
            });
            let _ = verdict_tx.send((
                ctx.cancel_reason(),
                committed.map_err(|e| e.is_lease_lost()),
            ));
            Ok(())
        })
        .start()?;
    wait_for(&stale_events, PATIENCE, "the stale start", |e| {
        started(e) == Some(id)
    })?;

    // On the right clock the lease has expired: rescue it, run it elsewhere.
    let rescued = queue.rescue(10)?;
    assert_eq!(rescued.rescued, 1);
    let fresh = Worker::builder(queue.clone())
        .worker_id("fresh")
        .handle(|args: Work, ctx| {
            ctx.transaction(|tx| {
                tx.execute(
                    "INSERT INTO charges (job_id, worker) VALUES (?1, 'fresh')",
                    [ctx.id()],
                )?;
                Ok(args.n)
            })
        })
        .start()?;
    wait_for(&events, PATIENCE, "the fresh completion", |e| {
        completed(e) == Some(id)
    })?;

    // The stale worker's next heartbeat finds the lease gone.
    wait_for(&stale_events, PATIENCE, "lease lost", |e| {
        *e == Event::LeaseLost { job_id: id }
    })?;
    let (reason, committed) = verdict.recv_timeout(PATIENCE)?;
    assert_eq!(reason, Some(CancelReason::LeaseLost));
    assert_eq!(
        committed,
        Err(true),
        "the stale commit is refused with LeaseLost"
    );

    stale.shutdown(PATIENCE)?;
    fresh.shutdown(PATIENCE)?;

    let charges: Vec<String> = db
        .connect()?
        .prepare("SELECT worker FROM charges WHERE job_id = ?1")?
        .query_map([id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    assert_eq!(charges, ["fresh"], "charged exactly once");
    let record = expect_state(&queue, id, "completed")?;
    assert_eq!(record.worker.as_deref(), Some("fresh"));
    assert_eq!(record.attempts, 2);
    assert_eq!(record.result.as_deref(), Some("7"));
    Ok(())
}
