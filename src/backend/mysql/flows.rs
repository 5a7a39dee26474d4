//! Job dependencies and workflows on MySQL/MariaDB, in the order of
//! `sqlite/flows.rs`.
//!
//! Differs from SQLite in the locks that keep several nodes apart, as on
//! PostgreSQL (see `postgres/flows.rs`): an enqueue reads its dependencies
//! `LOCK IN SHARE MODE`, pending table first, then live, then history; a
//! release counts down with an `UPDATE`, whose row lock orders two finishing
//! transactions. Under READ COMMITTED each plain read sees what was
//! committed before it. As there, an `enqueue_many` and a `complete_many`
//! do it per batch, each set statement on a `JSON_TABLE` of ids (one
//! parameter: the driver's named parameters cost quadratic time in their
//! number), joined `STRAIGHT_JOIN` on primary keys as the finishing
//! statements are (see `CLAIM`).
//! So does the cancel cascade of a job that did not complete, a level of
//! the graph at a time (`flows/cascade.rs`).
//!
//! And in how a release wakes other nodes: MySQL has no LISTEN/NOTIFY, and
//! its poller watches the newest job id, which a released job (keeping the
//! id it got at enqueue) does not move. So a transaction that releases jobs
//! also bumps the one-row counter `{releases}`, which the poller reads with
//! the id (`LATEST_JOB`).

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::queries::{Sql, Tables};
use super::sequences::Sequences;
use super::{take, Db, Now};
use crate::backend::flows;
use crate::backend::params::{
    DependencyRow, EnqueueParams, JobLinksRow, WorkflowParams, WorkflowRow,
};
use crate::backend::waits::{self, Place};
use crate::backend::Flows;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::outcome::{AttemptError, FinalStatus};
use crate::sequence;

mod cascade;

// ---- enqueue ---------------------------------------------------------------

/// As SQLite's `DEPENDENCY_STATE`, one table per statement, each row
/// share-locked.
pub const PENDING_FOR_SHARE: &str = "SELECT 1 FROM {pending} WHERE id = :id LOCK IN SHARE MODE";
/// See [`PENDING_FOR_SHARE`].
pub const LIVE_FOR_SHARE: &str = "SELECT 1 FROM {jobs} WHERE id = :id LOCK IN SHARE MODE";
/// See [`PENDING_FOR_SHARE`].
pub const HISTORY_STATUS: &str = "SELECT status FROM {history} WHERE id = :id";

/// The set forms of the three above, for a batch's dependencies (`:ids`, a
/// JSON array, ascending: the rows are locked in id order).
pub const PENDING_MANY_FOR_SHARE: &str = "
SELECT p.id, 'pending' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = d.id
LOCK IN SHARE MODE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const LIVE_MANY_FOR_SHARE: &str = "
SELECT j.id, 'live' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = d.id
LOCK IN SHARE MODE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const HISTORY_MANY_STATUS: &str = "
SELECT h.id, h.status FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {history} AS h FORCE INDEX (PRIMARY) ON h.id = d.id";

/// As SQLite's; `INSERT IGNORE` for `ON CONFLICT DO NOTHING`.
pub const INSERT_EDGE: &str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
VALUES (:dependency, :dependent, :run_anyway, :cancelled)";

/// [`INSERT_EDGE`] for a batch's edges: `:edges` a JSON array of
/// `[dependency, dependent, run_anyway, cancelled]` (the flags 0 or 1).
pub const INSERT_EDGES: &str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
SELECT e.dependency, e.dependent, e.run_anyway, e.cancelled
FROM JSON_TABLE(:edges, '$[*]' COLUMNS (
    dependency BIGINT PATH '$[0]', dependent BIGINT PATH '$[1]',
    run_anyway TINYINT PATH '$[2]', cancelled TINYINT PATH '$[3]')) AS e";

/// As SQLite's.
pub const LIVE_TO_PENDING: &str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, :remaining, created_at
FROM {jobs} WHERE id = :id";

/// [`LIVE_TO_PENDING`] for a batch: `:waits` a JSON array of
/// `[id, remaining]`; [`DELETE_LIVE_MANY`] then removes the live rows.
pub const LIVE_TO_PENDING_MANY: &str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT j.id, j.queue, j.kind, j.priority, j.payload, j.max_attempts, j.available_at,
       w.remaining, j.created_at
FROM JSON_TABLE(:waits, '$[*]' COLUMNS (id BIGINT PATH '$[0]', remaining INT PATH '$[1]')) AS w
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = w.id";

/// See [`LIVE_TO_PENDING_MANY`].
pub const DELETE_LIVE_MANY: &str = "
DELETE j FROM JSON_TABLE(:waits, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS w
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = w.id";

// ---- release ---------------------------------------------------------------

/// As SQLite's.
pub const DEPENDENTS: &str =
    "SELECT dependent, run_anyway FROM {dependencies} WHERE dependency = :id";

/// As SQLite's, without `RETURNING` (MariaDB has none for `UPDATE`):
/// [`REMAINING`] reads the count back, under the row lock this takes.
pub const COUNT_DOWN: &str = "UPDATE {pending} SET remaining = remaining - 1 WHERE id = :id";

/// See [`COUNT_DOWN`].
pub const REMAINING: &str = "SELECT remaining FROM {pending} WHERE id = :id";

/// [`COUNT_DOWN`] for every dependent of the completed jobs `:ids` (a JSON
/// array), by as many as it has edges among them (a multi-table `UPDATE`
/// changes a row once however many rows it joins, hence the `GROUP BY`);
/// [`FREED`] reads back the ones at 0, under the row locks this takes.
pub const COUNT_DOWN_MANY: &str = "
UPDATE (SELECT e.dependent, COUNT(*) AS n
        FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
        STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
        GROUP BY e.dependent) AS c
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = c.dependent
SET p.remaining = p.remaining - c.n";

/// See [`COUNT_DOWN_MANY`].
pub const FREED: &str = "
SELECT DISTINCT p.id FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = e.dependent
WHERE p.remaining = 0";

/// As SQLite's.
pub const RELEASE: &str = "
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, errors, max_attempts, available_at, created_at,
     updated_at)
SELECT id, queue, kind, priority, payload, '[]', max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM {pending} WHERE id = :id";

/// [`RELEASE`] for a batch: `:ids` a JSON array; [`DELETE_PENDING_MANY`]
/// then removes the pending rows.
pub const RELEASE_MANY: &str = "
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, errors, max_attempts, available_at, created_at,
     updated_at)
SELECT p.id, p.queue, p.kind, p.priority, p.payload, '[]', p.max_attempts,
       GREATEST(p.available_at, {now}), p.created_at, {now}
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS r
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = r.id";

/// As SQLite's.
pub const DELETE_PENDING: &str = "DELETE FROM {pending} WHERE id = :id";

/// See [`RELEASE_MANY`].
pub const DELETE_PENDING_MANY: &str = "
DELETE p FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS r
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = r.id";

/// Counts a transaction that released jobs, for other nodes' pollers.
pub const BUMP_RELEASES: &str = "
INSERT INTO {releases} (one, n) VALUES (1, 1) ON DUPLICATE KEY UPDATE n = n + 1";

/// As SQLite's. `:errors` is the JSON array of one entry.
pub const PENDING_TO_HISTORY: &str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at, :errors, FALSE,
       created_at, {now}, NULL, :status, NULL, NULL, {now}, NULL
FROM {pending} WHERE id = :id";

// ---- retry -----------------------------------------------------------------

/// As SQLite's.
pub const CANCELLED_DEPENDENTS: &str =
    "SELECT dependent FROM {dependencies} WHERE dependency = :id AND cancelled";

/// As SQLite's.
pub const UNMARK_CANCELLED: &str = "
UPDATE {dependencies} SET cancelled = FALSE
WHERE dependency = :dependency AND dependent = :dependent";

/// As SQLite's.
pub const HISTORY_TO_PENDING: &str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT h.id, h.queue, h.kind, h.priority, h.payload, h.max_attempts, h.available_at,
       (SELECT COUNT(*) FROM {dependencies} AS e
        LEFT JOIN {history} AS d ON d.id = e.dependency
        WHERE e.dependent = h.id
          AND (d.id IS NULL OR (d.status <> 'completed' AND NOT e.run_anyway))),
       h.created_at
FROM {history} AS h WHERE h.id = :id AND h.status = 'cancelled'";

/// As SQLite's.
pub const DELETE_HISTORY: &str = "DELETE FROM {history} WHERE id = :id";

// ---- workflows and inspection ----------------------------------------------

/// As SQLite's.
pub const INSERT_WORKFLOW: &str =
    "INSERT INTO {workflows} (name, created_at) VALUES (:name, {now})";

/// As SQLite's.
pub const INSERT_STEP: &str = "
INSERT INTO {workflow_steps} (workflow_id, step, job_id) VALUES (:workflow, :step, :job)";

/// As SQLite's.
pub const WORKFLOW: &str = "
SELECT id, name, created_at FROM {workflows}
WHERE id = :id OR (:id IS NULL AND name = :name)
ORDER BY id DESC LIMIT 1";

/// As SQLite's.
pub const STEPS: &str =
    "SELECT step, job_id FROM {workflow_steps} WHERE workflow_id = :id ORDER BY job_id";

/// As SQLite's.
pub const DEPENDENCIES: &str = "
SELECT e.dependency, s.step, h.status, h.result
FROM {dependencies} AS e
LEFT JOIN {workflow_steps} AS s ON s.job_id = e.dependency
LEFT JOIN {history} AS h ON h.id = e.dependency
WHERE e.dependent = :id
ORDER BY e.dependency";

/// As SQLite's.
pub const JOB_WORKFLOW: &str = "
SELECT w.id, w.name, s.step
FROM {workflow_steps} AS s JOIN {workflows} AS w ON w.id = s.workflow_id
WHERE s.job_id = :id";

/// As SQLite's.
pub const JOB_BATCH: &str = "SELECT batch_id FROM {batch_jobs} WHERE job_id = :id";

/// As SQLite's.
pub const IS_PENDING: &str = "SELECT 1 FROM {pending} WHERE id = :id";

/// As SQLite's, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL AS unique_key, payload, \
     0 AS attempts, max_attempts, available_at, '[]' AS errors, NULL AS locked_by, \
     NULL AS lease_until, NULL AS first_leased_at, FALSE AS cancel_requested, NULL AS result, \
     NULL AS finished_at, created_at, created_at AS updated_at, 'pending' AS state, \
     NULL AS progress, NULL AS group_key, NULL AS aggregated_into";

/// As SQLite's.
pub const COUNT_PENDING: &str = "\nSELECT queue, 'pending', COUNT(*) FROM {pending} GROUP BY queue";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub struct FlowSql {
    pending_for_share: String,
    live_for_share: String,
    history_status: String,
    pending_many_for_share: String,
    live_many_for_share: String,
    history_many_status: String,
    insert_edge: String,
    insert_edges: String,
    live_to_pending: String,
    live_to_pending_many: String,
    delete_live_many: String,
    dependents: String,
    count_down: String,
    remaining: String,
    count_down_many: String,
    freed: String,
    release: String,
    release_many: String,
    delete_pending: String,
    delete_pending_many: String,
    bump_releases: String,
    pending_to_history: String,
    dependents_many: String,
    lock_pending_many: String,
    pending_to_history_many: String,
    mark_cancelled_many: String,
    cancelled_dependents: String,
    unmark_cancelled: String,
    history_to_pending: String,
    delete_history: String,
    insert_workflow: String,
    insert_step: String,
    workflow: String,
    steps: String,
    dependencies: String,
    job_workflow: String,
    job_batch: String,
    is_pending: String,
    pub get_pending: String,
    pub list_pending: String,
    pub count_pending: String,
}

impl FlowSql {
    pub fn new(tables: &Tables) -> FlowSql {
        let r = |t: &str| tables.render(t);
        FlowSql {
            pending_for_share: r(PENDING_FOR_SHARE),
            live_for_share: r(LIVE_FOR_SHARE),
            history_status: r(HISTORY_STATUS),
            pending_many_for_share: r(PENDING_MANY_FOR_SHARE),
            live_many_for_share: r(LIVE_MANY_FOR_SHARE),
            history_many_status: r(HISTORY_MANY_STATUS),
            insert_edge: r(INSERT_EDGE),
            insert_edges: r(INSERT_EDGES),
            live_to_pending: r(LIVE_TO_PENDING),
            live_to_pending_many: r(LIVE_TO_PENDING_MANY),
            delete_live_many: r(DELETE_LIVE_MANY),
            dependents: r(DEPENDENTS),
            count_down: r(COUNT_DOWN),
            remaining: r(REMAINING),
            count_down_many: r(COUNT_DOWN_MANY),
            freed: r(FREED),
            release: r(RELEASE),
            release_many: r(RELEASE_MANY),
            delete_pending: r(DELETE_PENDING),
            delete_pending_many: r(DELETE_PENDING_MANY),
            bump_releases: r(BUMP_RELEASES),
            pending_to_history: r(PENDING_TO_HISTORY),
            dependents_many: r(cascade::DEPENDENTS_MANY),
            lock_pending_many: r(cascade::LOCK_PENDING_MANY),
            pending_to_history_many: r(cascade::PENDING_TO_HISTORY_MANY),
            mark_cancelled_many: r(cascade::MARK_CANCELLED_MANY),
            cancelled_dependents: r(CANCELLED_DEPENDENTS),
            unmark_cancelled: r(UNMARK_CANCELLED),
            history_to_pending: r(HISTORY_TO_PENDING),
            delete_history: r(DELETE_HISTORY),
            insert_workflow: r(INSERT_WORKFLOW),
            insert_step: r(INSERT_STEP),
            workflow: r(WORKFLOW),
            steps: r(STEPS),
            dependencies: r(DEPENDENCIES),
            job_workflow: r(JOB_WORKFLOW),
            job_batch: r(JOB_BATCH),
            is_pending: r(IS_PENDING),
            get_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE id = :id"
            )),
            list_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}}
                 WHERE (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 AND id > :after ORDER BY id LIMIT :limit"
            )),
            count_pending: r(COUNT_PENDING),
        }
    }
}

/// As PostgreSQL's `wait_all`: the whole batch in a constant number of
/// statements, or (a batch with a sequenced job) each job in order.
pub(crate) fn wait_all(
    sql: &Sql,
    q: &mut impl Queryable,
    jobs: &[EnqueueParams<'_>],
    ids: Vec<Enqueued>,
    now: Now,
) -> Result<Vec<Enqueued>> {
    if !waits::at_once(jobs) {
        for (i, p) in jobs.iter().enumerate() {
            flows::wait(&mut Flow { sql, q, now }, p, ids[i], &ids[..i])?;
        }
        return Ok(ids);
    }
    let f = &sql.flows;
    let read = waits::to_read(jobs, &ids)?;
    let states = waits::states(&read, |place, ids| {
        let statement = match place {
            Place::Pending => &f.pending_many_for_share,
            Place::Live => &f.live_many_for_share,
            Place::History => &f.history_many_status,
        };
        let ids = serde_json::to_string(ids)?;
        Ok(q.exec(statement, params! { "ids" => ids })?)
    })?;
    let plan = waits::plan(jobs, &ids, &states)?;
    for (id, error, _) in &plan.cancelled {
        super::jobs::finish(
            sql,
            q,
            *id,
            None,
            FinalStatus::Cancelled,
            None,
            Some(error),
            now,
        )?;
    }
    if !plan.edges.is_empty() {
        let edges: Vec<[i64; 4]> = plan
            .edges
            .iter()
            .map(|&(dependency, dependent, run_anyway, cancels)| {
                [dependency, dependent, run_anyway.into(), cancels.into()]
            })
            .collect();
        q.exec_drop(
            &f.insert_edges,
            params! { "edges" => serde_json::to_string(&edges)? },
        )?;
    }
    if !plan.pending.is_empty() {
        let waits: Vec<[i64; 2]> = plan
            .pending
            .iter()
            .map(|&(id, remaining)| [id, remaining.into()])
            .collect();
        let waits = serde_json::to_string(&waits)?;
        q.exec_drop(&f.live_to_pending_many, params! { "waits" => &waits })?;
        q.exec_drop(&f.delete_live_many, params! { "waits" => &waits })?;
    }
    Ok(ids)
}

/// Where job `id` is, its row share-locked: `pending`, `live`, a history
/// status, or `None`.
pub(crate) fn state_of(f: &FlowSql, q: &mut impl Queryable, id: i64) -> Result<Option<String>> {
    if q.exec_first::<i64, _, _>(&f.pending_for_share, params! { "id" => id })?
        .is_some()
    {
        return Ok(Some("pending".into()));
    }
    if q.exec_first::<i64, _, _>(&f.live_for_share, params! { "id" => id })?
        .is_some()
    {
        return Ok(Some("live".into()));
    }
    Ok(q.exec_first(&f.history_status, params! { "id" => id })?)
}

/// As SQLite's `finished`, for jobs just moved to history; bumps
/// `{releases}` when a job was released. As on PostgreSQL, the completed
/// jobs release their dependents together ([`COUNT_DOWN_MANY`],
/// [`RELEASE_MANY`]); the others cancel what waits on them level by level
/// ([`cascade::cascade`], in `flows/cascade.rs`).
pub(crate) fn finished(
    sql: &Sql,
    q: &mut impl Queryable,
    ended: Vec<(i64, FinalStatus)>,
    now: Now,
) -> Result<usize> {
    let f = &sql.flows;
    let (completed, ended): (Vec<_>, Vec<_>) = ended
        .into_iter()
        .partition(|&(_, status)| status == FinalStatus::Completed);
    let mut released = 0;
    if !completed.is_empty() {
        let mut completed: Vec<i64> = completed.into_iter().map(|(id, _)| id).collect();
        completed.sort_unstable();
        let completed = serde_json::to_string(&completed)?;
        let counted = q
            .exec_iter(&f.count_down_many, params! { "ids" => &completed })?
            .affected_rows();
        if counted > 0 {
            let mut free: Vec<i64> = q.exec(&f.freed, params! { "ids" => &completed })?;
            free.sort_unstable();
            if !free.is_empty() {
                let free_json = serde_json::to_string(&free)?;
                q.exec_drop(
                    &f.release_many,
                    params! { "ids" => &free_json, "now" => now.param() },
                )?;
                q.exec_drop(&f.delete_pending_many, params! { "ids" => &free_json })?;
                released += free.len();
            }
        }
    }
    released += cascade::cascade(sql, q, ended, now)?;
    if released > 0 {
        q.exec_drop(&f.bump_releases, ())?;
        super::connection::note_runnable();
    }
    Ok(released)
}

/// As SQLite's.
pub(crate) fn is_pending(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<bool> {
    Ok(
        q.exec_first::<i64, _, _>(&sql.flows.is_pending, params! { "id" => id })?
            .is_some(),
    )
}

/// As SQLite's.
pub(crate) fn end_by_operator(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
    now: Now,
) -> Result<bool> {
    flows::end_by_operator(&mut Flow { sql, q, now }, id, status, error)
}

/// As SQLite's.
pub(crate) fn deleting(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<bool> {
    flows::deleting(&mut Flow { sql, q, now }, id)
}

/// As SQLite's.
pub(crate) fn retried(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<()> {
    flows::retried(&mut Flow { sql, q, now }, id)
}

/// [`flows::Steps`] in a transaction, at `now`.
struct Flow<'a, Q: Queryable> {
    sql: &'a Sql,
    q: &'a mut Q,
    now: Now,
}

impl<Q: Queryable> flows::Steps for Flow<'_, Q> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        state_of(&self.sql.flows, self.q, id)
    }

    fn sequences(&mut self) -> impl sequence::Chain + '_ {
        Sequences(self.sql, self.q)
    }

    fn insert_edge(&mut self, edge: flows::Edge) -> Result<()> {
        let (dependency, dependent, run_anyway, cancelled) = edge;
        self.q.exec_drop(
            &self.sql.flows.insert_edge,
            params! {
                "dependency" => dependency, "dependent" => dependent,
                "run_anyway" => run_anyway, "cancelled" => cancelled,
            },
        )?;
        Ok(())
    }

    fn cancel_live(&mut self, id: i64, error: &AttemptError) -> Result<()> {
        let cancelled = FinalStatus::Cancelled;
        let (sql, now) = (self.sql, self.now);
        super::jobs::finish(sql, self.q, id, None, cancelled, None, Some(error), now)
    }

    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()> {
        self.q.exec_drop(
            &self.sql.flows.live_to_pending,
            params! { "id" => id, "remaining" => remaining },
        )?;
        self.q
            .exec_drop(&self.sql.delete_live, params! { "id" => id })?;
        Ok(())
    }

    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool> {
        let f = &self.sql.flows;
        let moved = self
            .q
            .exec_iter(
                &f.pending_to_history,
                params! {
                    "id" => id, "status" => status.as_str(), "errors" => errors,
                    "now" => self.now.param(),
                },
            )?
            .affected_rows();
        if moved == 0 {
            return Ok(false);
        }
        self.q
            .exec_drop(&f.delete_pending, params! { "id" => id })?;
        Ok(true)
    }

    fn delete_pending(&mut self, id: i64) -> Result<()> {
        self.q
            .exec_drop(&self.sql.flows.delete_pending, params! { "id" => id })?;
        Ok(())
    }

    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize> {
        finished(self.sql, self.q, vec![(id, status)], self.now)
    }

    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>> {
        Ok(self
            .q
            .exec(&self.sql.flows.cancelled_dependents, params! { "id" => id })?)
    }

    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.q.exec_drop(
            &self.sql.flows.unmark_cancelled,
            params! { "dependency" => dependency, "dependent" => dependent },
        )?;
        Ok(())
    }

    fn history_to_pending(&mut self, id: i64) -> Result<bool> {
        let f = &self.sql.flows;
        let moved = self
            .q
            .exec_iter(&f.history_to_pending, params! { "id" => id })?
            .affected_rows();
        if moved != 1 {
            return Ok(false);
        }
        self.q
            .exec_drop(&f.delete_history, params! { "id" => id })?;
        Ok(true)
    }
}

/// As SQLite's.
pub(crate) fn enqueue_workflow(
    sql: &Sql,
    q: &mut impl Queryable,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
    now: Now,
) -> Result<(i64, Vec<Enqueued>)> {
    let workflow = q
        .exec_iter(
            &sql.flows.insert_workflow,
            params! { "name" => w.name, "now" => now.param() },
        )?
        .last_insert_id()
        .and_then(|id| i64::try_from(id).ok())
        .ok_or_else(|| Error::Database("insert returned no id".into()))?;
    let ids = super::jobs::enqueue_all(sql, q, jobs, now)?;
    for (step, e) in w.steps.iter().zip(&ids) {
        q.exec_drop(
            &sql.flows.insert_step,
            params! { "workflow" => workflow, "step" => step, "job" => e.id },
        )?;
    }
    Ok((workflow, ids))
}

fn workflow(
    sql: &Sql,
    q: &mut impl Queryable,
    id: Option<i64>,
    name: Option<&str>,
) -> Result<Option<WorkflowRow>> {
    let Some(mut row) =
        q.exec_first::<Row, _, _>(&sql.flows.workflow, params! { "id" => id, "name" => name })?
    else {
        return Ok(None);
    };
    let id: i64 = take(&mut row, 0)?;
    let steps: Vec<(String, i64)> = q.exec(&sql.flows.steps, params! { "id" => id })?;
    Ok(Some(WorkflowRow {
        id,
        name: take(&mut row, 1)?,
        created_at: take(&mut row, 2)?,
        steps,
    }))
}

fn dependencies(sql: &Sql, q: &mut impl Queryable, job_id: i64) -> Result<Vec<DependencyRow>> {
    let rows: Vec<Row> = q.exec(&sql.flows.dependencies, params! { "id" => job_id })?;
    rows.into_iter()
        .map(|mut r| {
            Ok(DependencyRow {
                job_id: take(&mut r, 0)?,
                step: take(&mut r, 1)?,
                status: take(&mut r, 2)?,
                result: take(&mut r, 3)?,
            })
        })
        .collect()
}

fn links(sql: &Sql, q: &mut impl Queryable, job_id: i64) -> Result<JobLinksRow> {
    let workflow: Option<(i64, String, String)> =
        q.exec_first(&sql.flows.job_workflow, params! { "id" => job_id })?;
    let batch: Option<i64> = q.exec_first(&sql.flows.job_batch, params! { "id" => job_id })?;
    let rows: Vec<(i64, bool)> = q.exec(&sql.flows.dependents, params! { "id" => job_id })?;
    let mut dependents: Vec<i64> = rows.into_iter().map(|(id, _)| id).collect();
    dependents.sort_unstable();
    Ok(JobLinksRow {
        workflow,
        batch,
        dependents,
    })
}

impl Flows for Db {
    fn enqueue_workflow(
        &self,
        w: &WorkflowParams<'_>,
        jobs: &[EnqueueParams<'_>],
    ) -> Result<(i64, Vec<Enqueued>)> {
        self.write(|tx| enqueue_workflow(&self.sql, tx, w, jobs, self.now(w.now)))
    }

    fn workflow(&self, id: Option<i64>, name: Option<&str>) -> Result<Option<WorkflowRow>> {
        self.read(|c| workflow(&self.sql, c, id, name))
    }

    fn dependencies(&self, job_id: i64) -> Result<Vec<DependencyRow>> {
        self.read(|c| dependencies(&self.sql, c, job_id))
    }

    fn links(&self, job_id: i64) -> Result<JobLinksRow> {
        self.read(|c| links(&self.sql, c, job_id))
    }
}
