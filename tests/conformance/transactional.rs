//! Transactional enqueue and completion on the application's own
//! transactions (each backend's native transaction type), and a worker's
//! `ctx.transaction(..)`: effects and queue changes commit together or not at
//! all, and a stale lease commits nothing.

use std::collections::HashSet;
use std::time::Duration;

use backlog::{Error, Event, FinalStatus, JobState, LeaseRequest, NewJob, Worker};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

const TTL: Duration = Duration::from_secs(10);

/// A job whose lease went stale: it expired, was rescued and re-leased by
/// another worker. Returns (stale claim, fresh claim).
fn stale_and_fresh(h: &Harness) -> TestResult<(backlog::Job, backlog::Job)> {
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let stale = h
        .queue
        .lease(&LeaseRequest::new("slow-worker", 1).ttl(TTL))?
        .pop()
        .ok_or("nothing to lease")?;
    h.advance(TTL + Duration::from_secs(1));
    assert_eq!(h.queue.rescue(100)?.rescued, 1);
    let fresh = h.lease_one("fresh-worker")?;
    assert_eq!(fresh.id, stale.id);
    Ok((stale, fresh))
}

fn enqueue_in_a_committed_transaction_creates_the_jobs_with_the_callers_rows(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let jobs = vec![
        NewJob::new("charge", json!({"order": 7})),
        NewJob::new("mail", json!({"order": 7})).queue("mail"),
    ];
    let ids = h.enqueue_in(7, jobs, true)??;
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|e| !e.existed));
    assert_eq!(h.effects_of(7)?, 1);
    assert_eq!(h.live_rows()?, 2);
    assert_eq!(h.record(ids[1].id)?.queue, "mail");
    assert_eq!(h.lease_one("w")?.id, ids[0].id);
    Ok(())
}

fn enqueue_in_a_rolled_back_transaction_leaves_no_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids = h.enqueue_in(7, vec![NewJob::new("charge", json!({"order": 7}))], false)??;
    assert_eq!(ids.len(), 1, "the id was handed out inside the transaction");
    assert_eq!(h.effects_of(7)?, 0);
    assert_eq!(h.live_rows()?, 0);
    assert!(h.lease("w", 10)?.is_empty());
    assert!(matches!(
        h.queue.get(ids[0].id),
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

fn enqueue_in_with_bad_input_is_refused_before_anything_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let result = h.enqueue_in(
        7,
        vec![
            NewJob::new("ok", json!(1)),
            NewJob::new("bad", json!(1)).queue(""),
        ],
        true,
    )?;
    assert!(
        matches!(result, Err(Error::InvalidName { what: "queue", .. })),
        "{result:?}"
    );
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn enqueue_in_a_duplicate_unique_key_returns_the_existing_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).unique_key("u"))?;
    let ids = h.enqueue_in(1, vec![NewJob::new("k", json!(2)).unique_key("u")], true)??;
    assert_eq!(ids[0].id, first.id);
    assert!(ids[0].existed);
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

fn complete_in_then_rollback_leaves_the_job_leased_and_the_effects_absent(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.complete_in(&job, false)??;

    assert_eq!(h.effects_of(job.id)?, 0);
    assert_eq!(h.record(job.id)?.state, JobState::Running);
    assert_eq!(h.history_rows()?, 0);
    // The lease is still this caller's.
    let beat = h.queue.heartbeat(&[job.lease()], TTL)?;
    assert_eq!(beat.extended, vec![job.lease()]);
    Ok(())
}

fn complete_in_then_commit_completes_the_job_with_its_effects(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.complete_in(&job, true)??;

    assert_eq!(h.effects_of(job.id)?, 1);
    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn complete_in_with_a_stale_lease_is_lease_lost_and_commits_nothing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    let result = h.complete_in(&stale, true)?;
    assert!(
        matches!(result, Err(Error::LeaseLost { job_id }) if job_id == stale.id),
        "{result:?}"
    );
    assert_eq!(h.effects_of(stale.id)?, 0);
    assert_eq!(h.state(stale.id)?, JobState::Running);

    // The fresh holder commits its effects exactly once.
    h.complete_in(&fresh, true)??;
    assert_eq!(h.effects_of(fresh.id)?, 1);
    assert_eq!(
        h.state(fresh.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn a_worker_commits_each_jobs_effects_with_its_completion_exactly_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let events = h.queue.subscribe();
    let ids: HashSet<i64> = h
        .queue
        .enqueue_many((0..20).map(|i| NewJob::new("charge", json!(i))))?
        .iter()
        .map(|e| e.id)
        .collect();
    let effects = h.effects();
    let worker = Worker::builder(h.queue.clone())
        .concurrency(4)
        .handle_raw("charge", move |_payload, ctx| effects.write(ctx))
        .start()?;
    let mut completed = HashSet::new();
    while completed.len() < ids.len() {
        match events.recv_timeout(Duration::from_secs(20))? {
            Event::Completed { job_id } => {
                assert!(completed.insert(job_id), "job {job_id} completed twice");
            }
            Event::LeaseLost { job_id } => panic!("job {job_id} lost its lease"),
            _ => {}
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(completed, ids);
    for id in &ids {
        assert_eq!(h.effects_of(*id)?, 1, "job {id}");
        assert_eq!(h.state(*id)?, JobState::Finished(FinalStatus::Completed));
    }
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

conformance!(
    enqueue_in_a_committed_transaction_creates_the_jobs_with_the_callers_rows,
    enqueue_in_a_rolled_back_transaction_leaves_no_job,
    enqueue_in_with_bad_input_is_refused_before_anything_is_written,
    enqueue_in_a_duplicate_unique_key_returns_the_existing_job,
    complete_in_then_rollback_leaves_the_job_leased_and_the_effects_absent,
    complete_in_then_commit_completes_the_job_with_its_effects,
    complete_in_with_a_stale_lease_is_lease_lost_and_commits_nothing,
    a_worker_commits_each_jobs_effects_with_its_completion_exactly_once,
);
