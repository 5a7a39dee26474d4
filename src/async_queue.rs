//! The calls an async service makes — enqueue, get, wait for a result,
//! cancel — as futures that never block the caller's threads and need no
//! particular runtime (feature `async`).
//!
//! An [`AsyncQueue`] hands each call to a small pool of backlog's own
//! threads, which run the queue's ordinary blocking call and complete the
//! call's future through a one-shot channel. Any executor polls it: tokio,
//! async-std, smol, `futures::executor::block_on`. Nothing of a runtime is
//! linked.
//!
//! ```no_run
//! use std::time::Duration;
//! use backlog::async_queue::AsyncQueue;
//! use backlog::{NewJob, Queue};
//! use serde_json::json;
//!
//! # async fn handler() -> backlog::Result<()> {
//! let queue = AsyncQueue::new(Queue::connect("postgres://app@db.example/app")?)?;
//! let job = queue.enqueue(NewJob::new("resize", json!({"image": 7}))).await?;
//! let record = queue.wait(job.id, Duration::from_secs(30)).await?;
//! println!("{:?}", record.result);
//! # Ok(())
//! # }
//! ```
//!
//! ## The pool's bound
//!
//! At most [`AsyncOptions::threads`] calls run at once (default
//! [`DEFAULT_THREADS`]); up to [`AsyncOptions::line`] more wait in line
//! (default [`DEFAULT_LINE`]), in the order they were made. A call made when
//! the line is full is not queued: its future is ready at once with
//! [`Error::Busy`], and nothing was done (no job enqueued). So the memory a
//! burst takes is bounded, and a caller that sees `Busy` sheds load or
//! retries later.
//!
//! An [`AsyncQueue::wait`] holds one thread until the job finishes or its
//! timeout passes, so `threads` is also how many waits make progress at
//! once: size it for the waits you expect together plus a few for the
//! other calls. Each call, once running, is bounded as its blocking form is
//! (the queue's write deadline; `wait`'s timeout). Its time in line is
//! bounded by the calls ahead of it. On PostgreSQL and MySQL the threads
//! share the queue's [`pool_size`](crate::QueueOptions::pool_size)
//! connections: a call waits for one as its blocking form does; a `wait`
//! holds none between its looks.
//!
//! A call starts when it is made, not when its future is first polled: the
//! future only carries its answer back. Dropping a future does not undo its
//! call: an enqueue already handed to the pool still commits. A dropped
//! `wait` gives its thread back within [`WAIT_SLICE`].

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use futures_channel::oneshot;

use crate::error::{Error, Result};
use crate::inspect::{CancelOutcome, JobRecord};
use crate::job::{Enqueued, IntoNewJob, NewJob};
use crate::queue::Queue;

/// Threads of an [`AsyncQueue`]'s pool unless [`AsyncOptions::threads`]
/// says otherwise.
pub const DEFAULT_THREADS: usize = 16;

/// Calls that may wait in line for a thread unless [`AsyncOptions::line`]
/// says otherwise.
pub const DEFAULT_LINE: usize = 1024;

/// The most threads a pool may have.
pub const MAX_THREADS: usize = 1024;

/// How often a running `wait` checks whether its future was dropped.
pub const WAIT_SLICE: Duration = Duration::from_secs(1);

/// The size of an [`AsyncQueue`]'s pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncOptions {
    threads: usize,
    line: usize,
}

impl Default for AsyncOptions {
    fn default() -> Self {
        AsyncOptions {
            threads: DEFAULT_THREADS,
            line: DEFAULT_LINE,
        }
    }
}

impl AsyncOptions {
    /// How many calls run at once, 1 to [`MAX_THREADS`]; each is a thread
    /// of backlog's own (`backlog-async-N`), started with the pool.
    /// Defaults to [`DEFAULT_THREADS`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// How many calls may wait in line for a thread; a call beyond that is
    /// answered [`Error::Busy`] at once. Zero: only as many calls as
    /// threads are taken at once. Defaults to [`DEFAULT_LINE`].
    pub fn line(mut self, line: usize) -> Self {
        self.line = line;
        self
    }
}

/// One call for a pool thread.
type Task = Box<dyn FnOnce() + Send>;

/// The pool's sending side; its threads stop when the last clone of the
/// [`AsyncQueue`] is dropped and the calls in line have run.
#[derive(Debug)]
struct Pool {
    tasks: Sender<Task>,
    /// Calls taken and not yet finished: running or in line.
    taken: Arc<AtomicUsize>,
    /// Threads plus line: the most calls taken at once.
    limit: usize,
}

/// A [`Queue`] whose calls are futures. Cheap to clone: clones share the
/// queue and the pool.
#[derive(Debug, Clone)]
pub struct AsyncQueue {
    queue: Queue,
    pool: Arc<Pool>,
}

impl AsyncQueue {
    /// Wraps `queue` with a pool of the default size ([`DEFAULT_THREADS`]
    /// threads, [`DEFAULT_LINE`] calls in line).
    pub fn new(queue: Queue) -> Result<AsyncQueue> {
        AsyncQueue::with_options(queue, AsyncOptions::default())
    }

    /// Wraps `queue` with a pool of `options`' size.
    /// [`Error::InvalidArgument`] for zero threads or more than
    /// [`MAX_THREADS`]; an error when the operating system refuses a thread.
    pub fn with_options(queue: Queue, options: AsyncOptions) -> Result<AsyncQueue> {
        if options.threads == 0 || options.threads > MAX_THREADS {
            return Err(Error::InvalidArgument(format!(
                "an async pool needs 1 to {MAX_THREADS} threads, not {}",
                options.threads
            )));
        }
        // `taken` counts calls running or in line; the channel holds as
        // many, so a call `taken` admits always fits.
        let limit = options.threads.saturating_add(options.line);
        let (tasks, line) = crossbeam_channel::bounded::<Task>(limit);
        let taken = Arc::new(AtomicUsize::new(0));
        for n in 0..options.threads {
            let line = line.clone();
            let taken = taken.clone();
            thread::Builder::new()
                .name(format!("backlog-async-{n}"))
                .spawn(move || {
                    for task in line {
                        task(); // never unwinds: the call runs under catch_unwind
                        taken.fetch_sub(1, Ordering::AcqRel);
                    }
                })
                .map_err(|e| Error::Worker(format!("cannot start an async pool thread: {e}")))?;
        }
        Ok(AsyncQueue {
            queue,
            pool: Arc::new(Pool {
                tasks,
                taken,
                limit,
            }),
        })
    }

    /// The queue, for the calls not offered here.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// [`Queue::enqueue`] as a future. The job is converted and encoded on
    /// the caller's thread (an invalid one is refused at once), then
    /// inserted on the pool.
    pub fn enqueue(&self, job: impl IntoNewJob) -> Call<Enqueued> {
        match job.into_new_job() {
            Ok(job) => self.call(move |queue| queue.enqueue(job)),
            Err(e) => Call::ready(Err(e)),
        }
    }

    /// [`Queue::enqueue_many`] as a future: all the jobs in one transaction.
    pub fn enqueue_many<J: IntoNewJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
    ) -> Call<Vec<Enqueued>> {
        match jobs
            .into_iter()
            .map(IntoNewJob::into_new_job)
            .collect::<Result<Vec<NewJob>>>()
        {
            Ok(jobs) => self.call(move |queue| queue.enqueue_many(jobs)),
            Err(e) => Call::ready(Err(e)),
        }
    }

    /// [`Queue::get`] as a future.
    pub fn get(&self, id: i64) -> Call<JobRecord> {
        self.call(move |queue| queue.get(id))
    }

    /// [`Queue::wait`] as a future: ready when job `id` has finished,
    /// whichever process ran it, or with [`Error::Timeout`] after `timeout`.
    /// It holds one pool thread meanwhile (see the module's "The pool's
    /// bound").
    pub fn wait(&self, id: i64, timeout: Duration) -> Call<JobRecord> {
        let deadline = Instant::now().checked_add(timeout);
        self.call_watching(move |queue, dropped| loop {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            match queue.wait(id, left.min(WAIT_SLICE)) {
                Err(Error::Timeout { .. }) if left > WAIT_SLICE && !dropped() => continue,
                other => return other,
            }
        })
    }

    /// [`Queue::cancel`] as a future.
    pub fn cancel(&self, id: i64) -> Call<CancelOutcome> {
        self.call(move |queue| queue.cancel(id))
    }

    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Queue) -> Result<T> + Send + 'static,
    ) -> Call<T> {
        self.call_watching(move |queue, _| f(queue))
    }

    /// Hands `f` to the pool; `f` may ask whether its future was dropped.
    fn call_watching<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Queue, &dyn Fn() -> bool) -> Result<T> + Send + 'static,
    ) -> Call<T> {
        let (done, answer) = oneshot::channel::<Result<T>>();
        let queue = self.queue.clone();
        let task: Task = Box::new(move || {
            if done.is_canceled() {
                return; // dropped while in line: nothing to do for it
            }
            let dropped = || done.is_canceled();
            let result = catch_unwind(AssertUnwindSafe(|| f(&queue, &dropped)))
                .unwrap_or_else(|_| Err(Error::Worker("an async call panicked".into())));
            // The caller may have dropped the future: then nobody listens.
            let _ = done.send(result);
        });
        let pool = &self.pool;
        if pool.taken.fetch_add(1, Ordering::AcqRel) >= pool.limit {
            pool.taken.fetch_sub(1, Ordering::AcqRel);
            return Call::ready(Err(Error::Busy));
        }
        match pool.tasks.try_send(task) {
            Ok(()) => Call {
                state: State::Pending(answer),
            },
            Err(e) => {
                pool.taken.fetch_sub(1, Ordering::AcqRel);
                Call::ready(Err(match e {
                    TrySendError::Full(_) => Error::Busy,
                    TrySendError::Disconnected(_) => {
                        Error::Worker("the async pool has stopped".into())
                    }
                }))
            }
        }
    }
}

/// A call of an [`AsyncQueue`]: a future of its result.
#[derive(Debug)]
#[must_use = "a call's result is known only by awaiting it"]
pub struct Call<T> {
    state: State<T>,
}

#[derive(Debug)]
enum State<T> {
    Ready(Option<Result<T>>),
    Pending(oneshot::Receiver<Result<T>>),
}

// No field is structurally pinned: a call moves freely, whatever `T`.
impl<T> Unpin for Call<T> {}

impl<T> Call<T> {
    fn ready(result: Result<T>) -> Self {
        Call {
            state: State::Ready(Some(result)),
        }
    }
}

impl<T> Future for Call<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        // No field is pinned: `oneshot::Receiver` is `Unpin`.
        let this = self.get_mut();
        match &mut this.state {
            State::Ready(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(Error::InvalidArgument(
                    "a call polled after it completed".into(),
                ))
            })),
            State::Pending(answer) => match Pin::new(answer).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(result)) => Poll::Ready(result),
                Poll::Ready(Err(oneshot::Canceled)) => {
                    Poll::Ready(Err(Error::Worker("the async pool dropped the call".into())))
                }
            },
        }
    }
}
