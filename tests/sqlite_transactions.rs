//! The SQLite forms of transactional settling: `complete_in` / `fail_in` on
//! a `rusqlite` transaction of the application's, and `QueueExt::transaction`.
//! What every backend shares is in the conformance suite
//! (`tests/conformance/transactional.rs`); this file keeps what only the
//! `rusqlite` API has (its own transaction helper, autocommit connections).

mod common;

use std::time::Duration;

use backlog::sqlite::QueueExt;
use backlog::{Error, FinalStatus, Job, JobState, LeaseRequest, NewJob};
use common::{create_effects_table, effects_of, raw, Harness, TestDb, TestResult};
use rusqlite::TransactionBehavior;
use serde_json::json;

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

fn assert_lease_lost<T: std::fmt::Debug>(result: backlog::Result<T>, job_id: i64) {
    match result {
        Err(Error::LeaseLost { job_id: lost }) => assert_eq!(lost, job_id),
        other => panic!("expected LeaseLost for job {job_id}, got {other:?}"),
    }
}

#[test]
fn complete_in_with_a_stale_lease_rolls_back_the_effects_of_its_transaction() -> TestResult {
    let h = Harness::new()?;
    create_effects_table(h.path())?;
    let (stale, fresh) = stale_and_fresh(&h)?;

    let outcome: backlog::Result<()> = h.queue.transaction(|tx| {
        tx.execute(
            "INSERT INTO effects (job_id, note) VALUES (?1, 'stale')",
            [stale.id],
        )?;
        h.queue.complete_in(tx, &stale, None)?;
        Ok(())
    });
    assert_lease_lost(outcome, stale.id);
    assert_eq!(effects_of(h.path(), stale.id)?, 0);
    assert_eq!(h.state(stale.id)?, JobState::Running);

    // The fresh holder's transaction commits its effects exactly once.
    h.queue.transaction(|tx| -> backlog::Result<()> {
        h.queue.complete_in(tx, &fresh, None)?;
        tx.execute(
            "INSERT INTO effects (job_id, note) VALUES (?1, 'fresh')",
            [fresh.id],
        )?;
        Ok(())
    })?;
    assert_eq!(effects_of(h.path(), fresh.id)?, 1);
    assert_eq!(
        h.state(fresh.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

#[test]
fn fail_in_commits_the_retry_with_the_callers_transaction() -> TestResult {
    let h = Harness::new()?;
    create_effects_table(h.path())?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;

    let mut conn = h.raw()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    h.queue.fail_in(&tx, &job, "declined")?;
    tx.execute(
        "INSERT INTO effects (job_id, note) VALUES (?1, 'logged decline')",
        [job.id],
    )?;
    tx.rollback()?;
    assert_eq!(h.state(job.id)?, JobState::Running);

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    h.queue.fail_in(&tx, &job, "declined")?;
    tx.execute(
        "INSERT INTO effects (job_id, note) VALUES (?1, 'logged decline')",
        [job.id],
    )?;
    tx.commit()?;
    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Retrying);
    assert_eq!(record.errors.len(), 1);
    assert_eq!(record.errors[0].message, "declined");
    assert_eq!(effects_of(h.path(), job.id)?, 1);
    Ok(())
}

#[test]
fn complete_in_on_an_autocommit_connection_is_not_in_transaction() -> TestResult {
    let h = Harness::new()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    let conn = h.raw()?;
    let err = h.queue.complete_in(&conn, &job, None).unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert_eq!(h.state(job.id)?, JobState::Running);
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

/// What only SQLite's `QueueExt` has, inside the queue's own transaction:
/// `synchronous` reads the write connection that transaction holds, so it
/// answers `InsideTransaction` at once instead of waiting for itself. Every
/// method all backends share is called this way by the conformance suite
/// (`tests/conformance/inside_transaction.rs`).
#[test]
fn synchronous_inside_the_queues_own_transaction_answers_at_once() -> TestResult {
    use std::time::Instant;

    let h = Harness::new()?;
    let start = Instant::now();
    h.queue.transaction(|_| -> backlog::Result<()> {
        assert!(matches!(
            h.queue.synchronous(),
            Err(Error::InsideTransaction)
        ));
        Ok(())
    })?;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(h.queue.synchronous()?, 2, "FULL, read back outside");
    Ok(())
}
