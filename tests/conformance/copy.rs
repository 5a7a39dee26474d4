//! `backlog::copy`: a SQLite queue's live jobs and history move to another
//! database (each backend in turn) keeping ids, attempts, schedules and
//! unique keys; leased jobs arrive available.

use std::time::Duration;

use backlog::{FinalStatus, JobState, ManualClock, NewJob, QueueOptions};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn copy_from_sqlite_keeps_ids_attempts_schedules_and_keys(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::at(h.now());
    let from = QueueOptions::new()
        .clock(clock.clone())
        .open(dir.path().join("old.db"))?;
    // Some history first, so live ids are not 1..n.
    let done = from.enqueue(NewJob::new("k", json!({"done": true})))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.complete(&job, Some(json!({"ok": 1})))?;
    let dead = from.enqueue(NewJob::new("k", json!("dead")).max_attempts(1))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.fail(&job, "boom")?;
    let scheduled = from.enqueue(
        NewJob::new("k", json!({"later": 1}))
            .queue("mail")
            .priority(3)
            .delay(Duration::from_secs(3600))
            .unique_key("once"),
    )?;
    let retrying = from.enqueue(NewJob::new("k", json!("retry")))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.fail(&job, "flaky")?;
    let running = from.enqueue(NewJob::new("k", json!("running")))?;
    let leased = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    assert_eq!(leased.id, running.id);
    from.pause("mail")?;

    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!((report.live, report.history, report.skipped), (3, 2, 0));
    assert_eq!(report.paused_queues, 1);

    let got = h.record(scheduled.id)?;
    let want = from.get(scheduled.id)?;
    assert_eq!(got.state, JobState::Scheduled);
    assert_eq!((got.queue.as_str(), got.priority), ("mail", 3));
    assert_eq!(got.unique_key.as_deref(), Some("once"));
    assert_eq!(got.available_at, want.available_at);
    assert_eq!(got.created_at, want.created_at);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&got.payload)?,
        json!({"later": 1})
    );

    let got = h.record(retrying.id)?;
    assert_eq!(got.state, JobState::Retrying);
    assert_eq!(got.attempts, 1);
    assert_eq!(got.errors.len(), 1);
    assert_eq!(got.errors[0].message, "flaky");

    let got = h.record(running.id)?;
    assert_eq!(
        got.state,
        JobState::Available,
        "a leased job arrives available"
    );
    assert_eq!(got.attempts, 1);
    assert_eq!(got.available_at, from.get(running.id)?.available_at);

    let got = h.record(done.id)?;
    assert_eq!(got.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(got.result.as_deref().ok_or("no result")?)?,
        json!({"ok": 1})
    );
    assert_eq!(got.worker.as_deref(), Some("w"));
    assert_eq!(h.state(dead.id)?, JobState::Finished(FinalStatus::Dead));
    assert_eq!(h.queue.paused_queues()?, vec!["mail".to_owned()]);

    // The unique key is held on the target, new ids come after the copied
    // ones, and copying again changes nothing.
    let again = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).queue("mail").unique_key("once"))?;
    assert_eq!((again.id, again.existed), (scheduled.id, true));
    let fresh = h.queue.enqueue(NewJob::new("k", json!("new")))?;
    assert!(fresh.id > running.id, "{} <= {}", fresh.id, running.id);
    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!((report.live, report.history, report.skipped), (0, 0, 5));
    // The copied available job runs on the target.
    let job = h.lease_one("new-worker")?;
    assert_eq!(job.id, running.id);
    assert_eq!(job.attempt, 2);
    Ok(())
}

fn copy_onto_the_same_database_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let err = backlog::copy(&h.queue, &h.queue).unwrap_err();
    assert!(matches!(err, backlog::Error::InvalidArgument(_)), "{err:?}");
    Ok(())
}

conformance!(
    copy_from_sqlite_keeps_ids_attempts_schedules_and_keys,
    copy_onto_the_same_database_is_refused,
);
