//! What a handler's return value does to its job: retry, dead, discard,
//! cancel, snooze, and a payload that does not decode.

mod worker_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backlog::{
    CancelReason, Event, JobContext, JobError, NewJob, Queue, RetryPolicy, Worker, WorkerBuilder,
};
use serde_json::json;
use worker_common::*;

/// A quick retry policy, so retries come due in milliseconds.
fn quick() -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_millis(10),
        jitter: 0.0,
        max: Duration::from_millis(50),
    }
}

/// A worker that polls often enough for short retries and snoozes.
fn builder(queue: &Queue) -> WorkerBuilder {
    Worker::builder(queue.clone())
        .concurrency(2)
        .poll_interval(Duration::from_millis(50))
        .retry_policy(quick())
}

#[test]
fn a_job_that_fails_twice_is_retried_and_then_succeeds() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 1 })?.id;

    let worker = builder(&queue)
        .handle(|_: Work, ctx| {
            if ctx.attempt() < 3 {
                // Any error converts with `?` and means "retry by the policy".
                Err(std::io::Error::other(format!("flaky #{}", ctx.attempt())))?;
            }
            Ok("third time lucky")
        })
        .start()?;
    let retries = wait_count(&events, 2, PATIENCE, "retries", |e| match e {
        Event::Retried { job_id, .. } => Some(*job_id),
        _ => None,
    })?;
    wait_for(&events, PATIENCE, "completion", |e| {
        completed(e) == Some(id)
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(retries.get(&id), Some(&2));
    let record = expect_state(&queue, id, "completed")?;
    assert_eq!(record.attempts, 3);
    assert_eq!(record.result.as_deref(), Some("\"third time lucky\""));
    let messages: Vec<&str> = record.errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["flaky #1", "flaky #2"]);
    Ok(())
}

/// A handler of the application's that uses anyhow.
fn fetch_with_anyhow(args: Work, _: &JobContext) -> anyhow::Result<u32> {
    anyhow::ensure!(args.n != 1, "n = {} is refused", args.n);
    let n: u32 = "not a number"
        .parse()
        .map_err(anyhow::Error::from)
        .map_err(|e| e.context(format!("parsing for job {}", args.n)))?;
    Ok(n)
}

#[test]
fn handlers_returning_their_own_error_types_fail_their_attempt_with_its_message() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let one = |n: u32| NewJob::new("work", json!({ "n": n })).max_attempts(1);
    let refused = queue.enqueue(one(1))?.id;
    let unparsable = queue.enqueue(one(2))?.id;
    let boxed = queue
        .enqueue(NewJob::new("boxed", json!({})).max_attempts(1))?
        .id;
    let text = queue
        .enqueue(NewJob::new("text", json!({})).max_attempts(1))?
        .id;

    let worker = builder(&queue)
        .handle_fn(fetch_with_anyhow)
        .handle_raw_fn(
            "boxed",
            |_, _| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                Err("a boxed error".into())
            },
        )
        .handle_raw_fn("text", |_, _| -> Result<(), String> {
            Err("a string error".to_owned())
        })
        .start()?;
    wait_count(&events, 4, PATIENCE, "dead jobs", |e| match e {
        Event::Dead { job_id } => Some(*job_id),
        _ => None,
    })?;
    worker.shutdown(PATIENCE)?;

    let message = |id| -> TestResult<String> {
        let record = expect_state(&queue, id, "dead")?;
        Ok(record.errors.last().ok_or("no error")?.message.clone())
    };
    assert_eq!(message(refused)?, "n = 1 is refused");
    assert_eq!(
        message(unparsable)?,
        "parsing for job 2: invalid digit found in string"
    );
    assert_eq!(message(boxed)?, "a boxed error");
    assert_eq!(message(text)?, "a string error");
    Ok(())
}

#[test]
fn question_mark_converts_anyhow_and_boxed_errors_inside_a_closure() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue
        .enqueue(NewJob::new("work", json!({"n": 1})).max_attempts(1))?
        .id;

    let worker = builder(&queue)
        .handle(|args: Work, ctx| {
            let boxed: Result<(), Box<dyn std::error::Error + Send + Sync>> = Ok(());
            boxed?;
            fetch_with_anyhow(args, ctx)?;
            Ok(())
        })
        .start()?;
    wait_for(&events, PATIENCE, "dead", |e| {
        *e == Event::Dead { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;
    let record = expect_state(&queue, id, "dead")?;
    assert_eq!(record.errors[0].message, "n = 1 is refused");
    Ok(())
}

#[test]
fn a_job_that_exhausts_its_attempts_is_dead() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue
        .enqueue(NewJob::new("work", json!({"n": 1})).max_attempts(3))?
        .id;

    let worker = builder(&queue)
        .handle(|_: Work, ctx| -> Result<(), JobError> {
            Err(JobError::retry(format!("always fails ({})", ctx.attempt())))
        })
        .start()?;
    wait_for(&events, PATIENCE, "dead", |e| {
        *e == Event::Dead { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    let record = expect_state(&queue, id, "dead")?;
    assert_eq!(record.attempts, 3);
    assert_eq!(record.errors.len(), 3);
    assert_eq!(record.errors[2].message, "always fails (3)");
    Ok(())
}

#[test]
fn a_discarded_job_goes_to_history_without_retrying() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 0 })?.id;

    let worker = builder(&queue)
        .handle(|args: Work, _| -> Result<(), JobError> {
            Err(JobError::discard(format!("n = {} is not allowed", args.n)))
        })
        .start()?;
    wait_for(&events, PATIENCE, "discard", |e| {
        *e == Event::Discarded { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    let record = expect_state(&queue, id, "discarded")?;
    assert_eq!(record.attempts, 1);
    assert_eq!(record.errors[0].message, "n = 0 is not allowed");
    Ok(())
}

#[test]
fn a_cancelled_job_goes_to_history_as_cancelled() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 0 })?.id;

    let worker = builder(&queue)
        .handle(|_: Work, _| -> Result<(), JobError> { Err(JobError::cancel("no longer wanted")) })
        .start()?;
    wait_for(&events, PATIENCE, "cancel", |e| {
        *e == Event::Cancelled { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    expect_state(&queue, id, "cancelled")?;
    Ok(())
}

#[test]
fn a_snoozed_job_runs_again_without_using_an_attempt() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue
        .enqueue(NewJob::new("work", json!({"n": 1})).max_attempts(1))?
        .id;

    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let worker = builder(&queue)
        .handle(move |_: Work, ctx| {
            let mut runs = seen.lock().unwrap();
            runs.push(ctx.attempt());
            if runs.len() < 3 {
                return Err(JobError::snooze(Duration::from_millis(10)));
            }
            Ok(())
        })
        .start()?;
    let snoozes = wait_count(&events, 2, PATIENCE, "snoozes", |e| match e {
        Event::Snoozed { job_id, .. } => Some(*job_id),
        _ => None,
    })?;
    wait_for(&events, PATIENCE, "completion", |e| {
        completed(e) == Some(id)
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(snoozes.get(&id), Some(&2));
    // With max_attempts = 1, any attempt used by a snooze would have killed it.
    assert_eq!(*runs.lock().unwrap(), [1, 1, 1]);
    let record = expect_state(&queue, id, "completed")?;
    assert_eq!(record.attempts, 1);
    assert!(record.errors.is_empty());
    Ok(())
}

#[test]
fn a_payload_that_does_not_decode_goes_straight_to_dead() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    // 25 attempts allowed, but retrying the same bytes cannot help.
    let id = queue
        .enqueue(NewJob::new("work", json!({"n": "not a number"})))?
        .id;

    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let worker = builder(&queue)
        .handle(move |_: Work, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .start()?;
    wait_for(&events, PATIENCE, "dead", |e| {
        *e == Event::Dead { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    let record = expect_state(&queue, id, "dead")?;
    assert_eq!(record.attempts, 1);
    assert_eq!(record.max_attempts, 25);
    let message = &record.errors[0].message;
    assert!(
        message.contains("does not decode into") && message.contains("Work"),
        "{message}"
    );
    Ok(())
}

#[test]
fn a_job_past_its_timeout_sees_its_cancellation_flag() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue
        .enqueue(NewJob::new("work", json!({"n": 1})).max_attempts(1))?
        .id;

    let worker = builder(&queue)
        .timeout_for("work", Duration::from_millis(100))
        .handle(|_: Work, ctx| -> Result<(), JobError> {
            assert!(ctx.deadline().is_some());
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5)); // the "work"
            }
            Err(JobError::retry(format!(
                "stopped: {:?}",
                ctx.cancel_reason()
            )))
        })
        .start()?;
    wait_for(&events, PATIENCE, "dead", |e| {
        *e == Event::Dead { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    let record = expect_state(&queue, id, "dead")?;
    assert_eq!(
        record.errors[0].message,
        format!("stopped: {:?}", Some(CancelReason::Timeout))
    );
    Ok(())
}

#[test]
fn a_cancel_requested_while_running_reaches_the_handler() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    let id = queue.enqueue(Work { n: 1 })?.id;

    let worker = builder(&queue)
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(50))
        .handle(|_: Work, ctx| -> Result<(), JobError> {
            while ctx.cancel_reason() != Some(CancelReason::CancelRequested) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(JobError::retry("asked to stop"))
        })
        .start()?;
    wait_for(&events, PATIENCE, "start", |e| started(e) == Some(id))?;
    queue.cancel(id)?;
    wait_for(&events, PATIENCE, "cancel", |e| {
        *e == Event::Cancelled { job_id: id }
    })?;
    worker.shutdown(PATIENCE)?;

    expect_state(&queue, id, "cancelled")?;
    Ok(())
}
