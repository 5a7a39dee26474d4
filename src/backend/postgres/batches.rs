//! Batches on PostgreSQL, in the order of `sqlite/batches.rs`.
//!
//! Times follow the rule of the other tables (`$1`: a manual clock's now, or
//! NULL for the server's clock). The counting update locks the batch's row
//! until the finishing transaction ends, so of two transactions finishing
//! the last members at once, the second waits, then reads the first one's
//! counts and `finished_at` (READ COMMITTED re-reads an updated row): exactly
//! one fires. Its statements are rendered per call by the queue's `Tables`,
//! which know the batches' tables with the others (as the registry's).

use postgres::{GenericClient, Row};

use super::connection::Tx;
use super::queries::Queries;
use crate::backend::batches;
use crate::backend::params::{bigint, EnqueueParams};
use crate::batch::{self, BatchRow, CreateBatchParams};
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// As SQLite's `CREATE`, returning the id.
pub const CREATE: &str = "
INSERT INTO {batches} (on_complete, on_success, created_at, updated_at)
VALUES ($2, $3, {now}, {now}) RETURNING id";

/// As SQLite's `SEALED`. Differs in that it locks the row (`FOR UPDATE`), so
/// a seal cannot come between the check and the join.
pub const SEALED: &str = "SELECT sealed FROM {batches} WHERE id = $1 FOR UPDATE";

/// As SQLite's `ADD_MEMBERS` and `JOIN` in one statement: `$2` the joining
/// job ids, `$3` their batches.
pub const JOIN: &str = "
WITH joined AS (
    INSERT INTO {batch_jobs} (job_id, batch_id)
    SELECT * FROM unnest($2::int8[], $3::int8[])
    RETURNING batch_id)
UPDATE {batches} AS b SET total = b.total + j.n, updated_at = {now}
FROM (SELECT batch_id, count(*) AS n FROM joined GROUP BY batch_id) AS j
WHERE b.id = j.batch_id";

/// The columns of a batch's row, in [`batch_row`]'s order.
macro_rules! batch_columns {
    () => {
        "b.id, b.sealed, b.total, b.completed, b.discarded, b.cancelled, b.dead, b.on_complete,
         b.on_success, b.finished_at, b.complete_job_id, b.success_job_id, b.created_at"
    };
}

// As SQLite's `LEAVE` and `COUNT_FINISHED`: in the finishing statement
// itself (`FINISH_TO_HISTORY`, its `gone` and `counted` CTEs), so a job in no
// batch costs no statement more; [`counted`] fires what it counted.

/// As SQLite's `LEAVE` and `COUNT_DELETED` in one statement: `$2` the job.
pub const COUNT_DELETED: &str = concat!(
    "
WITH gone AS (DELETE FROM {batch_jobs} WHERE job_id = $2 RETURNING batch_id)
UPDATE {batches} AS b SET total = b.total - 1, updated_at = {now}
FROM gone WHERE b.id = gone.batch_id
RETURNING ",
    batch_columns!()
);

/// As SQLite's `SEAL`: `$2` the batch.
pub const SEAL: &str = concat!(
    "UPDATE {batches} AS b SET sealed = TRUE, updated_at = {now} WHERE b.id = $2 RETURNING ",
    batch_columns!()
);

/// As SQLite's `FINISH`: `$2` the batch, `$3` and `$4` its callbacks' jobs.
pub const FINISH: &str = "
UPDATE {batches}
SET finished_at = {now}, complete_job_id = $3, success_job_id = $4, updated_at = {now}
WHERE id = $2 AND finished_at IS NULL";

/// As SQLite's `PRUNE`: up to `$3` finished batches that finished before
/// `$2` (µs from now, negative), oldest first, through V13's
/// `{prefix}batches_finished`; how many. Differs in that batches another
/// node is pruning are skipped.
pub const PRUNE: &str = concat!(
    "
WITH gone AS (
    DELETE FROM {batches} WHERE id IN (
        SELECT b.id FROM {batches} AS b WHERE b.finished_at < {now} + $2
  AND ",
    batches::callbacks_gone!("{jobs}", "{pending}", "{group_members}"),
    "
        ORDER BY b.finished_at LIMIT $3
        FOR UPDATE SKIP LOCKED)
    RETURNING id)
SELECT count(*) FROM gone"
);

/// As SQLite's `GET`: `$1` the batch.
pub const GET: &str = concat!(
    "SELECT ",
    batch_columns!(),
    " FROM {batches} AS b WHERE b.id = $1"
);

/// The backend's whole enqueue (`jobs.rs`' `enqueue_all`), handed in by
/// the caller of what may fire a batch: its callbacks are enqueued as any
/// job, and that enqueue (and the finish it may run) recurses through here.
pub(crate) type EnqueueAll<C> =
    fn(&mut Tx<'_, C>, &Queries, &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>;

/// Inserts an open batch; its id.
pub(crate) fn create<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &CreateBatchParams<'_>,
) -> Result<i64> {
    let row = tx.query_opt(
        &q.tables.render(CREATE),
        &[&q.now_override(p.now), &p.on_complete, &p.on_success],
    )?;
    let row = row.ok_or_else(|| Error::Database("insert returned no id".into()))?;
    Ok(row.try_get(0)?)
}

/// As SQLite's `enqueue`: checks the named batches open (locking their rows),
/// enqueues with `insert`, and makes the new jobs members.
pub(crate) fn enqueue<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
    insert: impl FnOnce(&mut Tx<'_, C>, &Queries, &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>,
) -> Result<Vec<Enqueued>> {
    if jobs.iter().all(|p| p.batch.is_none()) {
        return insert(tx, q, jobs);
    }
    let mut batches: Vec<i64> = jobs.iter().filter_map(|p| p.batch).collect();
    // Locked in id order, so two enqueues into the same batches never wait
    // on each other in a circle.
    batches.sort_unstable();
    batches.dedup();
    let sealed = q.tables.render(SEALED);
    for &id in &batches {
        let found: Option<bool> = tx
            .query_opt(&sealed, &[&id])?
            .map(|r| r.try_get(0))
            .transpose()?;
        batch::join_verdict(id, found)?;
    }
    let ids = insert(tx, q, jobs)?;
    let (members, of): (Vec<i64>, Vec<i64>) = jobs
        .iter()
        .zip(&ids)
        .filter_map(|(p, e)| p.batch.filter(|_| !e.existed).map(|b| (e.id, b)))
        .unzip();
    if !members.is_empty() {
        let now = q.now_override(jobs.first().map_or(0, |p| p.now));
        tx.execute(&q.tables.render(JOIN), &[&now, &members, &of])?;
    }
    Ok(ids)
}

/// Fires the batches `FINISH_TO_HISTORY` just counted members into (their
/// rows locked by its update), when they are done.
pub(crate) fn counted<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
    batches: &[i64],
    enqueue: EnqueueAll<C>,
) -> Result<()> {
    for &id in batches {
        if let Some(row) = get(tx, q, id)? {
            fire_if_due(tx, q, row, now, enqueue)?;
        }
    }
    Ok(())
}

/// As SQLite's `deleted`.
pub(crate) fn deleted<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    job_id: i64,
    now: i64,
    enqueue: EnqueueAll<C>,
) -> Result<()> {
    let row = tx.query_opt(
        &q.tables.render(COUNT_DELETED),
        &[&q.now_override(now), &job_id],
    )?;
    match row {
        Some(row) => fire_if_due(tx, q, batch_row(&row)?, now, enqueue),
        None => Ok(()),
    }
}

/// As SQLite's `seal`.
pub(crate) fn seal<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
    enqueue: EnqueueAll<C>,
) -> Result<Option<BatchRow>> {
    let row = tx.query_opt(&q.tables.render(SEAL), &[&q.now_override(now), &id])?;
    let Some(row) = row else {
        return Ok(None);
    };
    fire_if_due(tx, q, batch_row(&row)?, now, enqueue)?;
    get(tx, q, id)
}

/// As SQLite's `get`.
pub(crate) fn get<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
) -> Result<Option<BatchRow>> {
    tx.query_opt(&q.tables.render(GET), &[&id])?
        .map(|r| batch_row(&r))
        .transpose()
}

/// As SQLite's `prune`: `cutoff` is an absolute time of the engine's
/// clock, turned into an offset from its `now` and applied to the
/// server's (as history's prune).
pub(crate) fn prune<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    cutoff: i64,
    limit: usize,
    now: i64,
) -> Result<usize> {
    let limit = bigint(limit);
    let back = cutoff.saturating_sub(now);
    let deleted: i64 = tx
        .query_opt(
            &q.tables.render(PRUNE),
            &[&q.now_override(now), &back, &limit],
        )?
        .map_or(Ok(0), |r| r.try_get(0))?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}

/// As SQLite's `fire_if_due`; the row is locked by the update that read it.
fn fire_if_due<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    row: BatchRow,
    now: i64,
    enqueue: EnqueueAll<C>,
) -> Result<()> {
    let Some(due) = row.due() else {
        return Ok(());
    };
    let (complete, success) = batch::enqueue_callbacks(row.id, due, now, |p| {
        let ids = enqueue(tx, q, std::slice::from_ref(p))?;
        ids.first()
            .map(|e| e.id)
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    })?;
    tx.execute(
        &q.tables.render(FINISH),
        &[&q.now_override(now), &row.id, &complete, &success],
    )?;
    Ok(())
}

/// Reads a row in `batch_columns!` order.
fn batch_row(r: &Row) -> Result<BatchRow> {
    Ok(BatchRow {
        id: r.try_get(0)?,
        sealed: r.try_get(1)?,
        total: r.try_get(2)?,
        completed: r.try_get(3)?,
        discarded: r.try_get(4)?,
        cancelled: r.try_get(5)?,
        dead: r.try_get(6)?,
        on_complete: r.try_get(7)?,
        on_success: r.try_get(8)?,
        finished_at: r.try_get(9)?,
        complete_job_id: r.try_get(10)?,
        success_job_id: r.try_get(11)?,
        created_at: r.try_get(12)?,
    })
}
