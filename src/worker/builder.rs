//! [`WorkerBuilder`]: a worker's configuration and handlers, validated at
//! [`WorkerBuilder::start`].

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::inspect::Retention;
use crate::job::{JobArgs, DEFAULT_QUEUE};
use crate::lease::DEFAULT_LEASE_TTL;
use crate::periodic::{Schedule, Scheduler};
use crate::queue::Queue;
use crate::retry::RetryPolicy;
use crate::validate;
use crate::worker::context::JobContext;
use crate::worker::error::JobError;
use crate::worker::handler::{self, Handlers};
use crate::worker::Worker;

/// Handler threads unless told otherwise.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// The most handler threads one worker may run.
pub const MAX_CONCURRENCY: usize = 1024;

/// The most jobs one worker may lease ahead of its handler threads.
pub const MAX_PREFETCH: usize = 4096;

/// The longest interval, TTL, delay or timeout a worker accepts: a year.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A worker's settings, after validation.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub queues: Vec<String>,
    pub concurrency: usize,
    /// `None`: the adaptive look-ahead ([`super::lookahead`]).
    pub prefetch: Option<usize>,
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    pub shutdown_grace: Duration,
    pub timeout: Option<Duration>,
    pub timeouts: HashMap<String, Duration>,
    pub retry_policy: Option<RetryPolicy>,
    pub retry_policies: HashMap<String, RetryPolicy>,
    pub completer_batch: usize,
    pub completer_delay: Duration,
    pub worker_id: String,
    pub poll_interval: Duration,
    pub watch_interval: Duration,
    pub rescue_interval: Duration,
    pub retention: Retention,
    /// Per queue: at most this many of its jobs held at once.
    pub queue_concurrency: Vec<(String, usize)>,
}

impl Config {
    /// Jobs this worker may hold at once: one per handler thread plus the
    /// prefetch, or plus the look-ahead's cap without one.
    pub(crate) fn slots(&self) -> usize {
        self.concurrency + self.prefetch.unwrap_or(super::lookahead::CAP)
    }

    pub(crate) fn timeout_for(&self, kind: &str) -> Option<Duration> {
        self.timeouts.get(kind).copied().or(self.timeout)
    }

    pub(crate) fn retry_policy_for(&self, kind: &str) -> Option<&RetryPolicy> {
        self.retry_policies.get(kind).or(self.retry_policy.as_ref())
    }
}

/// Configures and starts a [`Worker`]. Made by [`Worker::builder`].
///
/// Every setting has a default; only handlers are required. Nothing is
/// checked until [`WorkerBuilder::start`], which reports a bad setting as a
/// typed error ([`Error::InvalidArgument`] or [`Error::InvalidName`]).
#[derive(Debug)]
#[must_use = "a builder does nothing until start() is called"]
pub struct WorkerBuilder {
    queue: Queue,
    handlers: Handlers,
    queues: Vec<String>,
    concurrency: usize,
    prefetch: Option<usize>,
    lease_ttl: Duration,
    heartbeat_interval: Option<Duration>,
    shutdown_grace: Duration,
    timeout: Option<Duration>,
    timeouts: HashMap<String, Duration>,
    retry_policy: Option<RetryPolicy>,
    retry_policies: HashMap<String, RetryPolicy>,
    completer_batch: usize,
    completer_delay: Duration,
    worker_id: Option<String>,
    poll_interval: Duration,
    watch_interval: Duration,
    rescue_interval: Duration,
    retention: Retention,
    schedules: Vec<Schedule>,
    queue_concurrency: Vec<(String, usize)>,
}

impl WorkerBuilder {
    pub(crate) fn new(queue: Queue) -> Self {
        WorkerBuilder {
            queue,
            handlers: Handlers::default(),
            queues: vec![DEFAULT_QUEUE.to_owned()],
            concurrency: DEFAULT_CONCURRENCY,
            prefetch: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            heartbeat_interval: None,
            shutdown_grace: Duration::from_secs(10),
            timeout: None,
            timeouts: HashMap::new(),
            retry_policy: None,
            retry_policies: HashMap::new(),
            completer_batch: 100,
            completer_delay: Duration::from_millis(5),
            worker_id: None,
            poll_interval: Duration::from_secs(1),
            watch_interval: Duration::from_millis(10),
            rescue_interval: Duration::from_secs(5),
            retention: Retention::default(),
            schedules: Vec::new(),
            queue_concurrency: Vec::new(),
        }
    }

    /// Registers a handler for typed arguments, under `T::KIND`.
    ///
    /// A payload that does not decode into `T` is not retried: the job moves
    /// to history as `dead` on its first attempt, with the decode error. The
    /// handler's output is stored as the job's result; an output that
    /// serializes to JSON `null` (such as `()`) stores none.
    ///
    /// Registering a kind twice is an error at [`WorkerBuilder::start`].
    ///
    /// The closure returns `Result<O, JobError>`; `?` inside it converts any
    /// error (see [`JobError`]). A function with an error type of its own
    /// (`anyhow::Result`, say) registers with [`WorkerBuilder::handle_fn`].
    pub fn handle<T, O, F>(mut self, f: F) -> Self
    where
        T: JobArgs + 'static,
        O: Serialize + 'static,
        F: Fn(T, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
    {
        self.handlers.insert(T::KIND.to_owned(), handler::typed(f));
        self
    }

    /// Registers a handler for grouped jobs of `T::KIND` (enqueued with
    /// [`NewJob::group`](crate::NewJob::group)): it runs once per combined
    /// group, with the arguments of every member, oldest first. Output and
    /// errors work as for [`WorkerBuilder::handle`]; a retry runs the whole
    /// group again.
    ///
    /// A worker with a group handler also combines the groups that are
    /// ready, on time, whichever process enqueued them (a thread of its own,
    /// `backlog-aggregate`, woken by enqueues and by the next group's
    /// deadline). See [`crate::group`].
    ///
    /// Every job of `T::KIND` goes to this handler: one enqueued without a
    /// group has a payload that is not an array, and goes to history as
    /// `dead` on its first attempt (it does not decode), as any payload
    /// that does not decode.
    pub fn handle_group<T, O, F>(mut self, f: F) -> Self
    where
        T: JobArgs + 'static,
        O: Serialize + 'static,
        F: Fn(Vec<T>, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
    {
        self.handlers
            .insert(T::KIND.to_owned(), handler::grouped(f));
        self.handlers.grouped.push(T::KIND.to_owned());
        self
    }

    /// Registers a handler for jobs of `kind` that takes the payload as a
    /// JSON value. Output and errors work as for [`WorkerBuilder::handle`].
    pub fn handle_raw<O, F>(mut self, kind: impl Into<String>, f: F) -> Self
    where
        O: Serialize + 'static,
        F: Fn(Value, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
    {
        self.handlers.insert(kind.into(), handler::raw(f));
        self
    }

    /// Registers a typed handler whose error type is its own: any `E` that
    /// converts into a [`JobError`] (any `std::error::Error + Send + Sync`,
    /// `Box<dyn Error + Send + Sync>`, `anyhow::Error`, `String`, `&str`),
    /// which means retry by the policy. Otherwise as
    /// [`WorkerBuilder::handle`].
    ///
    /// ```
    /// use backlog::{JobArgs, JobContext, Queue, Worker};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Fetch {
    ///     url: String,
    /// }
    /// impl JobArgs for Fetch {
    ///     const KIND: &'static str = "fetch";
    /// }
    ///
    /// // An application's function, written with anyhow:
    /// fn fetch(args: Fetch, _ctx: &JobContext) -> anyhow::Result<usize> {
    ///     anyhow::ensure!(args.url.starts_with("https://"), "not https: {}", args.url);
    ///     Ok(args.url.len())
    /// }
    ///
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = Queue::open(dir.path().join("app.db"))?;
    /// let worker = Worker::builder(queue.clone()).handle_fn(fetch).start()?;
    /// # worker.shutdown(std::time::Duration::from_secs(5))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`WorkerBuilder::handle`] fixes the error type to `JobError` instead,
    /// so that a closure needs no type annotation and `?` converts each of
    /// those errors inside it; `handle_fn` suits a named function (or a
    /// closure with a declared return type). To choose what happens (discard,
    /// snooze, ...), return a `JobError` built with its constructors.
    pub fn handle_fn<T, O, E, F>(self, f: F) -> Self
    where
        T: JobArgs + 'static,
        O: Serialize + 'static,
        E: Into<JobError> + 'static,
        F: Fn(T, &JobContext) -> Result<O, E> + Send + Sync + 'static,
    {
        self.handle(move |args: T, ctx: &JobContext| f(args, ctx).map_err(Into::into))
    }

    /// [`WorkerBuilder::handle_raw`] for a handler whose error type is its
    /// own, as [`WorkerBuilder::handle_fn`].
    pub fn handle_raw_fn<O, E, F>(self, kind: impl Into<String>, f: F) -> Self
    where
        O: Serialize + 'static,
        E: Into<JobError> + 'static,
        F: Fn(Value, &JobContext) -> Result<O, E> + Send + Sync + 'static,
    {
        self.handle_raw(kind, move |payload, ctx: &JobContext| {
            f(payload, ctx).map_err(Into::into)
        })
    }

    /// The queues to lease from. Only jobs of kinds with a handler are ever
    /// leased. Defaults to `["default"]`.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Handler threads: how many jobs run at once. No more jobs are leased
    /// than there are free threads. 1 to 1024. Defaults to 8.
    pub fn concurrency(mut self, threads: usize) -> Self {
        self.concurrency = threads;
        self
    }

    /// A fixed number of jobs leased ahead of free handler threads, waiting
    /// in memory (their leases heartbeated, released on shutdown, their
    /// timeouts starting only when a handler picks them up), in place of the
    /// default adaptive look-ahead. With a prefetch the fetcher leases in
    /// batches of at least this many, whatever the jobs' length. Jobs held
    /// here are not available to other workers. 0 to 4096; 0 leases no more
    /// jobs than there are free handler threads.
    ///
    /// Defaults to the adaptive look-ahead: the worker holds at most the jobs
    /// its threads finish within 20 ms of measured handler time
    /// ([`LOOKAHEAD_HORIZON`](crate::worker::LOOKAHEAD_HORIZON)), at most
    /// 128 ([`LOOKAHEAD_CAP`](crate::worker::LOOKAHEAD_CAP)), and none for
    /// jobs that take 20 ms or more per thread: short jobs are leased and
    /// completed in batches, long ones are not hoarded.
    pub fn prefetch(mut self, jobs: usize) -> Self {
        self.prefetch = Some(jobs);
        self
    }

    /// How long a lease lasts without a heartbeat: a job whose worker died is
    /// leased again about this long (plus the rescue interval) later.
    /// Defaults to 30 seconds.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How often the leases of running jobs are extended, in one statement
    /// for all of them. Must be shorter than the lease TTL. Defaults to a
    /// third of the lease TTL (10 seconds).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// How long dropping the worker waits for running jobs before it flags
    /// them cancelled and releases them (see [`Worker::shutdown`]).
    /// Defaults to 10 seconds.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a job of any kind may run before its cancellation flag is
    /// set. A handler cannot be interrupted; it should check
    /// [`JobContext::is_cancelled`] and return, and an error it then returns
    /// fails the attempt. Defaults to no timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The timeout of one kind, overriding [`WorkerBuilder::timeout`]. The
    /// kind must have a handler. Defaults to the worker's timeout.
    pub fn timeout_for(mut self, kind: impl Into<String>, timeout: Duration) -> Self {
        self.timeouts.insert(kind.into(), timeout);
        self
    }

    /// The retry policy for failed attempts of every kind without its own.
    /// Defaults to the queue's
    /// ([`QueueOptions::retry_policy`](crate::QueueOptions::retry_policy)).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = Some(policy);
        self
    }

    /// The retry policy for failed attempts of one kind. The kind must have a
    /// handler. Defaults to the worker's policy.
    pub fn retry_policy_for(mut self, kind: impl Into<String>, policy: RetryPolicy) -> Self {
        self.retry_policies.insert(kind.into(), policy);
        self
    }

    /// Group commit of outcomes: the completer applies up to `size` outcomes
    /// in one transaction, waiting at most `max_delay` after the first for
    /// more. Defaults to 100 outcomes and 5 ms.
    ///
    /// Without a look-ahead (jobs of 20 ms or more, a concurrency limit that
    /// binds, or [`prefetch(0)`](Self::prefetch)) each outcome waiting keeps
    /// a handler thread idle until the commit that leases its next job, so
    /// the batch is committed as soon as no further outcome comes within
    /// 250 µs, whatever `max_delay`.
    pub fn completer_batch(mut self, size: usize, max_delay: Duration) -> Self {
        self.completer_batch = size;
        self.completer_delay = max_delay;
        self
    }

    /// The name this worker's leases are recorded under (`locked_by`, and
    /// `processed_by` in history). It must be unique among running workers:
    /// after a lease whose answer a lost connection took, a worker gives back
    /// every job leased under its id that it does not hold
    /// ([`Queue::release_unheld`](crate::Queue::release_unheld)). Defaults to
    /// `host-pid-random`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// The longest wait between lease attempts while the queue looks empty: a
    /// safety net. Enqueues in this process wake the worker at once, other
    /// processes' commits when the file changes (see
    /// [`WorkerBuilder::watch_interval`]), and scheduled jobs and retries
    /// when they come due. After work it starts at a tenth of this and
    /// doubles. Defaults to 1 second.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How a worker notices other processes' commits (their enqueues) on a
    /// SQLite file: it checks `PRAGMA data_version` (a shared-memory read, no
    /// table scan) when the operating system reports a write to the file
    /// (the default `file-events` feature: inotify on Linux, FSEvents on
    /// macOS, ReadDirectoryChangesW on Windows, kqueue on the BSDs), and
    /// only where that is unavailable every watch interval (each check a
    /// thread wake-up: at 10 ms an idle worker uses about 0.3 % of one core).
    /// The servers ignore it: on PostgreSQL a thread blocks on the LISTEN
    /// connection, on MySQL a thread probes the newest job id (every 2 ms
    /// while jobs flow, backing off to 25 ms), and each wakes the worker
    /// only when something arrived. Defaults to 10 ms.
    pub fn watch_interval(mut self, interval: Duration) -> Self {
        self.watch_interval = interval;
        self
    }

    /// How often expired leases are made available again (and history
    /// pruned, and the WAL checkpointed when idle). Defaults to 5 seconds.
    pub fn rescue_interval(mut self, interval: Duration) -> Self {
        self.rescue_interval = interval;
        self
    }

    /// Runs `schedule` while the worker runs: a [`Scheduler`] thread
    /// (`backlog-periodic`) starts with the worker, claims each due tick and
    /// enqueues its job, and stops first at shutdown. Each tick is enqueued
    /// once however many workers and processes run the same schedule. The
    /// tick's job is an ordinary job: any worker with its kind and queue
    /// runs it. See [`crate::periodic`].
    ///
    /// At [`WorkerBuilder::start`], the schedule's job is checked (a bad name
    /// or payload is an error) and the schedule registered in the database.
    pub fn periodic(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// How long finished jobs are kept; maintenance prunes older ones in
    /// small batches. Defaults to [`Retention::default`].
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// At most `n` jobs of `queue` held by this worker at once (running, or
    /// leased for a prefetch), whatever its [`concurrency`](Self::concurrency):
    /// a worker serving several queues caps one, and its other slots go to
    /// the other queues. Its fetcher asks each lease only for what fits.
    /// Local to this worker; for a cap across every worker, process and node
    /// see [`Queue::set_limits`](crate::Queue::set_limits). `queue` must be
    /// one of the worker's [`queues`](Self::queues) and `n` at least 1
    /// ([`Error::InvalidLimit`] at [`start`](Self::start) otherwise).
    /// Defaults to no cap.
    pub fn queue_concurrency(mut self, queue: impl Into<String>, n: usize) -> Self {
        let queue = queue.into();
        self.queue_concurrency.retain(|(q, _)| *q != queue);
        self.queue_concurrency.push((queue, n));
        self
    }

    /// Validates the settings and starts the worker's threads.
    ///
    /// Errors: [`Error::InvalidArgument`] for a setting out of range, no
    /// handlers, a kind registered twice, or a per-kind setting for a kind
    /// without a handler; [`Error::InvalidName`] for a bad queue name, kind or
    /// worker id; [`Error::InvalidLimit`] for a bad
    /// [`queue_concurrency`](Self::queue_concurrency); a database error if the change watcher cannot be opened.
    pub fn start(self) -> Result<Worker> {
        let config = self.validate()?;
        let scheduler = if self.schedules.is_empty() {
            None
        } else {
            let scheduler = Scheduler::start(self.queue.clone())?;
            for schedule in self.schedules {
                scheduler.add(schedule)?;
            }
            Some(scheduler)
        };
        let mut worker = Worker::start(self.queue, self.handlers, config)?;
        worker.scheduler = scheduler;
        Ok(worker)
    }

    /// What `backlog::testing::drain` runs jobs with: the queue, the
    /// handlers and the validated settings, without starting any thread.
    pub(crate) fn inline_parts(&self) -> Result<(&Queue, &Handlers, Config)> {
        Ok((&self.queue, &self.handlers, self.validate()?))
    }

    fn validate(&self) -> Result<Config> {
        let invalid = |why: String| Err(Error::InvalidArgument(why));
        if self.handlers.is_empty() {
            return invalid("a worker needs at least one handler".into());
        }
        if let Some(kind) = self.handlers.duplicates.first() {
            return invalid(format!("kind {kind:?} has more than one handler"));
        }
        for kind in self.handlers.kinds() {
            validate::name("kind", &kind)?;
        }
        if self.queues.is_empty() {
            return invalid("a worker needs at least one queue".into());
        }
        for queue in &self.queues {
            validate::name("queue", queue)?;
        }
        let mut queues = self.queues.clone();
        queues.sort();
        queues.dedup();
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return invalid(format!(
                "concurrency must be 1 to {MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if let Some(prefetch) = self.prefetch.filter(|&p| p > MAX_PREFETCH) {
            return invalid(format!(
                "prefetch must be 0 to {MAX_PREFETCH}, got {prefetch}"
            ));
        }
        for (queue, n) in &self.queue_concurrency {
            validate::name("queue", queue)?;
            if !queues.contains(queue) {
                return Err(Error::InvalidLimit(format!(
                    "queue_concurrency names {queue:?}, which is not one of the worker's queues"
                )));
            }
            if *n == 0 {
                return Err(Error::InvalidLimit(format!(
                    "queue_concurrency of {queue:?} is 0: leave the queue out of the worker's \
                     queues instead"
                )));
            }
        }
        positive("lease_ttl", self.lease_ttl)?;
        let heartbeat_interval = self.heartbeat_interval.unwrap_or(self.lease_ttl / 3);
        positive("heartbeat_interval", heartbeat_interval)?;
        if heartbeat_interval >= self.lease_ttl {
            return invalid(format!(
                "heartbeat_interval ({heartbeat_interval:?}) must be shorter than lease_ttl ({:?})",
                self.lease_ttl
            ));
        }
        if let Some(t) = self.timeout {
            positive("timeout", t)?;
        }
        for (kind, t) in &self.timeouts {
            self.registered("timeout_for", kind)?;
            positive("timeout_for", *t)?;
        }
        for kind in self.retry_policies.keys() {
            self.registered("retry_policy_for", kind)?;
        }
        if self.completer_batch == 0 {
            return invalid("completer batch size must be at least 1".into());
        }
        at_most_a_year("completer_batch max_delay", self.completer_delay)?;
        at_most_a_year("shutdown_grace", self.shutdown_grace)?;
        positive("poll_interval", self.poll_interval)?;
        positive("watch_interval", self.watch_interval)?;
        positive("rescue_interval", self.rescue_interval)?;
        let worker_id = match &self.worker_id {
            Some(id) => id.clone(),
            None => default_worker_id(),
        };
        validate::name("worker id", &worker_id)?;
        Ok(Config {
            queues,
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            lease_ttl: self.lease_ttl,
            heartbeat_interval,
            shutdown_grace: self.shutdown_grace,
            timeout: self.timeout,
            timeouts: self.timeouts.clone(),
            retry_policy: self.retry_policy,
            retry_policies: self.retry_policies.clone(),
            completer_batch: self.completer_batch,
            completer_delay: self.completer_delay,
            worker_id,
            poll_interval: self.poll_interval,
            watch_interval: self.watch_interval,
            rescue_interval: self.rescue_interval,
            retention: self.retention,
            queue_concurrency: self.queue_concurrency.clone(),
        })
    }

    fn registered(&self, setting: &str, kind: &str) -> Result<()> {
        if self.handlers.get(kind).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{setting}({kind:?}) names a kind with no handler"
            )));
        }
        Ok(())
    }
}

/// A duration that must be positive and at most a year.
fn positive(name: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::InvalidArgument(format!("{name} must be positive")));
    }
    at_most_a_year(name, d)
}

fn at_most_a_year(name: &str, d: Duration) -> Result<()> {
    if d > MAX_DURATION {
        return Err(Error::InvalidArgument(format!(
            "{name} of {d:?} is longer than a year"
        )));
    }
    Ok(())
}

/// `host-pid-random`, e.g. `web-1-4242-3f9a1c07`.
fn default_worker_id() -> String {
    format!(
        "{}-{}-{:08x}",
        host_name(),
        std::process::id(),
        rand::random::<u32>()
    )
}

/// This host's name, printable ASCII, at most 64 bytes; `host` when it
/// cannot be read.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(64)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}
