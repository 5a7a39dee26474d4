//! The live-worker registry on MySQL/MariaDB, in the order of
//! `sqlite/workers.rs`.
//!
//! Times follow the rule of the other tables (`:now`: a manual clock's now,
//! or NULL for the server's clock; the engine's start and expiry bound as
//! offsets from its own now). The registry's statements are rendered
//! per call by the queue's `Tables`, as the schedules' are.

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Db};
use crate::backend::registry::{self, DueCount, HeldJob, RegisterWorkerParams, WorkerRow};
use crate::backend::Workers;
use crate::error::Result;

// Differs from SQLite's `REGISTER` in that `ON DUPLICATE KEY` stands for
// `ON CONFLICT` (`VALUES(col)`: see `schedules.rs`), and the start and
// expiry are offsets (µs) from now.
registry::worker_statements!(table: "{workers}", id: ":id", now: "{now}",
    values: "(:id, :host, :pid, :queues, :kinds, :concurrency, {now} + :started, {now},
        {now} + :expires)",
    upsert: "ON DUPLICATE KEY UPDATE", refresh: ("VALUES(", ")"));

/// As SQLite's `HELD_JOBS`. Differs in that the index is forced, as
/// `COUNT_RUNNING`'s: `jobs_expiry` holds every claim's `lease_until`.
pub const HELD_JOBS: &str = "
SELECT locked_by, id, queue, kind FROM {jobs} FORCE INDEX (jobs_expiry)
WHERE lease_until IS NOT NULL AND lease_token IS NOT NULL ORDER BY id";

/// As SQLite's two `DUE_BY_KIND_*` in one, from `jobs_scheduled` as
/// `COUNT_WAITING_DUE`: differs in that jobs not due yet stay in the lease
/// index (no `due` flag, see V2).
pub const DUE_BY_KIND: &str = "
SELECT lease_queue, kind, COUNT(*) FROM {jobs} FORCE INDEX (jobs_scheduled)
WHERE lease_queue IS NOT NULL AND available_at <= {now} GROUP BY lease_queue, kind";

impl Workers for Db {
    fn register_worker(&self, p: &RegisterWorkerParams<'_>) -> Result<()> {
        let sql = self.sql.tables.render(REGISTER);
        let now = self.now(p.now);
        self.write(|tx| {
            tx.exec_drop(
                &sql,
                params! {
                    "id" => p.id,
                    "host" => p.host,
                    "pid" => p.pid,
                    "queues" => p.queues,
                    "kinds" => p.kinds,
                    "concurrency" => p.concurrency,
                    "started" => now.offset(p.started_at),
                    "expires" => now.offset(p.expires_at),
                    "now" => now.param(),
                },
            )?;
            Ok(())
        })
    }

    fn deregister_worker(&self, id: &str) -> Result<bool> {
        let sql = self.sql.tables.render(DEREGISTER);
        self.write(|tx| {
            let removed = tx.exec_iter(&sql, params! { "id" => id })?.affected_rows();
            Ok(removed > 0)
        })
    }

    fn workers(&self, now: i64) -> Result<Vec<WorkerRow>> {
        let sql = self.sql.tables.render(LIVE);
        let now = self.now(now);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(&sql, params! { "now" => now.param() })?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(WorkerRow {
                        id: take(&mut r, 0)?,
                        host: take(&mut r, 1)?,
                        pid: take(&mut r, 2)?,
                        queues: take(&mut r, 3)?,
                        kinds: take(&mut r, 4)?,
                        concurrency: take(&mut r, 5)?,
                        started_at: take(&mut r, 6)?,
                        heartbeat_at: take(&mut r, 7)?,
                        expires_at: take(&mut r, 8)?,
                    })
                })
                .collect()
        })
    }

    fn held_jobs(&self) -> Result<Vec<HeldJob>> {
        let sql = self.sql.tables.render(HELD_JOBS);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(&sql, ())?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(HeldJob {
                        locked_by: take::<Option<String>>(&mut r, 0)?.unwrap_or_default(),
                        id: take(&mut r, 1)?,
                        queue: take(&mut r, 2)?,
                        kind: take(&mut r, 3)?,
                    })
                })
                .collect()
        })
    }

    fn prune_workers(&self, now: i64) -> Result<usize> {
        let sql = self.sql.tables.render(PRUNE);
        let now = self.now(now);
        self.write(|tx| {
            let pruned = tx
                .exec_iter(&sql, params! { "now" => now.param() })?
                .affected_rows();
            Ok(usize::try_from(pruned).unwrap_or(usize::MAX))
        })
    }

    fn due_by_kind(&self, now: i64) -> Result<Vec<DueCount>> {
        let sql = self.sql.tables.render(DUE_BY_KIND);
        let now = self.now(now);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(&sql, params! { "now" => now.param() })?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(DueCount {
                        queue: take(&mut r, 0)?,
                        kind: take(&mut r, 1)?,
                        count: take(&mut r, 2)?,
                    })
                })
                .collect()
        })
    }
}
