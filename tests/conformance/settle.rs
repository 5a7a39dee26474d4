//! Settling a leased job: complete, fail (backoff, dead-lettering), snooze,
//! discard, release and their batch forms, all fenced on the lease token.
//! The transactional forms are in `transactional.rs`.

use std::time::Duration;

use backlog::{
    Error, Event, FinalStatus, Job, JobState, LeaseRequest, NewJob, Outcome, QueueOptions,
    RetryPolicy, MAX_ERRORS_KEPT,
};
use serde_json::json;

use crate::harness::{micros, since, Backend, Harness, TestResult};

const TTL: Duration = Duration::from_secs(10);

/// A job whose lease went stale: it expired, was rescued and re-leased by
/// another worker. Returns (stale claim, fresh claim).
fn stale_and_fresh(h: &Harness) -> TestResult<(Job, Job)> {
    h.queue.enqueue(NewJob::new("k", json!({"n": 1})))?;
    let stale = h
        .queue
        .lease(&LeaseRequest::new("slow-worker", 1).ttl(TTL))?
        .pop()
        .ok_or("nothing to lease")?;
    h.advance(TTL + Duration::from_secs(1));
    assert_eq!(h.queue.rescue(100)?.rescued, 1);
    let fresh = h.lease_one("fresh-worker")?;
    assert_eq!(fresh.id, stale.id);
    assert_ne!(fresh.lease_token, stale.lease_token);
    Ok((stale, fresh))
}

/// The fresh claim is untouched by whatever the stale one tried.
fn assert_fresh_claim_untouched(h: &Harness, fresh: &Job) -> TestResult {
    let record = h.record(fresh.id)?;
    assert_eq!(record.state, JobState::Running);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.worker.as_deref(), Some("fresh-worker"));
    assert_eq!(record.lease_until, Some(fresh.lease_until));
    assert_eq!(record.errors.len(), 1, "only the rescue's error entry");
    // The fresh holder can still finish it.
    h.queue.complete(fresh, None)?;
    assert_eq!(
        h.state(fresh.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn assert_lease_lost<T: std::fmt::Debug>(result: backlog::Result<T>, job_id: i64) {
    match result {
        Err(Error::LeaseLost { job_id: lost }) => assert_eq!(lost, job_id),
        other => panic!("expected LeaseLost for job {job_id}, got {other:?}"),
    }
}

fn complete_moves_the_job_to_history_with_its_result(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!({"n": 1})))?;
    let started = h.now();
    let job = h.lease_one("w1")?;
    h.advance(Duration::from_secs(2));
    h.queue.complete(&job, Some(json!({"sent": true})))?;

    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.history_rows()?, 1);
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(record.result.as_deref(), Some(r#"{"sent":true}"#));
    assert_eq!(record.worker.as_deref(), Some("w1"));
    assert_eq!(record.attempts, 1);
    assert_eq!(record.started_at, Some(started));
    assert_eq!(record.finished_at, Some(h.now()));
    assert!(record.errors.is_empty());
    // Completing twice: the lease is gone.
    assert_lease_lost(h.queue.complete(&job, None), job.id);
    Ok(())
}

fn fail_records_the_error_and_schedules_a_retry(b: &Backend) -> TestResult {
    let h = b.harness_with(QueueOptions::new().retry_policy(RetryPolicy {
        base: Duration::from_secs(5),
        jitter: 0.0,
        max: Duration::from_secs(60),
    }))?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    let failed_at = h.now();
    h.queue.fail(&job, "connection refused")?;

    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Retrying);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.worker, None);
    assert_eq!(record.lease_until, None);
    assert_eq!(record.available_at, failed_at + Duration::from_secs(5));
    assert_eq!(record.errors.len(), 1);
    assert_eq!(record.errors[0].attempt, 1);
    assert_eq!(record.errors[0].at, failed_at);
    assert_eq!(record.errors[0].message, "connection refused");

    assert!(h.lease("w", 1)?.is_empty(), "not before the backoff");
    h.advance(Duration::from_secs(5));
    let again = h.lease_one("w")?;
    assert_eq!(again.attempt, 2);
    Ok(())
}

fn fail_with_retry_after_overrides_the_backoff(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.queue.settle(
        &job,
        Outcome::Fail {
            error: "rate limited".into(),
            retry_after: Some(Duration::from_secs(300)),
        },
    )?;
    assert_eq!(
        h.record(job.id)?.available_at,
        h.now() + Duration::from_secs(300)
    );
    Ok(())
}

/// Fails the only job `attempts` times, moving the clock to each retry, and
/// returns the backoff each failure scheduled, in µs.
fn backoffs(h: &Harness, attempts: u32) -> TestResult<Vec<i64>> {
    let mut waits = Vec::new();
    for attempt in 1..=attempts {
        let job = h.lease_one("w")?;
        assert_eq!(job.attempt, attempt);
        let failed_at = h.now();
        h.queue.fail(&job, format!("failure {attempt}"))?;
        let record = h.record(job.id)?;
        assert_eq!(record.state, JobState::Retrying);
        waits.push(since(record.available_at, failed_at));
        // Due exactly at available_at, not a microsecond before.
        h.clock.set(record.available_at - Duration::from_micros(1));
        assert!(h.lease("w", 1)?.is_empty());
        h.clock.set(record.available_at);
    }
    Ok(waits)
}

fn backoff_doubles_from_base_and_is_capped_without_jitter(b: &Backend) -> TestResult {
    let h = b.harness_with(QueueOptions::new().retry_policy(RetryPolicy {
        base: Duration::from_secs(1),
        jitter: 0.0,
        max: Duration::from_secs(10),
    }))?;
    h.queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(10))?;
    let secs: Vec<i64> = [1, 2, 4, 8, 10, 10, 10]
        .iter()
        .map(|s| micros(Duration::from_secs(*s)))
        .collect();
    assert_eq!(backoffs(&h, 7)?, secs);
    Ok(())
}

fn backoff_grows_and_is_capped_within_the_jitter_bounds(b: &Backend) -> TestResult {
    let policy = RetryPolicy {
        base: Duration::from_secs(1),
        jitter: 0.2,
        max: Duration::from_secs(20),
    };
    let h = b.harness_with(QueueOptions::new().retry_policy(policy))?;
    h.queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(10))?;
    let waits = backoffs(&h, 9)?;
    for (i, wait) in waits.iter().enumerate() {
        let attempt = i as i32 + 1;
        let nominal = (2f64.powi(attempt - 1)).min(20.0) * 1e6;
        let low = (nominal * 0.8) as i64 - 1;
        let high = ((nominal * 1.2).min(20e6)) as i64 + 1;
        assert!(
            (low..=high).contains(wait),
            "attempt {attempt}: waited {wait} µs, expected {low}..={high}"
        );
    }
    // Uncapped, each wait exceeds the last even at opposite jitter extremes.
    for pair in waits[..5].windows(2) {
        assert!(pair[1] > pair[0], "{waits:?}");
    }
    // Capped from attempt 6 on: never above max.
    assert!(waits[5..].iter().all(|w| *w <= micros(policy.max)));
    Ok(())
}

fn retry_policy_for_a_kind_overrides_the_queue_policy(b: &Backend) -> TestResult {
    let h = b.harness_with(
        QueueOptions::new()
            .retry_policy(RetryPolicy {
                base: Duration::from_secs(1),
                jitter: 0.0,
                max: Duration::from_secs(60),
            })
            .retry_policy_for(
                "slow",
                RetryPolicy {
                    base: Duration::from_secs(90),
                    jitter: 0.0,
                    max: Duration::from_secs(3600),
                },
            ),
    )?;
    let slow = h.queue.enqueue(NewJob::new("slow", json!(1)))?;
    let fast = h.queue.enqueue(NewJob::new("fast", json!(2)))?;
    for job in h.lease("w", 2)? {
        h.queue.fail(&job, "nope")?;
    }
    let now = h.now();
    assert_eq!(
        since(h.record(slow.id)?.available_at, now),
        micros(Duration::from_secs(90))
    );
    assert_eq!(
        since(h.record(fast.id)?.available_at, now),
        micros(Duration::from_secs(1))
    );
    Ok(())
}

fn exhausted_attempts_move_the_job_to_dead_with_every_error(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(3))?;
    for attempt in 1..=3 {
        let job = h.lease_one("w")?;
        assert_eq!(job.attempt, attempt);
        assert_eq!(job.is_last_attempt(), attempt == 3);
        h.queue.fail(&job, format!("boom {attempt}"))?;
        if attempt < 3 {
            h.clock.set(h.record(job.id)?.available_at);
        }
    }
    assert_eq!(h.live_rows()?, 0);
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Dead));
    assert_eq!(record.attempts, 3);
    assert_eq!(record.finished_at, Some(h.now()));
    let errors: Vec<(u32, &str)> = record
        .errors
        .iter()
        .map(|e| (e.attempt, e.message.as_str()))
        .collect();
    assert_eq!(errors, vec![(1, "boom 1"), (2, "boom 2"), (3, "boom 3")]);
    let dead = h.count("SELECT count(*) FROM backlog_history WHERE status = 'dead'")?;
    assert_eq!(dead, 1);
    Ok(())
}

fn retry_brings_a_dead_job_back_available_with_attempts_reset(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(1))?;
    let job = h.lease_one("w")?;
    h.queue.fail(&job, "fatal")?;
    assert_eq!(h.state(enqueued.id)?, JobState::Finished(FinalStatus::Dead));

    h.advance(Duration::from_secs(60));
    h.queue.retry(enqueued.id)?;
    assert_eq!(h.history_rows()?, 0);
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Available);
    assert_eq!(record.attempts, 0);
    assert_eq!(record.available_at, h.now());
    assert_eq!(record.errors.len(), 1, "the dead attempt's error is kept");

    let again = h.lease_one("w")?;
    assert_eq!(again.id, enqueued.id);
    assert_eq!(again.attempt, 1);
    h.queue.complete(&again, None)?;
    assert_eq!(
        h.state(enqueued.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn retry_of_a_completed_job_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.queue.complete(&job, None)?;
    let err = h.queue.retry(enqueued.id).unwrap_err();
    assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    assert_eq!(
        h.state(enqueued.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn snooze_reschedules_without_using_an_attempt(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(1))?;
    let job = h.lease_one("w")?;
    assert!(job.is_last_attempt());
    h.queue.snooze(&job, Duration::from_secs(60))?;

    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Scheduled);
    assert_eq!(record.attempts, 0);
    assert!(record.errors.is_empty());
    assert_eq!(record.available_at, h.now() + Duration::from_secs(60));
    assert!(h.lease("w", 1)?.is_empty());

    h.advance(Duration::from_secs(60));
    let again = h.lease_one("w")?;
    assert_eq!(again.attempt, 1, "the snooze gave its attempt back");
    // Still on its one allowed attempt: a failure now is terminal.
    h.queue.fail(&again, "x")?;
    assert_eq!(h.state(enqueued.id)?, JobState::Finished(FinalStatus::Dead));
    Ok(())
}

fn release_is_reported_as_released_and_snooze_as_snoozed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let events = h.queue.subscribe();
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let (a, b) = (h.lease_one("w")?, h.lease_one("w")?);
    h.queue.release(&a)?;
    h.queue.snooze(&b, Duration::from_secs(5))?;
    let settled: Vec<Event> = events
        .try_iter()
        .filter(|e| matches!(e, Event::Released { .. } | Event::Snoozed { .. }))
        .collect();
    assert_eq!(
        settled,
        [
            Event::Released { job_id: a.id },
            Event::Snoozed {
                job_id: b.id,
                available_at: h.now() + Duration::from_secs(5),
            },
        ]
    );
    Ok(())
}

fn release_makes_the_job_available_at_once_without_using_an_attempt(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.queue.release(&job)?;

    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Available);
    assert_eq!(record.attempts, 0);
    assert_eq!(record.worker, None);
    assert_eq!(record.available_at, h.now());
    assert!(record.errors.is_empty());
    let again = h.lease_one("w2")?;
    assert_eq!(again.attempt, 1);
    Ok(())
}

fn discard_moves_the_job_to_history_as_discarded(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.queue.discard(&job, "malformed address")?;

    assert_eq!(h.live_rows()?, 0);
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Discarded));
    assert_eq!(record.errors.len(), 1);
    assert_eq!(record.errors[0].message, "malformed address");
    assert_eq!(record.worker.as_deref(), Some("w"));
    // A discarded job can be retried by an operator.
    h.queue.retry(enqueued.id)?;
    assert_eq!(h.state(enqueued.id)?, JobState::Available);
    Ok(())
}

fn the_error_list_keeps_only_the_most_recent_entries(b: &Backend) -> TestResult {
    let h = b.harness_with(QueueOptions::new().retry_policy(RetryPolicy {
        base: Duration::from_micros(1),
        jitter: 0.0,
        max: Duration::from_micros(1),
    }))?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let failures = MAX_ERRORS_KEPT as u32 + 3;
    for attempt in 1..=failures {
        let job = h.lease_one("w")?;
        h.queue.fail(&job, format!("failure {attempt}"))?;
        h.advance(Duration::from_micros(1));
    }
    let record = h.record(enqueued.id)?;
    assert_eq!(record.errors.len(), MAX_ERRORS_KEPT);
    let attempts: Vec<u32> = record.errors.iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, (4..=failures).collect::<Vec<_>>());
    Ok(())
}

// ---- stale leases -----------------------------------------------------------

fn complete_with_a_stale_lease_is_lease_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    assert_lease_lost(h.queue.complete(&stale, Some(json!("late"))), stale.id);
    assert_fresh_claim_untouched(&h, &fresh)
}

fn fail_with_a_stale_lease_is_lease_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    assert_lease_lost(h.queue.fail(&stale, "late failure"), stale.id);
    assert_fresh_claim_untouched(&h, &fresh)
}

fn snooze_with_a_stale_lease_is_lease_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    assert_lease_lost(h.queue.snooze(&stale, Duration::from_secs(5)), stale.id);
    assert_fresh_claim_untouched(&h, &fresh)
}

fn discard_with_a_stale_lease_is_lease_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    assert_lease_lost(h.queue.discard(&stale, "late discard"), stale.id);
    assert_fresh_claim_untouched(&h, &fresh)
}

fn release_with_a_stale_lease_is_lease_lost(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    assert_lease_lost(h.queue.release(&stale), stale.id);
    assert_fresh_claim_untouched(&h, &fresh)
}

// ---- batches -----------------------------------------------------------------

fn complete_many_completes_every_job_in_one_call(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..5).map(|i| NewJob::new("k", json!(i))))?;
    let jobs = h.lease("w", 5)?;
    let results = h.queue.complete_many(&jobs)?;
    assert_eq!(results.len(), 5);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.history_rows()?, 5);
    Ok(())
}

fn settle_many_applies_each_outcome_to_its_own_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = h
        .queue
        .enqueue_many((0..6).map(|i| NewJob::new("k", json!(i))))?
        .iter()
        .map(|e| e.id)
        .collect();
    let jobs = h.lease("w", 6)?;
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), ids);
    let results = h.queue.settle_many([
        (&jobs[0], Outcome::Complete(Some(json!(0)))),
        (&jobs[1], Outcome::fail("f")),
        (&jobs[2], Outcome::Snooze(Duration::from_secs(30))),
        (&jobs[3], Outcome::Discard("d".into())),
        (&jobs[4], Outcome::Release),
        (&jobs[5], Outcome::Cancel("c".into())),
    ])?;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let states: Vec<JobState> = ids
        .iter()
        .map(|id| h.state(*id))
        .collect::<TestResult<_>>()?;
    assert_eq!(
        states,
        vec![
            JobState::Finished(FinalStatus::Completed),
            JobState::Retrying,
            JobState::Scheduled,
            JobState::Finished(FinalStatus::Discarded),
            JobState::Available,
            JobState::Finished(FinalStatus::Cancelled),
        ]
    );
    Ok(())
}

fn settle_many_with_one_stale_lease_applies_the_others(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let (stale, fresh) = stale_and_fresh(&h)?;
    h.queue
        .enqueue_many([NewJob::new("k", json!("a")), NewJob::new("k", json!("b"))])?;
    let others = h.lease("w", 2)?;
    assert_eq!(others.len(), 2);

    let results = h.queue.settle_many([
        (&others[0], Outcome::Complete(None)),
        (&stale, Outcome::Complete(None)),
        (&others[1], Outcome::fail("boom")),
    ])?;
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok());
    assert!(
        matches!(results[1], Err(Error::LeaseLost { job_id }) if job_id == stale.id),
        "{results:?}"
    );
    assert!(results[2].is_ok());
    assert_eq!(
        h.state(others[0].id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    assert_eq!(h.state(others[1].id)?, JobState::Retrying);
    assert_fresh_claim_untouched(&h, &fresh)
}

// ---- transactional completion -----------------------------------------------

conformance!(
    release_is_reported_as_released_and_snooze_as_snoozed,
    complete_moves_the_job_to_history_with_its_result,
    fail_records_the_error_and_schedules_a_retry,
    fail_with_retry_after_overrides_the_backoff,
    backoff_doubles_from_base_and_is_capped_without_jitter,
    backoff_grows_and_is_capped_within_the_jitter_bounds,
    retry_policy_for_a_kind_overrides_the_queue_policy,
    exhausted_attempts_move_the_job_to_dead_with_every_error,
    retry_brings_a_dead_job_back_available_with_attempts_reset,
    retry_of_a_completed_job_is_refused,
    snooze_reschedules_without_using_an_attempt,
    release_makes_the_job_available_at_once_without_using_an_attempt,
    discard_moves_the_job_to_history_as_discarded,
    the_error_list_keeps_only_the_most_recent_entries,
    complete_with_a_stale_lease_is_lease_lost,
    fail_with_a_stale_lease_is_lease_lost,
    snooze_with_a_stale_lease_is_lease_lost,
    discard_with_a_stale_lease_is_lease_lost,
    release_with_a_stale_lease_is_lease_lost,
    complete_many_completes_every_job_in_one_call,
    settle_many_applies_each_outcome_to_its_own_job,
    settle_many_with_one_stale_lease_applies_the_others,
);
