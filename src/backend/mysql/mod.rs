//! The MySQL/MariaDB backend: a pool of sessions on one server, claims with
//! `SELECT .. FOR UPDATE SKIP LOCKED`, times from the server's clock.
//!
//! Everything MySQL-specific lives in this folder: the schema
//! (`migrations/mysql/`), every statement ([`queries`], in the order of
//! SQLite's), and the operations that run them ([`enqueue`], [`jobs`],
//! [`inspect`]).
//! Operations take any `Queryable` (the queue's own transaction, or an
//! application's `mysql::Transaction` for `enqueue_in` and `complete_in`).
//!
//! Runs on MySQL 8.0.1+ and MariaDB 10.6+ (checked at connect, see
//! [`version`]). Only MariaDB 10.11 is tested; the SQL keeps to what MySQL 8
//! documents, and the places the two differ are commented where they meet.

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
pub(crate) mod migrate;
pub(crate) mod poller;
pub(crate) mod queries;
mod rows;
pub(crate) mod schedules;
pub(crate) mod sequences;
pub(crate) mod version;
#[cfg(feature = "diesel-mysql")]
pub(crate) mod via_diesel;
pub(crate) mod workers;
pub(crate) mod workflows;

use std::sync::atomic::Ordering;
use std::time::Duration;

pub(crate) use db::{Db, Now};
pub(crate) use poller::Poller;

use crate::backend::params::{
    Acted, Aggregated, EnqueueParams, FinishedInMinute, HeartbeatParams, LeaseParams,
    ProgressWrite, RecentCompletions, ReleaseUnheldParams, RescueParams, Rescued,
    SettleAndLeaseParams, SettleParams, SettledAndLeased, UpdateParams,
};
use crate::backend::{ChangeWatcher, Changes, Store};
use crate::clock::ClockMicros;
use crate::error::{Error, Result};
use crate::inspect::{JobFilter, JobRecord, Page, StateCount};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job, Lease};
use crate::limits::QueueLimits;
use crate::outcome::{FinalStatus, Transition};

impl Db {
    /// Leases in the caller's transaction: the limited path (which locks the
    /// limited queues' rows) when `limited`.
    fn lease_in(
        &self,
        tx: &mut mysql::Transaction<'_>,
        p: &LeaseParams<'_>,
        limited: bool,
    ) -> Result<Vec<Job>> {
        if limited {
            limits::lease(&self.sql, tx, p, self.now(p.now))
        } else {
            jobs::lease(&self.sql, tx, p, self.now(p.now), true)
        }
    }

    /// Whether `p`'s lease takes the limited path
    /// ([`LimitedQueues::may_limit`](crate::limits::LimitedQueues::may_limit)).
    fn may_be_limited(&self, p: &LeaseParams<'_>) -> Result<bool> {
        self.limited.may_limit(p.queues, p.caps, || self.limits())
    }

    /// Applies `items` in the caller's transaction. A lost lease fails only
    /// its own item.
    fn settle_in(
        &self,
        tx: &mut mysql::Transaction<'_>,
        items: &[&SettleParams],
    ) -> Result<Vec<Result<bool>>> {
        // Plain completions (the worker's usual batch) go in three statements
        // for the lot; the other outcomes one by one, their rows locked in id
        // order. Results go back in the caller's order.
        let (mut plain, mut other): (Vec<usize>, Vec<usize>) =
            (0..items.len()).partition(|&i| plain_completion(items[i]).is_some());
        if plain.len() < 2 {
            // One alone costs a statement less on its own (no separate fence).
            other.append(&mut plain);
        }
        other.sort_by_key(|&i| items[i].lease.job_id);
        let completions: Vec<(Lease, Option<&str>)> = plain
            .iter()
            .filter_map(|&i| plain_completion(items[i]))
            .collect();
        let mut results: Vec<Option<Result<bool>>> = (0..items.len()).map(|_| None).collect();
        if let Some(&first) = plain.first() {
            let done =
                jobs::complete_many(&self.sql, tx, &completions, self.now(items[first].now))?;
            for (&i, result) in plain.iter().zip(done) {
                results[i] = Some(result);
            }
        }
        for &i in &other {
            let p = items[i];
            results[i] = Some(
                match jobs::settle_reporting(&self.sql, tx, p, self.now(p.now)) {
                    Err(e) if !e.is_lease_lost() => return Err(e),
                    result => result,
                },
            );
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Database("item not settled".into()))))
            .collect())
    }

    /// Notes a commit that made a job runnable at some time.
    fn rescheduled(&self) {
        self.bells.ring();
    }
}

impl Store for Db {
    fn migrate(&self, _write_deadline: Duration) -> Result<()> {
        self.refuse_inside()?;
        migrate::migrate(self)
    }

    fn pending_migrations(&self) -> Result<Vec<String>> {
        migrate::pending(self)
    }

    fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        let now = self.now(jobs.first().map_or(0, |j| j.now));
        if enqueue::is_one_statement(&self.sql, jobs) {
            let alone = self.autocommit(|conn| jobs::enqueue_all(&self.sql, conn, jobs, now));
            if let Some(result) = alone {
                return result;
            }
        }
        self.write(|tx| jobs::enqueue_all(&self.sql, tx, jobs, now))
    }

    fn aggregate(&self, now: i64, limit: usize) -> Result<Vec<Aggregated>> {
        self.write(|tx| groups::aggregate(&self.sql, tx, self.now(now), limit))
    }

    fn next_group_ready(&self, now: i64) -> Result<Option<i64>> {
        self.read(|conn| groups::next_ready(&self.sql, conn, self.now(now)))
    }

    fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
        let limited = self.may_be_limited(p)?;
        self.write(|tx| self.lease_in(tx, p, limited))
    }

    fn explain_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<String>> {
        self.read(|conn| jobs::explain_lease(&self.sql, conn, p, self.now(p.now)))
    }

    fn next_due(&self, queues: &[String], now: i64) -> Result<Option<i64>> {
        self.read(|conn| jobs::next_due(&self.sql, conn, queues, self.now(now)))
    }

    /// Applies many transitions, then a lease with `lease` when given, in
    /// one transaction: one commit where there were two. The claim's walk
    /// skips locked rows, so holding the settled rows adds no lock wait to
    /// it; a failure of either half rolls back both (as on SQLite), and a
    /// retried transaction runs both again.
    fn settle_and_lease(&self, p: &SettleAndLeaseParams<'_>) -> Result<SettledAndLeased> {
        let SettleAndLeaseParams {
            items,
            lease,
            queues,
            ..
        } = *p;
        let limited = match lease {
            Some(p) => self.may_be_limited(p)?,
            None => false,
        };
        let done = self.write(|tx| {
            let results = if items.is_empty() {
                Vec::new()
            } else {
                self.settle_in(tx, items)?
            };
            let jobs = match lease {
                Some(p) if limited => {
                    let freed = self.limited.places_freed(queues, &results);
                    limits::lease_handing_on(&self.sql, tx, p, self.now(p.now), &freed)?
                }
                Some(p) => self.lease_in(tx, p, false)?,
                None => Vec::new(),
            };
            Ok((results, jobs))
        })?;
        if has_reschedules(items) {
            self.rescheduled();
        }
        Ok(done)
    }

    fn write_progress(&self, writes: &[ProgressWrite], now: i64, wait: bool) -> Result<Vec<i64>> {
        self.write(|tx| jobs::write_progress(&self.sql, tx, writes, self.now(now), wait))
    }

    fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
        self.write(|tx| jobs::heartbeat(&self.sql, tx, p, self.now(p.now)))
    }

    fn rescue(&self, p: &RescueParams<'_>) -> Result<Vec<Rescued>> {
        let RescueParams { now, limit, decide } = *p;
        let done = self.write(|tx| jobs::rescue(&self.sql, tx, self.now(now), limit, decide))?;
        if !done.is_empty() {
            self.rescheduled();
        }
        Ok(done)
    }

    fn release_unheld(&self, p: &ReleaseUnheldParams<'_>) -> Result<Vec<Rescued>> {
        let done = self.write(|tx| {
            jobs::release_unheld(
                &self.sql,
                tx,
                p.worker_id,
                p.held,
                self.now(p.now),
                p.decide,
            )
        })?;
        if !done.is_empty() {
            self.rescheduled();
        }
        Ok(done)
    }

    fn get(&self, id: i64, now: i64) -> Result<Option<JobRecord>> {
        self.read_snapshot(|conn| inspect::get(&self.sql, conn, id, self.now(now)))
    }

    fn list(&self, filter: &JobFilter, now: i64) -> Result<Page> {
        self.read_snapshot(|conn| inspect::list(&self.sql, conn, filter, self.now(now)))
    }

    fn counts(&self, now: i64) -> Result<Vec<StateCount>> {
        self.read_snapshot(|conn| inspect::counts(&self.sql, conn, self.now(now)))
    }

    fn retry(&self, id: i64, now: i64) -> Result<Acted> {
        let acted = self.write(|tx| inspect::retry(&self.sql, tx, id, self.now(now)))?;
        if acted.applied {
            self.rescheduled();
        }
        Ok(acted)
    }

    fn run_now(&self, id: i64, now: i64) -> Result<Acted> {
        let acted = self.write(|tx| inspect::run_now(&self.sql, tx, id, self.now(now)))?;
        if acted.applied {
            self.rescheduled();
        }
        Ok(acted)
    }

    fn cancel(&self, id: i64, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::cancel(&self.sql, tx, id, self.now(now)))
    }

    fn cancel_steps(&self, ids: &[i64], now: i64) -> Result<Vec<Option<Acted>>> {
        self.write(|tx| inspect::cancel_steps(&self.sql, tx, ids, self.now(now)))
    }

    fn discard(&self, id: i64, reason: &str, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::discard(&self.sql, tx, id, reason, self.now(now)))
    }

    fn delete(&self, id: i64, now: i64) -> Result<bool> {
        self.write(|tx| inspect::delete(&self.sql, tx, id, self.now(now)))
    }

    /// Wakes this process's fetchers too: the job may have come due.
    fn update(&self, p: &UpdateParams<'_>) -> Result<Acted> {
        let acted = self.write(|tx| inspect::update(&self.sql, tx, p, self.now(p.now)))?;
        if acted.applied {
            self.rescheduled();
        }
        Ok(acted)
    }

    fn depth(&self, now: i64) -> Result<Vec<StateCount>> {
        self.read(|conn| inspect::depth(&self.sql, conn, self.now(now)))
    }

    /// The two times come without the engine's `now`; the queue's clock,
    /// read here, stands in for it (as in [`Db::prune`]): they are bound as
    /// offsets from it onto the server's clock, like every other time, so a
    /// node whose clock is off still counts the server's last hour. (The
    /// microseconds between the engine's read and this one widen both
    /// windows by as much; a manual clock reads the same value twice.)
    fn recent_completions(
        &self,
        hour_since: i64,
        minute_since: i64,
    ) -> Result<Vec<RecentCompletions>> {
        let now = self.now(self.clock.now_micros());
        self.read(|conn| {
            inspect::recent_completions(&self.sql, conn, hour_since, minute_since, now)
        })
    }

    /// Finished jobs per minute since the engine's `since` (an offset from
    /// this clock's now, applied to the server's).
    fn finished_per_minute(&self, since: i64, _now: i64) -> Result<Vec<FinishedInMinute>> {
        let now = self.now(self.clock.now_micros());
        self.read(|conn| inspect::finished_per_minute(&self.sql, conn, since, now))
    }

    fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()> {
        self.write(|tx| inspect::set_paused(&self.sql, tx, queue, paused, self.now(now)))?;
        if !paused {
            self.rescheduled();
        }
        Ok(())
    }

    fn import(&self, records: &[JobRecord]) -> Result<usize> {
        let written = self.write(|tx| inspect::import(&self.sql, tx, records))?;
        self.rescheduled();
        Ok(written)
    }

    fn find_unique(&self, queue: &str, key: &str, history: i64) -> Result<Vec<i64>> {
        self.read(|conn| inspect::find_unique(&self.sql, conn, queue, key, history))
    }

    fn set_limits(&self, queue: &str, limits: &QueueLimits, now: i64) -> Result<()> {
        self.write(|tx| limits::set_limits(&self.sql, tx, queue, limits, self.now(now)))?;
        self.limited.forget();
        Ok(())
    }

    fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.read(|conn| limits::limits(&self.sql, conn))
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|conn| inspect::paused_queues(&self.sql, conn))
    }

    fn watch_changes(&self, _interval: Duration, notified: bool) -> Result<ChangeWatcher> {
        // The poller says only that something was enqueued: a watcher that
        // is not asked to be woken (a `wait` for a job to finish) would gain
        // nothing from a connection and thread.
        if !notified {
            return Ok(ChangeWatcher::never());
        }
        let poller = Poller::start(self.opts.clone(), self.sql.clone(), &self.bells)?;
        let signal = poller.signal();
        Ok(ChangeWatcher::new(poller, signal))
    }

    /// `cutoff` comes without the engine's `now`; the queue's clock, read
    /// here, stands in for it (retention is measured in days).
    fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize> {
        let now = self.now(self.clock.now_micros());
        self.write(|tx| inspect::prune(&self.sql, tx, status, cutoff, limit, now))
    }

    fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }
}

impl Changes for Poller {
    fn changed(&mut self) -> Result<bool> {
        Poller::changed(self)
    }
}

/// Whether settling `items` makes a job runnable at some time.
fn has_reschedules(items: &[&SettleParams]) -> bool {
    items
        .iter()
        .any(|p| matches!(p.transition, Transition::Reschedule { .. }))
}

/// The lease and result of a completion that records no error.
fn plain_completion(p: &SettleParams) -> Option<(Lease, Option<&str>)> {
    match &p.transition {
        Transition::Finish {
            status: FinalStatus::Completed,
            result,
            error: None,
        } => Some((p.lease, result.as_deref())),
        _ => None,
    }
}
