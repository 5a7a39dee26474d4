//! Enqueue: one, many, and unique keys (inside the caller's transaction:
//! `transactional.rs`).

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use backlog::{FinalStatus, JobArgs, JobState, NewJob, Queue, UniqueScope};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::harness::{Backend, TestResult};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

fn enqueue_stores_every_option_as_given(b: &Backend) -> TestResult {
    let h = b.harness()?;
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
    assert_eq!(job.available_at, t0 + Duration::from_secs(30));
    assert_eq!(job.created_at, t0);
    assert!(job.errors.is_empty());
    assert_eq!(job.worker, None);
    Ok(())
}

fn typed_args_are_stored_under_their_kind_and_decode_back(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(SendEmail { to: "a@b.c".into() })?;
    let job = h.lease_one("w")?;
    assert_eq!(job.id, enqueued.id);
    assert_eq!(job.kind, "send_email");
    assert_eq!(job.queue, "default");
    assert_eq!(job.max_attempts, backlog::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(job.args::<SendEmail>()?, SendEmail { to: "a@b.c".into() });
    Ok(())
}

fn enqueue_many_returns_ids_in_input_order(b: &Backend) -> TestResult {
    let h = b.harness()?;
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

/// One call mixing what a database may insert in different ways (on
/// MariaDB a text per shape: keyed or not, the defaults or explicit
/// values): every job gets its own options, and its id in input order.
fn enqueue_many_of_mixed_shapes_keeps_each_jobs_options_in_input_order(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let t0 = h.now();
    let existing = h
        .queue
        .enqueue(NewJob::new("k", json!("old")).unique_key("held"))?;
    let delay = Duration::from_secs(90);
    let max = backlog::DEFAULT_MAX_ATTEMPTS;
    // (job, priority, max attempts, delayed, unique key)
    let shapes = [
        (NewJob::new("k", json!(0)), 0, max, false, None),
        (NewJob::new("k", json!(1)).priority(4), 4, max, false, None),
        (
            NewJob::new("k", json!(2)).unique_key("a"),
            0,
            max,
            false,
            Some("a"),
        ),
        (
            NewJob::new("k", json!(3)).max_attempts(3),
            0,
            3,
            false,
            None,
        ),
        (NewJob::new("k", json!(4)).delay(delay), 0, max, true, None),
        (
            NewJob::new("k", json!(5)).unique_key("held"),
            0,
            max,
            false,
            Some("held"),
        ),
        (
            NewJob::new("k", json!(6)).priority(-2).unique_key("b"),
            -2,
            max,
            false,
            Some("b"),
        ),
        (NewJob::new("k", json!(7)), 0, max, false, None),
    ];
    let ids = h
        .queue
        .enqueue_many(shapes.iter().map(|(job, ..)| job.clone()))?;
    assert_eq!(ids.len(), shapes.len());
    assert_eq!((ids[5].id, ids[5].existed), (existing.id, true));
    let mut inserted = Vec::new();
    for (i, ((_, priority, max_attempts, delayed, key), e)) in shapes.iter().zip(&ids).enumerate() {
        if i == 5 {
            continue;
        }
        assert!(!e.existed, "{i}");
        let job = h.record(e.id)?;
        assert_eq!(job.payload, i.to_string(), "{i}");
        assert_eq!(job.priority, *priority, "{i}");
        assert_eq!(job.max_attempts, *max_attempts, "{i}");
        assert_eq!(job.unique_key.as_deref(), *key, "{i}");
        assert_eq!(job.created_at, t0, "{i}");
        let due = if *delayed { t0 + delay } else { t0 };
        assert_eq!(job.available_at, due, "{i}");
        inserted.push(e.id);
    }
    assert!(inserted.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(h.live_rows()?, 8);

    // The same shapes one call each, the defaults alone too.
    for (i, (job, priority, max_attempts, delayed, key)) in shapes.iter().enumerate() {
        if key.is_some() {
            continue;
        }
        let e = h.queue.enqueue(job.clone())?;
        assert!(!e.existed, "{i}");
        let record = h.record(e.id)?;
        assert_eq!(record.priority, *priority, "{i}");
        assert_eq!(record.max_attempts, *max_attempts, "{i}");
        let due = if *delayed { t0 + delay } else { t0 };
        assert_eq!(record.available_at, due, "{i}");
    }
    // Five rows of the defaults together.
    for e in h
        .queue
        .enqueue_many((0..5).map(|i| NewJob::new("k", json!(i))))?
    {
        let record = h.record(e.id)?;
        assert_eq!((record.priority, record.max_attempts), (0, max));
        assert_eq!((record.created_at, record.available_at), (t0, t0));
        assert_eq!(record.unique_key, None);
    }
    Ok(())
}

/// Batches without unique keys whose two jobs differ in one option each,
/// and one whose jobs share options other than the defaults (on PostgreSQL
/// a batch whose jobs differ only in their payloads binds the other options
/// once): each job is stored with its own options, its id in input order.
fn enqueue_many_without_unique_keys_stores_each_jobs_options_in_input_order(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let t0 = h.now();
    let delay = Duration::from_secs(90);
    let plain = |i: i32| NewJob::new("a", json!(i));
    // (job, queue, kind, priority, max attempts, delayed)
    let first = |i| (plain(i), "default", "a", 0, 25, false);
    let batches = vec![
        vec![
            first(0),
            (plain(1).queue("media"), "media", "a", 0, 25, false),
        ],
        vec![
            first(2),
            (NewJob::new("b", json!(3)), "default", "b", 0, 25, false),
        ],
        vec![
            first(4),
            (plain(5).priority(7), "default", "a", 7, 25, false),
        ],
        vec![
            first(6),
            (plain(7).max_attempts(2), "default", "a", 0, 2, false),
        ],
        vec![
            first(8),
            (plain(9).delay(delay), "default", "a", 0, 25, true),
        ],
        (10..14)
            .map(|i| {
                let job = NewJob::new("c", json!(i)).queue("media").priority(-4);
                (job.max_attempts(3).delay(delay), "media", "c", -4, 3, true)
            })
            .collect(),
    ];
    let mut ids = Vec::new();
    for shapes in batches {
        let enqueued = h
            .queue
            .enqueue_many(shapes.iter().map(|(job, ..)| job.clone()))?;
        assert_eq!(enqueued.len(), shapes.len());
        for ((_, queue, kind, priority, max_attempts, delayed), e) in shapes.iter().zip(&enqueued) {
            assert!(!e.existed);
            let job = h.record(e.id)?;
            let i = ids.len();
            assert_eq!(job.payload, i.to_string(), "{i}");
            assert_eq!(
                (job.queue.as_str(), job.kind.as_str()),
                (*queue, *kind),
                "{i}"
            );
            assert_eq!(
                (job.priority, job.max_attempts),
                (*priority, *max_attempts),
                "{i}"
            );
            assert_eq!(job.created_at, t0, "{i}");
            let due = if *delayed { t0 + delay } else { t0 };
            assert_eq!(job.available_at, due, "{i}");
            ids.push(e.id);
        }
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(h.live_rows()?, 14);
    Ok(())
}

fn duplicate_unique_key_returns_the_existing_id(b: &Backend) -> TestResult {
    let h = b.harness()?;
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

fn unique_key_is_scoped_to_its_queue(b: &Backend) -> TestResult {
    let h = b.harness()?;
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

fn live_scope_frees_the_key_once_the_job_finishes(b: &Backend) -> TestResult {
    let h = b.harness()?;
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

fn batch_enqueue_dedups_inside_the_batch_and_against_existing_jobs(b: &Backend) -> TestResult {
    let h = b.harness()?;
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
    let keys = h.count(
        "SELECT count(DISTINCT unique_key) FROM backlog_jobs WHERE unique_key IS NOT NULL",
    )?;
    assert_eq!(keys, 3);
    Ok(())
}

fn live_and_history_scope_blocks_the_key_within_the_window_only(b: &Backend) -> TestResult {
    let h = b.harness()?;
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

fn concurrent_enqueues_of_one_unique_key_insert_exactly_one_row(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let other = h.second_handle()?;
    const THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            // Half share the first handle's connections, half race through the
            // database's own locks (another process or node).
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

conformance!(
    enqueue_stores_every_option_as_given,
    typed_args_are_stored_under_their_kind_and_decode_back,
    enqueue_many_returns_ids_in_input_order,
    enqueue_many_of_mixed_shapes_keeps_each_jobs_options_in_input_order,
    enqueue_many_without_unique_keys_stores_each_jobs_options_in_input_order,
    duplicate_unique_key_returns_the_existing_id,
    unique_key_is_scoped_to_its_queue,
    live_scope_frees_the_key_once_the_job_finishes,
    batch_enqueue_dedups_inside_the_batch_and_against_existing_jobs,
    live_and_history_scope_blocks_the_key_within_the_window_only,
    concurrent_enqueues_of_one_unique_key_insert_exactly_one_row,
);
