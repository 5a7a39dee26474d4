//! A lease whose commit reached the database while its answer was lost
//! leaves jobs leased under a worker that never got them; `release_unheld`
//! gives them back, touching neither the jobs the worker holds nor another
//! worker's.

use backlog::{CancelOutcome, Event, FinalStatus, JobState, NewJob};
use serde_json::json;
use std::time::Duration;

use crate::harness::{Backend, TestResult};

fn release_unheld_frees_only_the_workers_jobs_it_does_not_hold_with_attempts_refunded(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..4).map(|i| NewJob::new("k", json!(i))))?;
    // Worker "w" leased three; the answer of the lease that took two of them
    // was lost, so it holds only the first.
    let leased = h.lease("w", 3)?;
    let other = h.lease_one("other")?;
    let held = &leased[0];
    let orphans: Vec<i64> = leased[1..].iter().map(|j| j.id).collect();
    let due_before: Vec<_> = orphans
        .iter()
        .map(|id| Ok(h.record(*id)?.available_at))
        .collect::<TestResult<_>>()?;
    h.advance(Duration::from_secs(1));

    let events = h.queue.subscribe();
    let mut released = h.queue.release_unheld("w", &[held.id])?;
    released.sort_unstable();
    assert_eq!(released, orphans);
    for (id, due) in orphans.iter().zip(due_before) {
        let record = h.record(*id)?;
        assert_eq!(record.state, JobState::Available);
        assert_eq!(record.attempts, 0, "the claim that ran nothing is refunded");
        assert_eq!(record.worker, None);
        assert_eq!(record.lease_until, None);
        assert_eq!(record.available_at, due, "it keeps its place in line");
        assert!(record.errors.is_empty());
        assert_eq!(events.try_recv()?, Event::Released { job_id: *id });
    }

    let record = h.record(held.id)?;
    assert_eq!(
        (record.state, record.attempts, record.worker.as_deref()),
        (JobState::Running, 1, Some("w"))
    );
    let record = h.record(other.id)?;
    assert_eq!(
        (record.state, record.attempts, record.worker.as_deref()),
        (JobState::Running, 1, Some("other"))
    );
    // The held lease still fences: its outcome applies.
    h.queue.complete(held, None)?;
    assert_eq!(
        h.state(held.id)?,
        JobState::Finished(FinalStatus::Completed)
    );

    // Nothing is left to release; the orphans run again on their first attempt.
    assert!(h.queue.release_unheld("w", &[])?.is_empty());
    let again = h.lease("w2", 3)?;
    let mut ids: Vec<i64> = again.iter().map(|j| j.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, orphans);
    assert!(again.iter().all(|j| j.attempt == 1));
    Ok(())
}

fn release_unheld_cancels_an_unheld_job_whose_cancel_was_requested(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    h.lease_one("w")?;
    assert_eq!(h.queue.cancel(enqueued.id)?, CancelOutcome::Requested);
    assert_eq!(h.queue.release_unheld("w", &[])?, vec![enqueued.id]);
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Cancelled));
    assert!(h.lease("w", 1)?.is_empty());
    Ok(())
}

conformance!(
    release_unheld_frees_only_the_workers_jobs_it_does_not_hold_with_attempts_refunded,
    release_unheld_cancels_an_unheld_job_whose_cancel_was_requested,
);
