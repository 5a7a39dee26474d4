//! The boundary between the engine and the databases.
//!
//! The engine (queue API, validation, retry policy, time) decides; a backend
//! applies, and is the only place SQL is written. Each database keeps
//! everything it needs in its own folder (`sqlite/`, `postgres/`, `mysql/`),
//! with one `*Params` struct per operation so the engine never depends on a
//! dialect.
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

pub(crate) mod inside;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod registry;
pub(crate) mod sqlite;

use crate::lease::Lease;
use crate::outcome::Transition;

/// One job to insert, validated and encoded by the engine.
#[derive(Debug)]
pub(crate) struct EnqueueParams<'a> {
    pub queue: &'a str,
    pub kind: &'a str,
    pub priority: i32,
    pub unique_key: Option<&'a str>,
    /// With a unique key: also match history rows finished at or after this
    /// time (unix µs).
    pub unique_history_since: Option<i64>,
    pub payload: &'a str,
    pub max_attempts: u32,
    pub available_at: i64,
    pub now: i64,
    /// A grouped job: it waits in its group instead of being inserted live.
    pub group: Option<GroupParams<'a>>,
}

/// The group a job joins, and the group's policy (µs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupParams<'a> {
    pub key: &'a str,
    pub max_size: u32,
    pub grace_us: i64,
    pub max_delay_us: i64,
}

/// A group combined into one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Aggregated {
    pub job_id: i64,
    pub queue: String,
    pub kind: String,
    pub members: usize,
}

/// One claim of up to `limit` jobs.
#[derive(Debug)]
pub(crate) struct LeaseParams<'a> {
    pub queues: &'a [String],
    /// `None` claims any kind.
    pub kinds: Option<&'a [String]>,
    pub limit: usize,
    pub worker_id: &'a str,
    pub now: i64,
    pub lease_until: i64,
    /// At most this many jobs of these queues (the caller's own cap, on top
    /// of the queues' limits).
    pub caps: &'a [(String, usize)],
}

/// One decided state change of a leased job, fenced on its lease.
#[derive(Debug)]
pub(crate) struct SettleParams {
    pub lease: Lease,
    pub transition: Transition,
    pub now: i64,
}

/// Extends these leases to `lease_until`.
#[derive(Debug)]
pub(crate) struct HeartbeatParams<'a> {
    pub leases: &'a [Lease],
    pub lease_until: i64,
    pub now: i64,
}

/// A running job's progress to write, fenced on its lease.
#[derive(Debug, Clone)]
pub(crate) struct ProgressWrite {
    pub lease: Lease,
    /// JSON text, validated and size-capped by the engine.
    pub progress: String,
}

/// A leased job whose lease expired, as the rescuer sees it: no payload.
#[derive(Debug)]
pub(crate) struct ExpiredLease {
    pub lease: Lease,
    pub attempts: u32,
    pub max_attempts: u32,
    /// When the job was due before it was claimed: its place in line.
    pub available_at: i64,
    /// `cancel(id)` was called while it ran: the rescue finishes it as
    /// cancelled instead of running it again.
    pub cancel_requested: bool,
}

/// A decided change to a job that is not leased; `None` fields keep their
/// value. The engine validated every value.
#[derive(Debug)]
pub(crate) struct UpdateParams<'a> {
    pub id: i64,
    pub priority: Option<i32>,
    pub available_at: Option<i64>,
    pub queue: Option<&'a str>,
    pub now: i64,
}

/// Completed jobs per queue since two points in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecentCompletions {
    pub queue: String,
    /// Completed at or after `StatsParams::hour_since`.
    pub hour: u64,
    /// Completed at or after `StatsParams::minute_since`.
    pub minute: u64,
}

/// A periodic schedule as stored (`backlog_schedules`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScheduleRow {
    pub name: String,
    pub expression: String,
    /// The next tick not yet claimed (unix µs of the schedule's calendar).
    pub next_tick: i64,
    /// The last tick enqueued.
    pub last_tick: Option<i64>,
    pub updated_at: i64,
}

/// Registers a schedule: inserts its row, or when the stored expression
/// differs, replaces it and its next tick (the last registration wins). A
/// row with the same expression is left as it is, its next tick included:
/// a tick missed while no scheduler ran is still seen as missed.
#[derive(Debug)]
pub(crate) struct RegisterScheduleParams<'a> {
    pub name: &'a str,
    pub expression: &'a str,
    pub next_tick: i64,
    pub now: i64,
}

/// Claims the due tick of a schedule: moves `next_tick` on from `seen`, only
/// if the row still holds `seen` and `expression` (the compare-and-set that
/// makes a tick once across schedulers), and in the same transaction
/// enqueues `job` and records `tick` as the last tick; without a job the
/// missed tick is skipped.
#[derive(Debug)]
pub(crate) struct ClaimTickParams<'a> {
    pub name: &'a str,
    pub expression: &'a str,
    pub seen: i64,
    pub next_tick: i64,
    pub tick: i64,
    pub job: Option<EnqueueParams<'a>>,
    pub now: i64,
}

/// What a claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Another scheduler claimed it first, or the schedule was removed or
    /// registered again with another expression: nothing was written.
    Lost,
    /// The tick was skipped (missed during downtime).
    Skipped,
    /// The tick's job was enqueued (or, `existed`, its unique key was held).
    Enqueued(Enqueued),
}

/// Jobs of one queue that finished with one status in one minute: a row of
/// [`Backend::finished_per_minute`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FinishedInMinute {
    pub queue: String,
    pub status: String,
    /// Whole minutes between `finished_at` and now (0: the last minute).
    pub minutes_ago: i64,
    pub count: i64,
}

use crate::error::Result;
use crate::inspect::{CancelOutcome, JobFilter, JobRecord, Page, StateCount};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job};
use crate::outcome::FinalStatus;

/// The database behind a queue. A private enum rather than a generic, so the
/// public types never carry a backend parameter.
#[derive(Debug)]
pub(crate) enum Backend {
    Sqlite(sqlite::Connections),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Db),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Db),
}

/// Runs `$sqlite` for SQLite, and `$server` for each server backend compiled
/// in, with `$db` bound to the backend's handle. The server backends expose
/// the same method names, so one expression serves both.
macro_rules! dispatch {
    ($self:expr, $db:ident => $sqlite:expr, server => $server:expr) => {
        match $self {
            Backend::Sqlite($db) => $sqlite,
            #[cfg(feature = "postgres")]
            Backend::Postgres($db) => $server,
            #[cfg(feature = "mysql")]
            Backend::Mysql($db) => $server,
        }
    };
}

impl Backend {
    /// Applies pending schema migrations.
    pub(crate) fn migrate(&self, write_deadline: std::time::Duration) -> Result<()> {
        dispatch!(self, db => sqlite::migrate::migrate(&mut *db.writer()?, write_deadline),
            server => db.migrate())
    }

    /// The migrations this build has that the database has not applied,
    /// oldest first (`V2__due`). Reads only.
    pub(crate) fn pending_migrations(&self) -> Result<Vec<String>> {
        dispatch!(self, db => db.read(sqlite::migrate::pending),
            server => db.pending_migrations())
    }

    /// Inserts jobs in one transaction.
    pub(crate) fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        dispatch!(self, db => db.write(|tx| {
                let ids = sqlite::jobs::enqueue_all(tx, jobs)?;
                failpoint!("enqueue-before-commit");
                Ok(ids)
            }),
            server => db.enqueue_many(jobs))
    }

    /// Combines up to `limit` groups ready at `now`, each into one job, in
    /// one transaction: all of them or none. Server backends lock each
    /// group's row, skipping the ones another node is combining.
    pub(crate) fn aggregate(&self, now: i64, limit: usize) -> Result<Vec<Aggregated>> {
        dispatch!(self, db => db.write(|tx| {
                let done = sqlite::groups::aggregate(tx, now, limit)?;
                if !done.is_empty() {
                    failpoint!("aggregate-before-commit");
                }
                Ok(done)
            }),
            server => db.aggregate(now, limit))
    }

    /// How long after `now` the next group is ready, in µs (0: one is).
    pub(crate) fn next_group_ready(&self, now: i64) -> Result<Option<i64>> {
        dispatch!(self, db => db.read(|c| sqlite::groups::next_ready(c, now)),
            server => db.next_group_ready(now))
    }

    pub(crate) fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
        dispatch!(self, db => db.write(|tx| sqlite::jobs::lease(tx, p)), server => db.lease(p))
    }

    /// The plan of the lease statement for `p`, one line per node. Claims
    /// nothing.
    pub(crate) fn explain_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<String>> {
        dispatch!(self, db => db.read(|conn| sqlite::jobs::explain_lease(conn, p)),
            server => db.explain_lease(p))
    }

    /// How long after `now` the next job of `queues` that is not due yet
    /// comes due, in µs (server backends: measured on the server's clock).
    pub(crate) fn next_due(&self, queues: &[String], now: i64) -> Result<Option<i64>> {
        dispatch!(self, db => db.read(|c| sqlite::jobs::next_due(c, queues, now)),
            server => db.next_due(queues, now))
    }

    /// Applies many transitions, then a lease with `lease` when given, in
    /// one transaction (group commit for both halves). A lost lease fails
    /// only its own item; an item's `Ok(true)` says a cancel requested while
    /// the job ran won over its reschedule. With `until`, SQLite gives up
    /// then (`Busy`) however long another process holds the write lock; the
    /// servers have no such lock and keep their own bounds.
    pub(crate) fn settle_and_lease(
        &self,
        items: &[&SettleParams],
        lease: Option<&LeaseParams<'_>>,
        until: Option<std::time::Instant>,
    ) -> Result<(Vec<Result<bool>>, Vec<Job>)> {
        match self {
            Backend::Sqlite(db) => {
                let apply = |tx: &rusqlite::Transaction<'_>| {
                    let results = items
                        .iter()
                        .map(|p| match sqlite::jobs::settle_reporting(tx, p) {
                            Err(e) if !e.is_lease_lost() => Err(e),
                            result => Ok(result),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    failpoint!("settle-before-commit");
                    let jobs = match lease {
                        Some(p) => sqlite::jobs::lease(tx, p)?,
                        None => Vec::new(),
                    };
                    Ok((results, jobs))
                };
                match until {
                    Some(until) => db.write_until(until, apply),
                    None => db.write(apply),
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => db.settle_and_lease(items, lease),
            #[cfg(feature = "mysql")]
            Backend::Mysql(db) => db.settle_and_lease(items, lease),
        }
    }

    /// Writes running jobs' progress, fenced on their leases, in one
    /// transaction; returns the ids written. Without `wait`, a server
    /// backend skips a row another transaction holds (a handler's own
    /// transaction, a heartbeat) instead of waiting: it is not in the ids,
    /// and is written later. With it (before a settle), it waits.
    pub(crate) fn write_progress(
        &self,
        writes: &[ProgressWrite],
        now: i64,
        wait: bool,
    ) -> Result<Vec<i64>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let _ = wait; // SQLite's single writer never skips.
        dispatch!(self, db => db.write(|tx| sqlite::jobs::write_progress(tx, writes, now)),
            server => db.write_progress(writes, now, wait))
    }

    pub(crate) fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
        dispatch!(self, db => db.write(|tx| sqlite::jobs::heartbeat(tx, p)),
            server => db.heartbeat(p))
    }

    /// Lists expired leases and applies the engine's decision for each, in one
    /// transaction.
    pub(crate) fn rescue(
        &self,
        now: i64,
        limit: usize,
        decide: impl Fn(&ExpiredLease) -> SettleParams,
    ) -> Result<Vec<(ExpiredLease, SettleParams)>> {
        dispatch!(self, db => db.write(|tx| {
                let mut done = Vec::new();
                for expired in sqlite::jobs::expired_leases(tx, now, limit)? {
                    let settle = decide(&expired);
                    sqlite::jobs::settle(tx, &settle)?;
                    done.push((expired, settle));
                }
                Ok(done)
            }),
            server => db.rescue(now, limit, &decide))
    }

    pub(crate) fn get(&self, id: i64, now: i64) -> Result<JobRecord> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::get(c, id, now)),
            server => db.get(id, now))
    }

    pub(crate) fn list(&self, filter: &JobFilter, now: i64) -> Result<Page> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::list(c, filter, now)),
            server => db.list(filter, now))
    }

    pub(crate) fn counts(&self, now: i64) -> Result<Vec<StateCount>> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::counts(c, now)),
            server => db.counts(now))
    }

    pub(crate) fn retry(&self, id: i64, now: i64) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::retry(tx, id, now)),
            server => db.retry(id, now))
    }

    pub(crate) fn run_now(&self, id: i64, now: i64) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::run_now(tx, id, now)),
            server => db.run_now(id, now))
    }

    pub(crate) fn cancel(&self, id: i64, now: i64) -> Result<CancelOutcome> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::cancel(tx, id, now)),
            server => db.cancel(id, now))
    }

    /// Moves a job that is not running to history as `discarded`, `reason`
    /// appended to its errors (attempt 0): `NotFound`, or `InvalidState` for
    /// a running or finished job.
    pub(crate) fn discard(&self, id: i64, reason: &str, now: i64) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::discard(tx, id, reason, now)),
            server => db.discard(id, reason, now))
    }

    pub(crate) fn delete(&self, id: i64) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::delete(tx, id)),
            server => db.delete(id))
    }

    /// Changes priority, due time or queue of a job that is not leased:
    /// `NotFound`, or `InvalidState` for a running or finished job or when
    /// the target queue's live jobs already hold its unique key.
    pub(crate) fn update(&self, p: &UpdateParams<'_>) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::update(tx, p)),
            server => db.update(p))
    }

    /// Live jobs per queue and derived state at `now`, and dead jobs per
    /// queue: the counts a metrics scrape needs, without counting the rest
    /// of history.
    pub(crate) fn depth(&self, now: i64) -> Result<Vec<StateCount>> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::depth(c, now)),
            server => db.depth(now))
    }

    /// Completed jobs per queue finished at or after `hour_since`, and of
    /// those, at or after `minute_since`.
    pub(crate) fn recent_completions(
        &self,
        hour_since: i64,
        minute_since: i64,
    ) -> Result<Vec<RecentCompletions>> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::recent_completions(c, hour_since, minute_since)),
            server => db.recent_completions(hour_since, minute_since))
    }

    /// Finished jobs per queue, status and minute since `since` (engine
    /// time, unix µs): a range of the `(status, finished_at)` index.
    pub(crate) fn finished_per_minute(
        &self,
        since: i64,
        now: i64,
    ) -> Result<Vec<FinishedInMinute>> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::finished_per_minute(c, since, now)),
            server => db.finished_per_minute(since))
    }

    pub(crate) fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::set_paused(tx, queue, paused, now)),
            server => db.set_paused(queue, paused, now))
    }

    /// Inserts jobs copied from another database, keeping their ids; returns
    /// how many were written (the rest were there already).
    pub(crate) fn import(&self, records: &[JobRecord]) -> Result<usize> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::import(tx, records)),
            server => db.import(records))
    }

    /// The ids of the jobs holding `key` in `queue`: the live one first,
    /// then up to `history` finished ones, most recent first.
    pub(crate) fn find_unique(&self, queue: &str, key: &str, history: i64) -> Result<Vec<i64>> {
        dispatch!(self, db => db.read(|c| sqlite::inspect::find_unique(c, queue, key, history)),
            server => db.find_unique(queue, key, history))
    }

    /// Sets or clears (all `None`) a queue's limits; validated by the engine.
    pub(crate) fn set_limits(
        &self,
        queue: &str,
        limits: &crate::limits::QueueLimits,
        now: i64,
    ) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::limits::set_limits(tx, queue, limits, now)),
            server => db.set_limits(queue, limits, now))
    }

    /// Every queue with a limit, by name.
    pub(crate) fn limits(&self) -> Result<Vec<(String, crate::limits::QueueLimits)>> {
        dispatch!(self, db => db.read(sqlite::limits::limits), server => db.limits())
    }

    pub(crate) fn paused_queues(&self) -> Result<Vec<String>> {
        dispatch!(self, db => db.read(sqlite::inspect::paused_queues),
            server => db.paused_queues())
    }

    /// A watcher of commits by other connections (other processes and
    /// nodes), on a connection of its own, to be checked when its signal
    /// fires: on file notifications where SQLite has them and `notified` is
    /// asked for, else every `interval`. On PostgreSQL it fires when a
    /// notification arrives (read by a thread of its own); on MySQL when a
    /// thread of its own probing the newest job id sees a new one (see
    /// `mysql::poller`). On the servers it never fires when `notified` is
    /// false: `interval` is SQLite's only.
    pub(crate) fn watch_changes(
        &self,
        interval: std::time::Duration,
        notified: bool,
    ) -> Result<ChangeWatcher> {
        Ok(match self {
            Backend::Sqlite(db) => {
                let version = if notified {
                    sqlite::DataVersion::open(db.path(), interval)?
                } else {
                    sqlite::DataVersion::polling(db.path(), interval)?
                };
                ChangeWatcher {
                    signal: version.signal(),
                    source: Source::Sqlite(version),
                }
            }
            // A server's wake-ups say only that something was enqueued: a
            // watcher that is not asked to be woken (a `wait` for a job to
            // finish) would gain nothing from a connection and thread.
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) if !notified => ChangeWatcher {
                source: Source::Nothing,
                signal: crossbeam_channel::never(),
            },
            #[cfg(feature = "postgres")]
            Backend::Postgres(db) => {
                let listener = db.watch_changes()?;
                ChangeWatcher {
                    signal: listener.signal(),
                    source: Source::Postgres(listener),
                }
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql(_) if !notified => ChangeWatcher {
                source: Source::Nothing,
                signal: crossbeam_channel::never(),
            },
            #[cfg(feature = "mysql")]
            Backend::Mysql(db) => {
                let poller = db.watch_changes()?;
                ChangeWatcher {
                    signal: poller.signal(),
                    source: Source::Mysql(poller),
                }
            }
        })
    }

    /// Copies the write-ahead log back into the database, without waiting on
    /// other connections. Returns whether the whole log was copied. The server
    /// backends have nothing to do here.
    pub(crate) fn checkpoint(&self) -> Result<bool> {
        match self {
            Backend::Sqlite(db) => {
                // On a pooled connection: a passive checkpoint waits on
                // no one, and keeps this process's writers waiting for none.
                let done = db
                    .checkpoint_stats
                    .record(db.read(sqlite::wal::checkpoint))?;
                Ok(!done.busy && done.checkpointed_frames >= done.log_frames)
            }
            #[allow(unreachable_patterns)]
            _ => Ok(true),
        }
    }

    pub(crate) fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize> {
        dispatch!(self, db => db.write(|tx| sqlite::inspect::prune(tx, status, cutoff, limit)),
            server => db.prune(status, cutoff, limit))
    }

    /// Registers a periodic schedule (see [`RegisterScheduleParams`]).
    pub(crate) fn register_schedule(&self, p: &RegisterScheduleParams<'_>) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::schedules::register(tx, p)),
            server => db.register_schedule(p))
    }

    /// Claims a schedule's due tick and enqueues its job, in one transaction.
    pub(crate) fn claim_tick(&self, p: &ClaimTickParams<'_>) -> Result<Claimed> {
        dispatch!(self, db => db.write(|tx| {
                let claimed = sqlite::schedules::claim_tick(tx, p)?;
                failpoint!("claim-tick-before-commit");
                Ok(claimed)
            }),
            server => db.claim_tick(p))
    }

    /// Every schedule, by name.
    pub(crate) fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        dispatch!(self, db => db.read(sqlite::schedules::list),
            server => db.schedules())
    }

    /// Deletes a schedule's row; whether there was one.
    pub(crate) fn remove_schedule(&self, name: &str) -> Result<bool> {
        dispatch!(self, db => db.write(|tx| sqlite::schedules::remove(tx, name)),
            server => db.remove_schedule(name))
    }

    /// How many transactions were retried after a transient failure (SQLite
    /// BUSY, a server's deadlock or serialization failure).
    pub(crate) fn busy_retries(&self) -> u64 {
        dispatch!(self, db => db.busy_retries(), server => db.busy_retries())
    }

    // ---- the live-worker registry (`backlog_workers`, `*/workers.rs`) ----

    /// Inserts or refreshes a worker's row (see [`registry::RegisterWorkerParams`]).
    pub(crate) fn register_worker(&self, p: &registry::RegisterWorkerParams<'_>) -> Result<()> {
        dispatch!(self, db => db.write(|tx| sqlite::workers::register(tx, p)),
            server => db.register_worker(p))
    }

    /// Deletes a worker's row; whether there was one.
    pub(crate) fn deregister_worker(&self, id: &str) -> Result<bool> {
        dispatch!(self, db => db.write(|tx| sqlite::workers::deregister(tx, id)),
            server => db.deregister_worker(id))
    }

    /// The workers whose row has not expired at `now`, by id.
    pub(crate) fn workers(&self, now: i64) -> Result<Vec<registry::WorkerRow>> {
        dispatch!(self, db => db.read(|c| sqlite::workers::live(c, now)),
            server => db.workers(now))
    }

    /// Every leased job and the worker holding it, by id.
    pub(crate) fn held_jobs(&self) -> Result<Vec<registry::HeldJob>> {
        dispatch!(self, db => db.read(sqlite::workers::held_jobs), server => db.held_jobs())
    }

    /// Deletes the rows expired at `now` (crashed workers); how many.
    pub(crate) fn prune_workers(&self, now: i64) -> Result<usize> {
        dispatch!(self, db => db.write(|tx| sqlite::workers::prune(tx, now)),
            server => db.prune_workers(now))
    }

    /// Due jobs per queue and kind at `now`.
    pub(crate) fn due_by_kind(&self, now: i64) -> Result<Vec<registry::DueCount>> {
        dispatch!(self, db => db.read(|c| sqlite::workers::due_by_kind(c, now)),
            server => db.due_by_kind(now))
    }
}

/// The payload of a combined job: the JSON array of its members' payloads,
/// each already valid JSON text, in the order given.
pub(crate) fn combined_payload<'a>(payloads: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (i, payload) in payloads.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(payload);
    }
    out.push(']');
    out
}

/// Notices commits made by other connections (another process's enqueue),
/// cheaply enough to be asked whenever its signal fires.
#[derive(Debug)]
pub(crate) struct ChangeWatcher {
    source: Source,
    signal: crossbeam_channel::Receiver<std::time::Instant>,
}

#[derive(Debug)]
enum Source {
    Sqlite(sqlite::DataVersion),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Listener),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Poller),
    /// Never reports a change: its owner polls by itself.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    Nothing,
}

impl ChangeWatcher {
    /// True when something was committed since the last call (or, for a
    /// backend that can only poll, when it is time to look again).
    pub(crate) fn changed(&mut self) -> Result<bool> {
        match &mut self.source {
            Source::Sqlite(v) => v.changed(),
            #[cfg(feature = "postgres")]
            Source::Postgres(l) => l.changed(),
            #[cfg(feature = "mysql")]
            Source::Mysql(p) => p.changed(),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            Source::Nothing => Ok(false),
        }
    }

    /// Fires when it is time to call [`ChangeWatcher::changed`].
    pub(crate) fn signal(&self) -> crossbeam_channel::Receiver<std::time::Instant> {
        self.signal.clone()
    }

    /// True when woken by the operating system's file notifications rather
    /// than a timer.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_notified(&self) -> bool {
        match &self.source {
            Source::Sqlite(v) => v.is_notified(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}
