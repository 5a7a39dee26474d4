//! The live-worker registry on PostgreSQL, in the order of
//! `sqlite/workers.rs`.
//!
//! Times follow the rule of the other tables: the server's clock (`$1`: a
//! manual clock's now, or NULL), and the engine's start and expiry bound as
//! offsets from its own now. The registry's statements are rendered per
//! call by the queue's `Tables`, as the schedules' are.

use super::db::Db;
use crate::backend::registry::{self, DueCount, HeldJob, RegisterWorkerParams, WorkerRow};
use crate::backend::Workers;
use crate::error::Result;

// `$8` and `$9` of `REGISTER` are the start and the expiry as offsets (µs)
// from now.
registry::worker_statements!(table: "{workers}", id: "$1", now: "{now}",
    values: "($2, $3, $4, $5, $6, $7, {now} + $8, {now}, {now} + $9)",
    upsert: "ON CONFLICT (id) DO UPDATE SET", refresh: ("excluded.", ""));

/// As SQLite's `HELD_JOBS`, through the partial `{prefix}jobs_expiry`
/// (leased rows only).
pub const HELD_JOBS: &str = "
SELECT locked_by, id, queue, kind FROM {jobs} WHERE lease_token IS NOT NULL ORDER BY id";

/// As SQLite's two `DUE_BY_KIND_*` in one: differs in that jobs not due yet
/// stay in the lease index (no `due` flag, see V2), so one range of
/// `{prefix}jobs_scheduled` per queue holds them all.
pub const DUE_BY_KIND: &str = "
SELECT queue, kind, count(*) FROM {jobs}
WHERE lease_token IS NULL AND available_at <= {now} GROUP BY queue, kind";

impl Workers for Db {
    fn register_worker(&self, p: &RegisterWorkerParams<'_>) -> Result<()> {
        let sql = self.q.tables.render(REGISTER);
        let now = self.q.now_override(p.now);
        let started = p.started_at.saturating_sub(p.now);
        let expires = p.expires_at.saturating_sub(p.now);
        let concurrency = i32::try_from(p.concurrency).unwrap_or(i32::MAX);
        self.pool.write(|tx| {
            tx.execute(
                &sql,
                &[
                    &now,
                    &p.id,
                    &p.host,
                    &p.pid,
                    &p.queues,
                    &p.kinds,
                    &concurrency,
                    &started,
                    &expires,
                ],
            )?;
            Ok(())
        })
    }

    fn deregister_worker(&self, id: &str) -> Result<bool> {
        let sql = self.q.tables.render(DEREGISTER);
        self.pool.write(|tx| Ok(tx.execute(&sql, &[&id])? > 0))
    }

    fn workers(&self, now: i64) -> Result<Vec<WorkerRow>> {
        let sql = self.q.tables.render(LIVE);
        let now = self.q.now_override(now);
        self.pool.read(|tx| {
            tx.query(&sql, &[&now])?
                .iter()
                .map(|r| {
                    Ok(WorkerRow {
                        id: r.try_get(0)?,
                        host: r.try_get(1)?,
                        pid: r.try_get(2)?,
                        queues: r.try_get(3)?,
                        kinds: r.try_get(4)?,
                        concurrency: i64::from(r.try_get::<_, i32>(5)?),
                        started_at: r.try_get(6)?,
                        heartbeat_at: r.try_get(7)?,
                        expires_at: r.try_get(8)?,
                    })
                })
                .collect()
        })
    }

    fn held_jobs(&self) -> Result<Vec<HeldJob>> {
        let sql = self.q.tables.render(HELD_JOBS);
        self.pool.read(|tx| {
            tx.query(&sql, &[])?
                .iter()
                .map(|r| {
                    Ok(HeldJob {
                        locked_by: r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
                        id: r.try_get(1)?,
                        queue: r.try_get(2)?,
                        kind: r.try_get(3)?,
                    })
                })
                .collect()
        })
    }

    fn prune_workers(&self, now: i64) -> Result<usize> {
        let sql = self.q.tables.render(PRUNE);
        let now = self.q.now_override(now);
        self.pool
            .write(|tx| Ok(usize::try_from(tx.execute(&sql, &[&now])?).unwrap_or(usize::MAX)))
    }

    fn due_by_kind(&self, now: i64) -> Result<Vec<DueCount>> {
        let sql = self.q.tables.render(DUE_BY_KIND);
        let now = self.q.now_override(now);
        self.pool.read(|tx| {
            tx.query(&sql, &[&now])?
                .iter()
                .map(|r| {
                    Ok(DueCount {
                        queue: r.try_get(0)?,
                        kind: r.try_get(1)?,
                        count: r.try_get(2)?,
                    })
                })
                .collect()
        })
    }
}
