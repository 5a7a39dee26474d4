//! The default worker's look-ahead: it leases short jobs ahead of its
//! handler threads, but never more than they finish within the look-ahead
//! horizon of measured handler time, so a high-priority job enqueued behind
//! it waits no longer than that horizon.
//!
//! Handler time here is the manual clock's: each handler moves the clock
//! (and sleeps a little, so the worker cannot drain the queue before the
//! scenario looks). With one handler thread, the clock's advance between an
//! enqueue and a start is the handler time of the jobs that ran in between.
//! No handler starts while the enqueue is on its way (a server round trip
//! can take milliseconds), so that time counts from the enqueue's commit.
//! (Several processes sharing a queue: `tests/lookahead_processes.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backlog::worker::LOOKAHEAD_HORIZON;
use backlog::{Clock, Event, JobFilter, JobState, NewJob, Worker};
use crossbeam_channel::bounded;
use serde_json::{json, Value};

use crate::harness::{Backend, TestResult};

/// What each ordinary job stands for on the manual clock.
const JOB_TIME: Duration = Duration::from_millis(2);

fn a_high_priority_job_waits_no_longer_than_the_look_ahead_horizon(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..400).map(|n| NewJob::new("slow", json!(n))))?;
    let events = h.queue.subscribe();
    let (started_tx, started_rx) = bounded(1);
    let (clock, clock2) = (h.clock.clone(), h.clock.clone());
    let enqueuing = Arc::new(Mutex::new(()));
    let gate = enqueuing.clone();
    let worker = Worker::builder(h.queue.clone())
        .concurrency(1)
        .handle_raw("slow", move |_: Value, _| {
            drop(gate.lock());
            clock.advance(JOB_TIME);
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        })
        .handle_raw("urgent", move |_: Value, _| {
            let _ = started_tx.try_send(clock2.now());
            Ok(())
        })
        .start()?;
    // Enough runs for the worker to know its jobs' length; meanwhile, the
    // most jobs it held at once (leased, running or waiting to be).
    let (mut completed, mut held) = (0, 0);
    while completed < 30 {
        if let Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            completed += 1;
            let running = JobFilter::new(JobState::Running).limit(1000);
            held = held.max(h.queue.list(&running)?.jobs.len());
        }
    }
    let paused = enqueuing.lock();
    let enqueued_at = h.now();
    h.queue
        .enqueue(NewJob::new("urgent", json!(0)).priority(10))?;
    drop(paused);
    let started_at = started_rx.recv_timeout(Duration::from_secs(30))?;
    worker.shutdown(Duration::from_secs(5))?;

    let waited = started_at.duration_since(enqueued_at)?;
    println!(
        "look-ahead ({b:?}): held up to {held} jobs with 1 thread; the urgent job waited {waited:?}"
    );
    // One thread and more jobs leased than that: the worker batches.
    assert!(held > 1, "no look-ahead: {held} job(s) leased");
    assert!(
        waited <= LOOKAHEAD_HORIZON,
        "the urgent job waited {waited:?} of handler time, past the {LOOKAHEAD_HORIZON:?} horizon"
    );
    Ok(())
}

conformance!(a_high_priority_job_waits_no_longer_than_the_look_ahead_horizon);
