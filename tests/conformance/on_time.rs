//! On time: a worker starts a job when it comes due (a delay, a retry's
//! backoff, a job another process or node scheduled), not at its next idle
//! poll. The workers here poll once a minute, so a start within seconds
//! shows the due-time wake-up; these are correctness bounds, not speed
//! figures (those are in BENCHMARKS.md).

use std::time::{Duration, Instant};

use backlog::{Event, JobError, NewJob, QueueOptions, Worker, WorkerBuilder};
use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use crate::harness::{Backend, TestResult};

const DELAY: Duration = Duration::from_millis(400);
/// Far below the idle poll (its first wait is a tenth of the 300 s poll
/// interval), far above any scheduling noise.
const BOUND: Duration = Duration::from_secs(10);

fn sleepy(queue: &backlog::Queue) -> WorkerBuilder {
    Worker::builder(queue.clone())
        .poll_interval(Duration::from_secs(300))
        .concurrency(2)
}

/// Waits for the `attempt`-th start of `job_id`.
fn started(events: &Receiver<Event>, job_id: i64, attempt: u32) -> TestResult<Instant> {
    let deadline = Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left)? {
            Event::Started {
                job_id: id,
                attempt: a,
            } if id == job_id && a == attempt => return Ok(Instant::now()),
            _ => {}
        }
    }
}

fn a_delayed_job_starts_when_due_not_at_the_idle_poll(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let worker = sleepy(&h.queue)
        .handle_raw("k", |_: Value, _| Ok(()))
        .start()?;
    // The fetcher has gone to sleep on an empty queue.
    std::thread::sleep(Duration::from_millis(100));
    let enqueued_at = Instant::now();
    let job = h.queue.enqueue(NewJob::new("k", json!(1)).delay(DELAY))?;
    let at = started(&events, job.id, 1)?;
    worker.shutdown(Duration::from_secs(5))?;
    let waited = at - enqueued_at;
    assert!(
        waited >= DELAY - Duration::from_millis(5),
        "started early: {waited:?}"
    );
    Ok(())
}

fn a_retry_starts_when_its_backoff_passes(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let worker = sleepy(&h.queue)
        .handle_raw("k", |_: Value, ctx| {
            if ctx.attempt() == 1 {
                Err(JobError::retry_after(DELAY, "not yet"))
            } else {
                Ok(())
            }
        })
        .start()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let first = started(&events, job.id, 1)?;
    let second = started(&events, job.id, 2)?;
    worker.shutdown(Duration::from_secs(5))?;
    assert!(second - first >= DELAY - Duration::from_millis(5));
    Ok(())
}

/// The race of 2adc942, made certain: the retry's commit lands while the
/// fetcher already sleeps toward its idle poll, having asked when the next
/// job is due before the retry existed. A job held in the other slot keeps
/// the completer collecting for its whole batch delay (a second), so the
/// freed slot wakes the fetcher, which finds nothing due and goes back to
/// sleep, long before the retry commits. Nothing from the server says a job
/// became due (PostgreSQL notifies enqueues only): only this process's
/// doorbell, rung by the settle, can wake the fetcher before its 30 s poll.
fn a_retry_committed_while_the_fetcher_sleeps_starts_when_its_backoff_passes(
    b: &Backend,
) -> TestResult {
    const BACKOFF: Duration = Duration::from_millis(200);
    const COLLECT: Duration = Duration::from_secs(1);
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let (release, released) = crossbeam_channel::bounded::<()>(0);
    let worker = sleepy(&h.queue)
        .completer_batch(64, COLLECT)
        .handle_raw("hold", move |_: Value, _| {
            // Holds its slot (and the completer's batch open) until the end.
            let _ = released.recv_timeout(BOUND * 2);
            Ok(())
        })
        .handle_raw("flaky", |_: Value, ctx| {
            if ctx.attempt() == 1 {
                Err(JobError::retry_after(BACKOFF, "not yet"))
            } else {
                Ok(())
            }
        })
        .start()?;
    let hold = h.queue.enqueue(NewJob::new("hold", json!(0)))?;
    started(&events, hold.id, 1)?;
    let flaky = h.queue.enqueue(NewJob::new("flaky", json!(1)))?;
    let first = started(&events, flaky.id, 1)?;
    let second = started(&events, flaky.id, 2);
    drop(release);
    worker.shutdown(Duration::from_secs(5))?;
    let second = second.map_err(|e| {
        format!("the retry did not start within {BOUND:?} of the first attempt's: {e}")
    })?;
    // Committed at the end of the completer's collection, due a backoff
    // later; sooner, and the scenario no longer commits the retry while the
    // fetcher sleeps.
    assert!(
        second - first >= COLLECT + BACKOFF - Duration::from_millis(5),
        "the retry started {:?} after the first attempt, before the completer's \
         collection and the backoff had passed",
        second - first
    );
    Ok(())
}

fn a_job_another_process_scheduled_wakes_the_worker_when_due(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let other = h.handle_with(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let worker = sleepy(&h.queue)
        .handle_raw("k", |_: Value, _| Ok(()))
        .start()?;
    std::thread::sleep(Duration::from_millis(100));
    // Written through other connections: this process's doorbell stays quiet.
    let job = other.enqueue(NewJob::new("k", json!(1)).delay(DELAY))?;
    started(&events, job.id, 1)?;
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

fn a_sooner_job_wakes_a_worker_sleeping_toward_a_later_one(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let worker = sleepy(&h.queue)
        .handle_raw("k", |_: Value, _| Ok(()))
        .start()?;
    // The worker goes to sleep until this one is due, a minute from now.
    h.queue
        .enqueue(NewJob::new("k", json!("later")).delay(Duration::from_secs(60)))?;
    std::thread::sleep(Duration::from_millis(200));
    let enqueued_at = Instant::now(); // before: the delay counts from inside the call
    let sooner = h
        .queue
        .enqueue(NewJob::new("k", json!("sooner")).delay(DELAY))?;
    let at = started(&events, sooner.id, 1)?;
    worker.shutdown(Duration::from_secs(5))?;
    assert!(at - enqueued_at >= DELAY - Duration::from_millis(5));
    Ok(())
}

conformance!(
    a_sooner_job_wakes_a_worker_sleeping_toward_a_later_one,
    a_delayed_job_starts_when_due_not_at_the_idle_poll,
    a_retry_starts_when_its_backoff_passes,
    a_retry_committed_while_the_fetcher_sleeps_starts_when_its_backoff_passes,
    a_job_another_process_scheduled_wakes_the_worker_when_due,
);
