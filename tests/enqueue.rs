//! Enqueue: one, many, inside the caller's transaction, and unique keys.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use backlog::sqlite::QueueExt;
use backlog::{Error, FinalStatus, JobArgs, JobState, NewJob, Queue, UniqueScope};
use common::{count, micros, raw, Harness, TestDb, TestResult};
use rusqlite::TransactionBehavior;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

#[test]
fn enqueue_stores_every_option_as_given() -> TestResult {
    let h = Harness::new()?;
    let t0 = h.now();
    let enqueued = h.queue.enqueue(
        NewJob::new("resize", json!({"w": 64, "name": "ä"}))
            .queue("media")
            .priority(-3)
            .delay(Duration::from_secs(30))
            .max_attempts(7)
            .unique_key("img-42"),
    )?;
    assert!(!enqueued.existed);

    let job = h.record(enqueued.id)?;
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.queue, "media");
    assert_eq!(job.kind, "resize");
    assert_eq!(job.priority, -3);
    assert_eq!(job.max_attempts, 7);
    assert_eq!(job.attempts, 0);
    assert_eq!(job.unique_key.as_deref(), Some("img-42"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&job.payload)?,
        json!({"w": 64, "name": "ä"})
    );
    assert_eq!(job.available_at, t0 + micros(Duration::from_secs(30)));
    assert_eq!(job.created_at, t0);
    assert!(job.errors.is_empty());
    assert_eq!(job.worker, None);
    Ok(())
}

#[test]
fn typed_args_are_stored_under_their_kind_and_decode_back() -> TestResult {
    let h = Harness::new()?;
    let enqueued = h.queue.enqueue(SendEmail { to: "a@b.c".into() })?;
    let job = h.lease_one("w")?;
    assert_eq!(job.id, enqueued.id);
    assert_eq!(job.kind, "send_email");
    assert_eq!(job.queue, "default");
    assert_eq!(job.max_attempts, backlog::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(job.args::<SendEmail>()?, SendEmail { to: "a@b.c".into() });
    Ok(())
}

#[test]
fn enqueue_many_returns_ids_in_input_order() -> TestResult {
    let h = Harness::new()?;
    let ids = h
        .queue
        .enqueue_many((0..5).map(|i| NewJob::new("k", json!({ "i": i }))))?;
    assert_eq!(ids.len(), 5);
    for (i, e) in ids.iter().enumerate() {
        assert!(!e.existed);
        let payload: serde_json::Value = serde_json::from_str(&h.record(e.id)?.payload)?;
        assert_eq!(payload, json!({ "i": i }));
    }
    assert!(ids.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(h.live_rows()?, 5);
    Ok(())
}

#[test]
fn duplicate_unique_key_returns_the_existing_id() -> TestResult {
    let h = Harness::new()?;
    let first = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).unique_key("u"))?;
    let second = h
        .queue
        .enqueue(NewJob::new("k", json!(2)).unique_key("u"))?;
    assert!(!first.existed);
    assert!(second.existed);
    assert_eq!(second.id, first.id);
    assert_eq!(h.live_rows()?, 1);
    // The first job's payload is kept; the duplicate changed nothing.
    assert_eq!(h.record(first.id)?.payload, "1");
    Ok(())
}

#[test]
fn unique_key_is_scoped_to_its_queue() -> TestResult {
    let h = Harness::new()?;
    let a = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).queue("a").unique_key("u"))?;
    let b = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).queue("b").unique_key("u"))?;
    assert!(!a.existed && !b.existed);
    assert_ne!(a.id, b.id);
    assert_eq!(h.live_rows()?, 2);
    Ok(())
}

#[test]
fn live_scope_frees_the_key_once_the_job_finishes() -> TestResult {
    let h = Harness::new()?;
    let first = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).unique_key("u"))?;
    let job = h.lease_one("w")?;
    // Still live while running: still a duplicate.
    let during = h
        .queue
        .enqueue(NewJob::new("k", json!(2)).unique_key("u"))?;
    assert_eq!(during.id, first.id);
    assert!(during.existed);
    h.queue.complete(&job, None)?;

    let after = h
        .queue
        .enqueue(NewJob::new("k", json!(3)).unique_key("u"))?;
    assert!(!after.existed);
    assert_ne!(after.id, first.id);
    Ok(())
}

#[test]
fn batch_enqueue_dedups_inside_the_batch_and_against_existing_jobs() -> TestResult {
    let h = Harness::new()?;
    let existing = h
        .queue
        .enqueue(NewJob::new("k", json!("old")).unique_key("x"))?;
    let ids = h.queue.enqueue_many([
        NewJob::new("k", json!(1)).unique_key("y"),
        NewJob::new("k", json!(2)).unique_key("x"),
        NewJob::new("k", json!(3)).unique_key("y"),
        NewJob::new("k", json!(4)),
        NewJob::new("k", json!(5)).unique_key("z"),
    ])?;
    assert_eq!(ids.len(), 5);
    assert!(!ids[0].existed);
    assert_eq!((ids[1].id, ids[1].existed), (existing.id, true));
    assert_eq!((ids[2].id, ids[2].existed), (ids[0].id, true));
    assert!(!ids[3].existed);
    assert!(!ids[4].existed);
    // old x, y, the keyless job and z.
    assert_eq!(h.live_rows()?, 4);
    let keys: i64 = count(
        &h.raw()?,
        "SELECT count(DISTINCT unique_key) FROM backlog_jobs WHERE unique_key IS NOT NULL",
    )?;
    assert_eq!(keys, 3);
    Ok(())
}

#[test]
fn live_and_history_scope_blocks_the_key_within_the_window_only() -> TestResult {
    let h = Harness::new()?;
    let window = Duration::from_secs(3600);
    let tick = || {
        NewJob::new("tick", json!({}))
            .unique_key("tick-00:00")
            .unique_scope(UniqueScope::LiveAndHistory(window))
    };
    let first = h.queue.enqueue(tick())?;
    let job = h.lease_one("w")?;
    h.queue.complete(&job, None)?;
    assert_eq!(
        h.state(first.id)?,
        JobState::Finished(FinalStatus::Completed)
    );

    h.advance(Duration::from_secs(30 * 60));
    let within = h.queue.enqueue(tick())?;
    assert_eq!((within.id, within.existed), (first.id, true));
    assert_eq!(h.live_rows()?, 0);

    // Live scope ignores history even within the window.
    let live_only = h
        .queue
        .enqueue(NewJob::new("tick", json!({})).unique_key("tick-00:00"))?;
    assert!(!live_only.existed);
    h.queue.delete(live_only.id)?;

    h.advance(Duration::from_secs(31 * 60));
    let after = h.queue.enqueue(tick())?;
    assert!(!after.existed);
    assert_ne!(after.id, first.id);
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

#[test]
fn concurrent_enqueues_of_one_unique_key_insert_exactly_one_row() -> TestResult {
    let h = Harness::new()?;
    let other = h.second_handle()?;
    const THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            // Half share the first handle's write gate, half race through SQLite's locks.
            let queue: Queue = if i % 2 == 0 {
                h.queue.clone()
            } else {
                other.clone()
            };
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                queue.enqueue(NewJob::new("k", json!({ "thread": i })).unique_key("once"))
            })
        })
        .collect();
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.join().map_err(|_| "enqueue thread panicked")??);
    }
    let ids: HashSet<i64> = results.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 1, "every caller gets the same id: {results:?}");
    assert_eq!(results.iter().filter(|e| !e.existed).count(), 1);
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

#[test]
fn enqueue_in_then_rollback_leaves_no_job() -> TestResult {
    let h = Harness::new()?;
    let mut conn = h.raw()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let enqueued = h.queue.enqueue_in(&tx, NewJob::new("k", json!(1)))?;
    // Visible inside the transaction...
    assert_eq!(count(&tx, "SELECT count(*) FROM backlog_jobs")?, 1);
    tx.rollback()?;
    // ...and gone after the rollback.
    assert_eq!(h.live_rows()?, 0);
    assert!(matches!(
        h.queue.get(enqueued.id),
        Err(Error::NotFound { .. })
    ));
    assert!(h.lease("w", 10)?.is_empty());
    Ok(())
}

#[test]
fn enqueue_in_then_commit_leaves_one_job() -> TestResult {
    let h = Harness::new()?;
    let mut conn = h.raw()?;
    conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("INSERT INTO orders (id, total) VALUES (7, 100)", [])?;
    let enqueued = h
        .queue
        .enqueue_in(&tx, NewJob::new("charge", json!({"order": 7})))?;
    tx.commit()?;

    assert_eq!(h.live_rows()?, 1);
    let job = h.lease_one("w")?;
    assert_eq!(job.id, enqueued.id);
    assert_eq!(job.kind, "charge");
    assert_eq!(count(&h.raw()?, "SELECT count(*) FROM orders")?, 1);
    Ok(())
}

#[test]
fn enqueue_many_in_is_all_or_nothing_with_the_callers_transaction() -> TestResult {
    let h = Harness::new()?;
    let mut conn = h.raw()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let ids = h
        .queue
        .enqueue_many_in(&tx, (0..3).map(|i| NewJob::new("k", json!(i))))?;
    assert_eq!(ids.len(), 3);
    tx.rollback()?;
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

#[test]
fn enqueue_in_on_an_autocommit_connection_is_not_in_transaction() -> TestResult {
    let h = Harness::new()?;
    let conn = h.raw()?;
    let err = h
        .queue
        .enqueue_in(&conn, NewJob::new("k", json!(1)))
        .unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

#[test]
fn enqueue_in_on_another_database_file_is_refused() -> TestResult {
    let h = Harness::new()?;
    let elsewhere = TestDb::new()?;
    let mut conn = raw(&elsewhere.path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let err = h
        .queue
        .enqueue_in(&tx, NewJob::new("k", json!(1)))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    tx.rollback()?;
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}
