//! Batches on SQLite (`backlog_batches`, `backlog_batch_jobs`, V9): create,
//! join, count a finished or deleted member, seal, read. The engine's
//! verdict on a batch's counters is [`BatchRow::due`]; the callbacks go in
//! through this backend's own enqueue, in the transaction that finished the
//! batch's last member.
//!
//! Statements here are in the order of `postgres/batches.rs` and
//! `mysql/batches.rs`. Times are the engine's, unix µs.

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::backend::batches;
use crate::backend::params::{bigint, EnqueueParams};
use crate::batch::{self, BatchRow, CreateBatchParams};
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::outcome::FinalStatus;

/// The backend's whole enqueue (`jobs.rs`' `enqueue_all`), handed in by
/// the caller of what may fire a batch: its callbacks are enqueued as any
/// job, and that enqueue (and the finish it may run) recurses through here.
pub(crate) type EnqueueAll = fn(&Connection, &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>;

/// Inserts an open batch.
pub const CREATE: &str = "
INSERT INTO backlog_batches (on_complete, on_success, created_at, updated_at)
VALUES (?1, ?2, ?3, ?3)";

/// Whether batch `?1` is sealed; no row when there is no such batch.
pub const SEALED: &str = "SELECT sealed FROM backlog_batches WHERE id = ?1";

/// Counts `?2` more members into batch `?1`.
pub const ADD_MEMBERS: &str = "
UPDATE backlog_batches SET total = total + ?2, updated_at = ?3 WHERE id = ?1";

/// Records job `?1` as a live member of batch `?2`.
pub const JOIN: &str = "INSERT INTO backlog_batch_jobs (job_id, batch_id) VALUES (?1, ?2)";

/// Takes job `?1` out of its batch's live members; its batch, if it had one.
pub const LEAVE: &str = "DELETE FROM backlog_batch_jobs WHERE job_id = ?1 RETURNING batch_id";

/// The columns of a batch's row, in [`batch_row`]'s order.
macro_rules! batch_columns {
    () => {
        "id, sealed, total, completed, discarded, cancelled, dead, on_complete, on_success,
         finished_at, complete_job_id, success_job_id, created_at"
    };
}

/// Counts a finished member of batch `?1` under its status `?2`, at `?3`;
/// the row after.
pub const COUNT_FINISHED: &str = concat!(
    "
UPDATE backlog_batches
SET completed = completed + (?2 = 'completed'),
    discarded = discarded + (?2 = 'discarded'),
    cancelled = cancelled + (?2 = 'cancelled'),
    dead = dead + (?2 = 'dead'),
    updated_at = ?3
WHERE id = ?1
RETURNING ",
    batch_columns!()
);

/// Takes a deleted live member out of batch `?1`'s total, at `?2`; the row
/// after.
pub const COUNT_DELETED: &str = concat!(
    "UPDATE backlog_batches SET total = total - 1, updated_at = ?2 WHERE id = ?1 RETURNING ",
    batch_columns!()
);

/// Seals batch `?1` at `?2`; the row after.
pub const SEAL: &str = concat!(
    "UPDATE backlog_batches SET sealed = 1, updated_at = ?2 WHERE id = ?1 RETURNING ",
    batch_columns!()
);

/// Marks batch `?1` finished at `?2` with its callbacks' jobs `?3`, `?4`:
/// only once (`finished_at IS NULL`), though the single writer already
/// makes the counting transactions take turns.
pub const FINISH: &str = "
UPDATE backlog_batches
SET finished_at = ?2, complete_job_id = ?3, success_job_id = ?4, updated_at = ?2
WHERE id = ?1 AND finished_at IS NULL";

/// Deletes up to `?2` finished batches whose `finished_at` is before `?1`,
/// oldest first, through V13's `backlog_batches_finished`, but those whose
/// callback job is still live or waiting (its handler may read the batch);
/// returns their ids. A finished batch has no live member left (each left
/// `backlog_batch_jobs` as it was counted, and none can join once sealed),
/// and an open or counting one has no `finished_at`: neither is a candidate.
pub const PRUNE: &str = concat!(
    "
DELETE FROM backlog_batches WHERE id IN (
    SELECT b.id FROM backlog_batches AS b WHERE b.finished_at < ?1
  AND ",
    batches::callbacks_gone!("backlog_jobs", "backlog_pending", "backlog_group_members"),
    "
    ORDER BY b.finished_at LIMIT ?2)
RETURNING id"
);

/// Batch `?1`'s row.
pub const GET: &str = concat!(
    "SELECT ",
    batch_columns!(),
    " FROM backlog_batches WHERE id = ?1"
);

/// Inserts an open batch; its id.
pub(crate) fn create(conn: &Connection, p: &CreateBatchParams<'_>) -> Result<i64> {
    conn.prepare_cached(CREATE)?
        .execute(params![p.on_complete, p.on_success, p.now])?;
    Ok(conn.last_insert_rowid())
}

/// Enqueues `jobs` with `insert` (the backend's enqueue), and makes the new
/// ones that name a batch its members. Each named batch is checked open
/// first: a sealed or unknown batch refuses the whole call before anything
/// is written. A job that existed (its unique key held) joins nothing.
pub(crate) fn enqueue(
    conn: &Connection,
    jobs: &[EnqueueParams<'_>],
    insert: impl FnOnce(&Connection, &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>,
) -> Result<Vec<Enqueued>> {
    if jobs.iter().all(|p| p.batch.is_none()) {
        return insert(conn, jobs);
    }
    let mut sealed = conn.prepare_cached(SEALED)?;
    for id in jobs.iter().filter_map(|p| p.batch) {
        let found: Option<bool> = sealed.query_row([id], |r| r.get(0)).optional()?;
        batch::join_verdict(id, found)?;
    }
    let ids = insert(conn, jobs)?;
    let mut join = conn.prepare_cached(JOIN)?;
    let mut add = conn.prepare_cached(ADD_MEMBERS)?;
    for (p, e) in jobs.iter().zip(&ids) {
        if let (Some(batch), false) = (p.batch, e.existed) {
            join.execute(params![e.id, batch])?;
            add.execute(params![batch, 1, p.now])?;
        }
    }
    Ok(ids)
}

/// Counts job `job_id`, just moved to history as `status`, into its batch
/// if it is a live member, and enqueues the batch's callbacks when that was
/// its last member. One look-up for a job in no batch.
pub(crate) fn finished(
    conn: &Connection,
    job_id: i64,
    status: FinalStatus,
    now: i64,
    enqueue: EnqueueAll,
) -> Result<()> {
    let Some(batch) = leave(conn, job_id)? else {
        return Ok(());
    };
    let row = conn
        .prepare_cached(COUNT_FINISHED)?
        .query_row(params![batch, status.as_str(), now], batch_row)
        .optional()?;
    fire_if_due(conn, row, now, enqueue)
}

/// Takes a deleted live job out of its batch, if it was a member; the batch
/// may be done then.
pub(crate) fn deleted(conn: &Connection, job_id: i64, now: i64, enqueue: EnqueueAll) -> Result<()> {
    let Some(batch) = leave(conn, job_id)? else {
        return Ok(());
    };
    let row = conn
        .prepare_cached(COUNT_DELETED)?
        .query_row(params![batch, now], batch_row)
        .optional()?;
    fire_if_due(conn, row, now, enqueue)
}

/// Seals a batch and fires it when it is done; the row after, `None` when
/// there is no such batch.
pub(crate) fn seal(
    conn: &Connection,
    id: i64,
    now: i64,
    enqueue: EnqueueAll,
) -> Result<Option<BatchRow>> {
    let row = conn
        .prepare_cached(SEAL)?
        .query_row(params![id, now], batch_row)
        .optional()?;
    fire_if_due(conn, row.clone(), now, enqueue)?;
    get(conn, id)
}

/// A batch's row.
pub(crate) fn get(conn: &Connection, id: i64) -> Result<Option<BatchRow>> {
    Ok(conn
        .prepare_cached(GET)?
        .query_row([id], batch_row)
        .optional()?)
}

fn leave(conn: &Connection, job_id: i64) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached(LEAVE)?
        .query_row([job_id], |r| r.get(0))
        .optional()?)
}

/// Enqueues the callbacks of a batch whose counters just changed, when the
/// engine says it is done, and marks it finished.
fn fire_if_due(
    conn: &Connection,
    row: Option<BatchRow>,
    now: i64,
    enqueue: EnqueueAll,
) -> Result<()> {
    let Some(row) = row else {
        return Ok(());
    };
    let Some(due) = row.due() else {
        return Ok(());
    };
    let (complete, success) = batch::enqueue_callbacks(row.id, due, now, |p| {
        let ids = enqueue(conn, std::slice::from_ref(p))?;
        ids.first()
            .map(|e| e.id)
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    })?;
    conn.prepare_cached(FINISH)?
        .execute(params![row.id, now, complete, success])?;
    Ok(())
}

/// Deletes up to `limit` finished batches that finished before `cutoff`
/// ([`PRUNE`]); how many.
pub(crate) fn prune(conn: &Connection, cutoff: i64, limit: usize) -> Result<usize> {
    let limit = bigint(limit);
    let ids = conn
        .prepare_cached(PRUNE)?
        .query_map(params![cutoff, limit], |r| r.get::<_, i64>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(ids.len())
}

/// Reads a row in `batch_columns!` order.
fn batch_row(r: &Row<'_>) -> rusqlite::Result<BatchRow> {
    Ok(BatchRow {
        id: r.get(0)?,
        sealed: r.get(1)?,
        total: r.get(2)?,
        completed: r.get(3)?,
        discarded: r.get(4)?,
        cancelled: r.get(5)?,
        dead: r.get(6)?,
        on_complete: r.get(7)?,
        on_success: r.get(8)?,
        finished_at: r.get(9)?,
        complete_job_id: r.get(10)?,
        success_job_id: r.get(11)?,
        created_at: r.get(12)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of `sql`, one detail per line.
    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        stmt.query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    /// History's prune seeks the finished batches by `finished_at` (V13's
    /// index) and each one's callbacks by primary key: no table is scanned
    /// for it, however many batches are kept.
    #[test]
    fn pruning_batches_seeks_the_finished_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("plan.db")).unwrap();
        super::super::migrate::migrate(&mut conn, std::time::Duration::from_secs(5)).unwrap();
        let plan = plan(&conn, &PRUNE.replace("?1", "0").replace("?2", "10"));
        assert!(
            plan.iter()
                .any(|d| d.contains("INDEX backlog_batches_finished"))
                && plan.iter().all(|d| !d.starts_with("SCAN")),
            "{plan:?}"
        );
    }

    /// What a finishing member costs is primary-key writes, whatever the
    /// number of batches and members: no statement scans a table.
    #[test]
    fn counting_a_finished_member_searches_by_primary_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("plan.db")).unwrap();
        super::super::migrate::migrate(&mut conn, std::time::Duration::from_secs(5)).unwrap();
        for sql in [
            LEAVE,
            ADD_MEMBERS,
            COUNT_FINISHED,
            COUNT_DELETED,
            SEAL,
            FINISH,
        ] {
            let sql = sql
                .replace("?1", "1")
                .replace("?2", "'completed'")
                .replace("?3", "0")
                .replace("?4", "NULL");
            let plan = plan(&conn, &sql);
            assert!(
                plan.iter().any(|d| d.starts_with("SEARCH"))
                    && plan.iter().all(|d| !d.starts_with("SCAN")),
                "{sql}: {plan:?}"
            );
        }
    }
}
