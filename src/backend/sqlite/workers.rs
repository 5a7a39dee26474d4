//! The live-worker registry on SQLite (`backlog_workers`, V7): register and
//! refresh a worker's row, deregister it, list the live ones and the jobs
//! they hold, prune the expired, and count due jobs per queue and kind.
//!
//! Statements here are in the order of `postgres/workers.rs` and
//! `mysql/workers.rs`. Times are the engine's, unix µs.

use rusqlite::{params, Connection, Row};

use super::connection::Connections;
use crate::backend::registry::{self, DueCount, HeldJob, RegisterWorkerParams, WorkerRow};
use crate::backend::Workers;
use crate::error::Result;

registry::worker_statements!(table: "backlog_workers", id: "?1", now: "?1",
    values: "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)", upsert: "ON CONFLICT (id) DO UPDATE SET",
    refresh: ("excluded.", ""));

/// Every leased job and its holder, through `backlog_jobs_running` (leased
/// rows only; V5): the jobs a worker runs are the ones whose `locked_by` is
/// its id, read here rather than stored twice.
pub const HELD_JOBS: &str = "
SELECT locked_by, id, queue, kind FROM backlog_jobs INDEXED BY backlog_jobs_running
WHERE lease_token IS NOT NULL ORDER BY id";

/// Due jobs per queue and kind at `?1`, in two parts like
/// `COUNT_WAITING_DUE`: the promoted ones from `backlog_jobs_lease_kind`
/// (queue and kind in index order, no table read) ...
pub const DUE_BY_KIND_PROMOTED: &str = "
SELECT queue, kind, count(*) FROM backlog_jobs
WHERE lease_token IS NULL AND due AND available_at <= ?1 GROUP BY queue, kind";

/// ... and the ones come due since the last lease promoted them, from the
/// `available_at <= ?1` range of `backlog_jobs_scheduled`.
pub const DUE_BY_KIND_LATER: &str = "
SELECT queue, kind, count(*) FROM backlog_jobs
WHERE lease_token IS NULL AND NOT due AND available_at <= ?1 GROUP BY queue, kind";

pub(crate) fn register(conn: &Connection, p: &RegisterWorkerParams<'_>) -> Result<()> {
    conn.prepare_cached(REGISTER)?.execute(params![
        p.id,
        p.host,
        p.pid,
        p.queues,
        p.kinds,
        p.concurrency,
        p.started_at,
        p.now,
        p.expires_at
    ])?;
    Ok(())
}

pub(crate) fn deregister(conn: &Connection, id: &str) -> Result<bool> {
    Ok(conn.prepare_cached(DEREGISTER)?.execute([id])? > 0)
}

pub(crate) fn live(conn: &Connection, now: i64) -> Result<Vec<WorkerRow>> {
    let mut stmt = conn.prepare_cached(LIVE)?;
    let rows = stmt.query_map([now], row)?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

pub(crate) fn held_jobs(conn: &Connection) -> Result<Vec<HeldJob>> {
    let mut stmt = conn.prepare_cached(HELD_JOBS)?;
    let rows = stmt.query_map([], |r| {
        Ok(HeldJob {
            locked_by: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
            id: r.get(1)?,
            queue: r.get(2)?,
            kind: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

pub(crate) fn prune(conn: &Connection, now: i64) -> Result<usize> {
    Ok(conn.prepare_cached(PRUNE)?.execute([now])?)
}

/// Both parts; a queue and kind may be in each, once.
pub(crate) fn due_by_kind(conn: &Connection, now: i64) -> Result<Vec<DueCount>> {
    let mut counts = Vec::new();
    for sql in [DUE_BY_KIND_PROMOTED, DUE_BY_KIND_LATER] {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map([now], |r| {
            Ok(DueCount {
                queue: r.get(0)?,
                kind: r.get(1)?,
                count: r.get(2)?,
            })
        })?;
        counts.extend(rows.collect::<rusqlite::Result<Vec<_>>>()?);
    }
    Ok(counts)
}

fn row(r: &Row<'_>) -> rusqlite::Result<WorkerRow> {
    Ok(WorkerRow {
        id: r.get(0)?,
        host: r.get(1)?,
        pid: r.get(2)?,
        queues: r.get(3)?,
        kinds: r.get(4)?,
        concurrency: r.get(5)?,
        started_at: r.get(6)?,
        heartbeat_at: r.get(7)?,
        expires_at: r.get(8)?,
    })
}

impl Workers for Connections {
    fn register_worker(&self, p: &RegisterWorkerParams<'_>) -> Result<()> {
        self.write(|tx| register(tx, p))
    }

    fn deregister_worker(&self, id: &str) -> Result<bool> {
        self.write(|tx| deregister(tx, id))
    }

    fn workers(&self, now: i64) -> Result<Vec<WorkerRow>> {
        self.read(|c| live(c, now))
    }

    fn held_jobs(&self) -> Result<Vec<HeldJob>> {
        self.read(held_jobs)
    }

    fn prune_workers(&self, now: i64) -> Result<usize> {
        self.write(|tx| prune(tx, now))
    }

    fn due_by_kind(&self, now: i64) -> Result<Vec<DueCount>> {
        self.read(|c| due_by_kind(c, now))
    }
}
