//! The PostgreSQL backend: a pool of connections to one server, `FOR UPDATE
//! SKIP LOCKED` claims, the server's clock, LISTEN/NOTIFY wake-ups.
//!
//! Everything PostgreSQL-specific lives in this folder: the schema
//! (`migrations/postgres/`), every statement ([`queries`], rendered once at
//! connect with the queue's schema and table prefix), and the operations
//! that run them ([`enqueue`], [`jobs`], [`inspect`]) on any client: the
//! queue's own connections or an application's `postgres::Transaction`
//! (`enqueue_in`, `complete_in`).

pub(crate) mod batches;
pub(crate) mod connection;
pub(crate) mod counts;
mod db;
pub(crate) mod enqueue;
pub(crate) mod flows;
pub(crate) mod gauges;
pub(crate) mod groups;
pub(crate) mod inspect;
pub(crate) mod jobs;
pub(crate) mod limits;
pub(crate) mod listen;
pub(crate) mod migrate;
pub(crate) mod pool;
pub(crate) mod queries;
mod rows;
pub(crate) mod schedules;
pub(crate) mod sequences;
pub(crate) mod target;
#[cfg(feature = "diesel-postgres")]
pub(crate) mod via_diesel;
pub(crate) mod workers;
pub(crate) mod workflows;

use std::time::Duration;

pub(crate) use db::Db;
pub(crate) use listen::Listener;

use self::connection::Tx;
use crate::backend::params::{
    Acted, Aggregated, EnqueueParams, FinishedInMinute, HeartbeatParams, LeaseParams,
    ProgressWrite, RecentCompletions, ReleaseUnheldParams, RescueParams, Rescued,
    SettleAndLeaseParams, SettleParams, SettledAndLeased, UpdateParams,
};
use crate::backend::{ChangeWatcher, Changes, Store};
use crate::clock::ClockMicros;
use crate::error::Result;
use crate::inspect::{JobFilter, JobRecord, Page, StateCount};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job};
use crate::limits::QueueLimits;
use crate::outcome::FinalStatus;

impl Db {
    /// Whether `p`'s lease takes the limited path
    /// ([`LimitedQueues::may_limit`](crate::limits::LimitedQueues::may_limit)).
    fn may_be_limited(&self, p: &LeaseParams<'_>) -> Result<bool> {
        self.limited.may_limit(p.queues, p.caps, || self.limits())
    }

    pub(crate) fn settle_many(&self, items: &[&SettleParams]) -> Result<Vec<Result<bool>>> {
        self.pool
            .write(|tx| jobs::settle_all(tx, &self.q, items, false))
    }
}

impl Store for Db {
    fn migrate(&self, _write_deadline: Duration) -> Result<()> {
        // Refused inside this queue's transaction: its DDL would wait for
        // that transaction's locks.
        self.pool
            .migrating(|client| migrate::migrate(client, &self.q.tables))
    }

    /// The migrations of this build the database has not applied. Reads
    /// only, on a pooled connection.
    fn pending_migrations(&self) -> Result<Vec<String>> {
        self.pool.read(|tx| migrate::pending(tx, &self.q.tables))
    }

    fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        if enqueue::is_one_statement(jobs) {
            return self
                .pool
                .autocommit_once(|tx| jobs::enqueue_all(tx, &self.q, jobs));
        }
        self.pool.write(|tx| jobs::enqueue_all(tx, &self.q, jobs))
    }

    fn aggregate(&self, now: i64, limit: usize) -> Result<Vec<Aggregated>> {
        self.pool
            .write(|tx| groups::aggregate(tx, &self.q, now, limit))
    }

    fn next_group_ready(&self, now: i64) -> Result<Option<i64>> {
        self.pool.read(|tx| groups::next_ready(tx, &self.q, now))
    }

    fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
        // One statement, committing alone. If its connection dies before the
        // answer comes back, it runs again on another: the jobs a lost
        // answer claimed stay leased until the rescuer frees them.
        if self.may_be_limited(p)? {
            // One queue limited by concurrency alone, or with a rate limit,
            // claims before it locks the queue's row, unless that claim
            // would exceed a limit.
            if let Some(queue) = self.limited.by_concurrency_alone(p.queues, p.caps) {
                let (jobs, committed) = self
                    .pool
                    .write_deciding(|tx| limits::lease_ahead(tx, &self.q, p, queue))?;
                if committed {
                    return Ok(jobs);
                }
            } else if let Some(queue) = self.limited.by_rate(p.queues, p.caps) {
                let (jobs, committed) = self
                    .pool
                    .write_deciding(|tx| limits::lease_ahead_rated(tx, &self.q, p, queue))?;
                if committed {
                    return Ok(jobs);
                }
            }
            return self.pool.write(|tx| limits::lease(tx, &self.q, p));
        }
        self.pool.autocommit(|tx| jobs::lease(tx, &self.q, p, true))
    }

    fn explain_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<String>> {
        self.pool.read(|tx| jobs::explain_lease(tx, &self.q, p))
    }

    fn next_due(&self, queues: &[String], now: i64) -> Result<Option<i64>> {
        self.pool
            .read(|tx| jobs::next_due(tx, &self.q, queues, now))
    }

    /// Settles `items` and then leases with `lease`, in one transaction: one
    /// commit for both halves, as on SQLite. The lease claims with `SKIP
    /// LOCKED`, so it waits on no row the settle (or anyone) locked, and a
    /// failure of either half rolls back both and is retried whole: each
    /// settle is fenced on its lease token, so a retry applies it once.
    fn settle_and_lease(&self, p: &SettleAndLeaseParams<'_>) -> Result<SettledAndLeased> {
        let SettleAndLeaseParams {
            items,
            lease,
            queues,
            ..
        } = *p;
        match (items.is_empty(), lease) {
            (true, None) => Ok((Vec::new(), Vec::new())),
            (true, Some(p)) => Ok((Vec::new(), self.lease(p)?)),
            (false, None) => Ok((self.settle_many(items)?, Vec::new())),
            (false, Some(p)) => {
                let limited = self.may_be_limited(p)?;
                // A queue with a rate limit hands no places on (each start
                // counts in its window): its claim goes ahead of its lock
                // as in `lease`, and when that claim must be undone the
                // whole transaction runs again the locked way (each settle
                // is fenced on its lease token, so it applies once).
                if let Some(queue) = self.limited.by_rate(p.queues, p.caps) {
                    let (done, committed) = self.pool.write_deciding(|tx| {
                        let results = jobs::settle_all(tx, &self.q, items, false)?;
                        let (jobs, commit) = limits::lease_ahead_rated(tx, &self.q, p, queue)?;
                        Ok(((results, jobs), commit))
                    })?;
                    if committed {
                        return Ok(done);
                    }
                }
                self.pool.write(|tx| {
                    let results = jobs::settle_all(tx, &self.q, items, false)?;
                    let jobs = if limited {
                        let freed = self.limited.places_freed(queues, &results);
                        limits::lease_handing_on(tx, &self.q, p, &freed)?
                    } else {
                        jobs::lease(tx, &self.q, p, true)?
                    };
                    Ok((results, jobs))
                })
            }
        }
    }

    fn write_progress(&self, writes: &[ProgressWrite], now: i64, wait: bool) -> Result<Vec<i64>> {
        self.pool
            .autocommit(|tx| jobs::write_progress(tx, &self.q, writes, now, wait))
    }

    fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
        self.pool.autocommit(|tx| jobs::heartbeat(tx, &self.q, p))
    }

    fn rescue(&self, p: &RescueParams<'_>) -> Result<Vec<Rescued>> {
        let RescueParams { now, limit, decide } = *p;
        self.pool.write(|tx| {
            let expired = jobs::expired_leases(tx, &self.q, now, limit)?;
            jobs::settle_listed(tx, &self.q, expired, decide)
        })
    }

    fn release_unheld(&self, p: &ReleaseUnheldParams<'_>) -> Result<Vec<Rescued>> {
        self.pool.write(|tx| {
            let unheld = jobs::unheld_leases(tx, &self.q, p.worker_id, p.held)?;
            jobs::settle_listed(tx, &self.q, unheld, p.decide)
        })
    }

    fn get(&self, id: i64, now: i64) -> Result<Option<JobRecord>> {
        // One snapshot: a job moving between tables (a dependent released
        // from pending) is in one of them, never in neither.
        self.pool
            .read_snapshot(|tx| inspect::get(tx, &self.q, id, now))
    }

    fn list(&self, filter: &JobFilter, now: i64) -> Result<Page> {
        // One snapshot: the page and its sequence keys of one moment.
        self.pool
            .read_snapshot(|tx| inspect::list(tx, &self.q, filter, now))
    }

    fn counts(&self, now: i64) -> Result<Vec<StateCount>> {
        // One snapshot, so live and finished counts are of one moment.
        self.pool
            .read_snapshot(|tx| inspect::counts(tx, &self.q, now))
    }

    fn retry(&self, id: i64, now: i64) -> Result<Acted> {
        self.pool.write(|tx| inspect::retry(tx, &self.q, id, now))
    }

    fn run_now(&self, id: i64, now: i64) -> Result<Acted> {
        self.pool.write(|tx| inspect::run_now(tx, &self.q, id, now))
    }

    fn cancel(&self, id: i64, now: i64) -> Result<Acted> {
        self.pool.write(|tx| inspect::cancel(tx, &self.q, id, now))
    }

    fn cancel_steps(&self, ids: &[i64], now: i64) -> Result<Vec<Option<Acted>>> {
        self.pool
            .write(|tx| inspect::cancel_steps(tx, &self.q, ids, now))
    }

    fn discard(&self, id: i64, reason: &str, now: i64) -> Result<Acted> {
        self.pool
            .write(|tx| inspect::discard(tx, &self.q, id, reason, now))
    }

    fn delete(&self, id: i64, now: i64) -> Result<bool> {
        self.pool.write(|tx| inspect::delete(tx, &self.q, id, now))
    }

    fn update(&self, p: &UpdateParams<'_>) -> Result<Acted> {
        self.pool.write(|tx| inspect::update(tx, &self.q, p))
    }

    fn depth(&self, now: i64) -> Result<Vec<StateCount>> {
        // One statement: its counts are of one snapshot.
        self.pool.read(|tx| inspect::depth(tx, &self.q, now))
    }

    /// `hour_since` and `minute_since` are absolute times of the engine's
    /// clock: turned into offsets from that clock's now, and applied to the
    /// server's (as [`Db::prune`]'s cutoff).
    fn recent_completions(
        &self,
        hour_since: i64,
        minute_since: i64,
    ) -> Result<Vec<RecentCompletions>> {
        let now = self.clock.now_micros();
        self.pool
            .read(|tx| inspect::recent_completions(tx, &self.q, hour_since, minute_since, now))
    }

    /// Finished jobs per minute since the engine's `since`: an offset from
    /// this clock's now, applied to the server's (as `recent_completions`).
    fn finished_per_minute(&self, since: i64, _now: i64) -> Result<Vec<FinishedInMinute>> {
        let now = self.clock.now_micros();
        self.pool
            .read(|tx| inspect::finished_per_minute(tx, &self.q, since, now))
    }

    fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()> {
        self.pool
            .write(|tx| inspect::set_paused(tx, &self.q, queue, paused, now))
    }

    /// Inserts jobs copied from another database, keeping their ids.
    fn import(&self, records: &[JobRecord]) -> Result<usize> {
        self.pool.write(|tx| inspect::import(tx, &self.q, records))
    }

    fn find_unique(&self, queue: &str, key: &str, history: i64) -> Result<Vec<i64>> {
        self.pool
            .read(|tx| inspect::find_unique(tx, &self.q, queue, key, history))
    }

    fn set_limits(&self, queue: &str, limits: &QueueLimits, now: i64) -> Result<()> {
        self.pool
            .write(|tx| limits::set_limits(tx, &self.q, queue, limits, now))?;
        self.limited.forget();
        Ok(())
    }

    fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.pool.read(|tx| limits::limits(tx, &self.q))
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.pool.read(|tx| inspect::paused_queues(tx, &self.q))
    }

    fn watch_changes(&self, _interval: Duration, notified: bool) -> Result<ChangeWatcher> {
        // The notifications say only that something was enqueued: a watcher
        // that is not asked to be woken (a `wait` for a job to finish) would
        // gain nothing from a connection and thread.
        if !notified {
            return Ok(ChangeWatcher::never());
        }
        let listener = Listener::open(self.pool.target.clone(), self.q.listen.clone())?;
        let signal = listener.signal();
        Ok(ChangeWatcher::new(listener, signal))
    }

    /// `cutoff` is an absolute time of the engine's clock: it is turned into
    /// an offset from that clock's now, and applied to the server's.
    fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize> {
        let now = self.clock.now_micros();
        self.pool
            .write(|tx| inspect::prune(tx, &self.q, status, cutoff, limit, now))
    }

    fn busy_retries(&self) -> u64 {
        self.pool.busy_retries()
    }
}

impl Changes for Listener {
    fn changed(&mut self) -> Result<bool> {
        Listener::changed(self)
    }
}

/// Runs the job operations on an application's transaction.
pub(crate) fn on_transaction<'a, 't>(
    tx: &'a mut postgres::Transaction<'t>,
) -> Tx<'a, postgres::Transaction<'t>> {
    Tx::uncached(tx)
}
