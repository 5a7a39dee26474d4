//! Heartbeats extend leases and report lost ones; the rescuer recovers jobs
//! whose lease expired.

use std::time::Duration;

use backlog::{FinalStatus, HeartbeatReport, JobState, LeaseRequest, NewJob, RescueReport};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

const TTL: Duration = Duration::from_secs(10);

fn lease_with_ttl(h: &Harness, worker: &str, n: usize) -> TestResult<Vec<backlog::Job>> {
    Ok(h.queue.lease(&LeaseRequest::new(worker, n).ttl(TTL))?)
}

fn heartbeat_extends_every_held_lease_in_one_call(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!(i))))?;
    let jobs = lease_with_ttl(&h, "w", 3)?;
    let leases: Vec<_> = jobs.iter().map(|j| j.lease()).collect();

    h.advance(Duration::from_secs(8));
    let report = h.queue.heartbeat(&leases, TTL)?;
    let mut extended = report.extended.clone();
    extended.sort_by_key(|l| l.job_id);
    assert_eq!(extended, leases);
    assert!(report.lost.is_empty());
    assert!(report.cancel_requested.is_empty());
    for job in &jobs {
        assert_eq!(h.record(job.id)?.lease_until, Some(h.now() + TTL));
    }

    // Past the original expiry, but not the extended one: nothing to rescue.
    h.advance(Duration::from_secs(8));
    assert_eq!(h.queue.rescue(100)?, RescueReport::default());
    for job in &jobs {
        assert_eq!(h.state(job.id)?, JobState::Running);
    }
    Ok(())
}

fn heartbeat_reports_a_stale_lease_as_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let mut jobs = lease_with_ttl(&h, "slow", 2)?;
    let held = jobs.pop().ok_or("no job")?;
    let stale = jobs.pop().ok_or("no job")?;
    h.advance(TTL + Duration::from_secs(1));
    // Keep one lease alive; let the other be rescued and re-leased.
    assert_eq!(h.queue.heartbeat(&[held.lease()], TTL)?.lost, vec![]);
    assert_eq!(h.queue.rescue(100)?.rescued, 1);
    let fresh = h.lease_one("fresh")?;
    assert_eq!(fresh.id, stale.id);

    let before = h.record(fresh.id)?.lease_until;
    h.advance(Duration::from_secs(1));
    let report = h.queue.heartbeat(&[stale.lease(), held.lease()], TTL)?;
    assert_eq!(report.lost, vec![stale.lease()]);
    assert_eq!(report.extended, vec![held.lease()]);
    // The stale heartbeat did not extend the fresh claim.
    assert_eq!(h.record(fresh.id)?.lease_until, before);
    Ok(())
}

fn heartbeat_reports_finished_and_deleted_jobs_as_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!(i))))?;
    let jobs = lease_with_ttl(&h, "w", 3)?;
    h.queue.complete(&jobs[0], None)?;
    h.queue.delete(jobs[1].id)?;
    let leases: Vec<_> = jobs.iter().map(|j| j.lease()).collect();
    let report = h.queue.heartbeat(&leases, TTL)?;
    assert_eq!(report.lost, vec![jobs[0].lease(), jobs[1].lease()]);
    assert_eq!(report.extended, vec![jobs[2].lease()]);
    Ok(())
}

fn heartbeat_of_no_leases_reports_nothing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    assert_eq!(h.queue.heartbeat(&[], TTL)?, HeartbeatReport::default());
    Ok(())
}

fn rescue_makes_an_expired_lease_available_with_its_attempt_kept_and_an_error(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let due = h.now();
    let job = lease_with_ttl(&h, "crashed", 1)?.pop().ok_or("no job")?;

    h.advance(TTL);
    assert_eq!(
        h.queue.rescue(100)?,
        RescueReport::default(),
        "not expired yet"
    );
    h.advance(Duration::from_micros(1));
    assert_eq!(
        h.queue.rescue(100)?,
        RescueReport {
            rescued: 1,
            dead: 0,
            cancelled: 0
        }
    );

    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Available);
    assert_eq!(record.attempts, 1, "the expired claim counts");
    assert_eq!(record.worker, None);
    assert_eq!(record.lease_until, None);
    assert_eq!(record.available_at, due, "its place in line is kept");
    assert_eq!(record.errors.len(), 1);
    assert_eq!(record.errors[0].attempt, 1);
    assert!(
        record.errors[0].message.contains("lease expired"),
        "{:?}",
        record.errors[0]
    );

    let again = h.lease_one("healthy")?;
    assert_eq!(again.id, job.id);
    assert_eq!(again.attempt, 2);
    Ok(())
}

/// Regression: the rescuer used to make a job due "now", behind every job
/// waiting; with a backlog an orphaned job then waited far longer than lease
/// TTL + rescue interval (found by tests/chaos_workers.rs with all jobs
/// enqueued up front: 11.9 s against a 3.5 s bound).
fn a_rescued_job_keeps_its_place_in_line_ahead_of_later_jobs(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let orphaned = h.queue.enqueue(NewJob::new("k", json!("first")))?.id;
    lease_with_ttl(&h, "crashed", 1)?;
    h.advance(Duration::from_secs(1));
    let later: Vec<i64> = h
        .queue
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!(i))))?
        .into_iter()
        .map(|e| e.id)
        .collect();
    h.advance(TTL);
    assert_eq!(h.queue.rescue(100)?.rescued, 1);

    let next = h.lease_one("healthy")?;
    assert_eq!(next.id, orphaned, "the rescued job goes first");
    assert_eq!(next.attempt, 2);
    let rest: Vec<i64> = h.lease("healthy", 10)?.iter().map(|j| j.id).collect();
    assert_eq!(rest.len(), later.len());
    Ok(())
}

fn rescue_of_an_expired_last_attempt_moves_the_job_to_dead(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(2))?;
    for _ in 0..2 {
        lease_with_ttl(&h, "crashing", 1)?.pop().ok_or("no job")?;
        h.advance(TTL + Duration::from_secs(1));
        h.queue.rescue(100)?;
    }
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Dead));
    assert_eq!(record.attempts, 2);
    assert_eq!(record.errors.len(), 2);
    assert_eq!(record.worker.as_deref(), Some("crashing"));
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn rescue_reports_rescued_and_dead_separately(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(1))?;
    h.queue
        .enqueue(NewJob::new("k", json!(2)).max_attempts(5))?;
    assert_eq!(lease_with_ttl(&h, "w", 2)?.len(), 2);
    h.advance(TTL + Duration::from_secs(1));
    assert_eq!(
        h.queue.rescue(100)?,
        RescueReport {
            rescued: 1,
            dead: 1,
            cancelled: 0
        }
    );
    Ok(())
}

fn rescue_works_in_bounded_batches_oldest_expiry_first(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let mut order = Vec::new();
    for i in 0..5 {
        h.queue.enqueue(NewJob::new("k", json!(i)))?;
        order.push(lease_with_ttl(&h, "w", 1)?.pop().ok_or("no job")?.id);
        h.advance(Duration::from_secs(1));
    }
    h.advance(TTL);
    let first = h.queue.rescue(2)?;
    assert_eq!(first.rescued, 2);
    let available: Vec<i64> = order
        .iter()
        .copied()
        .filter(|id| h.state(*id).ok() == Some(JobState::Available))
        .collect();
    assert_eq!(available, order[..2].to_vec(), "oldest expiry first");
    assert_eq!(h.queue.rescue(2)?.rescued, 2);
    assert_eq!(h.queue.rescue(2)?.rescued, 1);
    assert_eq!(h.queue.rescue(2)?, RescueReport::default());
    Ok(())
}

fn rescue_of_an_expired_lease_with_a_cancel_request_cancels_the_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    lease_with_ttl(&h, "hung", 1)?.pop().ok_or("no job")?;
    assert_eq!(
        h.queue.cancel(enqueued.id)?,
        backlog::CancelOutcome::Requested
    );
    h.advance(TTL + Duration::from_secs(1));
    let events = h.queue.subscribe();
    assert_eq!(
        h.queue.rescue(100)?,
        RescueReport {
            rescued: 0,
            dead: 0,
            cancelled: 1
        }
    );
    assert_eq!(
        events.try_recv()?,
        backlog::Event::Cancelled {
            job_id: enqueued.id
        }
    );
    assert_eq!(
        h.state(enqueued.id)?,
        JobState::Finished(FinalStatus::Cancelled)
    );
    assert!(h.lease("w", 1)?.is_empty());
    Ok(())
}

conformance!(
    heartbeat_extends_every_held_lease_in_one_call,
    heartbeat_reports_a_stale_lease_as_lost,
    heartbeat_reports_finished_and_deleted_jobs_as_lost,
    heartbeat_of_no_leases_reports_nothing,
    rescue_makes_an_expired_lease_available_with_its_attempt_kept_and_an_error,
    a_rescued_job_keeps_its_place_in_line_ahead_of_later_jobs,
    rescue_of_an_expired_last_attempt_moves_the_job_to_dead,
    rescue_reports_rescued_and_dead_separately,
    rescue_works_in_bounded_batches_oldest_expiry_first,
    rescue_of_an_expired_lease_with_a_cancel_request_cancels_the_job,
);
