//! The boundary between the engine and the databases.
//!
//! The engine (queue API, validation, retry policy, time) decides; a backend
//! applies, and is the only place SQL is written. Each database keeps
//! everything it needs in its own folder (`sqlite/` today), with one `*Params`
//! struct per operation so the engine never depends on a dialect.

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

/// A leased job whose lease expired, as the rescuer sees it: no payload.
#[derive(Debug)]
pub(crate) struct ExpiredLease {
    pub lease: Lease,
    pub attempts: u32,
    pub max_attempts: u32,
    /// When the job was due before it was claimed: its place in line.
    pub available_at: i64,
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
}

impl Backend {
    /// Inserts jobs in one transaction.
    pub(crate) fn enqueue_many(&self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| {
                let ids = sqlite::jobs::enqueue_all(tx, jobs)?;
                failpoint!("enqueue-before-commit");
                Ok(ids)
            }),
        }
    }

    pub(crate) fn lease(&self, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::jobs::lease(tx, p)),
        }
    }

    /// Applies many transitions in one transaction; a lost lease fails only
    /// its own item. An item's `Ok(true)` says a cancel requested while the
    /// job ran won over its reschedule.
    pub(crate) fn settle_many(&self, items: &[&SettleParams]) -> Result<Vec<Result<bool>>> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| {
                let results = items
                    .iter()
                    .map(|p| match sqlite::jobs::settle_reporting(tx, p) {
                        Err(e) if !e.is_lease_lost() => Err(e),
                        result => Ok(result),
                    })
                    .collect::<Result<Vec<_>>>()?;
                failpoint!("settle-before-commit");
                Ok(results)
            }),
        }
    }

    pub(crate) fn heartbeat(&self, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::jobs::heartbeat(tx, p)),
        }
    }

    /// Lists expired leases and applies the engine's decision for each, in one
    /// transaction.
    pub(crate) fn rescue(
        &self,
        now: i64,
        limit: usize,
        decide: impl Fn(&ExpiredLease) -> SettleParams,
    ) -> Result<Vec<(ExpiredLease, SettleParams)>> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| {
                let mut done = Vec::new();
                for expired in sqlite::jobs::expired_leases(tx, now, limit)? {
                    let settle = decide(&expired);
                    sqlite::jobs::settle(tx, &settle)?;
                    done.push((expired, settle));
                }
                Ok(done)
            }),
        }
    }

    pub(crate) fn get(&self, id: i64, now: i64) -> Result<JobRecord> {
        match self {
            Backend::Sqlite(db) => db.read(|c| sqlite::inspect::get(c, id, now)),
        }
    }

    pub(crate) fn list(&self, filter: &JobFilter, now: i64) -> Result<Page> {
        match self {
            Backend::Sqlite(db) => db.read(|c| sqlite::inspect::list(c, filter, now)),
        }
    }

    pub(crate) fn counts(&self, now: i64) -> Result<Vec<StateCount>> {
        match self {
            Backend::Sqlite(db) => db.read(|c| sqlite::inspect::counts(c, now)),
        }
    }

    pub(crate) fn retry(&self, id: i64, now: i64) -> Result<()> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::inspect::retry(tx, id, now)),
        }
    }

    pub(crate) fn cancel(&self, id: i64, now: i64) -> Result<CancelOutcome> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::inspect::cancel(tx, id, now)),
        }
    }

    pub(crate) fn delete(&self, id: i64) -> Result<()> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::inspect::delete(tx, id)),
        }
    }

    pub(crate) fn set_paused(&self, queue: &str, paused: bool, now: i64) -> Result<()> {
        match self {
            Backend::Sqlite(db) => {
                db.write(|tx| sqlite::inspect::set_paused(tx, queue, paused, now))
            }
        }
    }

    pub(crate) fn paused_queues(&self) -> Result<Vec<String>> {
        match self {
            Backend::Sqlite(db) => db.read(sqlite::inspect::paused_queues),
        }
    }

    /// A watcher of commits by other connections, on a connection of its own.
    pub(crate) fn watch_changes(&self, path: &std::path::Path) -> Result<ChangeWatcher> {
        match self {
            Backend::Sqlite(_) => Ok(ChangeWatcher::Sqlite(sqlite::DataVersion::open(path)?)),
        }
    }

    /// Copies the write-ahead log back into the database, without waiting on
    /// other connections. Returns whether the whole log was copied.
    pub(crate) fn checkpoint(&self) -> Result<bool> {
        match self {
            Backend::Sqlite(db) => {
                let done = sqlite::wal::checkpoint(&db.writer())?;
                Ok(!done.busy && done.checkpointed_frames >= done.log_frames)
            }
        }
    }

    pub(crate) fn prune(&self, status: FinalStatus, cutoff: i64, limit: usize) -> Result<usize> {
        match self {
            Backend::Sqlite(db) => db.write(|tx| sqlite::inspect::prune(tx, status, cutoff, limit)),
        }
    }
}

/// Notices commits made by other connections (another process's enqueue),
/// cheaply enough to be asked every few milliseconds.
#[derive(Debug)]
pub(crate) enum ChangeWatcher {
    Sqlite(sqlite::DataVersion),
}

impl ChangeWatcher {
    /// True when something was committed since the last call.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        match self {
            ChangeWatcher::Sqlite(v) => v.changed(),
        }
    }
}
