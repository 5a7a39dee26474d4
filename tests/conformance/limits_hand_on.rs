//! Places handed on: a worker whose threads would fill a queue's
//! concurrency limit holds no look-ahead, and its completer claims the next
//! jobs in the transaction that settles the last ones. On the servers the
//! places those settles free pass to that claim without the queue's row
//! lock (`crate::limits::lease_handing_on`); on SQLite the claim counts as
//! any other. Either way: never more than the limit at once, a lowered limit
//! honoured, a rate limit still counted, a paused queue not claimed.
//!
//! Each handler here waits for the scenario's go (`Gate`), so the jobs
//! running when the scenario changes a control are known exactly.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::{Event, NewJob, Queue, QueueLimits, Rate, Worker};
use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

use crate::harness::{Backend, TestResult};

const QUEUE: &str = "placed";

/// How long a scenario watches for a start that must not come: past the
/// servers' memory of the limits (`LIMITS_SEEN_WITHIN`, 1 s), so both a
/// stale and a fresh look are seen.
const WATCH: Duration = Duration::from_millis(1500);

fn concurrency(n: u32) -> QueueLimits {
    QueueLimits {
        concurrency: Some(n),
        rate: None,
    }
}

/// What the handlers share with the scenario.
#[derive(Default)]
struct Gate {
    /// Handlers hold until this is set.
    go: AtomicBool,
    /// Handlers running now.
    running: AtomicUsize,
    /// Set by the scenario when it changed a control; starts after it are
    /// watched.
    changed: AtomicBool,
    /// The most handlers running at once, counting from a start after the
    /// change (the jobs still running from before it included).
    most_after: AtomicUsize,
    /// The most handlers running at once, overall.
    most: AtomicUsize,
}

/// A worker of `threads` on `queue`'s jobs of kind `gated`: each handler
/// reports its start on the returned channel and waits for the go.
fn gated_worker(queue: &Queue, threads: usize) -> TestResult<(Worker, Arc<Gate>, Receiver<()>)> {
    let gate = Arc::new(Gate::default());
    let (started_tx, started_rx) = unbounded();
    let g = gate.clone();
    let worker = Worker::builder(queue.clone())
        .queues([QUEUE])
        .concurrency(threads)
        .poll_interval(Duration::from_millis(50))
        .handle_raw("gated", move |_: Value, _| {
            let now = g.running.fetch_add(1, Ordering::SeqCst) + 1;
            g.most.fetch_max(now, Ordering::SeqCst);
            if g.changed.load(Ordering::SeqCst) {
                g.most_after.fetch_max(now, Ordering::SeqCst);
            }
            let _ = started_tx.send(());
            while !g.go.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(2));
            g.running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
        .start()?;
    Ok((worker, gate, started_rx))
}

fn enqueue(queue: &Queue, n: usize) -> backlog::Result<()> {
    queue.enqueue_many((0..n).map(|i| NewJob::new("gated", json!(i)).queue(QUEUE)))?;
    Ok(())
}

/// Waits for `n` handler starts.
fn starts(rx: &Receiver<()>, n: usize) -> TestResult {
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(30))?;
    }
    Ok(())
}

/// Counts the completions seen within `within` of the subscription.
fn completions(events: &Receiver<Event>, within: Duration) -> usize {
    let until = Instant::now() + within;
    let mut n = 0;
    while let Ok(event) = events.recv_deadline(until) {
        if let Event::Completed { .. } = event {
            n += 1;
        }
    }
    n
}

fn a_worker_that_would_fill_a_limit_hands_its_places_on_and_never_runs_more(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    const LIMIT: u32 = 3;
    const JOBS: usize = 150;
    h.queue.set_limits(QUEUE, concurrency(LIMIT))?;
    enqueue(&h.queue, JOBS)?;
    let events = h.queue.subscribe();
    let (worker, gate, _started) = gated_worker(&h.queue, 4)?;
    gate.go.store(true, Ordering::SeqCst);
    let mut done = 0;
    while done < JOBS {
        if let Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            done += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    let most = gate.most.load(Ordering::SeqCst);
    println!("hand-on ({b:?}): limit {LIMIT}, 4 threads, {JOBS} jobs: at most {most} at once");
    assert!(most <= LIMIT as usize, "{most} ran at once");
    assert_eq!(
        most, LIMIT as usize,
        "the limit never filled: the test proves little"
    );
    Ok(())
}

fn a_lowered_limit_holds_back_the_places_handed_on(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.set_limits(QUEUE, concurrency(4))?;
    enqueue(&h.queue, 30)?;
    let events = h.queue.subscribe();
    let (worker, gate, started) = gated_worker(&h.queue, 4)?;
    starts(&started, 4)?;
    // From another handle, as an operator would: this process's memory of
    // the limits is not forgotten, and its claims must read the new limit.
    h.second_handle()?.set_limits(QUEUE, concurrency(1))?;
    gate.changed.store(true, Ordering::SeqCst);
    gate.go.store(true, Ordering::SeqCst);
    let mut done = 0;
    while done < 30 {
        if let Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            done += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    let most = gate.most_after.load(Ordering::SeqCst);
    assert_eq!(
        most,
        1,
        "a job started while {} ran, under a limit lowered to 1",
        most.saturating_sub(1)
    );
    Ok(())
}

fn a_rate_limit_set_meanwhile_still_counts_the_starts_of_places_handed_on(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    h.queue.set_limits(QUEUE, concurrency(2))?;
    enqueue(&h.queue, 20)?;
    let (worker, gate, started) = gated_worker(&h.queue, 2)?;
    starts(&started, 2)?;
    // Another handle adds a rate limit: the manual clock stays in this
    // window, which allows 2 starts; this process still remembers the queue
    // as limited by concurrency alone for up to a second.
    h.second_handle()?.set_limits(
        QUEUE,
        QueueLimits {
            concurrency: Some(2),
            rate: Some(Rate::per_hour(2)),
        },
    )?;
    let events = h.queue.subscribe();
    gate.go.store(true, Ordering::SeqCst);
    let done = completions(&events, WATCH);
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(
        done, 4,
        "2 jobs running when the rate limit came, then 2 starts in its window"
    );
    Ok(())
}

fn a_paused_queue_gets_no_places_handed_on(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.set_limits(QUEUE, concurrency(2))?;
    enqueue(&h.queue, 20)?;
    let (worker, gate, started) = gated_worker(&h.queue, 2)?;
    starts(&started, 2)?;
    h.second_handle()?.pause(QUEUE)?;
    let events = h.queue.subscribe();
    gate.go.store(true, Ordering::SeqCst);
    let done = completions(&events, WATCH);
    assert_eq!(done, 2, "only the 2 jobs running when the queue was paused");
    h.queue.resume(QUEUE)?;
    let mut more = 0;
    while more < 18 {
        if let Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            more += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

conformance!(
    a_worker_that_would_fill_a_limit_hands_its_places_on_and_never_runs_more,
    a_lowered_limit_holds_back_the_places_handed_on,
    a_rate_limit_set_meanwhile_still_counts_the_starts_of_places_handed_on,
    a_paused_queue_gets_no_places_handed_on,
);
