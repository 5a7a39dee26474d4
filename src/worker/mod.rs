//! The worker runtime: register handlers, start a [`Worker`], and jobs flow.
//!
//! ```
//! use std::time::Duration;
//! use backlog::{Event, JobArgs, JobError, Queue, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//!
//! impl JobArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let queue = Queue::open(dir.path().join("app.db"))?;
//! let events = queue.subscribe();
//! queue.enqueue(SendEmail { to: "a@b.c".into() })?;
//!
//! let worker = Worker::builder(queue.clone())
//!     .concurrency(4)
//!     .handle(|args: SendEmail, _ctx| {
//!         if args.to.is_empty() {
//!             return Err(JobError::discard("no recipient"));
//!         }
//!         Ok(format!("sent to {}", args.to)) // stored as the job's result
//!     })
//!     .start()?;
//!
//! // The worker runs on its own threads; wait here until the job completed.
//! while !matches!(events.recv_timeout(Duration::from_secs(10))?, Event::Completed { .. }) {}
//! worker.shutdown(Duration::from_secs(5))?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Threads
//!
//! One worker runs, all named so they show in a debugger:
//!
//! - `backlog-fetch`: leases no more jobs than there are free handler threads
//!   plus a look-ahead: as many as the threads finish within 20 ms of
//!   measured handler time, at most 128 (or a fixed
//!   [prefetch](WorkerBuilder::prefetch)), and hands them over a bounded
//!   channel. It wakes on an enqueue in this
//!   process, on another process's commit (a file notification, then
//!   `PRAGMA data_version`; see [watch interval](WorkerBuilder::watch_interval)),
//!   on a freed handler thread, when the next scheduled job comes due, or on
//!   an idle poll that backs off to the
//!   [poll interval](WorkerBuilder::poll_interval). Idle, it sleeps.
//! - `backlog-exec-N`: the handler threads. A panic is caught and recorded as
//!   a failed attempt; the thread goes on.
//! - `backlog-complete`: applies outcomes in batches, one transaction each.
//! - `backlog-heartbeat`: extends every held lease in one statement per tick;
//!   sets the cancellation flag of jobs whose lease was lost, whose cancel was
//!   requested, or whose timeout passed; refreshes the worker's row in the
//!   [worker registry](registry) and warns about due jobs no live worker
//!   handles.
//! - `backlog-maint`: rescues expired leases, prunes history and the rows of
//!   workers gone without a shutdown, checkpoints the WAL when idle. Safe to
//!   run in many processes on one file.
//!
//! ## Outcomes
//!
//! A handler returns `Ok(output)` (stored as the result) or a [`JobError`]:
//! retry by the policy (any error, with `?`), retry after a delay, snooze
//! (no attempt used), discard, or cancel. A payload that does not decode into
//! the handler's argument type sends the job to `dead` at once. A handler that
//! commits its effects with `ctx.transaction(..)` (`backlog::sqlite::JobContextExt`) completes the job in
//! the same transaction, exactly once.
//!
//! ## Shutdown
//!
//! [`Worker::shutdown`] stops leasing, lets running jobs finish within the
//! grace period, then sets the cancellation flags of the rest and releases
//! them (available at once, no attempt used), flushes the completer and joins
//! the threads. Dropping a worker does the same with the configured
//! [shutdown grace](WorkerBuilder::shutdown_grace).

mod aggregator;
mod builder;
mod completer;
mod context;
mod error;
mod executor;
mod fetcher;
mod handler;
mod heartbeater;
mod inflight;
mod lookahead;
mod maintenance;
pub mod registry;

pub use builder::{WorkerBuilder, DEFAULT_CONCURRENCY, MAX_CONCURRENCY, MAX_PREFETCH};
pub(crate) use context::to_result;
pub use context::{CancelReason, JobContext};
pub use error::{Action, JobError};
pub(crate) use executor::run_handler;
pub use lookahead::{CAP as LOOKAHEAD_CAP, HORIZON as LOOKAHEAD_HORIZON};
pub use registry::{RunningJob, UnhandledJobs, WorkerInfo, EXPIRY_HEARTBEATS};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::error::{Error, Result};
use crate::lease::{self, LeaseRequest};
use crate::outcome::Outcome;
use crate::queue::Queue;
use crate::sync;
use aggregator::Aggregator;
use builder::Config;
use completer::{Completer, Settle};
use executor::Executor;
use fetcher::Fetcher;
use handler::Handlers;
use heartbeater::Heartbeater;
use inflight::InFlight;
use lookahead::LookAhead;
use maintenance::Maintenance;

/// After the grace period, how long shutdown waits for flagged handlers to
/// return before leaving them running on detached threads.
const CANCELLED_HANDLER_WAIT: Duration = Duration::from_millis(250);

/// How long [`Worker::shutdown`] may take beyond its grace period (400 ms):
/// flagged handlers get a quarter of a second to return while the completer
/// commits what the grace period left, and the completer gives up 100 ms
/// before the end.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_millis(400);

/// The part of the shutdown margin the completer keeps for returning after
/// it gave up on what another process's lock kept it from committing.
const COMPLETER_WRAP_UP: Duration = Duration::from_millis(100);

/// What [`Worker::shutdown`] could not do within its bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Jobs whose outcome or release could not be committed (another
    /// process held the write lock, the database was unreachable, a handler
    /// ignored its cancellation): their leases expire and the rescuer makes
    /// them available again.
    pub unsettled: usize,
}

/// Per queue, how many more of its jobs a lease may claim.
pub(crate) type QueueCaps = Vec<(String, usize)>;

/// What the worker's threads share.
pub(crate) struct Shared {
    pub queue: Queue,
    pub config: Config,
    pub handlers: Handlers,
    pub inflight: InFlight,
    /// Slots (handler threads plus prefetch, or plus the look-ahead's cap)
    /// not holding a job: neither running one nor with one waiting in the
    /// channel. Only [`Shared::claimable`] of them may be filled now.
    pub free: AtomicUsize,
    /// The measured handler time that sizes the look-ahead.
    pub lookahead: LookAhead,
    /// Set when shutdown begins: no new leases, queued jobs are released.
    pub stopping: AtomicBool,
    /// Outcomes handed to the completer and not yet committed. Without a
    /// look-ahead the completer refills the slots of the jobs it settles in
    /// the same transaction, so the fetcher leaves free slots to it while
    /// this is not zero.
    pub settling: AtomicUsize,
    /// Outcomes the completer gave up on (their leases expire; the rescuer
    /// frees the jobs): counted for [`ShutdownReport::unsettled`].
    pub unsettled: AtomicUsize,
    /// Handler threads working on a job right now: when none is, no outcome
    /// is on its way and the completer commits at once.
    pub busy: AtomicUsize,
    /// The completer's way to hand the jobs it leased to the handler
    /// threads; taken (dropped) when shutdown begins, so the threads end.
    pub handoff: std::sync::Mutex<Option<Sender<fetcher::Run>>>,
    /// Held from counting a capped queue's jobs to handing the leased ones
    /// over, so the fetcher and the completer never both fill one cap.
    pub lease_gate: std::sync::Mutex<()>,
    /// Read by every lease from its call until its jobs are in `inflight`;
    /// written by [`Shared::release_unheld_if_lost`], so that a lease on its
    /// way, whose jobs are not held yet, never has them released.
    pub leasing: std::sync::RwLock<()>,
    /// Set when a lease failed for want of the server: its commit may have
    /// reached the server and leased jobs this worker never got. Cleared
    /// once [`Shared::release_unheld_if_lost`] gave them back.
    pub lease_answer_lost: AtomicBool,
}

impl Shared {
    /// Jobs held beyond the handler threads that this worker may hold now:
    /// the prefetch, or the look-ahead from the measured handler time.
    pub(crate) fn ahead(&self) -> usize {
        match self.config.prefetch {
            Some(prefetch) => prefetch,
            None => self.lookahead.depth(),
        }
    }

    /// The free slots that may be filled now, given `free`: the slots beyond
    /// the threads and the current look-ahead stay empty.
    fn claimable_of(&self, free: usize) -> usize {
        let unused = self.config.slots() - self.config.concurrency - self.ahead();
        free.saturating_sub(unused)
    }

    /// How many jobs a lease may take now.
    pub(crate) fn claimable(&self) -> usize {
        self.claimable_of(self.free.load(Ordering::SeqCst))
    }

    /// How many slots must be claimable before the fetcher leases: one
    /// without a look-ahead; with a prefetch, the prefetch (each lease
    /// carries at least that many jobs while those held keep the threads
    /// busy); with the adaptive look-ahead, half of it, so the threads never
    /// run dry while a lease is on its way.
    pub(crate) fn refill_at(&self) -> usize {
        match self.config.prefetch {
            Some(prefetch) => prefetch.max(1),
            None => (self.lookahead.depth() / 2).max(1),
        }
    }

    /// Claims the slots that may be filled now; the caller gives back what
    /// it does not fill with [`Shared::give_back`].
    pub(crate) fn claim_slots(&self) -> usize {
        let mut claimed = 0;
        let _ = self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| {
                claimed = self.claimable_of(free);
                Some(free - claimed)
            });
        claimed
    }

    /// Hands an outcome to the completer, counted in
    /// [`Shared::settling`] until it is committed.
    pub(crate) fn settle(&self, outcomes: &Sender<Settle>, job: Arc<lease::Job>, outcome: Outcome) {
        self.settling.fetch_add(1, Ordering::SeqCst);
        if outcomes.send(Settle::Apply(job, outcome)).is_err() {
            self.settling.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// With per-queue caps ([`WorkerBuilder::queue_concurrency`]): the lease
    /// gate, to hold until the leased jobs are in [`Shared::inflight`], and
    /// what each cap leaves free now. `None` without caps.
    pub(crate) fn queue_caps(&self) -> Option<(std::sync::MutexGuard<'_, ()>, QueueCaps)> {
        if self.config.queue_concurrency.is_empty() {
            return None;
        }
        let gate = sync::lock(&self.lease_gate);
        let caps = self
            .config
            .queue_concurrency
            .iter()
            .map(|(q, n)| (q.clone(), n.saturating_sub(self.inflight.held_of(q))))
            .collect();
        Some((gate, caps))
    }

    /// Taken by a lease from its call until its jobs are in `inflight`
    /// (see [`Shared::leasing`]).
    pub(crate) fn lease_on_its_way(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        sync::read(&self.leasing)
    }

    /// Notes a lease that failed: when the server could not be reached, its
    /// commit may have happened with only the answer lost.
    pub(crate) fn lease_failed(&self, error: &Error) {
        if completer::is_unreachable(error) {
            self.lease_answer_lost.store(true, Ordering::SeqCst);
        }
    }

    /// After a lease's answer may have been lost, gives back the jobs leased
    /// under this worker's id that it does not hold, so they run at once
    /// instead of after lease expiry and the rescuer. Only while no lease of
    /// this worker is on its way (else at the next call); on failure (the
    /// server still away) the next call tries again.
    pub(crate) fn release_unheld_if_lost(&self) {
        if !self.lease_answer_lost.load(Ordering::SeqCst) {
            return;
        }
        let Ok(_leasing) = self.leasing.try_write() else {
            return;
        };
        self.lease_answer_lost.store(false, Ordering::SeqCst);
        let held = self.inflight.ids();
        match self.queue.release_unheld(&self.config.worker_id, &held) {
            Ok(released) if !released.is_empty() => tracing::warn!(
                jobs = released.len(),
                job_ids = ?released,
                "a lease's answer was lost with the connection; released the jobs \
                 it leased for this worker, which never got them"
            ),
            Ok(_) => {}
            Err(error) => {
                self.lease_answer_lost.store(true, Ordering::SeqCst);
                tracing::debug!(
                    %error,
                    "could not release the jobs of a lease whose answer was lost yet; \
                     trying again later"
                );
            }
        }
    }

    /// Frees `n` claimed slots.
    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            self.free.fetch_add(n, Ordering::SeqCst);
        }
    }

    /// Whether the completer refills freed slots (no look-ahead now: each
    /// lease holds no more jobs than there are free threads, and a settle's
    /// commit carries the next lease).
    pub(crate) fn completer_refills(&self) -> bool {
        self.ahead() == 0
    }
}

/// A running pool of handler threads leasing jobs from a [`Queue`].
///
/// Made with [`Worker::builder`]. Stop it with [`Worker::shutdown`]; dropping
/// it shuts it down with the configured
/// [shutdown grace](WorkerBuilder::shutdown_grace) (10 seconds by default),
/// blocking the dropping thread meanwhile.
#[derive(Debug)]
pub struct Worker {
    id: String,
    grace: Duration,
    running: Option<Running>,
    /// The schedules given to `WorkerBuilder::periodic`, stopped first.
    scheduler: Option<crate::periodic::Scheduler>,
}

/// The threads and the channels that stop them.
struct Running {
    shared: Arc<Shared>,
    /// Dropped to stop the fetcher.
    stop_fetch: Option<Sender<()>>,
    /// Dropped to stop the heartbeater and maintenance.
    stop_background: Option<Sender<()>>,
    outcomes: Sender<Settle>,
    /// Disconnects once every handler thread has ended.
    executors_alive: Receiver<()>,
    fetcher: Option<JoinHandle<()>>,
    executors: Vec<JoinHandle<()>>,
    completer: Option<JoinHandle<()>>,
    heartbeater: Option<JoinHandle<()>>,
    maintenance: Option<JoinHandle<()>>,
    aggregator: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("handlers", &self.shared.handlers)
            .field("threads", &self.executors.len())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts configuring a worker on `queue`. Register handlers, then
    /// [`WorkerBuilder::start`].
    pub fn builder(queue: Queue) -> WorkerBuilder {
        WorkerBuilder::new(queue)
    }

    /// The name this worker's leases are recorded under.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops the worker: no more leases; running jobs get up to `grace` to
    /// finish; then the rest have their cancellation flag set and are
    /// released (available at once, no attempt used) for the next worker; the
    /// completer flushes every outcome; the threads are joined.
    ///
    /// A handler cannot be interrupted: one still running a quarter of a
    /// second after the grace period (it ignores [`JobContext::is_cancelled`]) is left on its
    /// detached thread. Its job was released, so nothing it returns or
    /// commits with `ctx.transaction(..)` is applied (`LeaseLost`).
    ///
    /// **Bound**: it returns within `grace` plus [`SHUTDOWN_MARGIN`] (400 ms),
    /// even while another process holds the SQLite file's write lock. What
    /// could not be settled by then (a release or an outcome that could not
    /// commit) is left to lease expiry and the rescuer, and counted in
    /// [`ShutdownReport::unsettled`]; a thread still inside a database call
    /// then is left to finish on its own.
    ///
    /// Errors only if one of the worker's own threads panicked.
    pub fn shutdown(mut self, grace: Duration) -> Result<ShutdownReport> {
        self.stop(grace)
    }

    pub(crate) fn start(queue: Queue, handlers: Handlers, config: Config) -> Result<Worker> {
        let watcher = queue.watch_changes(config.watch_interval)?;
        let request = LeaseRequest {
            queues: config.queues.clone(),
            kinds: Some(handlers.kinds()),
            limit: config.slots(),
            worker_id: config.worker_id.clone(),
            ttl: config.lease_ttl,
            queue_caps: Vec::new(),
        };
        let slots = config.slots();
        // Listed from the moment `start` returns; refreshed by the
        // heartbeat thread, which retries a registration that failed here.
        let registration = registry::Registration::new(
            &queue,
            &config.worker_id,
            &config.queues,
            &handlers.kinds(),
            config.concurrency,
            config.heartbeat_interval,
        );
        registration.beat(&queue);
        let shared = Arc::new(Shared {
            queue,
            handlers,
            inflight: InFlight::default(),
            free: AtomicUsize::new(slots),
            lookahead: LookAhead::new(config.concurrency),
            stopping: AtomicBool::new(false),
            settling: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            unsettled: AtomicUsize::new(0),
            handoff: std::sync::Mutex::new(None),
            lease_gate: std::sync::Mutex::new(()),
            leasing: std::sync::RwLock::new(()),
            lease_answer_lost: AtomicBool::new(false),
            config,
        });
        Self::spawn(shared, request, watcher, registration)
    }
}

impl Worker {
    /// Spawns the threads. If one cannot be spawned, the ones already running
    /// are stopped and the error returned.
    fn spawn(
        shared: Arc<Shared>,
        request: LeaseRequest,
        watcher: crate::backend::ChangeWatcher,
        registration: registry::Registration,
    ) -> Result<Worker> {
        let concurrency = shared.config.concurrency;
        let slots = shared.config.slots();
        let (stop_fetch, stop_fetch_rx) = bounded::<()>(0);
        let (stop_background, stop_background_rx) = bounded::<()>(0);
        // Each leased job produces one message; twice the slots leaves room
        // for outcomes waiting while the fetcher refills the slots.
        let (outcomes, outcomes_rx) = bounded::<Settle>(2 * slots);
        let (jobs, jobs_rx) = bounded(slots);
        let (slot_freed, slot_freed_rx) = bounded::<()>(1);
        let (deadline_set, deadline_set_rx) = bounded::<()>(1);
        let (alive, executors_alive) = bounded::<()>(0);
        let doorbell = shared.queue.doorbell();

        let mut worker = Worker {
            id: shared.config.worker_id.clone(),
            grace: shared.config.shutdown_grace,
            scheduler: None,
            running: Some(Running {
                shared: shared.clone(),
                stop_fetch: Some(stop_fetch),
                stop_background: Some(stop_background),
                outcomes: outcomes.clone(),
                executors_alive,
                fetcher: None,
                executors: Vec::with_capacity(concurrency),
                completer: None,
                heartbeater: None,
                maintenance: None,
                aggregator: None,
            }),
        };
        let result = (|| -> Result<()> {
            let Some(running) = worker.running.as_mut() else {
                return Ok(());
            };
            *sync::lock(&shared.handoff) = Some(jobs.clone());
            let completer = Completer {
                shared: shared.clone(),
                outcomes: outcomes_rx,
                refill: request.clone(),
                slot_freed: slot_freed.clone(),
            };
            running.completer = Some(spawn("backlog-complete".into(), move || completer.run())?);
            let heartbeater = Heartbeater {
                shared: shared.clone(),
                stop: stop_background_rx.clone(),
                deadline_set: deadline_set_rx,
                registration,
            };
            running.heartbeater = Some(spawn("backlog-heartbeat".into(), move || {
                heartbeater.run()
            })?);
            if !shared.handlers.grouped.is_empty() {
                let aggregator = Aggregator {
                    shared: shared.clone(),
                    stop: stop_background_rx.clone(),
                    doorbell: shared.queue.doorbell(),
                    watcher: shared.queue.watch_changes(shared.config.watch_interval)?,
                };
                running.aggregator =
                    Some(spawn("backlog-aggregate".into(), move || aggregator.run())?);
            }
            let maintenance = Maintenance {
                shared: shared.clone(),
                stop: stop_background_rx,
            };
            running.maintenance = Some(spawn("backlog-maint".into(), move || maintenance.run())?);
            for n in 0..concurrency {
                let executor = Executor {
                    shared: shared.clone(),
                    jobs: jobs_rx.clone(),
                    stop: stop_fetch_rx.clone(),
                    outcomes: outcomes.clone(),
                    slot_freed: slot_freed.clone(),
                    deadline_set: deadline_set.clone(),
                    manual: shared.queue.options().clock.is_manual(),
                    _alive: alive.clone(),
                };
                running
                    .executors
                    .push(spawn(format!("backlog-exec-{n}"), move || executor.run())?);
            }
            let fetcher = Fetcher {
                shared: shared.clone(),
                request,
                jobs,
                doorbell,
                slot_freed: slot_freed_rx,
                stop: stop_fetch_rx,
                watcher,
                next_due: None,
                limited: Vec::new(),
                place_retry: None,
                dry: false,
            };
            running.fetcher = Some(spawn("backlog-fetch".into(), move || fetcher.run())?);
            Ok(())
        })();
        match result {
            Ok(()) => Ok(worker),
            Err(e) => {
                let _ = worker.stop(Duration::ZERO);
                Err(e)
            }
        }
    }

    fn stop(&mut self, grace: Duration) -> Result<ShutdownReport> {
        if let Some(mut scheduler) = self.scheduler.take() {
            // Within the shutdown bound: a scheduler thread stuck in a
            // database call is left to end on its own.
            scheduler.stop_by(Instant::now() + Duration::from_millis(250));
        }
        let Some(mut running) = self.running.take() else {
            return Ok(ShutdownReport::default());
        };
        let shared = running.shared.clone();
        let mut panicked = Vec::new();
        let start = Instant::now();
        let graced = start.checked_add(grace).unwrap_or(start);
        // The last moment anything is waited for.
        let limit = graced + SHUTDOWN_MARGIN;

        // 1. No more leases. The fetcher's exit drops the job channel's
        // sender, so handler threads end once it is empty.
        shared.stopping.store(true, Ordering::SeqCst);
        sync::lock(&shared.handoff).take();
        running.stop_fetch.take();
        // A lease blocked on another process's write lock is not waited for
        // past the grace period.
        join_by(
            running.fetcher.take(),
            graced,
            "backlog-fetch",
            &mut panicked,
        );

        // 2. Running jobs get the grace period; then the rest are flagged and
        // released, no attempt used.
        if !shared.inflight.wait_handlers_done(graced) {
            // What the unfinished handlers reported so far stays with their
            // jobs, for whoever runs them next.
            shared.inflight.write_progress(&shared.queue, None, false);
            for job in shared.inflight.take_unfinished(CancelReason::Shutdown) {
                shared.settle(&running.outcomes, job, Outcome::Release);
            }
        }

        // 3. Handler threads end once their handler returns; one that ignores
        // its flag is left behind, detached.
        let wait_until = (Instant::now() + CANCELLED_HANDLER_WAIT).min(limit);
        // Nothing is ever sent: this returns when the last sender is dropped.
        let _ = running.executors_alive.recv_deadline(wait_until);
        for handle in running.executors.drain(..) {
            if handle.is_finished() {
                join(Some(handle), "backlog-exec", &mut panicked);
            }
        }

        // 4. Flush the outcomes (given up at the limit), stop the
        // background threads.
        // The completer gives up a little before the limit, to have returned
        // by then.
        let _ = running.outcomes.send(Settle::Stop(
            limit.checked_sub(COMPLETER_WRAP_UP).unwrap_or(limit),
        ));
        // A completer still waiting then (behind this process's write gate,
        // which a heartbeat blocked on the lock holds) is left behind; its
        // outcomes count as unsettled.
        join_by(
            running.completer.take(),
            limit,
            "backlog-complete",
            &mut panicked,
        );
        running.stop_background.take();
        join_by(
            running.heartbeater.take(),
            limit,
            "backlog-heartbeat",
            &mut panicked,
        );
        join_by(
            running.maintenance.take(),
            limit,
            "backlog-maint",
            &mut panicked,
        );
        join_by(
            running.aggregator.take(),
            limit,
            "backlog-aggregate",
            &mut panicked,
        );

        threads_panicked(&panicked)?;
        Ok(ShutdownReport {
            // Given up on, still with a completer left behind, or held by a
            // handler that never returned.
            unsettled: shared.unsettled.load(Ordering::SeqCst)
                + shared.settling.load(Ordering::SeqCst)
                + shared.inflight.len(),
        })
    }
}

impl Drop for Worker {
    /// Shuts the worker down with the configured grace period, as
    /// [`Worker::shutdown`] does.
    fn drop(&mut self) {
        let _ = self.stop(self.grace);
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    spawn_on(thread::Builder::new().name(name), f)
}

/// Spawns a worker thread that logs to the `tracing` subscriber in force
/// where the worker was started: a subscriber set for a scope
/// (`tracing::subscriber::set_default`, as a test does) sees the worker's
/// events too, not only a global one.
fn spawn_on(builder: thread::Builder, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
    builder
        .spawn(move || tracing::dispatcher::with_default(&dispatch, f))
        .map_err(|e| Error::Worker(format!("cannot spawn a thread: {e}")))
}

/// [`Worker::shutdown`]'s result, given the names of the threads that
/// panicked.
fn threads_panicked(names: &[String]) -> Result<()> {
    if names.is_empty() {
        Ok(())
    } else {
        Err(Error::Worker(format!(
            "threads panicked: {}",
            names.join(", ")
        )))
    }
}

/// Joins a thread that finishes by `until`; one still busy then (inside a
/// database call) is left to finish on its own.
fn join_by(handle: Option<JoinHandle<()>>, until: Instant, name: &str, panicked: &mut Vec<String>) {
    let Some(handle) = handle else { return };
    while !handle.is_finished() && Instant::now() < until {
        thread::sleep(Duration::from_millis(2));
    }
    if handle.is_finished() {
        join(Some(handle), name, panicked);
    }
}

fn join(handle: Option<JoinHandle<()>>, name: &str, panicked: &mut Vec<String>) {
    if let Some(handle) = handle {
        if handle.join().is_err() {
            panicked.push(name.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_cannot_be_spawned_is_a_worker_error() {
        // No system maps a 64 TiB stack.
        let builder = thread::Builder::new().stack_size(1 << 46);
        match spawn_on(builder, || {}) {
            Err(Error::Worker(why)) => assert!(why.starts_with("cannot spawn"), "{why}"),
            other => panic!("expected Error::Worker, got {other:?}"),
        }
    }

    #[test]
    fn a_worker_thread_that_panicked_is_a_worker_error() {
        let mut panicked = Vec::new();
        let handle = spawn("backlog-test".into(), || panic!("on purpose"));
        join(handle.ok(), "backlog-test", &mut panicked);
        match threads_panicked(&panicked) {
            Err(Error::Worker(why)) => assert_eq!(why, "threads panicked: backlog-test"),
            other => panic!("expected Error::Worker, got {other:?}"),
        }
        assert!(threads_panicked(&[]).is_ok());
    }
}
