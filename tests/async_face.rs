//! `backlog::async_queue`: enqueue, get, wait and cancel as futures, polled
//! here by a dozen-line executor of the test's own (no runtime crate), on
//! SQLite, PostgreSQL and MariaDB through the conformance harness.
//!
//! `cargo test --features async,postgres,mysql --test async_face`

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use backlog::async_queue::{AsyncOptions, AsyncQueue, Call};
use backlog::{CancelOutcome, Error, FinalStatus, JobState, NewJob, QueueOptions, Worker};
use serde_json::json;

use harness::{Backend, TestResult};

conformance!(
    an_async_wait_completes_when_another_handle_finishes_the_job,
    waits_run_together_up_to_the_pool_and_a_full_line_is_busy,
    a_dropped_wait_gives_its_thread_back,
    get_cancel_and_bad_input_through_the_async_face,
);

/// Wakes the polling thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn waker() -> Waker {
    Waker::from(Arc::new(Unpark(thread::current())))
}

/// Polls `future` on this thread until it is ready, parking between wakes.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = waker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

/// Polls every call on this one thread until all are ready or `limit`
/// passes; `None` for a call still pending then.
fn join_all<T>(mut calls: Vec<Call<T>>, limit: Duration) -> Vec<Option<backlog::Result<T>>> {
    let waker = waker();
    let mut cx = Context::from_waker(&waker);
    let mut out: Vec<Option<backlog::Result<T>>> = calls.iter().map(|_| None).collect();
    let start = Instant::now();
    while out.iter().any(Option::is_none) && start.elapsed() < limit {
        for (call, slot) in calls.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                if let Poll::Ready(r) = Pin::new(call).poll(&mut cx) {
                    *slot = Some(r);
                }
            }
        }
        thread::park_timeout(Duration::from_millis(20));
    }
    out
}

/// One poll: whether the call is still pending (it never blocks to answer).
fn pending<T>(call: &mut Call<T>) -> bool {
    let waker = waker();
    Pin::new(call)
        .poll(&mut Context::from_waker(&waker))
        .is_pending()
}

/// The job is enqueued and awaited through the async face; a worker on
/// another handle (its own connections: another node) runs it.
fn an_async_wait_completes_when_another_handle_finishes_the_job(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let queue = AsyncQueue::new(h.queue.clone())?;
    let worker = Worker::builder(h.handle_with(QueueOptions::new())?)
        .poll_interval(Duration::from_millis(20))
        .handle_raw("double", |payload, _| {
            Ok(json!(payload.as_i64().unwrap_or(0) * 2))
        })
        .start()?;
    let id = block_on(queue.enqueue(NewJob::new("double", json!(21))))?.id;
    let record = block_on(queue.wait(id, Duration::from_secs(10)))?;
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(record.result.as_deref(), Some("42"));
    Ok(())
}

/// Two threads, one place in line. Two waits hold both threads; a `get`
/// waits in line (its future stays pending, the caller is not blocked);
/// a further call is `Busy` at once and did nothing. When another handle
/// finishes the jobs, both waits and the `get` complete.
fn waits_run_together_up_to_the_pool_and_a_full_line_is_busy(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let options = AsyncOptions::default().threads(2).line(1);
    let queue = AsyncQueue::with_options(h.queue.clone(), options)?;
    let ids: Vec<i64> = (0..2)
        .map(|i| Ok(h.queue.enqueue(NewJob::new("k", json!(i)))?.id))
        .collect::<TestResult<_>>()?;

    let mut waits: Vec<Call<backlog::JobRecord>> = ids
        .iter()
        .map(|&id| queue.wait(id, Duration::from_secs(30)))
        .collect();
    // Both waits have a thread once neither is in line any more.
    thread::sleep(Duration::from_millis(200));
    for wait in &mut waits {
        let waker = waker();
        let polled = Pin::new(wait).poll(&mut Context::from_waker(&waker));
        assert!(
            polled.is_pending(),
            "the jobs have not finished: {polled:?}"
        );
    }
    let mut in_line = queue.get(ids[0]);
    thread::sleep(Duration::from_millis(300));
    assert!(
        pending(&mut in_line),
        "both threads are waiting: the get waits in line"
    );
    let before = h.live_rows()?;
    let mut refused = queue.enqueue(NewJob::new("k", json!("refused")));
    assert!(matches!(block_on(&mut refused), Err(Error::Busy)));
    assert_eq!(h.live_rows()?, before, "a refused call did nothing");

    let worker = Worker::builder(h.handle_with(QueueOptions::new())?)
        .poll_interval(Duration::from_millis(20))
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    waits.push(in_line);
    let results = join_all(waits, Duration::from_secs(15));
    worker.shutdown(Duration::from_secs(5))?;
    for r in results {
        let record = r.ok_or("a call never completed")??;
        assert!(ids.contains(&record.id));
    }
    Ok(())
}

/// One thread: a wait dropped before its job finishes gives the thread back
/// (within `WAIT_SLICE`), and the next call runs.
fn a_dropped_wait_gives_its_thread_back(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let queue = AsyncQueue::with_options(h.queue.clone(), AsyncOptions::default().threads(1))?;
    let id = h.queue.enqueue(NewJob::new("k", json!(1)))?.id;
    let mut wait = queue.wait(id, Duration::from_secs(3600));
    thread::sleep(Duration::from_millis(100));
    assert!(pending(&mut wait));
    drop(wait);
    let got = join_all(vec![queue.get(id)], Duration::from_secs(10));
    let record = got
        .into_iter()
        .next()
        .flatten()
        .ok_or("the get never ran: the dropped wait kept the thread")??;
    assert_eq!(record.id, id);
    Ok(())
}

/// `get` and `cancel` answer as their blocking forms; an invalid job is
/// refused at once and nothing is enqueued; a pool of zero threads is an
/// invalid argument.
fn get_cancel_and_bad_input_through_the_async_face(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let queue = AsyncQueue::new(h.queue.clone())?;
    let id = block_on(queue.enqueue(NewJob::new("k", json!(1))))?.id;
    assert_eq!(block_on(queue.get(id))?.state, JobState::Available);
    assert_eq!(block_on(queue.cancel(id))?, CancelOutcome::Cancelled);
    assert_eq!(
        block_on(queue.get(id))?.state,
        JobState::Finished(FinalStatus::Cancelled)
    );
    assert!(matches!(
        block_on(queue.get(id + 1000)),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        block_on(queue.enqueue(NewJob::new("", json!(1)))),
        Err(Error::InvalidName { .. })
    ));
    let many = block_on(queue.enqueue_many((0..3).map(|i| NewJob::new("k", json!(i)))))?;
    assert_eq!(many.len(), 3);
    assert_eq!(h.live_rows()?, 3);
    assert!(matches!(
        AsyncQueue::with_options(h.queue.clone(), AsyncOptions::default().threads(0)),
        Err(Error::InvalidArgument(_))
    ));
    Ok(())
}
