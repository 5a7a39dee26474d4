//! Batches with callbacks (`backlog::batch`): a callback job enqueued once
//! every member finished (complete) and once every member completed
//! (success), exactly once, counted in the transaction that finishes each
//! member.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use backlog::{Error, Job, LeaseRequest, NewJob, Queue, QueueOptions, Retention, Worker};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

const CALLBACKS: &str = "callbacks";

fn member(n: i64) -> NewJob {
    NewJob::new("member", json!({ "n": n }))
}

fn leased_members(h: &Harness, n: usize) -> TestResult<Vec<Job>> {
    let jobs = h
        .queue
        .lease(&LeaseRequest::new("w", n).kinds(["member"]))?;
    assert_eq!(jobs.len(), n, "{jobs:?}");
    Ok(jobs)
}

/// The callback jobs enqueued so far, by kind, live or finished.
fn callbacks(h: &Harness) -> TestResult<i64> {
    h.count("SELECT count(*) FROM backlog_jobs WHERE queue = 'callbacks'")
}

fn callbacks_fire_once_on_complete_and_on_success(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({"file": "a.csv"})).queue(CALLBACKS))
        .on_success(NewJob::new("done", json!([1])).queue(CALLBACKS))
        .create()?;
    let ids: Vec<i64> = (0..4)
        .map(|n| Ok(h.queue.enqueue(member(n).batch(batch.id))?.id))
        .collect::<backlog::Result<_>>()?;
    h.queue.seal_batch(batch.id)?;
    let jobs = leased_members(&h, 4)?;
    h.queue.complete(&jobs[0], None)?;
    h.queue.complete(&jobs[1], None)?;
    assert_eq!(callbacks(&h)?, 0);
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.total, status.pending, status.completed), (4, 2, 2));
    assert_eq!(status.finished_at, None);

    // The last two finish in one batched completion (MySQL's
    // COMPLETE_MANY_TO_HISTORY).
    h.queue.complete_many([&jobs[2], &jobs[3]])?;
    assert_eq!(callbacks(&h)?, 2);
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.total, status.pending, status.completed), (4, 0, 4));
    assert!(status.finished_at.is_some());
    let fired = h
        .queue
        .lease(&LeaseRequest::new("w", 10).queues([CALLBACKS]))?;
    assert_eq!(fired.len(), 2, "{fired:?}");
    let report = fired
        .iter()
        .find(|j| j.kind == "report")
        .ok_or("no report")?;
    let done = fired.iter().find(|j| j.kind == "done").ok_or("no done")?;
    assert_eq!(status.complete_job_id, Some(report.id));
    assert_eq!(status.success_job_id, Some(done.id));
    let payload: serde_json::Value = serde_json::from_str(&report.payload)?;
    assert_eq!(payload, json!({"file": "a.csv", "batch_id": batch.id}));
    // A payload that is not an object is passed as it is.
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&done.payload)?,
        json!([1])
    );
    assert_eq!(ids.len(), 4);
    Ok(())
}

fn success_does_not_fire_when_a_member_died(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue(CALLBACKS))
        .on_success(NewJob::new("done", json!({})).queue(CALLBACKS))
        .create()?;
    let dead = h
        .queue
        .enqueue(member(0).max_attempts(1).batch(batch.id))?
        .id;
    for n in 1..3 {
        h.queue.enqueue(member(n).max_attempts(1).batch(batch.id))?;
    }
    h.queue.seal_batch(batch.id)?;
    let jobs = leased_members(&h, 3)?;
    assert_eq!(jobs[0].id, dead);
    h.queue.fail(&jobs[0], "boom")?;
    h.queue.complete(&jobs[1], None)?;
    h.queue.complete(&jobs[2], None)?;
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.dead, status.completed, status.pending), (1, 2, 0));
    assert!(status.complete_job_id.is_some());
    assert_eq!(status.success_job_id, None);
    assert_eq!(callbacks(&h)?, 1);
    let fired = h
        .queue
        .lease(&LeaseRequest::new("w", 10).queues([CALLBACKS]))?;
    assert_eq!(
        fired.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>(),
        ["report"]
    );

    // The dead member retried by an operator runs outside its batch: the
    // batch counted it once, and stays finished without success.
    h.queue.retry(dead)?;
    h.queue.complete(&leased_members(&h, 1)?[0], None)?;
    let after = h.queue.batch_status(batch.id)?;
    assert_eq!((after.dead, after.completed), (1, 2));
    assert_eq!(after.success_job_id, None);
    assert_eq!(callbacks(&h)?, 1);
    Ok(())
}

fn an_open_batch_fires_only_once_sealed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue(CALLBACKS))
        .create()?;
    // Members enqueued over time: each finishes before the next joins.
    for n in 0..2 {
        h.queue.enqueue(member(n).batch(batch.id))?;
        h.queue.complete(&leased_members(&h, 1)?[0], None)?;
        h.advance(Duration::from_secs(1));
    }
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.sealed, status.total, status.pending), (false, 2, 0));
    assert_eq!(callbacks(&h)?, 0);

    h.queue.seal_batch(batch.id)?;
    assert_eq!(callbacks(&h)?, 1);
    // Sealing again changes nothing; joining a sealed batch is refused and
    // writes nothing.
    h.queue.seal_batch(batch.id)?;
    assert_eq!(callbacks(&h)?, 1);
    let live = h.live_rows()?;
    match h.queue.enqueue(member(9).batch(batch.id)) {
        Err(Error::InvalidArgument(_)) => {}
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    assert_eq!(h.live_rows()?, live);
    Ok(())
}

fn an_empty_batch_fires_when_sealed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue(CALLBACKS))
        .on_success(NewJob::new("done", json!({})).queue(CALLBACKS))
        .create()?;
    h.queue.seal_batch(batch.id)?;
    assert_eq!(callbacks(&h)?, 2);
    Ok(())
}

fn progress_is_counted_per_state(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h.queue.batch().create()?;
    // The last two get one attempt: their expired leases are dead-lettered.
    let ids: Vec<i64> = (0..7)
        .map(|n| {
            let attempts = if n >= 5 { 1 } else { 2 };
            Ok(h.queue
                .enqueue(member(n).max_attempts(attempts).batch(batch.id))?
                .id)
        })
        .collect::<backlog::Result<_>>()?;
    h.queue.seal_batch(batch.id)?;
    // Operator actions on waiting members: cancel, discard, delete.
    h.queue.cancel(ids[0])?;
    h.queue.delete(ids[1])?;
    let jobs = leased_members(&h, 5)?;
    let by_id = |id: i64| jobs.iter().find(|j| j.id == id).ok_or("not leased");
    h.queue.complete(by_id(ids[2])?, None)?;
    h.queue.discard(by_id(ids[3])?, "bad row")?;
    // A failed attempt with attempts left is a retry: still pending.
    h.queue.fail(by_id(ids[4])?, "flaky")?;
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!(
        (
            status.total,
            status.pending,
            status.completed,
            status.discarded,
            status.cancelled,
            status.dead
        ),
        (6, 3, 1, 1, 1, 0)
    );
    // Rescue of an expired lease on its last attempt: dead.
    h.advance(Duration::from_secs(3600));
    h.queue.rescue(100)?;
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.pending, status.dead), (1, 2));
    assert_eq!(status.finished_at, None);
    // The retried member's last attempt fails: the batch is done.
    let again = leased_members(&h, 1)?;
    assert_eq!(again[0].id, ids[4]);
    h.queue.fail(&again[0], "again")?;
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.pending, status.dead), (0, 3));
    assert!(status.finished_at.is_some());
    Ok(())
}

fn deleting_the_last_pending_member_finishes_the_batch(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_success(NewJob::new("done", json!({})).queue(CALLBACKS))
        .create()?;
    h.queue.enqueue(member(0).batch(batch.id))?;
    let last = h.queue.enqueue(member(1).batch(batch.id))?.id;
    h.queue.seal_batch(batch.id)?;
    let first = leased_members(&h, 1)?;
    h.queue.complete(&first[0], None)?;
    assert_eq!(callbacks(&h)?, 0);
    h.queue.delete(last)?;
    let status = h.queue.batch_status(batch.id)?;
    assert_eq!((status.total, status.completed), (1, 1));
    assert_eq!(callbacks(&h)?, 1);
    Ok(())
}

fn callbacks_in_a_rolled_back_transaction_are_not_enqueued(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue(CALLBACKS))
        .create()?;
    h.queue.enqueue(member(0).batch(batch.id))?;
    h.queue.seal_batch(batch.id)?;
    let job = leased_members(&h, 1)?.remove(0);

    // The last member's transactional completion, rolled back: no count, no
    // callback.
    let rolled_back: TestResult = b.in_queue_transaction(&h.queue, |tx| {
        tx.complete_in(&h.queue, &job)?;
        Err("roll back".into())
    });
    assert!(rolled_back.is_err());
    assert_eq!(callbacks(&h)?, 0);
    assert_eq!(h.queue.batch_status(batch.id)?.pending, 1);

    // Committed, it fires once, in the application's transaction.
    b.in_queue_transaction(&h.queue, |tx| Ok(tx.complete_in(&h.queue, &job)?))?;
    assert_eq!(callbacks(&h)?, 1);
    Ok(())
}

fn batches_are_created_and_sealed_in_the_application_transaction(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let on_complete = || NewJob::new("report", json!({})).queue(CALLBACKS);
    // Created, filled and sealed in one transaction that rolls back: nothing.
    let rolled_back: TestResult = b.in_queue_transaction(&h.queue, |tx| {
        let batch = tx.create_batch_in(&h.queue, h.queue.batch().on_complete(on_complete()))?;
        tx.enqueue_in(&h.queue, member(0).batch(batch.id))?;
        tx.seal_batch_in(&h.queue, batch.id)?;
        Err("roll back".into())
    });
    assert!(rolled_back.is_err());
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_batches")?, 0);

    let batch = b.in_queue_transaction(&h.queue, |tx| {
        let batch = tx.create_batch_in(&h.queue, h.queue.batch().on_complete(on_complete()))?;
        tx.enqueue_in(&h.queue, member(0).batch(batch.id))?;
        Ok(batch)
    })?;
    h.queue.complete(&leased_members(&h, 1)?[0], None)?;
    // Every member finished: the seal fires; rolled back, it did not.
    let rolled_back: TestResult = b.in_queue_transaction(&h.queue, |tx| {
        tx.seal_batch_in(&h.queue, batch.id)?;
        Err("roll back".into())
    });
    assert!(rolled_back.is_err());
    assert_eq!(callbacks(&h)?, 0);
    assert!(!h.queue.batch_status(batch.id)?.sealed);
    b.in_queue_transaction(&h.queue, |tx| Ok(tx.seal_batch_in(&h.queue, batch.id)?))?;
    assert_eq!(callbacks(&h)?, 1);
    Ok(())
}

fn concurrent_finishers_of_the_last_members_enqueue_one_callback(b: &Backend) -> TestResult {
    let h = b.harness()?;
    const MEMBERS: usize = 6;
    let handles: Vec<Queue> = (0..MEMBERS)
        .map(|_| h.second_handle())
        .collect::<TestResult<_>>()?;
    for round in 0..5 {
        let batch = h
            .queue
            .batch()
            .on_complete(NewJob::new("report", json!({"round": round})).queue(CALLBACKS))
            .on_success(NewJob::new("done", json!({"round": round})).queue(CALLBACKS))
            .create()?;
        h.queue
            .enqueue_many((0..MEMBERS as i64).map(|n| member(n).batch(batch.id)))?;
        h.queue.seal_batch(batch.id)?;
        let jobs = leased_members(&h, MEMBERS)?;
        let start = Arc::new(Barrier::new(MEMBERS));
        std::thread::scope(|s| -> TestResult {
            let finishers: Vec<_> = jobs
                .iter()
                .zip(&handles)
                .map(|(job, queue)| {
                    let start = Arc::clone(&start);
                    s.spawn(move || {
                        start.wait();
                        queue.complete(job, None)
                    })
                })
                .collect();
            for f in finishers {
                f.join().map_err(|_| "finisher panicked")??;
            }
            Ok(())
        })?;
        let status = h.queue.batch_status(batch.id)?;
        assert_eq!(status.completed, MEMBERS as i64);
        assert_eq!(callbacks(&h)?, 2 * (round + 1), "round {round}: {status:?}");
    }
    Ok(())
}

fn bad_batches_are_refused_before_anything_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let invalid = |r: backlog::Result<_>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(
        h.queue.enqueue(member(0).batch(424242)).map(|_| ())
    ));
    assert!(invalid(h.queue.batch_status(424242).map(|_| ())));
    assert!(invalid(h.queue.seal_batch(424242)));
    assert!(invalid(
        h.queue
            .batch()
            .on_complete(NewJob::new("cb", json!({})).unique_key("k"))
            .create()
            .map(|_| ())
    ));
    assert!(matches!(
        h.queue
            .batch()
            .on_success(NewJob::new("", json!({})))
            .create(),
        Err(Error::InvalidName { .. })
    ));
    let batch = h.queue.batch().create()?;
    let grouped = member(0).group(backlog::Group::new("g")).batch(batch.id);
    assert!(invalid(h.queue.enqueue(grouped).map(|_| ())));
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_batches")?, 1);
    Ok(())
}

fn a_worker_runs_the_callback_its_own_completion_enqueued(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (tx, rx) = crossbeam_channel::unbounded::<serde_json::Value>();
    // No idle poll to fall back on: the callback must wake the worker.
    let worker = Worker::builder(h.queue.clone())
        .queues(["default", CALLBACKS])
        .poll_interval(Duration::from_secs(60))
        .handle_raw("member", |_payload, _ctx| Ok(()))
        .handle_raw("report", move |payload, _ctx| {
            let _ = tx.send(payload);
            Ok(())
        })
        .start()?;
    let batch = h
        .queue
        .batch()
        .on_complete(NewJob::new("report", json!({"of": "import"})).queue(CALLBACKS))
        .create()?;
    h.queue
        .enqueue_many((0..5).map(|n| member(n).batch(batch.id)))?;
    h.queue.seal_batch(batch.id)?;
    let payload = rx.recv_timeout(Duration::from_secs(10))?;
    assert_eq!(payload, json!({"of": "import", "batch_id": batch.id}));
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(h.queue.batch_status(batch.id)?.completed, 5);
    Ok(())
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// A batch with an on-complete callback of kind `callback` (if any) and one
/// member, sealed, its member completed; the callback left waiting.
fn finished_batch(h: &Harness, callback: Option<&str>) -> TestResult<i64> {
    let mut builder = h.queue.batch();
    if let Some(kind) = callback {
        builder = builder.on_complete(NewJob::new(kind, json!({})).queue(CALLBACKS));
    }
    let batch = builder.create()?;
    h.queue.enqueue(member(0).batch(batch.id))?;
    h.queue.seal_batch(batch.id)?;
    h.queue.complete(&leased_members(h, 1)?[0], None)?;
    assert!(h.queue.batch_status(batch.id)?.finished_at.is_some());
    Ok(batch.id)
}

/// Runs the callbacks of kind `kind`.
fn run_callbacks(h: &Harness, kind: &str) -> TestResult {
    let request = LeaseRequest::new("w", 10).queues([CALLBACKS]).kinds([kind]);
    for job in h.queue.lease(&request)? {
        h.queue.complete(&job, None)?;
    }
    Ok(())
}

fn batches(h: &Harness) -> TestResult<i64> {
    h.count("SELECT count(*) FROM backlog_batches")
}

/// History's prune deletes a finished batch once its `finished_at` is older
/// than the longest retention and its callbacks have finished, a bounded
/// number per call; never an open one, nor one whose callback is waiting.
fn pruning_history_deletes_old_finished_batches_only(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let done = finished_batch(&h, Some("done"))?;
    run_callbacks(&h, "done")?;
    let bare = finished_batch(&h, None)?;
    let waiting = finished_batch(&h, Some("waiting"))?;
    // Open: its member finished, but it was never sealed.
    let open = h.queue.batch().create()?.id;
    h.queue.enqueue(member(1).batch(open))?;
    h.queue.complete(&leased_members(&h, 1)?[0], None)?;
    h.advance(10 * DAY);
    let young = finished_batch(&h, Some("young"))?;
    run_callbacks(&h, "young")?;
    // Still counting: sealed, its member live.
    let counting = h.queue.batch().create()?.id;
    h.queue.enqueue(member(2).batch(counting))?;
    h.queue.seal_batch(counting)?;
    assert_eq!(batches(&h)?, 6);

    // 95 days after the first ones finished, 85 after the young one.
    h.advance(85 * DAY);
    let forever = Retention {
        dead: None,
        ..Retention::default()
    };
    h.queue.prune_history(&forever, 10)?;
    assert_eq!(batches(&h)?, 6, "a retention kept forever keeps batches");

    let retention = Retention::default();
    h.queue.prune_history(&retention, 1)?;
    assert_eq!(batches(&h)?, 5, "a bounded batch");
    h.queue.prune_history(&retention, 1)?;
    assert_eq!(batches(&h)?, 4);
    h.queue.prune_history(&retention, 1)?;
    assert_eq!(batches(&h)?, 4, "only the old finished ones go");
    for gone in [done, bare] {
        match h.queue.batch_status(gone) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("no batch"), "{m}"),
            other => panic!("batch {gone}: {other:?}"),
        }
    }
    assert!(matches!(
        h.queue.batch_status(i64::MAX),
        Err(Error::InvalidArgument(_))
    ));
    for kept in [waiting, open, counting, young] {
        h.queue.batch_status(kept)?;
    }

    // Its callback finished, the waiting one goes at the next pass; the
    // others stay.
    run_callbacks(&h, "waiting")?;
    h.queue.prune_history(&retention, 10)?;
    assert!(h.queue.batch_status(waiting).is_err());
    for kept in [open, counting, young] {
        h.queue.batch_status(kept)?;
    }
    assert_eq!(batches(&h)?, 3);
    Ok(())
}

conformance!(
    a_worker_runs_the_callback_its_own_completion_enqueued,
    callbacks_fire_once_on_complete_and_on_success,
    success_does_not_fire_when_a_member_died,
    an_open_batch_fires_only_once_sealed,
    an_empty_batch_fires_when_sealed,
    progress_is_counted_per_state,
    deleting_the_last_pending_member_finishes_the_batch,
    callbacks_in_a_rolled_back_transaction_are_not_enqueued,
    batches_are_created_and_sealed_in_the_application_transaction,
    concurrent_finishers_of_the_last_members_enqueue_one_callback,
    bad_batches_are_refused_before_anything_is_written,
    pruning_history_deletes_old_finished_batches_only,
);
