//! [`Store`] on SQLite: each operation is one transaction on the write path
//! (`BEGIN IMMEDIATE` behind the process's write gate) or one read on a
//! pooled connection, running the statements of [`jobs`], [`inspect`],
//! [`groups`] and [`limits`] ([`Schedules`](crate::backend::Schedules) is
//! in `schedules.rs`). The crash points of the
//! reliability tests (`failpoint!`) sit between a transaction's writes and
//! its commit.

use std::time::Duration;

use super::connection::Connections;
use super::data_version::DataVersion;
use super::{groups, inspect, jobs, limits, migrate, wal};
use crate::backend::params::{
    Acted, Aggregated, EnqueueParams, FinishedInMinute, HeartbeatParams, LeaseParams,
    ProgressWrite, RecentCompletions, ReleaseUnheldParams, RescueParams, Rescued,
    SettleAndLeaseParams, SettledAndLeased, UpdateParams,
};
use crate::backend::{ChangeWatcher, Changes, Store};
use crate::error::Result;
use crate::inspect::{JobFilter, JobRecord, Page, StateCount};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job};
use crate::limits::QueueLimits;
use crate::outcome::FinalStatus;

impl Store for Connections {
    fn migrate(&self, write_deadline: Duration) -> Result<()> {
        migrate::migrate(&mut *self.writer()?, write_deadline)
    }

    fn pending_migrations(&self) -> Result<Vec<String>> {
        self.read(migrate::pending)
    }

    fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        self.write(|tx| {
            let ids = jobs::enqueue_all(tx, jobs)?;
            failpoint!("enqueue-before-commit");
            Ok(ids)
        })
    }

    fn aggregate(&self, now: i64, limit: usize) -> Result<Vec<Aggregated>> {
        self.write(|tx| {
            let done = groups::aggregate(tx, now, limit)?;
            if !done.is_empty() {
                failpoint!("aggregate-before-commit");
            }
            Ok(done)
        })
    }

    fn next_group_ready(&self, now: i64) -> Result<Option<i64>> {
        self.read(|c| groups::next_ready(c, now))
    }

    fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
        self.write(|tx| jobs::lease(tx, p))
    }

    fn explain_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<String>> {
        self.read(|c| jobs::explain_lease(c, p))
    }

    fn next_due(&self, queues: &[String], now: i64) -> Result<Option<i64>> {
        self.read(|c| jobs::next_due(c, queues, now))
    }

    fn settle_and_lease(&self, p: &SettleAndLeaseParams<'_>) -> Result<SettledAndLeased> {
        // SQLite's single writer needs no hand-on of places: its lease
        // counts a limited queue's running jobs without a lock.
        let SettleAndLeaseParams {
            items,
            lease,
            until,
            ..
        } = *p;
        let apply = |tx: &rusqlite::Transaction<'_>| {
            let results = items
                .iter()
                .map(|p| match jobs::settle_reporting(tx, p) {
                    Err(e) if !e.is_lease_lost() => Err(e),
                    result => Ok(result),
                })
                .collect::<Result<Vec<_>>>()?;
            failpoint!("settle-before-commit");
            let jobs = match lease {
                Some(p) => jobs::lease(tx, p)?,
                None => Vec::new(),
            };
            Ok((results, jobs))
        };
        match until {
            Some(until) => self.write_until(until, apply),
            None => self.write(apply),
        }
    }

    fn write_progress(&self, writes: &[ProgressWrite], now: i64, _wait: bool) -> Result<Vec<i64>> {
        self.write(|tx| jobs::write_progress(tx, writes, now))
    }

    fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
        self.write(|tx| jobs::heartbeat(tx, p))
    }

    fn rescue(&self, p: &RescueParams<'_>) -> Result<Vec<Rescued>> {
        let RescueParams { now, limit, decide } = *p;
        self.write(|tx| {
            let mut done = Vec::new();
            for expired in jobs::expired_leases(tx, now, limit)? {
                let settle = decide(&expired);
                jobs::settle(tx, &settle)?;
                done.push((expired, settle));
            }
            Ok(done)
        })
    }

    fn release_unheld(&self, p: &ReleaseUnheldParams<'_>) -> Result<Vec<Rescued>> {
        self.write(|tx| {
            let mut done = Vec::new();
            for unheld in jobs::unheld_leases(tx, p.worker_id, p.held)? {
                let settle = (p.decide)(&unheld);
                jobs::settle(tx, &settle)?;
                done.push((unheld, settle));
            }
            Ok(done)
        })
    }

    fn get(&self, id: i64, now: i64) -> Result<Option<JobRecord>> {
        self.read(|c| inspect::get(c, id, now))
    }

    fn list(&self, filter: &JobFilter, now: i64) -> Result<Page> {
        self.read(|c| inspect::list(c, filter, now))
    }

    fn counts(&self, now: i64) -> Result<Vec<StateCount>> {
        self.read(|c| inspect::counts(c, now))
    }

    fn retry(&self, id: i64, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::retry(tx, id, now))
    }

    fn run_now(&self, id: i64, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::run_now(tx, id, now))
    }

    fn cancel(&self, id: i64, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::cancel(tx, id, now))
    }

    fn cancel_steps(&self, ids: &[i64], now: i64) -> Result<Vec<Option<Acted>>> {
        self.write(|tx| inspect::cancel_steps(tx, ids, now))
    }

    fn discard(&self, id: i64, reason: &str, now: i64) -> Result<Acted> {
        self.write(|tx| inspect::discard(tx, id, reason, now))
    }

    fn delete(&self, id: i64, now: i64) -> Result<bool> {
        self.write(|tx| inspect::delete(tx, id, now))
    }

    fn update(&self, p: &UpdateParams<'_>) -> Result<Acted> {
        self.write(|tx| inspect::update(tx, p))
    }

    fn depth(&self, now: i64) -> Result<Vec<StateCount>> {
        self.read(|c| inspect::depth(c, now))
    }

    fn recent_completions(
        &self,
        hour_since: i64,
        minute_since: i64,
    ) -> Result<Vec<RecentCompletions>> {
        self.read(|c| inspect::recent_completions(c, hour_since, minute_since))
    }

    fn finished_per_minute(&self, since: i64, now: i64) -> Result<Vec<FinishedInMinute>> {
        self.read(|c| inspect::finished_per_minute(c, since, now))
    }

    fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()> {
        self.write(|tx| inspect::set_paused(tx, queue, paused, now))
    }

    fn import(&self, records: &[JobRecord]) -> Result<usize> {
        self.write(|tx| inspect::import(tx, records))
    }

    fn find_unique(&self, queue: &str, key: &str, history: i64) -> Result<Vec<i64>> {
        self.read(|c| inspect::find_unique(c, queue, key, history))
    }

    fn set_limits(&self, queue: &str, limits: &QueueLimits, now: i64) -> Result<()> {
        self.write(|tx| limits::set_limits(tx, queue, limits, now))
    }

    fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.read(limits::limits)
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(inspect::paused_queues)
    }

    fn watch_changes(&self, interval: Duration, notified: bool) -> Result<ChangeWatcher> {
        let version = if notified {
            DataVersion::open(self.path(), self.key(), interval)?
        } else {
            DataVersion::polling(self.path(), self.key(), interval)?
        };
        let signal = version.signal();
        Ok(ChangeWatcher::new(version, signal))
    }

    fn checkpoint(&self) -> Result<bool> {
        // On a pooled connection: a passive checkpoint waits on no one, and
        // keeps this process's writers waiting for none.
        let done = self.checkpoint_stats.record(self.read(wal::checkpoint))?;
        Ok(!done.busy && done.checkpointed_frames >= done.log_frames)
    }

    fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize> {
        self.write(|tx| inspect::prune(tx, status, cutoff, limit))
    }

    fn busy_retries(&self) -> u64 {
        Connections::busy_retries(self)
    }
}

impl Changes for DataVersion {
    fn changed(&mut self) -> Result<bool> {
        DataVersion::changed(self)
    }

    fn is_notified(&self) -> bool {
        DataVersion::is_notified(self)
    }

    fn sees_every_commit(&self) -> bool {
        true
    }
}
