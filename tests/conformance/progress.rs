//! Progress and partial results: a handler reports them while it runs
//! (`ctx.set_progress`), the worker writes the latest with its heartbeats and
//! before the job settles, fenced on the lease; `get`/`list` show them and
//! history keeps them, whatever the job's final status; `copy` carries them.

use std::time::{Duration, Instant};

use backlog::{
    Error, JobContext, JobState, LeaseRequest, ManualClock, NewJob, QueueOptions, Worker,
    MAX_PROGRESS_BYTES,
};
use serde_json::{json, Value};

use crate::harness::{Backend, Harness, TestResult};

const TTL: Duration = Duration::from_secs(10);

fn lease(h: &Harness, worker: &str) -> TestResult<backlog::Job> {
    Ok(h.queue
        .lease(&LeaseRequest::new(worker, 1).ttl(TTL))?
        .pop()
        .ok_or("nothing to lease")?)
}

fn progress_of(h: &Harness, id: i64) -> TestResult<Option<Value>> {
    Ok(h.record(id)?.progress::<Value>()?)
}

fn a_running_jobs_progress_shows_with_the_next_heartbeat_and_stays_in_history(
    b: &Backend,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (step, wait_step) = crossbeam_channel::bounded::<()>(0);
    let worker = Worker::builder(h.queue.clone())
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_interval(Duration::from_millis(100))
        .handle_raw("import", move |_: Value, ctx| {
            ctx.set_progress(&json!({"done": 1, "of": 2}))?;
            // The test reads the first value before the job goes on.
            let _ = wait_step.recv_timeout(Duration::from_secs(20));
            ctx.set_progress(&json!({"done": 2, "of": 2}))?;
            Ok(json!("imported"))
        })
        .start()?;
    let job = h.queue.enqueue(NewJob::new("import", json!({})))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let record = h.record(job.id)?;
        if record.progress::<Value>()? == Some(json!({"done": 1, "of": 2})) {
            assert_eq!(record.state, JobState::Running);
            break;
        }
        assert!(Instant::now() < deadline, "progress never became visible");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Listed too.
    let page = h.queue.list(&backlog::JobFilter::new(JobState::Running))?;
    assert_eq!(
        page.jobs[0].progress.as_deref(),
        Some(r#"{"done":1,"of":2}"#)
    );
    step.send(())?;
    let record = h.queue.wait(job.id, Duration::from_secs(20))?;
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(record.state, JobState::COMPLETED);
    // The last value, set just before the handler returned: written before
    // the completion, kept by it.
    assert_eq!(
        record.progress::<Value>()?,
        Some(json!({"done": 2, "of": 2}))
    );
    assert_eq!(record.result::<String>()?.as_deref(), Some("imported"));
    Ok(())
}

fn a_manual_heartbeat_writes_progress_at_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let ctx = JobContext::for_test(h.queue.clone(), lease(&h, "w")?);
    ctx.set_progress(&json!({"pct": 10}))?;
    // Kept, not written yet.
    assert_eq!(ctx.progress().as_deref(), Some(r#"{"pct":10}"#));
    assert_eq!(progress_of(&h, job.id)?, None);
    ctx.heartbeat()?;
    assert_eq!(progress_of(&h, job.id)?, Some(json!({"pct": 10})));
    // The latest wins.
    ctx.set_progress(&json!({"pct": 20}))?;
    ctx.set_progress(&json!({"pct": 30}))?;
    ctx.heartbeat()?;
    assert_eq!(progress_of(&h, job.id)?, Some(json!({"pct": 30})));
    Ok(())
}

fn progress_after_a_lost_lease_is_lease_lost_and_writes_nothing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let stale = JobContext::for_test(h.queue.clone(), lease(&h, "slow")?);
    stale.set_progress(&json!("from the first claim"))?;
    stale.heartbeat()?;
    // Past the lease the manual heartbeat extended (the default TTL).
    h.advance(backlog::DEFAULT_LEASE_TTL + Duration::from_secs(1));
    assert_eq!(h.queue.rescue(10)?.rescued, 1);
    let fresh = JobContext::for_test(h.queue.clone(), lease(&h, "fresh")?);
    assert_eq!(fresh.id(), job.id);

    stale.set_progress(&json!("stale"))?;
    assert!(
        matches!(stale.heartbeat(), Err(Error::LeaseLost { job_id }) if job_id == job.id),
        "a stale claim's heartbeat is LeaseLost"
    );
    assert_eq!(
        progress_of(&h, job.id)?,
        Some(json!("from the first claim")),
        "nothing written by the stale claim"
    );
    // Known lost now: refused at once, and nothing kept.
    assert!(matches!(
        stale.set_progress(&json!("again")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(stale.progress().as_deref(), Some(r#""stale""#));

    fresh.set_progress(&json!("from the second claim"))?;
    fresh.heartbeat()?;
    assert_eq!(
        progress_of(&h, job.id)?,
        Some(json!("from the second claim"))
    );
    Ok(())
}

fn progress_past_the_cap_is_refused_and_the_last_value_stays(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let ctx = JobContext::for_test(h.queue.clone(), lease(&h, "w")?);
    ctx.set_progress(&json!({"ok": true}))?;
    let big = "x".repeat(MAX_PROGRESS_BYTES);
    match ctx.set_progress(&big) {
        Err(Error::ProgressTooLarge { size, limit }) => {
            assert_eq!(limit, MAX_PROGRESS_BYTES);
            assert_eq!(
                size,
                MAX_PROGRESS_BYTES + 2,
                "the JSON string's quotes count"
            );
        }
        other => panic!("expected ProgressTooLarge, got {other:?}"),
    }
    // Exactly at the cap is fine.
    let fits = "x".repeat(MAX_PROGRESS_BYTES - 2);
    ctx.heartbeat()?;
    assert_eq!(progress_of(&h, job.id)?, Some(json!({"ok": true})));
    ctx.set_progress(&fits)?;
    ctx.heartbeat()?;
    assert_eq!(progress_of(&h, job.id)?, Some(json!(fits)));
    Ok(())
}

fn progress_is_kept_across_a_retry_and_in_the_dead_letter_history(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).max_attempts(2))?;
    let first = lease(&h, "w")?;
    let ctx = JobContext::for_test(h.queue.clone(), first.clone());
    ctx.set_progress(&json!({"rows": 40}))?;
    ctx.heartbeat()?;
    h.queue.fail(&first, "boom")?;
    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Retrying);
    assert_eq!(record.progress::<Value>()?, Some(json!({"rows": 40})));

    h.advance(Duration::from_secs(3600));
    let second = lease(&h, "w")?;
    let ctx = JobContext::for_test(h.queue.clone(), second.clone());
    ctx.set_progress(&json!({"rows": 70}))?;
    ctx.heartbeat()?;
    h.queue.fail(&second, "boom again")?;
    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::DEAD);
    assert_eq!(record.progress::<Value>()?, Some(json!({"rows": 70})));
    Ok(())
}

fn copy_carries_progress_of_live_and_finished_jobs(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let from = QueueOptions::new()
        .clock(ManualClock::at(h.now()))
        .open(dir.path().join("old.db"))?;
    let done = from.enqueue(NewJob::new("k", json!("done")))?;
    let job = from
        .lease(&LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    let ctx = JobContext::for_test(from.clone(), job.clone());
    ctx.set_progress(&json!("finished at 100%"))?;
    ctx.heartbeat()?;
    from.complete(&job, None)?;
    let live = from.enqueue(NewJob::new("k", json!("live")))?;
    let job = from
        .lease(&LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    let ctx = JobContext::for_test(from.clone(), job);
    ctx.set_progress(&json!("half way"))?;
    ctx.heartbeat()?;

    backlog::copy(&from, &h.queue)?;
    assert_eq!(progress_of(&h, done.id)?, Some(json!("finished at 100%")));
    assert_eq!(progress_of(&h, live.id)?, Some(json!("half way")));
    Ok(())
}

fn drain_writes_the_last_progress_before_settling(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(3)))?;
    let worker = Worker::builder(h.queue.clone()).handle_raw("k", |n: Value, ctx| {
        for i in 1..=n.as_i64().unwrap_or(0) {
            ctx.set_progress(&json!(i))?;
        }
        Ok(())
    });
    let runs = backlog::testing::drain(&worker)?;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].progress, Some(json!(3)));
    assert_eq!(progress_of(&h, job.id)?, Some(json!(3)));
    Ok(())
}

fn a_job_released_at_shutdown_keeps_the_progress_its_handler_reported(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (started, wait_started) = crossbeam_channel::bounded::<()>(1);
    let worker = Worker::builder(h.queue.clone())
        // No heartbeat writes it first: only the shutdown's flush can.
        .lease_ttl(Duration::from_secs(60))
        .heartbeat_interval(Duration::from_secs(50))
        .handle_raw("long", move |_: Value, ctx| {
            ctx.set_progress(&json!({"step": 7}))?;
            let _ = started.send(());
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err::<(), _>(backlog::JobError::retry("stopped"))
        })
        .start()?;
    let job = h.queue.enqueue(NewJob::new("long", json!({})))?;
    wait_started.recv_timeout(Duration::from_secs(20))?;
    worker.shutdown(Duration::from_millis(100))?;
    let record = h.record(job.id)?;
    assert_eq!(
        record.state,
        JobState::Available,
        "released, no attempt used"
    );
    assert_eq!(record.progress::<Value>()?, Some(json!({"step": 7})));
    Ok(())
}

conformance!(
    a_job_released_at_shutdown_keeps_the_progress_its_handler_reported,
    a_running_jobs_progress_shows_with_the_next_heartbeat_and_stays_in_history,
    a_manual_heartbeat_writes_progress_at_once,
    progress_after_a_lost_lease_is_lease_lost_and_writes_nothing,
    progress_past_the_cap_is_refused_and_the_last_value_stays,
    progress_is_kept_across_a_retry_and_in_the_dead_letter_history,
    copy_carries_progress_of_live_and_finished_jobs,
    drain_writes_the_last_progress_before_settling,
);
