//! The seam between the engine and the databases.
//!
//! The engine (queue API, validation, retry policy, operator actions, time)
//! decides; a database applies. [`Store`] lists everything a database must
//! do, once, and every backend implements it: SQLite on
//! [`sqlite::Connections`] (`sqlite/store.rs`), PostgreSQL and MySQL on
//! their `Db` (`postgres/mod.rs`, `mysql/mod.rs`), so the compiler checks
//! that none lacks an operation. What an operation takes and returns is in
//! [`params`]: one `*Params` struct per operation, times already decided.
//! Decisions come down as explicit targets (a settle's [`Transition`], a
//! rescue's `decide`); where a database must look before it acts (an
//! operator's retry or cancel), it reports what it found
//! ([`params::Acted`]) and the engine ([`crate::action`]) says what that
//! means, so a rule or an error message is written once.
//!
//! SQL lives only below this module, one folder per database with the same
//! files in the same order (`queries`, `jobs`, `inspect`, `groups`,
//! `flows`, `limits`, `schedules`, `migrate`): the engine never writes any. The
//! [`Backend`] enum is kept only for what one database alone has (typed
//! access for `backlog::sqlite`, `backlog::postgres`, `backlog::mysql`);
//! every other call goes through `&dyn Store`.
//!
//! ## Time on the server backends
//!
//! The engine stamps every operation with `now` from the queue's clock and
//! computes absolute times from it (a retry's `available_at = now + backoff`).
//! SQLite stores those values as they are. PostgreSQL and MySQL serve many
//! nodes whose clocks may disagree, so they read "now" from the database
//! server instead: every absolute time `t` of a `*Params` is applied as the
//! offset `t - now` added to the server's clock. Only a clock moved by hand
//! ([`Clock::is_manual`](crate::Clock::is_manual), the tests' `ManualClock`)
//! overrides the server's: then its `now` is bound as the server's now, so a
//! test steps over a backoff on every backend alike.
//!
//! [`Transition`]: crate::outcome::Transition

pub(crate) mod batches;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod cascade;
pub(crate) mod counts;
pub(crate) mod flows;
pub(crate) mod gauges;
pub(crate) mod inside;
pub(crate) mod live_state;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod params;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod record;
pub(crate) mod registry;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod room;
pub(crate) mod rows;
pub(crate) mod sqlite;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod statements;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod waits;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod watcher;

use std::fmt::Debug;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::inspect::{JobFilter, JobRecord, Page, StateCount};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job};
use crate::limits::QueueLimits;
use crate::outcome::FinalStatus;
// The worker's progress writes name it from here.
pub(crate) use params::ProgressWrite;
use params::{
    Acted, Aggregated, ClaimTickParams, Claimed, EnqueueParams, FinishedInMinute, HeartbeatParams,
    LeaseParams, RecentCompletions, RegisterScheduleParams, ReleaseUnheldParams, RescueParams,
    Rescued, ScheduleRow, SettleAndLeaseParams, SettledAndLeased, UpdateParams,
};

/// Everything a database must do for the engine. Each method is one
/// operation, applied in one transaction unless it says otherwise; `now` is
/// the engine's clock (see the time rule above). A concern with tables of
/// its own is a part of its own ([`Schedules`]), implemented beside its SQL
/// in each backend's file of that name.
pub(crate) trait Store:
    Schedules
    + Workers
    + Flows
    + Batches
    + counts::Counts
    + gauges::FlowGauges
    + rows::Rows
    + Send
    + Sync
    + Debug
{
    /// Applies pending schema migrations. SQLite waits at most
    /// `write_deadline` for the write lock.
    fn migrate(&self, write_deadline: Duration) -> Result<()>;

    /// The migrations this build has that the database has not applied,
    /// oldest first (`V2__due`). Reads only.
    fn pending_migrations(&self) -> Result<Vec<String>>;

    /// Inserts jobs in one transaction.
    fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>;

    /// Combines up to `limit` groups ready at `now`, each into one job, in
    /// one transaction: all of them or none. Server backends lock each
    /// group's row, skipping the ones another node is combining.
    fn aggregate(&self, now: i64, limit: usize) -> Result<Vec<Aggregated>>;

    /// How long after `now` the next group is ready, in µs (0: one is).
    fn next_group_ready(&self, now: i64) -> Result<Option<i64>>;

    /// Claims up to `p.limit` jobs.
    fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>>;

    /// The plan of the lease statement for `p`, one line per node. Claims
    /// nothing.
    fn explain_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<String>>;

    /// How long after `now` the next job of `queues` that is not due yet
    /// comes due, in µs (server backends: measured on the server's clock).
    fn next_due(&self, queues: &[String], now: i64) -> Result<Option<i64>>;

    /// Applies many transitions, then a lease when asked, in one transaction
    /// (see [`SettleAndLeaseParams`]). A lost lease fails only its own item.
    fn settle_and_lease(&self, p: &SettleAndLeaseParams<'_>) -> Result<SettledAndLeased>;

    /// Writes running jobs' progress (never none), fenced on their leases,
    /// in one transaction; returns the ids written. Without `wait`, a server
    /// backend skips a row another transaction holds (a handler's own
    /// transaction, a heartbeat) instead of waiting: it is not in the ids,
    /// and is written later. With it (before a settle), it waits. SQLite's
    /// single writer never skips.
    fn write_progress(&self, writes: &[ProgressWrite], now: i64, wait: bool) -> Result<Vec<i64>>;

    /// Extends leases, fenced on their tokens.
    fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport>;

    /// Lists expired leases and applies the engine's decision for each, in
    /// one transaction (see [`RescueParams`]).
    fn rescue(&self, p: &RescueParams<'_>) -> Result<Vec<Rescued>>;

    /// Lists the leases of a worker that it does not hold and applies the
    /// engine's decision for each, in one transaction (see
    /// [`ReleaseUnheldParams`]).
    fn release_unheld(&self, p: &ReleaseUnheldParams<'_>) -> Result<Vec<Rescued>>;

    /// A job by id, live, finished or grouped.
    fn get(&self, id: i64, now: i64) -> Result<Option<JobRecord>>;

    /// One page of jobs matching `filter`.
    fn list(&self, filter: &JobFilter, now: i64) -> Result<Page>;

    /// Jobs per queue and state, live and finished, of one moment.
    fn counts(&self, now: i64) -> Result<Vec<StateCount>>;

    /// Moves a finished job back to live, due at once, attempts reset, when
    /// [`Action::Retry`](crate::action::Action::Retry) applies to it.
    fn retry(&self, id: i64, now: i64) -> Result<Acted>;

    /// Makes a waiting job due now, keeping its attempts, when
    /// [`Action::RunNow`](crate::action::Action::RunNow) applies to it.
    fn run_now(&self, id: i64, now: i64) -> Result<Acted>;

    /// Finishes a waiting job as cancelled (error "cancelled by request",
    /// attempt 0), or flags a running one for its handler.
    fn cancel(&self, id: i64, now: i64) -> Result<Acted>;

    /// [`cancel`](Store::cancel) of each of a workflow's steps `ids` not
    /// finished when the transaction first looked at them all, in order, in
    /// one transaction (`crate::flow::cancel_unfinished`); `None` for a step
    /// finished or gone by then.
    fn cancel_steps(&self, ids: &[i64], now: i64) -> Result<Vec<Option<Acted>>>;

    /// Moves a waiting job to history as `discarded`, `reason` appended to
    /// its errors (attempt 0).
    fn discard(&self, id: i64, reason: &str, now: i64) -> Result<Acted>;

    /// Deletes a job, live or finished; whether there was one. A worker
    /// running it gets `LeaseLost`. A live or pending job counts as
    /// cancelled for what waits on it, at `now`. A live batch member leaves
    /// its batch, which may finish then (`now` stamps its callbacks).
    fn delete(&self, id: i64, now: i64) -> Result<bool>;

    /// Changes priority, due time or queue of a waiting job; not applied
    /// when the target queue's live jobs already hold its unique key.
    fn update(&self, p: &UpdateParams<'_>) -> Result<Acted>;

    /// Live jobs per queue and derived state at `now`, and dead jobs per
    /// queue: the counts a metrics scrape needs, without counting the rest
    /// of history.
    fn depth(&self, now: i64) -> Result<Vec<StateCount>>;

    /// Completed jobs per queue finished at or after `hour_since`, and of
    /// those, at or after `minute_since`.
    fn recent_completions(
        &self,
        hour_since: i64,
        minute_since: i64,
    ) -> Result<Vec<RecentCompletions>>;

    /// Finished jobs per queue, status and minute since `since` (engine
    /// time, unix µs): a range of the `(status, finished_at)` index.
    fn finished_per_minute(&self, since: i64, now: i64) -> Result<Vec<FinishedInMinute>>;

    /// Pauses (`true`) or resumes (`false`) a queue.
    fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()>;

    /// Inserts jobs copied from another database, keeping their ids; returns
    /// how many were written (the rest were there already).
    fn import(&self, records: &[JobRecord]) -> Result<usize>;

    /// The ids of the jobs holding `key` in `queue`: the live one first,
    /// then up to `history` finished ones, most recent first.
    fn find_unique(&self, queue: &str, key: &str, history: i64) -> Result<Vec<i64>>;

    /// Sets or clears (all `None`) a queue's limits; validated by the engine.
    fn set_limits(&self, queue: &str, limits: &QueueLimits, now: i64) -> Result<()>;

    /// Every queue with a limit, by name.
    fn limits(&self) -> Result<Vec<(String, QueueLimits)>>;

    /// The paused queues.
    fn paused_queues(&self) -> Result<Vec<String>>;

    /// A watcher of commits by other connections (other processes and
    /// nodes), on a connection of its own, to be checked when its signal
    /// fires: on file notifications where SQLite has them and `notified` is
    /// asked for, else every `interval`. On PostgreSQL it fires when a
    /// notification arrives (read by a thread of its own); on MySQL when a
    /// thread of its own probing the newest job id sees a new one (see
    /// `mysql::poller`). On the servers it never fires when `notified` is
    /// false ([`ChangeWatcher::never`]): `interval` is SQLite's only.
    fn watch_changes(&self, interval: Duration, notified: bool) -> Result<ChangeWatcher>;

    /// Copies the write-ahead log back into the database, without waiting on
    /// other connections; whether the whole log was copied. Only SQLite has
    /// one.
    fn checkpoint(&self) -> Result<bool> {
        Ok(true)
    }

    /// Deletes up to `limit` finished jobs of `status` that finished before
    /// `cutoff`; how many.
    fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize>;

    /// How many transactions were retried after a transient failure (SQLite
    /// BUSY, a server's deadlock or serialization failure).
    fn busy_retries(&self) -> u64;
}

/// Periodic schedules (`backlog_schedules`): the part of [`Store`] each
/// backend implements in its `schedules.rs`.
pub(crate) trait Schedules {
    /// Registers a periodic schedule (see [`RegisterScheduleParams`]).
    fn register_schedule(&self, p: &RegisterScheduleParams<'_>) -> Result<()>;

    /// Claims a schedule's due tick and enqueues its job, in one transaction.
    fn claim_tick(&self, p: &ClaimTickParams<'_>) -> Result<Claimed>;

    /// Every schedule, by name.
    fn schedules(&self) -> Result<Vec<ScheduleRow>>;

    /// Deletes a schedule's row; whether there was one.
    fn remove_schedule(&self, name: &str) -> Result<bool>;
}

/// Job dependencies and workflows (`pending`, `dependencies`,
/// `workflows`, `workflow_steps`, see `crate::flow`): the part of [`Store`]
/// each backend implements in its `flows.rs`. A job's dependencies are
/// written by [`Store::enqueue_many`], and applied by every operation that
/// finishes a job, in its transaction.
pub(crate) trait Flows {
    /// Inserts a workflow's row, then its steps' jobs as
    /// [`Store::enqueue_many`] does, each recorded as its step, in one
    /// transaction; the workflow's id and the jobs'.
    fn enqueue_workflow(
        &self,
        w: &params::WorkflowParams<'_>,
        jobs: &[EnqueueParams<'_>],
    ) -> Result<(i64, Vec<Enqueued>)>;

    /// A workflow by id, or the newest of `name`, with its steps.
    fn workflow(&self, id: Option<i64>, name: Option<&str>) -> Result<Option<params::WorkflowRow>>;

    /// The jobs `job_id` depends on, their ends and results, by id.
    fn dependencies(&self, job_id: i64) -> Result<Vec<params::DependencyRow>>;

    /// Job `job_id`'s workflow and step, its batch (while it is a live
    /// member), and the jobs that depend on it.
    fn links(&self, job_id: i64) -> Result<params::JobLinksRow>;
}

/// The live-worker registry (`backlog_workers`, see [`registry`]): the part
/// of [`Store`] each backend implements in its `workers.rs`.
pub(crate) trait Workers {
    /// Inserts or refreshes a worker's row (see
    /// [`registry::RegisterWorkerParams`]).
    fn register_worker(&self, p: &registry::RegisterWorkerParams<'_>) -> Result<()>;

    /// Deletes a worker's row; whether there was one.
    fn deregister_worker(&self, id: &str) -> Result<bool>;

    /// The workers whose row has not expired at `now`, by id.
    fn workers(&self, now: i64) -> Result<Vec<registry::WorkerRow>>;

    /// Every leased job and the worker holding it, by id.
    fn held_jobs(&self) -> Result<Vec<registry::HeldJob>>;

    /// Deletes the rows expired at `now` (crashed workers); how many.
    fn prune_workers(&self, now: i64) -> Result<usize>;

    /// Due jobs per queue and kind at `now`.
    fn due_by_kind(&self, now: i64) -> Result<Vec<registry::DueCount>>;
}

/// Batches (`backlog_batches`, see [`crate::batch`]): the part of [`Store`]
/// each backend implements in its `batches.rs`. Members are counted by the
/// finishing paths themselves (`jobs.rs`), each with one call into that file.
pub(crate) trait Batches {
    /// Inserts an open batch; its id.
    fn create_batch(&self, p: &crate::batch::CreateBatchParams<'_>) -> Result<i64>;

    /// Seals a batch, and enqueues its callbacks when every member has
    /// finished, in one transaction; the row after, `None` when there is no
    /// such batch.
    fn seal_batch(&self, id: i64, now: i64) -> Result<Option<crate::batch::BatchRow>>;

    /// A batch's row. Reads only.
    fn batch(&self, id: i64) -> Result<Option<crate::batch::BatchRow>>;

    /// Deletes up to `limit` finished batches whose `finished_at` is before
    /// `cutoff` (the engine's clock) and whose callback jobs are finished
    /// (`batch.rs`'s rule); how many.
    fn prune_batches(&self, cutoff: i64, limit: usize) -> Result<usize>;
}

/// The database behind a queue. A private enum rather than a generic, so the
/// public types never carry a backend parameter; matched only where one
/// database's own types are needed, everything else goes through
/// [`Backend::store`].
#[derive(Debug)]
pub(crate) enum Backend {
    Sqlite(sqlite::Connections),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Db),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Db),
}

impl Backend {
    /// The database, as the engine sees every one of them.
    pub(crate) fn store(&self) -> &dyn Store {
        match self {
            Backend::Sqlite(db) => db,
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => db,
            #[cfg(feature = "mysql")]
            Backend::Mysql(db) => db,
        }
    }
}

/// Notices commits made by other connections (another process's enqueue),
/// cheaply enough to be asked whenever its signal fires.
#[derive(Debug)]
pub(crate) struct ChangeWatcher {
    /// `None`: never reports a change; its owner polls by itself.
    source: Option<Box<dyn Changes>>,
    signal: crossbeam_channel::Receiver<Instant>,
}

/// What a database watches commits with: SQLite's data version, a
/// PostgreSQL listener, a MySQL poller.
pub(crate) trait Changes: Send + Debug {
    /// True when something was committed since the last call (or, for a
    /// watcher that can only poll, when it is time to look again).
    fn changed(&mut self) -> Result<bool>;

    /// True when woken by the operating system's file notifications rather
    /// than a timer.
    fn is_notified(&self) -> bool {
        false
    }

    /// True when every commit by another connection counts as a change
    /// (SQLite's data version), settles included; a server's watcher
    /// reports new jobs only.
    fn sees_every_commit(&self) -> bool {
        false
    }
}

impl ChangeWatcher {
    /// Checks `source` whenever `signal` fires.
    pub(crate) fn new(
        source: impl Changes + 'static,
        signal: crossbeam_channel::Receiver<Instant>,
    ) -> ChangeWatcher {
        ChangeWatcher {
            source: Some(Box::new(source)),
            signal,
        }
    }

    /// A watcher that never fires: for a caller that polls by itself.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn never() -> ChangeWatcher {
        ChangeWatcher {
            source: None,
            signal: crossbeam_channel::never(),
        }
    }

    /// True when something was committed since the last call (or, for a
    /// backend that can only poll, when it is time to look again).
    pub(crate) fn changed(&mut self) -> Result<bool> {
        match &mut self.source {
            Some(source) => source.changed(),
            None => Ok(false),
        }
    }

    /// Fires when it is time to call [`ChangeWatcher::changed`].
    pub(crate) fn signal(&self) -> crossbeam_channel::Receiver<Instant> {
        self.signal.clone()
    }

    /// True when every commit by another connection counts as a change
    /// (see [`Changes::sees_every_commit`]); false for a watcher that
    /// never fires.
    pub(crate) fn sees_every_commit(&self) -> bool {
        self.source.as_ref().is_some_and(|s| s.sees_every_commit())
    }

    /// True when woken by the operating system's file notifications rather
    /// than a timer.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_notified(&self) -> bool {
        self.source.as_ref().is_some_and(|s| s.is_notified())
    }
}
