//! The live-worker registry: what [`Queue::workers`](crate::Queue::workers)
//! lists, which due jobs no live worker handles
//! ([`Queue::unhandled`](crate::Queue::unhandled)), and a running worker's
//! own registration.
//!
//! Every running [`Worker`](crate::Worker) has a row in `backlog_workers`:
//! written when it starts, refreshed by its heartbeat thread every
//! [heartbeat interval](crate::WorkerBuilder::heartbeat_interval), deleted
//! when it shuts down. A worker that dies without shutting down (a crash, a
//! kill) leaves its row behind; the row counts as gone once
//! [`EXPIRY_HEARTBEATS`] heartbeat intervals passed without a refresh (30
//! seconds with the defaults, as long as a lease), and any worker's
//! maintenance deletes it.
//!
//! The jobs a worker runs are not stored in its row: they are the leased
//! jobs whose `locked_by` is its id, read beside it.
//!
//! A due job of a queue and kind that no live worker handles (none serves
//! the queue with a handler for the kind) waits for nobody: `Queue::stats`,
//! `Queue::unhandled`, `backlog stats`, the dashboard and the
//! `backlog_unhandled_jobs` metric flag it, and each worker serving the
//! queue logs a warning once per queue and kind, at its next heartbeat tick.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

use crate::backend::registry::RegisterWorkerParams;
use crate::clock;
// Defined with the queue reads it belongs to (`QueueStats::unhandled` holds it);
// re-exported here, where it was first public.
pub use crate::inspect::UnhandledJobs;
use crate::queue::Queue;

/// A worker's row counts as gone this many heartbeat intervals after its
/// last refresh.
pub const EXPIRY_HEARTBEATS: u32 = 3;

/// A live worker, as [`Queue::workers`](crate::Queue::workers) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's id: the `locked_by` of the jobs it leases
    /// ([`WorkerBuilder::worker_id`](crate::WorkerBuilder::worker_id)).
    pub id: String,
    /// The host it runs on, as the host reported its name.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The queues it leases from, by name.
    pub queues: Vec<String>,
    /// The kinds it has handlers for, by name.
    pub kinds: Vec<String>,
    /// Its handler threads.
    pub concurrency: usize,
    /// When it started.
    pub started_at: SystemTime,
    /// Its last heartbeat.
    pub heartbeat_at: SystemTime,
    /// When it counts as gone without another heartbeat: the last one plus
    /// [`EXPIRY_HEARTBEATS`] heartbeat intervals.
    pub expires_at: SystemTime,
    /// The jobs it holds (leased: running, or waiting in its look-ahead),
    /// by id.
    pub running: Vec<RunningJob>,
}

/// A job a worker holds: see [`WorkerInfo::running`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunningJob {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
}

impl WorkerInfo {
    /// Whether this worker leases jobs of `kind` from `queue`.
    pub fn handles(&self, queue: &str, kind: &str) -> bool {
        self.queues.iter().any(|q| q == queue) && self.kinds.iter().any(|k| k == kind)
    }
}

impl Queue {
    /// The live workers on this database, by id, each with the jobs it
    /// holds. A worker is live from its start until its shutdown, or, if it
    /// died without one, until [`EXPIRY_HEARTBEATS`] of its heartbeat
    /// intervals passed since its last heartbeat (see
    /// [`crate::worker::registry`]). Two reads: the registry, and the leased
    /// jobs (a partial index of leased rows, never the whole table).
    pub fn workers(&self) -> crate::Result<Vec<WorkerInfo>> {
        let rows = self.store().workers(self.now_micros())?;
        let mut held = BTreeMap::<String, Vec<RunningJob>>::new();
        for job in self.store().held_jobs()? {
            held.entry(job.locked_by).or_default().push(RunningJob {
                id: job.id,
                queue: job.queue,
                kind: job.kind,
            });
        }
        Ok(rows
            .into_iter()
            .map(|row| WorkerInfo {
                running: held.remove(&row.id).unwrap_or_default(),
                queues: names(&row.queues),
                kinds: names(&row.kinds),
                id: row.id,
                host: row.host,
                pid: u32::try_from(row.pid).unwrap_or(0),
                concurrency: usize::try_from(row.concurrency).unwrap_or(0),
                started_at: clock::at(row.started_at),
                heartbeat_at: clock::at(row.heartbeat_at),
                expires_at: clock::at(row.expires_at),
            })
            .collect())
    }

    /// The due jobs that no live worker handles, per queue and kind, by
    /// queue then kind: a job enqueued with a kind no worker has a handler
    /// for, or into a queue no worker serves. Each waits until a worker
    /// that handles it starts. A paused queue's jobs are not listed: they
    /// wait for the queue to be resumed, not for a worker. Reads the live
    /// workers and counts the due jobs per queue and kind (from the lease
    /// index on SQLite); reads the paused queues only when some due job has
    /// no worker.
    pub fn unhandled(&self) -> crate::Result<Vec<UnhandledJobs>> {
        let workers = self.workers()?;
        let mut due = BTreeMap::<(String, String), u64>::new();
        for c in self.store().due_by_kind(self.now_micros())? {
            if !workers.iter().any(|w| w.handles(&c.queue, &c.kind)) {
                *due.entry((c.queue, c.kind)).or_default() += c.count.max(0) as u64;
            }
        }
        if !due.is_empty() {
            let paused = self.paused_queues()?;
            due.retain(|(queue, _), _| !paused.contains(queue));
        }
        Ok(due
            .into_iter()
            .map(|((queue, kind), due)| UnhandledJobs { queue, kind, due })
            .collect())
    }
}

impl Queue {
    /// Deletes the registry rows of workers gone without a shutdown (their
    /// expiry passed); how many. Maintenance runs it.
    pub(crate) fn prune_workers(&self) -> crate::Result<usize> {
        self.store().prune_workers(self.now_micros())
    }

    /// Writes (or refreshes) the registry row of a worker `id` serving
    /// `queues` with handlers for `kinds`, as each heartbeat tick does,
    /// expiring in a minute: for `examples/heartbeat_cost.rs`, which weighs
    /// the tick's [`Queue::unhandled`] check against this write.
    #[doc(hidden)]
    pub fn register_worker_row(
        &self,
        id: &str,
        queues: &[String],
        kinds: &[String],
    ) -> crate::Result<()> {
        let now = self.now_micros();
        self.store().register_worker(&RegisterWorkerParams {
            id,
            host: "bench",
            pid: i64::from(std::process::id()),
            queues: &serde_json::to_string(queues)?,
            kinds: &serde_json::to_string(kinds)?,
            concurrency: 1,
            started_at: now,
            expires_at: now.saturating_add(60_000_000),
            now,
        })
    }
}

/// A JSON array of names as stored; anything else reads as none.
fn names(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

/// A running worker's registration: its row's contents, refreshed by the
/// heartbeat thread, and the unhandled kinds it already warned about.
#[derive(Debug)]
pub(crate) struct Registration {
    id: String,
    host: String,
    queues: Vec<String>,
    queues_json: String,
    kinds_json: String,
    concurrency: usize,
    started_at: i64,
    expiry: Duration,
    /// The queues and kinds of its queues flagged unhandled at the last
    /// look: warned about once, until they are handled again.
    warned: HashSet<(String, String)>,
}

impl Registration {
    pub(crate) fn new(
        queue: &Queue,
        id: &str,
        queues: &[String],
        kinds: &[String],
        concurrency: usize,
        heartbeat_interval: Duration,
    ) -> Registration {
        let json = |names: &[String]| serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
        Registration {
            id: id.to_owned(),
            host: super::builder::host_name(),
            queues: queues.to_vec(),
            queues_json: json(queues),
            kinds_json: json(kinds),
            concurrency,
            started_at: queue.now_micros(),
            expiry: heartbeat_interval.saturating_mul(EXPIRY_HEARTBEATS),
            warned: HashSet::new(),
        }
    }

    /// Writes the row with a fresh heartbeat. A failure is logged and left
    /// to the next tick.
    pub(crate) fn beat(&self, queue: &Queue) {
        let now = queue.now_micros();
        let expires_at = clock::add_micros(now, self.expiry).unwrap_or(i64::MAX);
        let written = queue.store().register_worker(&RegisterWorkerParams {
            id: &self.id,
            host: &self.host,
            pid: i64::from(std::process::id()),
            queues: &self.queues_json,
            kinds: &self.kinds_json,
            concurrency: crate::backend::params::bigint(self.concurrency),
            started_at: self.started_at,
            expires_at,
            now,
        });
        if let Err(error) = written {
            tracing::warn!(
                %error,
                worker_id = %self.id,
                "could not refresh this worker's row in the worker registry; \
                 the next heartbeat tries again"
            );
        }
    }

    /// Looks for due jobs of this worker's queues that no live worker
    /// handles, and warns once about each queue and kind newly found.
    pub(crate) fn check_unhandled(&mut self, queue: &Queue) {
        let unhandled = match queue.unhandled() {
            Ok(unhandled) => unhandled,
            Err(error) => {
                tracing::debug!(%error, "could not look for unhandled jobs");
                return;
            }
        };
        let mut now_flagged = HashSet::new();
        for u in unhandled {
            if !self.queues.contains(&u.queue) {
                continue;
            }
            let key = (u.queue, u.kind);
            if !self.warned.contains(&key) {
                tracing::warn!(
                    queue = %key.0,
                    kind = %key.1,
                    due = u.due,
                    worker_id = %self.id,
                    "due jobs of a kind that no live worker handles on this queue: \
                     they wait until a worker with a handler for the kind serves the queue"
                );
            }
            now_flagged.insert(key);
        }
        self.warned = now_flagged;
    }

    /// Deletes the row: a clean shutdown.
    pub(crate) fn deregister(&self, queue: &Queue) {
        if let Err(error) = queue.store().deregister_worker(&self.id) {
            tracing::warn!(
                %error,
                worker_id = %self.id,
                "could not remove this worker from the worker registry; its row \
                 expires on its own"
            );
        }
    }
}
