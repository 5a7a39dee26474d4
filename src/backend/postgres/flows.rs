//! Job dependencies and workflows on PostgreSQL, in the order of
//! `sqlite/flows.rs`.
//!
//! Differs from SQLite in that several nodes write at once, so each step
//! that reads a row before acting on it locks it first:
//!
//! - an enqueue looks its dependencies up `FOR SHARE`, pending table first,
//!   then live, then history (the order of a job's life). A transaction
//!   moving that job on holds its row locked until it commits, so the look
//!   waits and then finds it where it went; and once the look holds the
//!   share lock, the job cannot move on before the enqueue (and its edge)
//!   commits, so the finishing transaction sees the edge (READ COMMITTED:
//!   each statement reads what was committed before it began).
//! - a release decrements the dependent's `remaining` with an `UPDATE`, whose
//!   row lock makes two finishing transactions count one after the other:
//!   exactly one of them sees 0.
//!
//! And in that an `enqueue_many` and a `complete_many` do this per batch
//! (`backend/waits.rs` plans the enqueue): a constant number of statements
//! on arrays, not a round trip per edge; so does the cancel cascade of a job
//! that did not complete, a level of the graph per statement. Sequenced jobs
//! in an enqueue, and the run-anyway edges of a job that did not complete
//! (a sequence's hand-over among them), still go one at a time.
//!
//! A release notifies the queue's channel, as an enqueue does.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::{Queries, Tables};
use super::sequences::Sequences;
use super::Db;
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
/// locked `FOR SHARE`. Parameter: `$1` id.
pub const PENDING_FOR_SHARE: &str = "SELECT 1 FROM {pending} WHERE id = $1 FOR SHARE";
/// See [`PENDING_FOR_SHARE`].
pub const LIVE_FOR_SHARE: &str = "SELECT 1 FROM {jobs} WHERE id = $1 FOR SHARE";
/// See [`PENDING_FOR_SHARE`].
pub const HISTORY_STATUS: &str = "SELECT status FROM {history} WHERE id = $1";

/// The set forms of the three above, for a batch's dependencies (`$1` ids,
/// ascending): the rows locked in id order, so two batches sharing
/// dependencies take them in the same order.
pub const PENDING_MANY_FOR_SHARE: &str =
    "SELECT id, 'pending' FROM {pending} WHERE id = ANY($1) ORDER BY id FOR SHARE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const LIVE_MANY_FOR_SHARE: &str =
    "SELECT id, 'live' FROM {jobs} WHERE id = ANY($1) ORDER BY id FOR SHARE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const HISTORY_MANY_STATUS: &str = "SELECT id, status FROM {history} WHERE id = ANY($1)";

/// As SQLite's.
pub const INSERT_EDGE: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING";

/// [`INSERT_EDGE`] for a batch's edges, one array per column.
pub const INSERT_EDGES: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
SELECT * FROM unnest($1::int8[], $2::int8[], $3::bool[], $4::bool[])
ON CONFLICT DO NOTHING";

/// As SQLite's, moving the row in one statement.
pub const LIVE_TO_PENDING: &str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = $1 RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, $2, created_at
FROM moved";

/// [`LIVE_TO_PENDING`] for a batch: `$1` ids, `$2` their counters.
pub const LIVE_TO_PENDING_MANY: &str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = ANY($1) RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT m.id, m.queue, m.kind, m.priority, m.payload, m.max_attempts, m.available_at,
       w.remaining, m.created_at
FROM moved AS m JOIN unnest($1::int8[], $2::int4[]) AS w (id, remaining) ON w.id = m.id";

// ---- release ---------------------------------------------------------------

/// As SQLite's.
pub const DEPENDENTS: &str =
    "SELECT dependent, run_anyway FROM {dependencies} WHERE dependency = $1";

/// As SQLite's.
pub const COUNT_DOWN: &str =
    "UPDATE {pending} SET remaining = remaining - 1 WHERE id = $1 RETURNING remaining";

/// [`COUNT_DOWN`] for every dependent of the completed jobs `$1`, by as many
/// as it has edges among them. The rows are locked first in id order (two
/// completers sharing dependents take them in the same order); the
/// `UPDATE` then counts on the latest version of each.
pub const COUNT_DOWN_MANY: &str = "
WITH e AS (
    SELECT dependent, count(*)::int4 AS n FROM {dependencies}
    WHERE dependency = ANY($1) GROUP BY dependent
), locked AS (
    SELECT p.id FROM {pending} AS p JOIN e ON e.dependent = p.id
    ORDER BY p.id FOR UPDATE OF p
)
UPDATE {pending} AS p SET remaining = p.remaining - e.n
FROM e JOIN locked ON locked.id = e.dependent
WHERE p.id = e.dependent
RETURNING p.id, p.remaining";

/// As SQLite's, moving the row in one statement. `$1` now override, `$2` id.
pub const RELEASE: &str = "
WITH moved AS (DELETE FROM {pending} WHERE id = $2 RETURNING *)
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, max_attempts, available_at, created_at, updated_at)
SELECT id, queue, kind, priority, payload, max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM moved";

/// [`RELEASE`] for a batch: `$1` now override, `$2` ids.
pub const RELEASE_MANY: &str = "
WITH moved AS (DELETE FROM {pending} WHERE id = ANY($2) RETURNING *)
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, max_attempts, available_at, created_at, updated_at)
SELECT id, queue, kind, priority, payload, max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM moved";

/// As SQLite's, moving the row in one statement. `$1` now override, `$2`
/// id, `$3` status, `$4` errors (JSON text).
pub const PENDING_TO_HISTORY: &str = "
WITH moved AS (DELETE FROM {pending} WHERE id = $2 RETURNING *)
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at,
       $4::text::jsonb, FALSE, created_at, {now}, NULL, $3, NULL, NULL, {now}, NULL
FROM moved";

// ---- retry -----------------------------------------------------------------

/// As SQLite's.
pub const CANCELLED_DEPENDENTS: &str =
    "SELECT dependent FROM {dependencies} WHERE dependency = $1 AND cancelled";

/// As SQLite's.
pub const UNMARK_CANCELLED: &str =
    "UPDATE {dependencies} SET cancelled = FALSE WHERE dependency = $1 AND dependent = $2";

/// As SQLite's, moving the row in one statement.
pub const HISTORY_TO_PENDING: &str = "
WITH moved AS (DELETE FROM {history} WHERE id = $1 AND status = 'cancelled' RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT m.id, m.queue, m.kind, m.priority, m.payload, m.max_attempts, m.available_at,
       (SELECT count(*) FROM {dependencies} AS e
        LEFT JOIN {history} AS d ON d.id = e.dependency
        WHERE e.dependent = m.id
          AND (d.id IS NULL OR (d.status <> 'completed' AND NOT e.run_anyway))),
       m.created_at
FROM moved AS m";

// ---- workflows and inspection ----------------------------------------------

/// As SQLite's. `$1` now override, `$2` name.
pub const INSERT_WORKFLOW: &str =
    "INSERT INTO {workflows} (name, created_at) VALUES ($2, {now}) RETURNING id";

/// As SQLite's.
pub const INSERT_STEP: &str =
    "INSERT INTO {workflow_steps} (workflow_id, step, job_id) VALUES ($1, $2, $3)";

/// As SQLite's.
pub const WORKFLOW: &str = "
SELECT id, name, created_at FROM {workflows}
WHERE id = $1 OR ($1::int8 IS NULL AND name = $2)
ORDER BY id DESC LIMIT 1";

/// As SQLite's.
pub const STEPS: &str =
    "SELECT step, job_id FROM {workflow_steps} WHERE workflow_id = $1 ORDER BY job_id";

/// As SQLite's.
pub const DEPENDENCIES: &str = "
SELECT e.dependency, s.step, h.status, h.result::text
FROM {dependencies} AS e
LEFT JOIN {workflow_steps} AS s ON s.job_id = e.dependency
LEFT JOIN {history} AS h ON h.id = e.dependency
WHERE e.dependent = $1
ORDER BY e.dependency";

/// As SQLite's.
pub const JOB_WORKFLOW: &str = "
SELECT w.id, w.name, s.step
FROM {workflow_steps} AS s JOIN {workflows} AS w ON w.id = s.workflow_id
WHERE s.job_id = $1";

/// As SQLite's.
pub const JOB_BATCH: &str = "SELECT batch_id FROM {batch_jobs} WHERE job_id = $1";

/// As SQLite's.
pub const IS_PENDING: &str = "SELECT 1 FROM {pending} WHERE id = $1";

/// As SQLite's, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL::text AS unique_key, \
     payload::text, 0 AS attempts, max_attempts, available_at, '[]' AS errors, \
     NULL::text AS locked_by, NULL::int8 AS lease_until, NULL::int8 AS first_leased_at, \
     FALSE AS cancel_requested, NULL::text AS result, NULL::int8 AS finished_at, created_at, \
     created_at AS updated_at, 'pending' AS state, NULL::text AS progress, \
     NULL::text AS group_key, NULL::int8 AS aggregated_into";

/// As SQLite's.
pub const COUNT_PENDING: &str = "SELECT queue, 'pending', count(*) FROM {pending} GROUP BY queue";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub(crate) struct FlowQueries {
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
    dependents: String,
    count_down: String,
    count_down_many: String,
    release: String,
    release_many: String,
    pending_to_history: String,
    dependents_many: String,
    cancel_pending_many: String,
    cancelled_dependents: String,
    unmark_cancelled: String,
    history_to_pending: String,
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

impl FlowQueries {
    pub(crate) fn render(tables: &Tables) -> FlowQueries {
        let r = |t: &str| tables.render(t);
        FlowQueries {
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
            dependents: r(DEPENDENTS),
            count_down: r(COUNT_DOWN),
            count_down_many: r(COUNT_DOWN_MANY),
            release: r(RELEASE),
            release_many: r(RELEASE_MANY),
            pending_to_history: r(PENDING_TO_HISTORY),
            dependents_many: r(cascade::DEPENDENTS_MANY),
            cancel_pending_many: r(cascade::CANCEL_PENDING_MANY),
            cancelled_dependents: r(CANCELLED_DEPENDENTS),
            unmark_cancelled: r(UNMARK_CANCELLED),
            history_to_pending: r(HISTORY_TO_PENDING),
            insert_workflow: r(INSERT_WORKFLOW),
            insert_step: r(INSERT_STEP),
            workflow: r(WORKFLOW),
            steps: r(STEPS),
            dependencies: r(DEPENDENCIES),
            job_workflow: r(JOB_WORKFLOW),
            job_batch: r(JOB_BATCH),
            is_pending: r(IS_PENDING),
            get_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE id = $1"
            )),
            list_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE ($1::text IS NULL OR queue = $1)
                 AND ($2::text IS NULL OR kind = $2) AND id > $3 ORDER BY id LIMIT $4"
            )),
            count_pending: r(COUNT_PENDING),
        }
    }
}

/// As SQLite's [`wait`](crate::backend::sqlite::flows::wait), for a whole
/// batch (`ids` are the batch's, every job inserted): the dependencies'
/// states read in at most three statements, the jobs cancelled at enqueue
/// finished, then every edge in one statement and every waiting job moved
/// in one. A batch with a sequenced job goes one job at a time, in order: a
/// job's `Earlier` dependencies come before it, so they are settled first.
pub(crate) fn wait_all<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
    ids: Vec<Enqueued>,
) -> Result<Vec<Enqueued>> {
    if !waits::at_once(jobs) {
        for (i, p) in jobs.iter().enumerate() {
            let now = p.now;
            flows::wait(&mut Flow { tx, q, now }, p, ids[i], &ids[..i])?;
        }
        return Ok(ids);
    }
    let f = &q.flows;
    let read = waits::to_read(jobs, &ids)?;
    let states = waits::states(&read, |place, ids| {
        let statement = match place {
            Place::Pending => &f.pending_many_for_share,
            Place::Live => &f.live_many_for_share,
            Place::History => &f.history_many_status,
        };
        tx.query(statement, &[&ids])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    })?;
    let plan = waits::plan(jobs, &ids, &states)?;
    for (id, error, now) in &plan.cancelled {
        super::jobs::finish_one(tx, q, *id, FinalStatus::Cancelled, Some(error), *now)?;
    }
    if !plan.edges.is_empty() {
        let (mut dependencies, mut dependents, mut run_anyway, mut cancelled) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(dependency, dependent, anyway, cancels) in &plan.edges {
            dependencies.push(dependency);
            dependents.push(dependent);
            run_anyway.push(anyway);
            cancelled.push(cancels);
        }
        tx.execute(
            &f.insert_edges,
            &[&dependencies, &dependents, &run_anyway, &cancelled],
        )?;
    }
    if !plan.pending.is_empty() {
        let (waiting, remaining): (Vec<i64>, Vec<i32>) = plan.pending.iter().copied().unzip();
        tx.execute(&f.live_to_pending_many, &[&waiting, &remaining])?;
    }
    Ok(ids)
}

/// Where job `id` is, its row share-locked: `pending`, `live`, a history
/// status, or `None`.
pub(crate) fn state_of<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    f: &FlowQueries,
    id: i64,
) -> Result<Option<String>> {
    if tx.query_opt(&f.pending_for_share, &[&id])?.is_some() {
        return Ok(Some("pending".into()));
    }
    if tx.query_opt(&f.live_for_share, &[&id])?.is_some() {
        return Ok(Some("live".into()));
    }
    Ok(match tx.query_opt(&f.history_status, &[&id])? {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// As SQLite's `finished`, for jobs just moved to history (`ended`: id and
/// status); notifies the queue's channel when a job was released. The
/// completed jobs release their dependents together ([`COUNT_DOWN_MANY`],
/// [`RELEASE_MANY`]). The others cancel what waits on them level by level
/// ([`cascade::cascade`], in `flows/cascade.rs`).
pub(crate) fn finished<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    ended: Vec<(i64, FinalStatus)>,
    now: i64,
) -> Result<usize> {
    let f = &q.flows;
    let now_override = q.now_override(now);
    let (completed, ended): (Vec<_>, Vec<_>) = ended
        .into_iter()
        .partition(|&(_, status)| status == FinalStatus::Completed);
    let mut released = 0;
    if !completed.is_empty() {
        let completed: Vec<i64> = completed.into_iter().map(|(id, _)| id).collect();
        let mut free = Vec::new();
        for row in tx.query(&f.count_down_many, &[&completed])? {
            if row.try_get::<_, i32>(1)? == 0 {
                free.push(row.try_get::<_, i64>(0)?);
            }
        }
        if !free.is_empty() {
            released += tx.execute(&f.release_many, &[&now_override, &free])? as usize;
        }
    }
    released += cascade::cascade(tx, q, ended, now)?;
    if released > 0 {
        tx.query(&q.notify, &[&q.channel])?;
    }
    Ok(released)
}

/// As SQLite's.
pub(crate) fn is_pending<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
) -> Result<bool> {
    Ok(tx.query_opt(&q.flows.is_pending, &[&id])?.is_some())
}

/// As SQLite's.
pub(crate) fn end_by_operator<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
    now: i64,
) -> Result<bool> {
    flows::end_by_operator(&mut Flow { tx, q, now }, id, status, error)
}

/// As SQLite's.
pub(crate) fn deleting<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<bool> {
    flows::deleting(&mut Flow { tx, q, now }, id)
}

/// As SQLite's.
pub(crate) fn retried<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<()> {
    flows::retried(&mut Flow { tx, q, now }, id)
}

/// [`flows::Steps`] in a transaction, at `now`.
struct Flow<'a, 't, C: GenericClient> {
    tx: &'a mut Tx<'t, C>,
    q: &'a Queries,
    now: i64,
}

impl<C: GenericClient> flows::Steps for Flow<'_, '_, C> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        state_of(self.tx, &self.q.flows, id)
    }

    fn sequences(&mut self) -> impl sequence::Chain + '_ {
        Sequences(self.tx, self.q)
    }

    fn insert_edge(&mut self, edge: flows::Edge) -> Result<()> {
        let (dependency, dependent, run_anyway, cancelled) = edge;
        self.tx.execute(
            &self.q.flows.insert_edge,
            &[&dependency, &dependent, &run_anyway, &cancelled],
        )?;
        Ok(())
    }

    fn cancel_live(&mut self, id: i64, error: &AttemptError) -> Result<()> {
        let cancelled = FinalStatus::Cancelled;
        super::jobs::finish_one(self.tx, self.q, id, cancelled, Some(error), self.now)
    }

    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()> {
        let remaining = i32::try_from(remaining)
            .map_err(|_| Error::InvalidArgument("too many dependencies".into()))?;
        self.tx
            .execute(&self.q.flows.live_to_pending, &[&id, &remaining])?;
        Ok(())
    }

    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool> {
        let moved = self.tx.execute(
            &self.q.flows.pending_to_history,
            &[
                &self.q.now_override(self.now),
                &id,
                &status.as_str(),
                &errors,
            ],
        )?;
        Ok(moved > 0)
    }

    fn delete_pending(&mut self, id: i64) -> Result<()> {
        let delete = self.q.tables.render("DELETE FROM {pending} WHERE id = $1");
        self.tx.execute(&delete, &[&id])?;
        Ok(())
    }

    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize> {
        finished(self.tx, self.q, vec![(id, status)], self.now)
    }

    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>> {
        self.tx
            .query(&self.q.flows.cancelled_dependents, &[&id])?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }

    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.tx
            .execute(&self.q.flows.unmark_cancelled, &[&dependency, &dependent])?;
        Ok(())
    }

    fn history_to_pending(&mut self, id: i64) -> Result<bool> {
        Ok(self.tx.execute(&self.q.flows.history_to_pending, &[&id])? == 1)
    }
}

/// As SQLite's.
pub(crate) fn enqueue_workflow<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
) -> Result<(i64, Vec<Enqueued>)> {
    let row = tx
        .query_opt(&q.flows.insert_workflow, &[&q.now_override(w.now), &w.name])?
        .ok_or_else(|| Error::Database("insert returned no id".into()))?;
    let workflow: i64 = row.try_get(0)?;
    let ids = super::jobs::enqueue_all(tx, q, jobs)?;
    for (step, e) in w.steps.iter().zip(&ids) {
        tx.execute(&q.flows.insert_step, &[&workflow, step, &e.id])?;
    }
    Ok((workflow, ids))
}

fn workflow<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: Option<i64>,
    name: Option<&str>,
) -> Result<Option<WorkflowRow>> {
    let Some(row) = tx.query_opt(&q.flows.workflow, &[&id, &name])? else {
        return Ok(None);
    };
    let id: i64 = row.try_get(0)?;
    let steps = tx
        .query(&q.flows.steps, &[&id])?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_>>()?;
    Ok(Some(WorkflowRow {
        id,
        name: row.try_get(1)?,
        created_at: row.try_get(2)?,
        steps,
    }))
}

fn dependencies<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    job_id: i64,
) -> Result<Vec<DependencyRow>> {
    tx.query(&q.flows.dependencies, &[&job_id])?
        .iter()
        .map(|r| {
            Ok(DependencyRow {
                job_id: r.try_get(0)?,
                step: r.try_get(1)?,
                status: r.try_get(2)?,
                result: r
                    .try_get::<_, Option<String>>(3)?
                    .map(super::jobs::canonical_json),
            })
        })
        .collect()
}

fn links<C: GenericClient>(tx: &mut Tx<'_, C>, q: &Queries, job_id: i64) -> Result<JobLinksRow> {
    let workflow = match tx.query_opt(&q.flows.job_workflow, &[&job_id])? {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)),
        None => None,
    };
    let batch = match tx.query_opt(&q.flows.job_batch, &[&job_id])? {
        Some(r) => Some(r.try_get(0)?),
        None => None,
    };
    let mut dependents = tx
        .query(&q.flows.dependents, &[&job_id])?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect::<Result<Vec<i64>>>()?;
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
        self.pool.write(|tx| enqueue_workflow(tx, &self.q, w, jobs))
    }

    fn workflow(&self, id: Option<i64>, name: Option<&str>) -> Result<Option<WorkflowRow>> {
        self.pool.read(|tx| workflow(tx, &self.q, id, name))
    }

    fn dependencies(&self, job_id: i64) -> Result<Vec<DependencyRow>> {
        self.pool.read(|tx| dependencies(tx, &self.q, job_id))
    }

    fn links(&self, job_id: i64) -> Result<JobLinksRow> {
        self.pool.read(|tx| links(tx, &self.q, job_id))
    }
}
