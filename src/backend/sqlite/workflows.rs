//! Workflows on SQLite (`migrations/sqlite/V8`): a workflow's row and its
//! steps, written with its jobs' enqueue (`crate::backend::flows`'
//! [`enqueue_workflow`](flows::enqueue_workflow) decides the order), and
//! what a handler or an operator reads of them. And the seam's [`Batches`]
//! on [`Connections`], whose seal may enqueue a batch's callbacks. Both
//! enqueue through `jobs.rs`, so this file sits above it; `flows.rs` (the
//! dependencies the steps wait on) and `batches.rs`, below it, are handed
//! that enqueue. The same statements, in the same order, are in
//! `postgres/workflows.rs` and `mysql/workflows.rs`.

use rusqlite::{params, Connection, OptionalExtension};

use super::connection::Connections;
use super::{batches, flows as dependencies, jobs};
use crate::backend::flows::{self, Workflows};
use crate::backend::params::{
    DependencyRow, EnqueueParams, JobLinksRow, WorkflowParams, WorkflowRow,
};
use crate::backend::Batches;
use crate::batch::{BatchRow, CreateBatchParams};
use crate::error::Result;
use crate::job::Enqueued;

/// Inserts a workflow: `?1` name, `?2` now.
pub const INSERT_WORKFLOW: &str =
    "INSERT INTO backlog_workflows (name, created_at) VALUES (?1, ?2)";

/// Records a step: `?1` workflow, `?2` step, `?3` job.
pub const INSERT_STEP: &str =
    "INSERT INTO backlog_workflow_steps (workflow_id, step, job_id) VALUES (?1, ?2, ?3)";

/// A workflow by id (`?1`), or the newest of a name (`?2`).
pub const WORKFLOW: &str = "
SELECT id, name, created_at FROM backlog_workflows
WHERE id = ?1 OR (?1 IS NULL AND name = ?2)
ORDER BY id DESC LIMIT 1";

/// A workflow's steps (`?1`), in the order they were added.
pub const STEPS: &str = "
SELECT step, job_id FROM backlog_workflow_steps WHERE workflow_id = ?1 ORDER BY job_id";

/// A job's (`?1`) dependencies: their step names, statuses and results.
pub const DEPENDENCIES: &str = "
SELECT e.dependency, s.step, h.status, h.result
FROM backlog_dependencies AS e
LEFT JOIN backlog_workflow_steps AS s ON s.job_id = e.dependency
LEFT JOIN backlog_history AS h ON h.id = e.dependency
WHERE e.dependent = ?1
ORDER BY e.dependency";

/// The workflow and step of job `?1`.
pub const JOB_WORKFLOW: &str = "
SELECT w.id, w.name, s.step
FROM backlog_workflow_steps AS s JOIN backlog_workflows AS w ON w.id = s.workflow_id
WHERE s.job_id = ?1";

/// The batch job `?1` is a live member of.
pub const JOB_BATCH: &str = "SELECT batch_id FROM backlog_batch_jobs WHERE job_id = ?1";

/// [`flows::enqueue_workflow`] on the caller's transaction.
pub(crate) fn enqueue_workflow(
    conn: &Connection,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
) -> Result<(i64, Vec<Enqueued>)> {
    flows::enqueue_workflow(&mut Steps(conn), w, jobs)
}

/// [`Workflows`] on the caller's transaction.
struct Steps<'c>(&'c Connection);

impl Workflows for Steps<'_> {
    fn insert_workflow(&mut self, name: &str, now: i64) -> Result<i64> {
        self.0
            .prepare_cached(INSERT_WORKFLOW)?
            .execute(params![name, now])?;
        Ok(self.0.last_insert_rowid())
    }

    fn enqueue_all(&mut self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        jobs::enqueue_all(self.0, jobs)
    }

    fn insert_step(&mut self, workflow: i64, step: &str, job: i64) -> Result<()> {
        self.0
            .prepare_cached(INSERT_STEP)?
            .execute(params![workflow, step, job])?;
        Ok(())
    }
}

/// A workflow by id, or the newest of `name`, with its steps.
pub(crate) fn workflow(
    conn: &Connection,
    id: Option<i64>,
    name: Option<&str>,
) -> Result<Option<WorkflowRow>> {
    let Some((id, name, created_at)) = conn
        .prepare_cached(WORKFLOW)?
        .query_row(params![id, name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?
    else {
        return Ok(None);
    };
    let steps = conn
        .prepare_cached(STEPS)?
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(WorkflowRow {
        id,
        name,
        created_at,
        steps,
    }))
}

/// A job's dependencies, by id.
pub(crate) fn dependencies(conn: &Connection, job_id: i64) -> Result<Vec<DependencyRow>> {
    let rows = conn
        .prepare_cached(DEPENDENCIES)?
        .query_map([job_id], |r| {
            Ok(DependencyRow {
                job_id: r.get(0)?,
                step: r.get(1)?,
                status: r.get(2)?,
                result: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// Job `job_id`'s workflow and step, batch, and dependents.
pub(crate) fn links(conn: &Connection, job_id: i64) -> Result<JobLinksRow> {
    let workflow = conn
        .prepare_cached(JOB_WORKFLOW)?
        .query_row([job_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let batch = conn
        .prepare_cached(JOB_BATCH)?
        .query_row([job_id], |r| r.get(0))
        .optional()?;
    let dependents = conn
        .prepare_cached(dependencies::DEPENDENTS)?
        .query_map([job_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(flows::links(workflow, batch, dependents))
}

flows::impl_flows!(Connections, self, c => read: [self.read], write: [self.write], args: [c]);

impl Batches for Connections {
    fn create_batch(&self, p: &CreateBatchParams<'_>) -> Result<i64> {
        self.write(|tx| batches::create(tx, p))
    }

    fn seal_batch(&self, id: i64, now: i64) -> Result<Option<BatchRow>> {
        self.write(|tx| batches::seal(tx, id, now, jobs::enqueue_all))
    }

    fn batch(&self, id: i64) -> Result<Option<BatchRow>> {
        self.read(|c| batches::get(c, id))
    }

    fn prune_batches(&self, cutoff: i64, limit: usize) -> Result<usize> {
        self.write(|tx| batches::prune(tx, cutoff, limit))
    }
}
