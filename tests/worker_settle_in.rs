//! A handler that settles its own job in a transaction of its own
//! (`queue.complete_in(tx, ctx.job(), ..)`, `settle_in`) instead of
//! `ctx.transaction`: the worker does not settle it again, reports no lost
//! lease, and sends the event of what the handler's transaction did.

mod worker_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backlog::sqlite::{rusqlite, QueueExt};
use backlog::{Event, JobError, NewJob, Outcome, Queue, Worker, WorkerBuilder};
use rusqlite::TransactionBehavior;
use serde_json::json;
use worker_common::*;

fn builder(queue: &Queue) -> WorkerBuilder {
    Worker::builder(queue.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        // Heartbeats often, so one is likely to find a job the handler
        // settled before the worker learns of it.
        .lease_ttl(Duration::from_millis(300))
        .heartbeat_interval(Duration::from_millis(20))
}

/// Every event of `job_id` until the worker is shut down.
fn events_of(events: &crossbeam_channel::Receiver<Event>, job_id: i64) -> Vec<Event> {
    events
        .try_iter()
        .filter(|e| match e {
            Event::Completed { job_id: id }
            | Event::LeaseLost { job_id: id }
            | Event::Dead { job_id: id }
            | Event::Discarded { job_id: id }
            | Event::Cancelled { job_id: id }
            | Event::Retried { job_id: id, .. }
            | Event::Snoozed { job_id: id, .. }
            | Event::Released { job_id: id } => *id == job_id,
            _ => false,
        })
        .collect()
}

#[test]
fn complete_in_on_the_queues_transaction_is_the_jobs_completion() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 1 })?.id;

    let q = queue.clone();
    let worker = builder(&queue)
        .handle(move |_: Work, ctx| {
            q.transaction(|tx| q.complete_in(tx, ctx.job(), Some(json!("by the handler"))))?;
            // Whatever it returns now is not applied: the job is finished.
            Ok("by the worker")
        })
        .start()?;
    wait_for(&events, PATIENCE, "completion", |e| {
        completed(e) == Some(id)
    })?;
    // Long enough for a heartbeat, and for a second settle to show.
    std::thread::sleep(Duration::from_millis(100));
    worker.shutdown(PATIENCE)?;

    assert_eq!(events_of(&events, id), []);
    let record = expect_state(&queue, id, "completed")?;
    assert_eq!(
        record.result::<String>()?.as_deref(),
        Some("by the handler")
    );
    assert_eq!(record.attempts, 1);
    Ok(())
}

#[test]
fn complete_in_on_the_applications_own_connection_is_the_jobs_completion() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    db.connect()?
        .execute_batch("CREATE TABLE effects (job_id INTEGER NOT NULL)")?;
    let events = queue.subscribe();
    let ids: Vec<i64> = (0..20)
        .map(|n| Ok(queue.enqueue(Work { n })?.id))
        .collect::<backlog::Result<_>>()?;

    let (q, path) = (queue.clone(), db.path.clone());
    let worker = builder(&queue)
        .handle(move |_: Work, ctx| {
            let mut conn = rusqlite::Connection::open(&path)?;
            conn.busy_timeout(Duration::from_secs(10))?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            q.complete_in(&tx, ctx.job(), None)?;
            tx.execute("INSERT INTO effects (job_id) VALUES (?1)", [ctx.id()])?;
            tx.commit()?;
            Ok(())
        })
        .start()?;
    wait_count(&events, ids.len(), PATIENCE, "completions", completed)?;
    std::thread::sleep(Duration::from_millis(100));
    worker.shutdown(PATIENCE)?;

    let lost: Vec<Event> = events
        .try_iter()
        .filter(|e| matches!(e, Event::LeaseLost { .. } | Event::Completed { .. }))
        .collect();
    assert_eq!(lost, [], "no lease lost, no job completed twice");
    let conn = db.connect()?;
    for id in ids {
        expect_state(&queue, id, "completed")?;
        let effects: i64 = conn.query_row(
            "SELECT count(*) FROM effects WHERE job_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        assert_eq!(effects, 1, "job {id}");
    }
    Ok(())
}

#[test]
fn settle_in_with_a_failure_is_reported_as_a_retry() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 1 })?.id;

    let q = queue.clone();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let worker = builder(&queue)
        .retry_policy(backlog::RetryPolicy {
            base: Duration::from_millis(10),
            jitter: 0.0,
            max: Duration::from_millis(10),
        })
        .handle(move |_: Work, ctx| {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                q.transaction(|tx| q.settle_in(tx, ctx.job(), Outcome::fail("settled as failed")))?;
                // The job is back in line; this return value changes nothing.
                return Err(JobError::discard("not applied"));
            }
            Ok(())
        })
        .start()?;
    let mut seen = Vec::new();
    wait_for(&events, PATIENCE, "completion", |e| {
        seen.push(e.clone());
        completed(e) == Some(id)
    })?;
    worker.shutdown(PATIENCE)?;

    seen.extend(events.try_iter());
    seen.retain(|e| {
        !matches!(
            e,
            Event::Enqueued { .. } | Event::Leased { .. } | Event::Started { .. }
        )
    });
    assert!(
        matches!(
            seen.as_slice(),
            [Event::Retried { attempt: 1, .. }, Event::Completed { .. }]
        ),
        "{seen:?}"
    );
    let record = expect_state(&queue, id, "completed")?;
    assert_eq!(record.attempts, 2);
    assert_eq!(record.errors.len(), 1);
    assert_eq!(record.errors[0].message, "settled as failed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    Ok(())
}

#[test]
fn a_rolled_back_complete_in_leaves_the_job_to_the_handlers_return_value() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(NewJob::new("work", json!({"n": 1})))?.id;

    let q = queue.clone();
    let worker = builder(&queue)
        .handle(move |_: Work, ctx| {
            let rolled_back = q.transaction(|tx| {
                q.complete_in(tx, ctx.job(), Some(json!("rolled back")))?;
                Err::<(), _>(backlog::Error::InvalidArgument("changed my mind".into()))
            });
            assert!(rolled_back.is_err());
            Err::<(), _>(JobError::discard("discarded by the return value"))
        })
        .start()?;
    wait_for(&events, PATIENCE, "discard", |e| {
        *e == Event::Discarded { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(events_of(&events, id), []);
    let record = expect_state(&queue, id, "discarded")?;
    assert_eq!(record.result, None);
    Ok(())
}
