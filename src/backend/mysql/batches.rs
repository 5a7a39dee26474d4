//! Batches on MySQL/MariaDB, in the order of `sqlite/batches.rs`.
//!
//! Times follow the rule of the other tables (`:now`: a manual clock's now,
//! or NULL for the server's clock). The counting update locks the batch's
//! row until the finishing transaction ends; the row is then read with a
//! locking read (`FOR UPDATE`), which sees the latest committed version
//! whatever the isolation level, so of two transactions finishing the last
//! members at once exactly one sees the batch done and not yet finished.
//! Its statements are rendered per call by the queue's `Tables`, which know
//! the batches' tables with the others (as the registry's).

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Now};
use super::queries::Sql;
use crate::backend::batches;
use crate::backend::params::EnqueueParams;
use crate::batch::{self, BatchRow, CreateBatchParams};
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::outcome::FinalStatus;

/// As SQLite's `CREATE`.
pub const CREATE: &str = "
INSERT INTO {batches} (on_complete, on_success, created_at, updated_at)
VALUES (:on_complete, :on_success, {now}, {now})";

/// As SQLite's `SEALED`. Differs in that it locks the row (`FOR UPDATE`), so
/// a seal cannot come between the check and the join.
pub const SEALED: &str = "SELECT sealed FROM {batches} WHERE id = :id FOR UPDATE";

/// As SQLite's `JOIN`, for many jobs: `:members` a JSON array of
/// `[job id, batch id]`.
pub const JOIN: &str = "
INSERT INTO {batch_jobs} (job_id, batch_id)
SELECT j.job_id, j.batch_id FROM JSON_TABLE(:members, '$[*]' COLUMNS (
    job_id BIGINT PATH '$[0]', batch_id BIGINT PATH '$[1]')) AS j";

/// As SQLite's `ADD_MEMBERS`.
pub const ADD_MEMBERS: &str = "
UPDATE {batches} SET total = total + :n, updated_at = {now} WHERE id = :id";

/// As SQLite's `LEAVE`, in two statements (MySQL has no `DELETE ..
/// RETURNING`): the batches of the jobs of `:done` (a JSON array of
/// `[id, status]`) that are live members, locked ...
pub const MEMBERS_OF: &str = "
SELECT m.batch_id, d.status
FROM JSON_TABLE(:done, '$[*]' COLUMNS (
         id BIGINT PATH '$[0]', status VARCHAR(16) PATH '$[1]')) AS d
STRAIGHT_JOIN {batch_jobs} AS m FORCE INDEX (PRIMARY) ON m.job_id = d.id
FOR UPDATE";

/// ... and their membership removed.
pub const LEAVE: &str = "
DELETE m
FROM JSON_TABLE(:done, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS d
STRAIGHT_JOIN {batch_jobs} AS m FORCE INDEX (PRIMARY) ON m.job_id = d.id";

/// As SQLite's `COUNT_FINISHED`, for counts of each status, without
/// `RETURNING` (read after with [`GET_LOCKED`]).
pub const COUNT_FINISHED: &str = "
UPDATE {batches}
SET completed = completed + :completed, discarded = discarded + :discarded,
    cancelled = cancelled + :cancelled, dead = dead + :dead, updated_at = {now}
WHERE id = :id";

/// As SQLite's `COUNT_DELETED`, without `RETURNING`.
pub const COUNT_DELETED: &str = "
UPDATE {batches} SET total = total - 1, updated_at = {now} WHERE id = :id";

/// As SQLite's `SEAL`, without `RETURNING`.
pub const SEAL: &str = "UPDATE {batches} SET sealed = 1, updated_at = {now} WHERE id = :id";

/// As SQLite's `FINISH`.
pub const FINISH: &str = "
UPDATE {batches}
SET finished_at = {now}, complete_job_id = :complete, success_job_id = :success,
    updated_at = {now}
WHERE id = :id AND finished_at IS NULL";

/// As SQLite's `PRUNE`, in two statements (MySQL has no `DELETE ..
/// RETURNING`, nor a `DELETE` reading its own table in a subquery): up to
/// `:limit` finished batches that finished before `:cutoff_in` from now,
/// oldest first, through V12's `batches_open` (every batch by
/// `finished_at`; the range below the cutoff leaves out the open ones'
/// NULLs), selected and locked, skipping those another node is pruning ...
pub const PRUNE_SELECT: &str = concat!(
    "
SELECT b.id FROM {batches} AS b FORCE INDEX (batches_open)
WHERE b.finished_at < {now} + :cutoff_in
  AND ",
    batches::callbacks_gone!("{jobs}", "{pending}", "{group_members}"),
    "
ORDER BY b.finished_at LIMIT :limit
FOR UPDATE SKIP LOCKED"
);

/// ... and deleted (`:ids`, a JSON array).
pub const PRUNE: &str = "
DELETE b
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {batches} AS b ON b.id = g.id";

/// The columns of a batch's row, in [`batch_row`]'s order.
macro_rules! batch_columns {
    () => {
        "id, sealed, total, completed, discarded, cancelled, dead, on_complete, on_success,
         finished_at, complete_job_id, success_job_id, created_at"
    };
}

/// As SQLite's `GET`.
pub const GET: &str = concat!(
    "SELECT ",
    batch_columns!(),
    " FROM {batches} WHERE id = :id"
);

/// A batch's row, locked: the latest committed version.
pub const GET_LOCKED: &str = concat!(
    "SELECT ",
    batch_columns!(),
    " FROM {batches} WHERE id = :id FOR UPDATE"
);

/// The backend's whole enqueue (`jobs.rs`' `enqueue_all`), handed in by
/// the caller of what may fire a batch: its callbacks are enqueued as any
/// job, and that enqueue (and the finish it may run) recurses through here.
pub(crate) type EnqueueAll<Q> =
    fn(&Sql, &mut Q, &[EnqueueParams<'_>], Now) -> Result<Vec<Enqueued>>;

/// Inserts an open batch; its id.
pub(crate) fn create(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &CreateBatchParams<'_>,
    now: Now,
) -> Result<i64> {
    let id = q
        .exec_iter(
            sql.tables.render(CREATE),
            params! {
                "on_complete" => p.on_complete, "on_success" => p.on_success,
                "now" => now.param(),
            },
        )?
        .last_insert_id();
    id.and_then(|id| i64::try_from(id).ok())
        .ok_or_else(|| Error::Database("insert returned no id".into()))
}

/// As SQLite's `enqueue`: checks the named batches open (locking their rows,
/// in id order), enqueues with `insert`, and makes the new jobs members.
pub(crate) fn enqueue<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    jobs: &[EnqueueParams<'_>],
    now: Now,
    insert: impl FnOnce(&Sql, &mut Q, &[EnqueueParams<'_>], Now) -> Result<Vec<Enqueued>>,
) -> Result<Vec<Enqueued>> {
    if jobs.iter().all(|p| p.batch.is_none()) {
        return insert(sql, q, jobs, now);
    }
    let mut batches: Vec<i64> = jobs.iter().filter_map(|p| p.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let sealed = sql.tables.render(SEALED);
    for &id in &batches {
        let found: Option<bool> = q.exec_first(&sealed, params! { "id" => id })?;
        batch::join_verdict(id, found)?;
    }
    let ids = insert(sql, q, jobs, now)?;
    let members: Vec<[i64; 2]> = jobs
        .iter()
        .zip(&ids)
        .filter_map(|(p, e)| p.batch.filter(|_| !e.existed).map(|b| [e.id, b]))
        .collect();
    if members.is_empty() {
        return Ok(ids);
    }
    q.exec_drop(
        sql.tables.render(JOIN),
        params! { "members" => serde_json::to_string(&members)? },
    )?;
    let add = sql.tables.render(ADD_MEMBERS);
    for &id in &batches {
        let n = members.iter().filter(|m| m[1] == id).count();
        if n > 0 {
            q.exec_drop(&add, params! { "id" => id, "n" => n, "now" => now.param() })?;
        }
    }
    Ok(ids)
}

/// Counts jobs just moved to history (`done`: id and status) into their
/// batches, and fires the batches that are done. One statement when none of
/// them is in a batch.
pub(crate) fn finished<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    done: &[(i64, FinalStatus)],
    now: Now,
    enqueue: EnqueueAll<Q>,
) -> Result<()> {
    if done.is_empty() {
        return Ok(());
    }
    let done_json = serde_json::to_string(
        &done
            .iter()
            .map(|(id, s)| (id, s.as_str()))
            .collect::<Vec<_>>(),
    )?;
    let members: Vec<(i64, String)> = q.exec(
        sql.tables.render(MEMBERS_OF),
        params! { "done" => &done_json },
    )?;
    if members.is_empty() {
        return Ok(());
    }
    q.exec_drop(sql.tables.render(LEAVE), params! { "done" => &done_json })?;
    let mut batches: Vec<i64> = members.iter().map(|(b, _)| *b).collect();
    batches.sort_unstable();
    batches.dedup();
    let count = sql.tables.render(COUNT_FINISHED);
    for id in batches {
        let n = |status: &str| {
            members
                .iter()
                .filter(|(b, s)| *b == id && s == status)
                .count()
        };
        q.exec_drop(
            &count,
            params! {
                "id" => id, "completed" => n("completed"), "discarded" => n("discarded"),
                "cancelled" => n("cancelled"), "dead" => n("dead"), "now" => now.param(),
            },
        )?;
        fire_if_due(sql, q, id, now, enqueue)?;
    }
    Ok(())
}

/// As SQLite's `deleted`.
pub(crate) fn deleted<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    job_id: i64,
    now: Now,
    enqueue: EnqueueAll<Q>,
) -> Result<()> {
    let done = serde_json::to_string(&[(job_id, "deleted")])?;
    let batch: Option<(i64, String)> =
        q.exec_first(sql.tables.render(MEMBERS_OF), params! { "done" => &done })?;
    let Some((batch, _)) = batch else {
        return Ok(());
    };
    q.exec_drop(sql.tables.render(LEAVE), params! { "done" => &done })?;
    q.exec_drop(
        sql.tables.render(COUNT_DELETED),
        params! { "id" => batch, "now" => now.param() },
    )?;
    fire_if_due(sql, q, batch, now, enqueue)
}

/// As SQLite's `seal`.
pub(crate) fn seal<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    id: i64,
    now: Now,
    enqueue: EnqueueAll<Q>,
) -> Result<Option<BatchRow>> {
    q.exec_drop(
        sql.tables.render(SEAL),
        params! { "id" => id, "now" => now.param() },
    )?;
    fire_if_due(sql, q, id, now, enqueue)?;
    get(sql, q, id)
}

/// As SQLite's `get`.
pub(crate) fn get(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<Option<BatchRow>> {
    let row: Option<Row> = q.exec_first(sql.tables.render(GET), params! { "id" => id })?;
    row.map(batch_row).transpose()
}

/// As SQLite's `fire_if_due`, reading the batch's row locked.
fn fire_if_due<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    id: i64,
    now: Now,
    enqueue: EnqueueAll<Q>,
) -> Result<()> {
    let row: Option<Row> = q.exec_first(sql.tables.render(GET_LOCKED), params! { "id" => id })?;
    let Some(row) = row.map(batch_row).transpose()? else {
        return Ok(());
    };
    let Some(due) = row.due() else {
        return Ok(());
    };
    let (complete, success) = batch::enqueue_callbacks(row.id, due, now.engine, |p| {
        let ids = enqueue(sql, q, std::slice::from_ref(p), now)?;
        ids.first()
            .map(|e| e.id)
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    })?;
    if complete.is_some() || success.is_some() {
        super::connection::note_runnable();
    }
    q.exec_drop(
        sql.tables.render(FINISH),
        params! {
            "id" => row.id, "complete" => complete, "success" => success, "now" => now.param(),
        },
    )?;
    Ok(())
}

/// Reads a row in `batch_columns!` order.
fn batch_row(mut r: Row) -> Result<BatchRow> {
    Ok(BatchRow {
        id: take(&mut r, 0)?,
        sealed: take(&mut r, 1)?,
        total: take(&mut r, 2)?,
        completed: take(&mut r, 3)?,
        discarded: take(&mut r, 4)?,
        cancelled: take(&mut r, 5)?,
        dead: take(&mut r, 6)?,
        on_complete: take(&mut r, 7)?,
        on_success: take(&mut r, 8)?,
        finished_at: take(&mut r, 9)?,
        complete_job_id: take(&mut r, 10)?,
        success_job_id: take(&mut r, 11)?,
        created_at: take(&mut r, 12)?,
    })
}

/// As SQLite's `prune`: `now` the engine's clock, to turn `cutoff` into
/// an offset from now (as history's prune).
pub(crate) fn prune(
    sql: &Sql,
    q: &mut impl Queryable,
    cutoff: i64,
    limit: usize,
    now: Now,
) -> Result<usize> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let ids: Vec<i64> = q.exec(
        sql.tables.render(PRUNE_SELECT),
        params! { "cutoff_in" => now.offset(cutoff), "limit" => limit, "now" => now.param() },
    )?;
    if ids.is_empty() {
        return Ok(0);
    }
    q.exec_drop(
        sql.tables.render(PRUNE),
        params! { "ids" => serde_json::to_string(&ids)? },
    )?;
    Ok(ids.len())
}
