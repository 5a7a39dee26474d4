//! [`Queue`]: the handle applications enqueue with, and workers lease from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::backend::sqlite::Connections;
use crate::backend::{
    Backend, ClaimTickParams, Claimed, EnqueueParams, GroupParams, HeartbeatParams, LeaseParams,
    ProgressWrite, SettleParams, UpdateParams,
};
use crate::clock::{self, add_micros, duration_micros, system_time_to_micros, ClockMicros};
use crate::error::{Error, Result};
use crate::events::{Bus, Event};
use crate::group::AggregateReport;
use crate::inspect::{
    BulkReport, CancelOutcome, FinishedCount, JobFilter, JobRecord, JobState, JobUpdate, Page,
    QueueStats, Retention, StateCount,
};
use crate::job::{Enqueued, IntoNewJob, NewJob, Payload, Schedule, UniqueScope};
use crate::lease::{HeartbeatReport, Job, Lease, LeaseRequest, RescueReport};
use crate::limits::QueueLimits;
use crate::options::QueueOptions;
use crate::outcome::{decide, AttemptError, FinalStatus, Outcome, Transition};
use crate::validate;

/// How many finished jobs [`Queue::find_by_unique_key`] returns at most.
pub const FIND_UNIQUE_HISTORY: usize = 20;

/// A durable job queue: in a SQLite file ([`Queue::open`]), or on a
/// PostgreSQL or MySQL server ([`Queue::connect`], behind the `postgres` and
/// `mysql` features).
///
/// Cheap to clone; clones share connections. All methods are blocking and
/// safe to call from many threads. Every method that writes waits at most
/// the queue's [`write_deadline`](crate::QueueOptions::write_deadline)
/// (default 30 s) for locks held by other threads or processes, then
/// returns [`Error::Busy`]. Reads wait at most that long for a pooled
/// connection. What only one database can do (its transaction type for
/// `enqueue_in` and `complete_in`) lives in that database's module:
/// [`crate::sqlite`], `backlog::postgres`, `backlog::mysql`.
///
/// # Inside the queue's own transaction
///
/// A thread inside one of this queue's transactions (`ctx.transaction` in a
/// handler, or `QueueExt::transaction` of [`crate::sqlite`],
/// `backlog::postgres` or `backlog::mysql`) never waits for itself, on any
/// backend: every method that writes (and a nested `transaction`) returns
/// [`Error::InsideTransaction`] at once and writes nothing; the `_in` forms
/// (`enqueue_in(tx, ..)`, `complete_in(tx, ..)`) join the transaction; reads
/// work, and see what was committed rather than the transaction's own
/// changes (on PostgreSQL and MySQL they need a second pooled connection,
/// and answer `InsideTransaction` at once when none is free: always with
/// `pool_size(1)`). Tested for every public method on every backend by the
/// conformance scenarios in `tests/conformance/inside_transaction.rs`.
///
/// # Inside the application's own transaction (SQLite)
///
/// On SQLite (unix) a thread that holds the file's write lock through a
/// `rusqlite` connection of the application's (after `BEGIN IMMEDIATE`, or
/// a write in a deferred transaction) gets the same answer: every method that
/// writes returns [`Error::InsideTransaction`] at once, writes nothing, and
/// `enqueue_in(&tx, ..)` joins that transaction. This holds for connections
/// the application opened through backlog's shim VFS, which notes who holds
/// the lock ([`sqlite::open_connection`](crate::sqlite::open_connection), or
/// any connection opened after
/// [`sqlite::make_default_vfs`](crate::sqlite::make_default_vfs)); another
/// connection is waited for like another process's, up to the write
/// deadline (`tests/sqlite_foreign_transactions.rs`).
#[derive(Debug, Clone)]
pub struct Queue {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    options: QueueOptions,
    /// SQLite: the path as given and its canonical form, to check that a
    /// caller's connection (`enqueue_in`, `complete_in`) is to this database.
    path: Option<PathBuf>,
    canonical_path: Option<PathBuf>,
    bus: Bus,
    /// Leases settled by `settle_in` / `complete_in` inside a caller's
    /// transaction in this process: the worker checks here before settling a
    /// job its handler may already have finished (that transaction may also
    /// have rolled back).
    settled_in: std::sync::Mutex<std::collections::HashSet<Lease>>,
    /// Held while a job's progress is read and written (heartbeater,
    /// completer, a handler's manual heartbeat), so an older value read by
    /// one never lands after a newer one written by another.
    progress_gate: std::sync::Mutex<()>,
}

/// An encoded, validated job, ready for the backend.
pub(crate) struct Prepared {
    job: NewJob,
    payload: String,
    available_at: i64,
    unique_history_since: Option<i64>,
    /// The group's policy: max size, grace and max delay in µs.
    group: Option<(u32, i64, i64)>,
}

impl Queue {
    /// Opens (creating if needed) the queue in the SQLite file at `path`, with
    /// the default options: WAL, `synchronous=FULL`, migrated.
    pub fn open(path: impl AsRef<Path>) -> Result<Queue> {
        Self::open_with(path, QueueOptions::default())
    }

    /// Opens the queue at `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: QueueOptions) -> Result<Queue> {
        let path = path.as_ref();
        options.check_sqlite()?;
        let connections = Connections::open(path, &options)?;
        Self::start(
            Backend::Sqlite(connections),
            options,
            Some(path.to_path_buf()),
        )
    }

    /// Connects to the queue at `url` with the default options, migrating it:
    ///
    /// - `postgres://user@host/db` (or `postgresql://`): PostgreSQL, with the
    ///   `postgres` feature. `sslmode=require` or `verify-full` in the URL
    ///   turns on TLS.
    /// - `mysql://user@host/db`: MySQL ≥ 8.0.1 or MariaDB ≥ 10.6, with the
    ///   `mysql` feature.
    /// - `sqlite:PATH` or `sqlite://PATH`: the SQLite file at `PATH`, as
    ///   [`Queue::open`].
    ///
    /// A URL for a backend this build does not include is
    /// [`Error::FeatureDisabled`]; its password never appears in an error.
    pub fn connect(url: &str) -> Result<Queue> {
        Self::connect_with(url, QueueOptions::default())
    }

    /// Connects to the queue at `url` with `options`. See [`Queue::connect`].
    pub fn connect_with(url: &str, options: QueueOptions) -> Result<Queue> {
        match Target::parse(url)? {
            Target::Sqlite(path) => Self::open_with(path, options),
            #[cfg(feature = "postgres")]
            Target::Postgres => {
                let db = crate::backend::postgres::Db::connect(url, &options)?;
                Self::start(Backend::Postgres(db), options, None)
            }
            #[cfg(feature = "mysql")]
            Target::Mysql => {
                let db = crate::backend::mysql::Db::connect(url, &options)?;
                Self::start(Backend::Mysql(db), options, None)
            }
        }
    }

    fn start(backend: Backend, options: QueueOptions, path: Option<PathBuf>) -> Result<Queue> {
        if options.migrate {
            backend.migrate(options.write_deadline)?;
        }
        let bus = Bus::new(options.event_capacity);
        Ok(Queue {
            inner: Arc::new(Inner {
                backend,
                canonical_path: path.as_ref().and_then(|p| p.canonicalize().ok()),
                path,
                options,
                bus,
                settled_in: Default::default(),
                progress_gate: Default::default(),
            }),
        })
    }

    /// Applies pending schema migrations (for queues opened with
    /// [`QueueOptions::migrate`]`(false)`).
    pub fn migrate(&self) -> Result<()> {
        self.inner
            .backend
            .migrate(self.inner.options.write_deadline)
    }

    /// The schema migrations this version of backlog has that the database
    /// has not applied yet, oldest first (`V2__due`); empty when the schema
    /// is current. Reads only: tools that open with
    /// [`QueueOptions::migrate`]`(false)` check here before using a database
    /// an older backlog created.
    pub fn pending_migrations(&self) -> Result<Vec<String>> {
        self.inner.backend.pending_migrations()
    }

    /// The database file, for a queue on SQLite.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The backend, for the per-database modules.
    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The options the queue was opened with.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn options(&self) -> &QueueOptions {
        &self.inner.options
    }

    /// Whether `other` is a handle on the same database.
    pub(crate) fn same_database(&self, other: &Queue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.canonical_path.is_some()
                && self.inner.canonical_path == other.inner.canonical_path)
    }

    /// SQLite: the path as given and its canonical form.
    pub(crate) fn paths(&self) -> (Option<&Path>, Option<&Path>) {
        (
            self.inner.path.as_deref(),
            self.inner.canonical_path.as_deref(),
        )
    }

    /// The current time of the queue's clock.
    pub fn now(&self) -> SystemTime {
        self.inner.options.clock.now()
    }

    /// The current time of the queue's clock as the databases store it,
    /// unix µs.
    pub(crate) fn now_micros(&self) -> i64 {
        self.inner.options.clock.now_micros()
    }

    /// How many transactions were retried after a transient failure: SQLite's
    /// BUSY/LOCKED, or a server's deadlock or serialization failure.
    pub fn busy_retries(&self) -> u64 {
        self.inner.backend.busy_retries()
    }

    /// The plan of the statement [`Queue::lease`] would run for `request`
    /// (SQLite's `EXPLAIN QUERY PLAN`, the server's `EXPLAIN`), one line per
    /// plan node. Claims nothing. For tests that pin the lease to its index.
    #[doc(hidden)]
    pub fn explain_lease(&self, request: &LeaseRequest) -> Result<Vec<String>> {
        let now = self.now_micros();
        self.inner.backend.explain_lease(&LeaseParams {
            queues: &request.queues,
            kinds: request.kinds.as_deref(),
            limit: request.limit,
            worker_id: &request.worker_id,
            now,
            lease_until: add_micros(now, request.ttl)?,
            caps: &request.queue_caps,
        })
    }

    // ---- enqueue -----------------------------------------------------------

    /// Enqueues one job and commits.
    ///
    /// A job whose unique key is already taken is not inserted: the existing
    /// job's id comes back with `existed: true`.
    pub fn enqueue(&self, job: impl IntoNewJob) -> Result<Enqueued> {
        let mut ids = self.enqueue_many([job])?;
        ids.pop()
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    }

    /// Enqueues many jobs in one transaction: all or none. Every job is
    /// validated before anything is written. Ids come back in input order.
    pub fn enqueue_many<J: IntoNewJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>> {
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now)?;
        let params: Vec<EnqueueParams<'_>> = params(&prepared, now);
        let ids = self.inner.backend.enqueue_many(&params)?;
        failpoint!("enqueue-after-commit");
        if self.inner.bus.has_listeners() {
            self.inner.bus.ring();
            self.inner
                .bus
                .emit(
                    ids.iter()
                        .zip(&prepared)
                        .filter(|(e, _)| !e.existed)
                        .map(|(e, p)| Event::Enqueued {
                            job_id: e.id,
                            queue: p.job.queue.clone(),
                            kind: p.job.kind.clone(),
                        }),
                );
        }
        Ok(ids)
    }

    pub(crate) fn prepare_all<J: IntoNewJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
        now: i64,
    ) -> Result<Vec<Prepared>> {
        jobs.into_iter()
            .map(|j| self.prepare(j.into_new_job()?, now))
            .collect()
    }

    /// Validates and encodes one job. Nothing here touches the database.
    fn prepare(&self, job: NewJob, now: i64) -> Result<Prepared> {
        validate::name("queue", &job.queue)?;
        validate::name("kind", &job.kind)?;
        if let Some(key) = &job.unique_key {
            validate::unique_key(key)?;
        }
        if job.max_attempts == 0 {
            return Err(Error::InvalidArgument(
                "max_attempts must be at least 1".into(),
            ));
        }
        let limit = self.inner.options.max_payload_bytes;
        let payload = match &job.payload {
            Payload::Value(value) => validate::payload(value, limit)?,
            Payload::Text(text) => {
                // The cap is checked before parsing, so oversize text costs nothing.
                validate::payload_size(text.len(), limit)?;
                let value = validate::parse_json(text)?;
                validate::payload(&value, limit)?
            }
        };
        let available_at = match job.schedule {
            Schedule::Now => now,
            Schedule::Delay(delay) => add_micros(now, delay)?,
            Schedule::DelaySecs(secs) => {
                if !secs.is_finite() || secs < 0.0 {
                    return Err(Error::InvalidSchedule(format!(
                        "delay must be a finite, non-negative number of seconds, got {secs}"
                    )));
                }
                let delay = Duration::try_from_secs_f64(secs)
                    .map_err(|e| Error::InvalidSchedule(e.to_string()))?;
                add_micros(now, delay)?
            }
            // A time before the unix epoch is in the past too: it means now.
            Schedule::At(at) if at < UNIX_EPOCH => now,
            Schedule::At(at) => system_time_to_micros(at)?.max(now),
        };
        let unique_history_since = match (job.unique_scope, &job.unique_key) {
            (UniqueScope::LiveAndHistory(period), Some(_)) => {
                Some(now.saturating_sub(duration_micros(period)?))
            }
            _ => None,
        };
        let group = match &job.group {
            None => None,
            Some(group) => {
                if !matches!(job.schedule, Schedule::Now) || job.unique_key.is_some() {
                    return Err(Error::InvalidArgument(
                        "a grouped job can have neither a delay nor a unique key: its group \
                         decides when it runs"
                            .into(),
                    ));
                }
                Some(group.check()?)
            }
        };
        Ok(Prepared {
            job,
            payload,
            available_at,
            unique_history_since,
            group,
        })
    }

    // ---- lease -------------------------------------------------------------

    /// Claims up to the request's limit of available jobs, in `priority DESC,
    /// available_at, id` order, skipping paused queues. Each claim increments
    /// the job's attempts and gets a fresh random lease token.
    pub fn lease(&self, request: &LeaseRequest) -> Result<Vec<Job>> {
        let (queues, kinds) = self.check_lease(request)?;
        if kinds.as_ref().is_some_and(|k| k.is_empty()) {
            return Ok(Vec::new());
        }
        let now = self.now_micros();
        let jobs = self.inner.backend.lease(&LeaseParams {
            queues: &queues,
            kinds: kinds.as_deref(),
            limit: request.limit,
            worker_id: &request.worker_id,
            now,
            lease_until: add_micros(now, request.ttl)?,
            caps: &request.queue_caps,
        })?;
        if !jobs.is_empty() {
            failpoint!("lease-after-commit");
        }
        self.emit_leased(&jobs);
        Ok(jobs)
    }

    fn emit_leased(&self, jobs: &[Job]) {
        self.inner.bus.emit(jobs.iter().map(|j| Event::Leased {
            job_id: j.id,
            attempt: j.attempt,
            queue: j.queue.clone(),
            kind: j.kind.clone(),
            available_at: j.available_at,
        }));
    }

    /// Validates a lease request; its queues and kinds sorted, without
    /// duplicates (a queue or kind named twice would be walked twice, and
    /// its candidates counted twice against the limit).
    #[allow(clippy::type_complexity)]
    fn check_lease(&self, request: &LeaseRequest) -> Result<(Vec<String>, Option<Vec<String>>)> {
        if request.limit == 0 {
            return Err(Error::InvalidArgument(
                "a lease must ask for at least 1 job".into(),
            ));
        }
        if request.queues.is_empty() {
            return Err(Error::InvalidArgument(
                "a lease needs at least one queue".into(),
            ));
        }
        validate::name("worker id", &request.worker_id)?;
        for queue in &request.queues {
            validate::name("queue", queue)?;
        }
        if let Some(kinds) = &request.kinds {
            for kind in kinds {
                validate::name("kind", kind)?;
            }
        }
        for (queue, _) in &request.queue_caps {
            validate::name("queue", queue)?;
        }
        let mut queues = request.queues.clone();
        queues.sort_unstable();
        queues.dedup();
        let kinds = request.kinds.clone().map(|mut kinds| {
            kinds.sort_unstable();
            kinds.dedup();
            kinds
        });
        Ok((queues, kinds))
    }

    // ---- settle ------------------------------------------------------------

    /// Completes a leased job: it moves to history as `completed` with an
    /// optional JSON result. `LeaseLost` if the lease is no longer held.
    pub fn complete(&self, job: &Job, result: Option<Value>) -> Result<()> {
        self.settle(job, Outcome::Complete(result))
    }

    /// Records a failed attempt: retried after the kind's backoff, or moved to
    /// history as `dead` when this was the last attempt.
    pub fn fail(&self, job: &Job, error: impl Into<String>) -> Result<()> {
        self.settle(job, Outcome::fail(error))
    }

    /// Reschedules a leased job after `delay` without using an attempt.
    pub fn snooze(&self, job: &Job, delay: Duration) -> Result<()> {
        self.settle(job, Outcome::Snooze(delay))
    }

    /// Discards a leased job: it moves to history as `discarded`.
    pub fn discard(&self, job: &Job, reason: impl Into<String>) -> Result<()> {
        self.settle(job, Outcome::Discard(reason.into()))
    }

    /// Gives a leased job back, available at once, without using an attempt.
    pub fn release(&self, job: &Job) -> Result<()> {
        self.settle(job, Outcome::Release)
    }

    /// Applies any outcome to a leased job, in its own transaction.
    pub fn settle(&self, job: &Job, outcome: Outcome) -> Result<()> {
        let mut results = self.settle_many([(job, outcome)])?;
        results
            .pop()
            .unwrap_or_else(|| Err(Error::Database("settle returned no result".into())))
    }

    /// Applies many outcomes in one transaction (group commit). The outer
    /// `Result` fails only if the transaction does; each item's own result is
    /// `Err(LeaseLost)` when its lease was no longer held (that item changed
    /// nothing, the others were applied).
    pub fn settle_many<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a Job, Outcome)>,
    ) -> Result<Vec<Result<()>>> {
        Ok(self.settle_many_and_lease(items, None, None)?.0)
    }

    /// [`Queue::settle_many`], and in the same transaction a lease of
    /// `refill` (when given and its limit is not zero): the worker's
    /// completer hands the slots its outcomes free to the next jobs with one
    /// commit for both. With `until`, given up then (a worker's shutdown).
    pub(crate) fn settle_many_and_lease<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a Job, Outcome)>,
        refill: Option<&LeaseRequest>,
        until: Option<std::time::Instant>,
    ) -> Result<(Vec<Result<()>>, Vec<Job>)> {
        let now = self.now_micros();
        let refill = match refill {
            Some(r) if r.limit > 0 && r.kinds.as_ref().is_none_or(|k| !k.is_empty()) => {
                let (queues, kinds) = self.check_lease(r)?;
                Some((r, queues, kinds, add_micros(now, r.ttl)?))
            }
            _ => None,
        };
        let lease = refill
            .as_ref()
            .map(|(r, queues, kinds, until)| LeaseParams {
                queues,
                kinds: kinds.as_deref(),
                limit: r.limit,
                worker_id: &r.worker_id,
                now,
                lease_until: *until,
                caps: &r.queue_caps,
            });
        // (job, released, params): a release and a snooze make the same
        // transition but are different events.
        let items: Vec<(&Job, bool, SettleParams)> = items
            .into_iter()
            .map(|(job, outcome)| {
                let released = matches!(outcome, Outcome::Release);
                Ok((job, released, self.settle_params(job, outcome, now)?))
            })
            .collect::<Result<_>>()?;
        let params: Vec<&SettleParams> = items.iter().map(|(_, _, p)| p).collect();
        let (results, jobs) =
            self.inner
                .backend
                .settle_and_lease(&params, lease.as_ref(), until)?;
        if self.inner.bus.has_listeners() {
            self.inner.bus.emit(items.iter().zip(&results).filter_map(
                |((job, released, p), r)| match r {
                    Ok(true) => Some(Event::Cancelled { job_id: job.id }),
                    Ok(false) => Some(settled_event(job, *released, &p.transition)),
                    Err(_) => None,
                },
            ));
            self.emit_leased(&jobs);
        }
        Ok((results.into_iter().map(|r| r.map(|_| ())).collect(), jobs))
    }

    /// Completes every job in one transaction.
    pub fn complete_many<'a>(
        &self,
        jobs: impl IntoIterator<Item = &'a Job>,
    ) -> Result<Vec<Result<()>>> {
        self.settle_many(jobs.into_iter().map(|j| (j, Outcome::Complete(None))))
    }

    pub(crate) fn settle_params(
        &self,
        job: &Job,
        outcome: Outcome,
        now: i64,
    ) -> Result<SettleParams> {
        let policy = self.inner.options.policy_for(&job.kind);
        Ok(SettleParams {
            lease: job.lease(),
            transition: decide(job, outcome, now, policy)?,
            now,
        })
    }

    // ---- heartbeat and rescue ---------------------------------------------

    /// Extends every given lease still held to `ttl` from now, in one
    /// statement, and reports the leases lost and the jobs asked to cancel.
    pub fn heartbeat(&self, leases: &[Lease], ttl: Duration) -> Result<HeartbeatReport> {
        if leases.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let now = self.now_micros();
        self.inner.backend.heartbeat(&HeartbeatParams {
            leases,
            lease_until: add_micros(now, ttl)?,
            now,
        })
    }

    /// Writes running jobs' progress, fenced on their leases, in one
    /// transaction; returns the ids written (the others' leases were lost,
    /// or on a server, without `wait`, their rows were held by another
    /// transaction).
    /// Taken around reading the progress to write and writing it: see
    /// [`Inner::progress_gate`].
    pub(crate) fn progress_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .progress_gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write_progress(&self, writes: &[ProgressWrite], wait: bool) -> Result<Vec<i64>> {
        self.inner
            .backend
            .write_progress(writes, self.now_micros(), wait)
    }

    /// Makes up to `limit` jobs whose lease expired available again, in the
    /// place in line they had (their `available_at` is kept), or moves them to
    /// history as `dead` when their last attempt expired. Never decodes
    /// payloads. Call repeatedly until it reports fewer than `limit`.
    pub fn rescue(&self, limit: usize) -> Result<RescueReport> {
        let now = self.now_micros();
        let done = self.inner.backend.rescue(now, limit, |expired| {
            let error = AttemptError {
                attempt: expired.attempts,
                at: clock::at(now),
                message:
                    "lease expired: the worker stopped heartbeating (crashed, hung or stopped)"
                        .to_owned(),
            };
            let transition = if expired.cancel_requested {
                // Its worker died before it could honour the cancel request.
                Transition::Finish {
                    status: FinalStatus::Cancelled,
                    result: None,
                    error: Some(AttemptError {
                        message: "cancelled by request; the worker's lease expired first".into(),
                        ..error
                    }),
                }
            } else if expired.attempts >= expired.max_attempts {
                Transition::Finish {
                    status: FinalStatus::Dead,
                    result: None,
                    error: Some(error),
                }
            } else {
                // The expired claim counts as an attempt, so a job that kills
                // its worker every time still ends up dead. The job keeps its
                // place in line: due now would put it behind every job that
                // is waiting, and a backlog would delay its recovery past
                // lease TTL + rescue interval.
                Transition::Reschedule {
                    available_at: expired.available_at.min(now),
                    error: Some(error),
                    refund_attempt: false,
                }
            };
            SettleParams {
                lease: expired.lease,
                transition,
                now,
            }
        })?;
        if !done.is_empty() {
            failpoint!("rescue");
        }
        for (expired, p) in &done {
            let became = match p.transition {
                Transition::Finish { status, .. } => status.as_str(),
                Transition::Reschedule { .. } => "available",
            };
            tracing::warn!(
                job_id = expired.lease.job_id,
                attempt = expired.attempts,
                max_attempts = expired.max_attempts,
                became,
                "rescued a job whose lease expired: its worker stopped heartbeating \
                 (crashed, hung or stopped)"
            );
        }
        self.inner
            .bus
            .emit(done.iter().map(|(expired, p)| match p.transition {
                Transition::Finish {
                    status: FinalStatus::Cancelled,
                    ..
                } => Event::Cancelled {
                    job_id: expired.lease.job_id,
                },
                Transition::Finish { .. } => Event::Dead {
                    job_id: expired.lease.job_id,
                },
                Transition::Reschedule { .. } => Event::Rescued {
                    job_id: expired.lease.job_id,
                },
            }));
        let finished = |wanted: FinalStatus| {
            done.iter()
                .filter(|(_, s)| {
                    matches!(s.transition, Transition::Finish { status, .. } if status == wanted)
                })
                .count()
        };
        let (dead, cancelled) = (
            finished(FinalStatus::Dead),
            finished(FinalStatus::Cancelled),
        );
        Ok(RescueReport {
            rescued: done.len() - dead - cancelled,
            dead,
            cancelled,
        })
    }

    // ---- events ------------------------------------------------------------

    /// Subscribes to the lifecycle events of jobs handled through this queue
    /// (and its clones) in this process, from now on. Drop the receiver to
    /// unsubscribe. A subscription holds at most
    /// [`QueueOptions::event_capacity`] unread events (4096 by default): the
    /// queue never waits for it, and a subscriber that fell behind receives
    /// [`Event::Lagged`] with the number of events it missed.
    pub fn subscribe(&self) -> crossbeam_channel::Receiver<Event> {
        self.inner.bus.subscribe()
    }

    /// How long until the next job of `queues` that is not due yet comes due
    /// (delayed, retrying or snoozed, written by any process), or the next
    /// rate window of a rate-limited one of them opens, whichever is first;
    /// `None` when neither. The fetcher sleeps until then.
    pub(crate) fn next_due_in(&self, queues: &[String]) -> Result<Option<Duration>> {
        let now = self.now_micros();
        let due = self.inner.backend.next_due(queues, now)?;
        let window = crate::limits::next_window_in(
            self.all_limits()?
                .iter()
                .filter(|(q, _)| queues.contains(q))
                .map(|(_, limits)| limits),
            now,
        );
        let first = match (due, window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(first.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// A coalescing wake-up that fires when this process enqueues a job.
    pub(crate) fn doorbell(&self) -> crossbeam_channel::Receiver<()> {
        self.inner.bus.doorbell()
    }

    /// A watcher that notices commits by other connections to this database
    /// (the worker's cross-process wake-up), woken by file notifications
    /// where it can be, else checked every `interval`.
    pub(crate) fn watch_changes(
        &self,
        interval: Duration,
    ) -> Result<crate::backend::ChangeWatcher> {
        self.inner.backend.watch_changes(interval, true)
    }

    /// Checkpoints the write-ahead log without waiting on other connections
    /// (the worker's maintenance, when idle). True when the whole log was
    /// copied back.
    pub(crate) fn checkpoint(&self) -> Result<bool> {
        self.inner.backend.checkpoint()
    }

    /// Records that `lease` was settled inside a caller's transaction (which
    /// may still roll back). Every backend's `settle_in` calls it.
    pub(crate) fn note_settled_in(&self, lease: Lease) {
        self.inner
            .settled_in
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease);
    }

    /// Whether `lease` was settled inside a caller's transaction, forgetting
    /// it.
    pub(crate) fn take_settled_in(&self, lease: Lease) -> bool {
        self.inner
            .settled_in
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&lease)
    }

    /// Sends events (the worker's `Started` and `LeaseLost`).
    pub(crate) fn emit(&self, events: impl IntoIterator<Item = Event>) {
        self.inner.bus.emit(events);
    }

    // ---- periodic ----------------------------------------------------------

    /// Validates and encodes `job` as an enqueue at `now` would, writing
    /// nothing: a periodic schedule's job is checked when it is registered.
    pub(crate) fn check_job(&self, job: &NewJob, now: i64) -> Result<()> {
        self.prepare(job.clone(), now).map(|_| ())
    }

    /// Claims a periodic tick (`claim.job` is filled from `job`), and tells
    /// this process's workers and subscribers of an enqueued job as
    /// [`Queue::enqueue`] does.
    pub(crate) fn claim_tick(
        &self,
        claim: ClaimTickParams<'_>,
        job: Option<NewJob>,
    ) -> Result<Claimed> {
        let prepared = job.map(|j| self.prepare(j, claim.now)).transpose()?;
        let claim = ClaimTickParams {
            job: prepared
                .as_ref()
                .and_then(|p| params(std::slice::from_ref(p), claim.now).pop()),
            ..claim
        };
        let claimed = self.inner.backend.claim_tick(&claim)?;
        if matches!(claimed, Claimed::Enqueued(_)) {
            failpoint!("claim-tick-after-commit");
        }
        if let (Claimed::Enqueued(e), Some(p)) = (claimed, &prepared) {
            if !e.existed && self.inner.bus.has_listeners() {
                self.inner.bus.ring();
                self.inner.bus.emit([Event::Enqueued {
                    job_id: e.id,
                    queue: p.job.queue.clone(),
                    kind: p.job.kind.clone(),
                }]);
            }
        }
        Ok(claimed)
    }

    // ---- inspect -----------------------------------------------------------

    /// A job by id, live or finished.
    pub fn get(&self, id: i64) -> Result<JobRecord> {
        self.inner.backend.get(id, self.now_micros())
    }

    /// Waits until job `id` has finished (completed, dead, discarded or
    /// cancelled), whichever process or node ran it, and returns its final
    /// record: the result of a job enqueued here and run elsewhere.
    ///
    /// It sleeps between looks: this process's own events wake it at once,
    /// another process's commit on SQLite within the watch interval
    /// (`PRAGMA data_version`, every 2 ms), and on a server a look every few
    /// milliseconds, backing off to [`WAIT_MAX_POLL`]. Returns
    /// [`Error::Timeout`] after `timeout` (the job may still finish later) and
    /// [`Error::NotFound`] for an unknown id.
    pub fn wait(&self, id: i64, timeout: Duration) -> Result<JobRecord> {
        let deadline = std::time::Instant::now() + timeout;
        let events = self.subscribe();
        // Polling: a file-notification thread per call would cost more than
        // a counter read every couple of milliseconds for a wait's span.
        let mut watcher = self
            .inner
            .backend
            .watch_changes(WAIT_WATCH_INTERVAL, false)?;
        let watch = watcher.signal();
        let mut poll = WAIT_WATCH_INTERVAL;
        loop {
            let record = self.get(id)?;
            if matches!(record.state, JobState::Finished(_)) {
                return Ok(record);
            }
            let next_look = std::time::Instant::now() + poll;
            poll = (poll * 2).min(WAIT_MAX_POLL);
            // Sleep until something may have finished it.
            loop {
                let now = std::time::Instant::now();
                if now >= deadline {
                    return Err(Error::Timeout { job_id: id });
                }
                let left = deadline.min(next_look).saturating_duration_since(now);
                crossbeam_channel::select! {
                    recv(events) -> event => match event {
                        // A lagged subscription may have missed the finish.
                        Ok(e) if e.finishes(id) || matches!(e, Event::Lagged { .. }) => break,
                        Ok(_) => {}
                        // The bus never drops its subscribers while the queue lives.
                        Err(_) => break,
                    },
                    recv(watch) -> _ => {
                        // An error (a lock during WAL recovery) counts as a change.
                        if watcher.changed().unwrap_or(true) {
                            break;
                        }
                    }
                    default(left) => {
                        if std::time::Instant::now() >= next_look {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One page of jobs matching `filter`, by ascending id.
    pub fn list(&self, filter: &JobFilter) -> Result<Page> {
        if filter.limit == 0 {
            return Err(Error::InvalidArgument(
                "page limit must be at least 1".into(),
            ));
        }
        self.inner.backend.list(filter, self.now_micros())
    }

    /// How many jobs each queue holds in each state; empty states are left out.
    ///
    /// The list mixes two kinds of count: live jobs by their state now
    /// (available, scheduled, retrying, running), and finished jobs by their
    /// history status ([`JobState::Finished`], for as long as
    /// [`Retention`] keeps them). Tell them apart with
    /// [`JobState::is_finished`]:
    ///
    /// ```
    /// # use backlog::{NewJob, Queue};
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = Queue::open(dir.path().join("app.db"))?;
    /// # queue.enqueue(NewJob::new("k", serde_json::json!({})))?;
    /// let counts = queue.counts()?;
    /// let live: u64 = counts.iter().filter(|c| !c.state.is_finished()).map(|c| c.count).sum();
    /// let dead: u64 = counts.iter().filter(|c| c.state == backlog::JobState::DEAD).map(|c| c.count).sum();
    /// assert_eq!((live, dead), (1, 0));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`JobState::Finished`]: crate::JobState::Finished
    /// [`JobState::is_finished`]: crate::JobState::is_finished
    pub fn counts(&self) -> Result<Vec<StateCount>> {
        self.inner.backend.counts(self.now_micros())
    }

    /// Runs a dead, discarded or cancelled job again: it moves back from
    /// history to live, available at once, attempts reset, errors kept.
    /// [`Error::InvalidState`] for a completed job, a live one (see
    /// [`Queue::run_now`]), or one whose unique key a live job now holds.
    pub fn retry(&self, id: i64) -> Result<()> {
        let result = self.inner.backend.retry(id, self.now_micros());
        self.not_a_member(id, result)
    }

    /// Makes a scheduled or retrying job due now (a manual trigger), keeping
    /// its attempts; a job already available keeps its place.
    /// [`Error::InvalidState`] for a running or finished job.
    pub fn run_now(&self, id: i64) -> Result<()> {
        let result = self.inner.backend.run_now(id, self.now_micros());
        self.not_a_member(id, result)
    }

    /// Cancels a job. One that is not running moves to history as `cancelled`
    /// at once; a running one is flagged and its handler told at the next
    /// heartbeat.
    pub fn cancel(&self, id: i64) -> Result<CancelOutcome> {
        let result = self.inner.backend.cancel(id, self.now_micros());
        self.not_a_member(id, result)
    }

    /// Deletes a job, live or finished. A worker running it gets `LeaseLost`.
    pub fn delete(&self, id: i64) -> Result<()> {
        let result = self.inner.backend.delete(id);
        self.not_a_member(id, result)
    }

    /// Pauses a queue: leases skip it until it is resumed.
    pub fn pause(&self, queue: &str) -> Result<()> {
        validate::name("queue", queue)?;
        self.inner
            .backend
            .set_paused(queue, true, self.now_micros())
    }

    /// Resumes a paused queue.
    pub fn resume(&self, queue: &str) -> Result<()> {
        validate::name("queue", queue)?;
        self.inner
            .backend
            .set_paused(queue, false, self.now_micros())
    }

    /// Sets a queue's limits, replacing the ones it had; `QueueLimits::default()`
    /// clears them. Every lease from then on honours them, in every process
    /// and node (see [`limits`](crate::limits) for how, and for the rate
    /// window). [`Error::InvalidLimit`] for a zero or out-of-range value, or
    /// `InvalidName` for the queue; nothing is written then.
    pub fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        validate::name("queue", queue)?;
        limits.validate()?;
        self.inner
            .backend
            .set_limits(queue, &limits, self.now_micros())
    }

    /// A queue's limits; `QueueLimits::default()` (none) for a queue never
    /// limited.
    pub fn limits(&self, queue: &str) -> Result<QueueLimits> {
        validate::name("queue", queue)?;
        Ok(self
            .all_limits()?
            .into_iter()
            .find(|(name, _)| name == queue)
            .map(|(_, limits)| limits)
            .unwrap_or_default())
    }

    /// Every queue that has a limit, with its limits, by name.
    pub fn all_limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.inner.backend.limits()
    }

    /// The names of the paused queues.
    pub fn paused_queues(&self) -> Result<Vec<String>> {
        self.inner.backend.paused_queues()
    }

    /// Deletes up to `limit` finished jobs per status that are older than
    /// `retention` allows, oldest first. Returns how many were deleted; call
    /// again while it returns a full batch.
    pub fn prune_history(&self, retention: &Retention, limit: usize) -> Result<usize> {
        let now = self.now_micros();
        let mut deleted = 0;
        for status in FinalStatus::ALL {
            if let Some(keep) = retention.for_status(status) {
                let cutoff = now.saturating_sub(duration_micros(keep)?);
                let pruned = self.inner.backend.prune(status, cutoff, limit)?;
                if pruned > 0 {
                    failpoint!("prune");
                }
                deleted += pruned;
            }
        }
        Ok(deleted)
    }
}

// ---- operate: what the CLI and the dashboard share ------------------------

impl Queue {
    /// Changes a waiting job (available, scheduled or retrying): its
    /// priority, when it is due, or its queue. Every value is checked before
    /// anything is written; a `run_at` in the past means now. Attempts and
    /// errors are kept.
    ///
    /// [`Error::NotFound`] for an unknown id; [`Error::InvalidState`] for a
    /// running or finished job, or when a live job of the target queue
    /// already holds the job's unique key; [`Error::InvalidArgument`] for an
    /// update that changes nothing.
    pub fn update(&self, id: i64, update: &JobUpdate) -> Result<()> {
        if update.is_empty() {
            return Err(Error::InvalidArgument(
                "an update needs a priority, a run time or a queue".into(),
            ));
        }
        if let Some(queue) = &update.queue {
            validate::name("queue", queue)?;
        }
        let now = self.now_micros();
        let available_at = match update.run_at {
            None => None,
            Some(at) if at < UNIX_EPOCH => Some(now),
            Some(at) => Some(system_time_to_micros(at)?.max(now)),
        };
        let result = self.inner.backend.update(&UpdateParams {
            id,
            priority: update.priority,
            available_at,
            queue: update.queue.as_deref(),
            now,
        });
        self.not_a_member(id, result)
    }

    /// An operator action's `NotFound` for a job waiting in its group:
    /// [`Error::InvalidState`] instead, since the job exists but belongs to
    /// its group until the group is combined.
    fn not_a_member<T>(&self, id: i64, result: Result<T>) -> Result<T> {
        match result {
            Err(Error::NotFound { .. })
                if self.get(id).is_ok_and(|r| r.state == JobState::Grouped) =>
            {
                Err(Error::InvalidState {
                    job_id: id,
                    reason: "it waits in its group, which decides when it runs; it leaves \
                             the group only when the group is combined"
                        .into(),
                })
            }
            other => other,
        }
    }

    // ---- groups ------------------------------------------------------------

    /// Combines up to `limit` groups that are ready (see [`crate::group`]),
    /// each into one job due now, in one transaction; returns the jobs
    /// inserted. A worker with a group handler calls this on time by itself;
    /// call it to combine groups without one. Safe on any number of
    /// processes at once: each member goes into exactly one job.
    pub fn aggregate(&self, limit: usize) -> Result<AggregateReport> {
        if limit == 0 {
            return Err(Error::InvalidArgument(
                "aggregate needs a limit of at least 1".into(),
            ));
        }
        let done = self.inner.backend.aggregate(self.now_micros(), limit)?;
        if !done.is_empty() && self.inner.bus.has_listeners() {
            self.inner.bus.ring();
            self.inner.bus.emit(done.iter().map(|a| Event::Enqueued {
                job_id: a.job_id,
                queue: a.queue.clone(),
                kind: a.kind.clone(),
            }));
        }
        Ok(AggregateReport {
            jobs: done.iter().map(|a| (a.job_id, a.members)).collect(),
        })
    }

    /// How long until the next group is ready (zero when one is); `None`
    /// when no group has members waiting.
    pub(crate) fn next_group_ready_in(&self) -> Result<Option<Duration>> {
        let due = self.inner.backend.next_group_ready(self.now_micros())?;
        Ok(due.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// Every queue at a glance, by name: its live jobs by state, its dead
    /// jobs, completions in the last hour and minute, whether it is paused,
    /// and its limits. A queue is listed when it has live or dead jobs,
    /// completed one in the last hour, is paused or has a limit.
    ///
    /// Counts the live jobs (a scan of the live table) and reads the dead
    /// and recently completed ranges of history, never the rest of it.
    pub fn stats(&self) -> Result<Vec<QueueStats>> {
        let now = self.now_micros();
        let hour_ago = now.saturating_sub(3_600_000_000);
        let minute_ago = now.saturating_sub(60_000_000);
        let mut by_queue = std::collections::BTreeMap::<String, QueueStats>::new();
        fn entry<'m>(
            by_queue: &'m mut std::collections::BTreeMap<String, QueueStats>,
            queue: &str,
        ) -> &'m mut QueueStats {
            by_queue
                .entry(queue.to_owned())
                .or_insert_with(|| QueueStats {
                    queue: queue.to_owned(),
                    ..QueueStats::default()
                })
        }
        for c in self.inner.backend.depth(now)? {
            let stats = entry(&mut by_queue, &c.queue);
            match c.state {
                JobState::Available => stats.available += c.count,
                JobState::Scheduled => stats.scheduled += c.count,
                JobState::Retrying => stats.retrying += c.count,
                JobState::Running => stats.running += c.count,
                JobState::Grouped => stats.grouped += c.count,
                JobState::Finished(FinalStatus::Dead) => stats.dead += c.count,
                JobState::Finished(_) => {}
            }
        }
        for r in self
            .inner
            .backend
            .recent_completions(hour_ago, minute_ago)?
        {
            let stats = entry(&mut by_queue, &r.queue);
            stats.completed_last_hour = r.hour;
            stats.completed_last_minute = r.minute;
        }
        let paused = self.paused_queues()?;
        for queue in &paused {
            entry(&mut by_queue, queue).paused = true;
        }
        for (queue, limits) in self.all_limits()? {
            entry(&mut by_queue, &queue).limits = limits;
        }
        Ok(by_queue.into_values().collect())
    }

    /// How many jobs finished in each of the last `minutes` minutes, per
    /// queue and status (completed, discarded, cancelled, dead): throughput
    /// and failures over time, as the dashboard charts them. Minutes without
    /// finished jobs are left out; `minutes` is at most 1440 (a day).
    ///
    /// Reads the recent range of the history's `(status, finished_at)`
    /// index, never the rest of it.
    ///
    /// ```
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = backlog::Queue::open(dir.path().join("app.db"))?;
    /// use backlog::{FinalStatus, LeaseRequest, NewJob};
    ///
    /// queue.enqueue(NewJob::new("email", serde_json::json!({})))?;
    /// let job = queue.lease(&LeaseRequest::new("worker-1", 1))?.remove(0);
    /// queue.complete(&job, None)?;
    /// let last_hour = queue.finished_per_minute(60)?;
    /// assert_eq!(last_hour[0].status, FinalStatus::Completed);
    /// assert_eq!((last_hour[0].minutes_ago, last_hour[0].count), (0, 1));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Error::InvalidArgument`] when `minutes` is 0 or more than 1440.
    pub fn finished_per_minute(&self, minutes: u32) -> Result<Vec<FinishedCount>> {
        if !(1..=1440).contains(&minutes) {
            return Err(crate::Error::InvalidArgument(format!(
                "finished_per_minute looks back 1 to 1440 minutes, not {minutes}"
            )));
        }
        let now = self.now_micros();
        // The oldest minute reported is `minutes - 1` ago, in full.
        let since = now.saturating_sub(i64::from(minutes) * 60_000_000 - 1);
        let mut counts: Vec<FinishedCount> = self
            .inner
            .backend
            .finished_per_minute(since, now)?
            .into_iter()
            .filter_map(|row| {
                Some(FinishedCount {
                    queue: row.queue,
                    status: FinalStatus::parse(&row.status)?,
                    minutes_ago: u32::try_from(row.minutes_ago).ok()?.min(minutes - 1),
                    count: row.count.max(0) as u64,
                })
            })
            .collect();
        counts.sort_by(|a, b| {
            (a.minutes_ago, &a.queue, a.status.as_str()).cmp(&(
                b.minutes_ago,
                &b.queue,
                b.status.as_str(),
            ))
        });
        Ok(counts)
    }

    /// The jobs of `queue` holding unique key `key`: the live one (there is
    /// at most one) first, then the finished ones, most recent first, at most
    /// [`FIND_UNIQUE_HISTORY`] of those. Empty when no job holds it.
    /// Two indexed reads.
    ///
    /// ```
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = backlog::Queue::open(dir.path().join("app.db"))?;
    /// use backlog::NewJob;
    ///
    /// let job = NewJob::new("invoice", serde_json::json!({})).unique_key("INV-7");
    /// let id = queue.enqueue(job)?.id;
    /// let found = queue.find_by_unique_key("default", "INV-7")?;
    /// assert_eq!(found.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
    /// assert!(queue.find_by_unique_key("default", "INV-8")?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn find_by_unique_key(&self, queue: &str, key: &str) -> Result<Vec<JobRecord>> {
        let ids = self
            .inner
            .backend
            .find_unique(queue, key, FIND_UNIQUE_HISTORY as i64)?;
        let mut records = Vec::with_capacity(ids.len());
        for id in ids {
            match self.get(id) {
                Ok(record) => records.push(record),
                // Deleted (or pruned) since the lookup.
                Err(crate::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(records)
    }

    /// SQLite: how this queue's WAL checkpoints ended so far, as
    /// `(complete, partial, failed)`; `None` on a server.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn checkpoint_counts(&self) -> Option<(u64, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        match &self.inner.backend {
            Backend::Sqlite(db) => {
                let s = &db.checkpoint_stats;
                Some((
                    s.complete.load(Relaxed),
                    s.partial.load(Relaxed),
                    s.failed.load(Relaxed),
                ))
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// SQLite: the longest the engine's maintenance held this queue's write
    /// gate at once (a rescue or prune transaction of a worker, a slice of
    /// WAL truncation, a checkpoint catching up), for benchmarks and tests.
    /// `None` on a server.
    #[doc(hidden)]
    pub fn longest_maintenance_hold(&self) -> Option<Duration> {
        match &self.inner.backend {
            Backend::Sqlite(db) => Some(db.longest_maintenance_hold()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Counts the last write of this thread (a worker's rescue or prune) as
    /// a maintenance hold of the write gate; nothing on a server.
    pub(crate) fn note_maintenance_write(&self) {
        #[allow(irrefutable_let_patterns)]
        if let Backend::Sqlite(db) = &self.inner.backend {
            db.note_maintenance_hold(crate::backend::sqlite::connection::last_write_hold());
        }
    }

    /// The size of the SQLite write-ahead log in bytes (0 when there is
    /// none); `None` on a server backend.
    pub fn wal_size(&self) -> Option<u64> {
        let mut wal = self.path()?.as_os_str().to_owned();
        wal.push("-wal");
        Some(std::fs::metadata(wal).map_or(0, |m| m.len()))
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    /// Live jobs per queue and state, and dead jobs per queue: the cheap
    /// part of [`Queue::counts`] that metrics scrape.
    pub(crate) fn depth(&self) -> Result<Vec<StateCount>> {
        self.inner.backend.depth(self.now_micros())
    }

    /// Discards a job that is waiting to run (available, scheduled or
    /// retrying): it moves to history as `discarded`, with `reason` as its
    /// last error. What an operator does to a job that must not run; a
    /// handler discards its own job with [`Queue::discard`].
    /// [`Error::NotFound`], or [`Error::InvalidState`] for a running job
    /// (see [`Queue::cancel`]) or a finished one.
    pub fn discard_job(&self, id: i64, reason: &str) -> Result<()> {
        let result = self.inner.backend.discard(id, reason, self.now_micros());
        self.not_a_member(id, result)
    }

    /// Discards every waiting job matching `filter`, page by page; see
    /// [`Queue::discard_job`].
    pub fn discard_matching(&self, filter: &JobFilter, reason: &str) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.discard_job(id, reason).map(|()| false))
    }

    /// Retries every job matching `filter` (a dead, discarded or cancelled
    /// state), page by page, each in its own transaction; see
    /// [`Queue::retry`].
    pub fn retry_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.retry(id).map(|()| false))
    }

    /// Cancels every job matching `filter`, page by page; see
    /// [`Queue::cancel`]. Running jobs are asked to stop
    /// ([`BulkReport::requested`]).
    pub fn cancel_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| {
            self.cancel(id).map(|o| o == CancelOutcome::Requested)
        })
    }

    /// Deletes every job matching `filter`, page by page; see
    /// [`Queue::delete`].
    pub fn delete_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.delete(id).map(|()| false))
    }

    /// Applies `op` to every job `filter` lists, in id order. A job that
    /// moved on since it was listed (`NotFound`, `InvalidState`) is skipped;
    /// any other error stops the walk. `op` returns whether the job's change
    /// is only requested.
    fn for_each_matching(
        &self,
        filter: &JobFilter,
        op: impl Fn(i64) -> Result<bool>,
    ) -> Result<BulkReport> {
        let mut report = BulkReport::default();
        let mut filter = filter.clone();
        loop {
            let page = self.list(&filter)?;
            for job in &page.jobs {
                match op(job.id) {
                    Ok(requested) => {
                        report.done += 1;
                        report.requested += u64::from(requested);
                    }
                    Err(Error::NotFound { .. } | Error::InvalidState { .. }) => report.skipped += 1,
                    Err(e) => return Err(e),
                }
            }
            match page.next_after {
                Some(after) => filter = filter.after(after),
                None => return Ok(report),
            }
        }
    }
}

/// How often [`Queue::wait`] checks for other processes' commits.
const WAIT_WATCH_INTERVAL: Duration = Duration::from_millis(2);

/// The longest [`Queue::wait`] goes without reading the job again, for
/// changes no watcher reports (another node's completion on a server).
pub const WAIT_MAX_POLL: Duration = Duration::from_millis(250);

/// The event a committed transition produces. `released`: the outcome was
/// [`Outcome::Release`], which reschedules as a snooze does.
fn settled_event(job: &Job, released: bool, transition: &Transition) -> Event {
    let (job_id, attempt) = (job.id, job.attempt);
    match transition {
        Transition::Finish { status, .. } => match status {
            // Only the aggregator writes `aggregated`, never a settle.
            FinalStatus::Completed | FinalStatus::Aggregated => Event::Completed { job_id },
            FinalStatus::Discarded => Event::Discarded { job_id },
            FinalStatus::Cancelled => Event::Cancelled { job_id },
            FinalStatus::Dead => Event::Dead { job_id },
        },
        Transition::Reschedule { .. } if released => Event::Released { job_id },
        Transition::Reschedule {
            available_at,
            refund_attempt: true,
            ..
        } => Event::Snoozed {
            job_id,
            available_at: clock::at(*available_at),
        },
        Transition::Reschedule { available_at, .. } => Event::Retried {
            job_id,
            attempt,
            available_at: clock::at(*available_at),
        },
    }
}

/// The backend's view of prepared jobs, all stamped with the same `now`.
pub(crate) fn params(prepared: &[Prepared], now: i64) -> Vec<EnqueueParams<'_>> {
    prepared
        .iter()
        .map(|p| EnqueueParams {
            queue: &p.job.queue,
            kind: &p.job.kind,
            priority: p.job.priority,
            unique_key: p.job.unique_key.as_deref(),
            unique_history_since: p.unique_history_since,
            payload: &p.payload,
            max_attempts: p.job.max_attempts,
            available_at: p.available_at,
            now,
            group: match (&p.job.group, p.group) {
                (Some(g), Some((max_size, grace_us, max_delay_us))) => Some(GroupParams {
                    key: &g.key,
                    max_size,
                    grace_us,
                    max_delay_us,
                }),
                _ => None,
            },
        })
        .collect()
}

/// Where [`Queue::connect`] goes.
enum Target {
    Sqlite(PathBuf),
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    Mysql,
}

impl Target {
    fn parse(url: &str) -> Result<Target> {
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("sqlite") => {
                let rest = &url["sqlite:".len()..];
                let path = rest.strip_prefix("//").unwrap_or(rest);
                Ok(Target::Sqlite(PathBuf::from(path)))
            }
            #[cfg(feature = "postgres")]
            Some("postgres" | "postgresql") => Ok(Target::Postgres),
            #[cfg(not(feature = "postgres"))]
            Some("postgres" | "postgresql") => Err(Error::FeatureDisabled {
                feature: "postgres",
            }),
            #[cfg(feature = "mysql")]
            Some("mysql" | "mariadb") => Ok(Target::Mysql),
            #[cfg(not(feature = "mysql"))]
            Some("mysql" | "mariadb") => Err(Error::FeatureDisabled { feature: "mysql" }),
            _ => Err(Error::InvalidArgument(format!(
                "not a database URL (postgres://, mysql:// or sqlite:PATH): {:?}",
                crate::validate::redact_url(url)
            ))),
        }
    }
}
