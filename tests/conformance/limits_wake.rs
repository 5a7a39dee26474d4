//! A place of a concurrency limit freed by another process is taken up
//! soon, not at the next idle poll: a worker whose lease found the limit
//! full leases again when the place frees (SQLite: its watcher sees the
//! commit; the servers, whose watchers report new jobs only: a short
//! re-lease interval while the limit is full).

use std::time::{Duration, Instant};

use backlog::{LeaseRequest, NewJob, QueueLimits, Worker};
use crossbeam_channel::unbounded;
use serde_json::{json, Value};

use crate::harness::{Backend, TestResult};

const QUEUE: &str = "one_place";

fn a_worker_takes_a_place_that_another_process_frees_within_a_second(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.set_limits(
        QUEUE,
        QueueLimits {
            concurrency: Some(1),
            rate: None,
        },
    )?;
    h.queue
        .enqueue_many((0..2).map(|i| NewJob::new("placed", json!(i)).queue(QUEUE)))?;
    // Another process holds the one place.
    let other = h.second_handle()?;
    let held = other.lease(&LeaseRequest::new("other", 1).queues([QUEUE]))?;
    assert_eq!(held.len(), 1);
    let (started_tx, started) = unbounded();
    let worker = Worker::builder(h.queue.clone())
        .queues([QUEUE])
        .concurrency(1)
        // Only a wake-up, never the idle poll, can start the job in time.
        .poll_interval(Duration::from_secs(10))
        .handle_raw("placed", move |_: Value, _| {
            let _ = started_tx.send(Instant::now());
            Ok(())
        })
        .start()?;
    // Past the worker's first leases (found full) and into its waits.
    assert!(
        started.recv_timeout(Duration::from_millis(1500)).is_err(),
        "a job started while the other process held the limit's one place"
    );
    other.complete(&held[0], None)?;
    let freed = Instant::now();
    let start = started.recv_timeout(Duration::from_secs(5));
    worker.shutdown(Duration::from_secs(5))?;
    let late = start.map(|at| at.saturating_duration_since(freed));
    println!("limits_wake ({b:?}): started {late:?} after the place was freed");
    let late = late.map_err(|_| "the job did not start within 5 s of the place freed")?;
    assert!(
        late < Duration::from_secs(1),
        "the job started {late:?} after the place was freed"
    );
    Ok(())
}

conformance!(a_worker_takes_a_place_that_another_process_frees_within_a_second,);
