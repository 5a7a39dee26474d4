//! Workflows on MySQL/MariaDB, in the order of `sqlite/workflows.rs`: a
//! workflow's row and steps, written with its jobs' enqueue
//! (`crate::backend::flows` decides the order), and what a handler or an
//! operator reads of them. And the seam's [`Batches`] on [`Db`], whose seal
//! may enqueue a batch's callbacks. Both enqueue through `jobs.rs`, so this
//! file sits above it; `flows.rs` and `batches.rs`, below it, are handed
//! that enqueue.

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Db, Now};
use super::queries::Sql;
use super::{batches, jobs};
use crate::backend::flows::{self, Workflows};
use crate::backend::params::{
    DependencyRow, EnqueueParams, JobLinksRow, WorkflowParams, WorkflowRow,
};
use crate::backend::Batches;
use crate::batch::{BatchRow, CreateBatchParams};
use crate::clock::ClockMicros;
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// As SQLite's: [`flows::enqueue_workflow`] in `q`'s transaction, at the
/// server's now (or the manual clock's).
pub(crate) fn enqueue_workflow<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
    now: Now,
) -> Result<(i64, Vec<Enqueued>)> {
    flows::enqueue_workflow(&mut Steps { sql, q, now }, w, jobs)
}

/// [`Workflows`] in a transaction, at `now`.
struct Steps<'a, Q: Queryable> {
    sql: &'a Sql,
    q: &'a mut Q,
    now: Now,
}

impl<Q: Queryable> Workflows for Steps<'_, Q> {
    fn insert_workflow(&mut self, name: &str, _: i64) -> Result<i64> {
        self.q
            .exec_iter(
                &self.sql.flows.insert_workflow,
                params! { "name" => name, "now" => self.now.param() },
            )?
            .last_insert_id()
            .and_then(|id| i64::try_from(id).ok())
            .ok_or_else(|| Error::Database("insert returned no id".into()))
    }

    fn enqueue_all(&mut self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        jobs::enqueue_all(self.sql, self.q, jobs, self.now)
    }

    fn insert_step(&mut self, workflow: i64, step: &str, job: i64) -> Result<()> {
        self.q.exec_drop(
            &self.sql.flows.insert_step,
            params! { "workflow" => workflow, "step" => step, "job" => job },
        )?;
        Ok(())
    }
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
    let dependents = rows.into_iter().map(|(id, _)| id).collect();
    Ok(flows::links(workflow, batch, dependents))
}

flows::impl_flows!(Db, self, c => read: [self.read], write: [self.write], args: [&self.sql, c],
    now: [self.now]);

impl Batches for Db {
    fn create_batch(&self, p: &CreateBatchParams<'_>) -> Result<i64> {
        let now = self.now(p.now);
        self.write(|tx| batches::create(&self.sql, tx, p, now))
    }

    fn seal_batch(&self, id: i64, now: i64) -> Result<Option<BatchRow>> {
        let now = self.now(now);
        self.write(|tx| batches::seal(&self.sql, tx, id, now, jobs::enqueue_all))
    }

    fn batch(&self, id: i64) -> Result<Option<BatchRow>> {
        self.read(|conn| batches::get(&self.sql, conn, id))
    }

    /// `cutoff` comes without the engine's `now`; the queue's clock, read
    /// here, stands in for it (as history's prune).
    fn prune_batches(&self, cutoff: i64, limit: usize) -> Result<usize> {
        let now = self.now(self.clock.now_micros());
        self.write(|tx| batches::prune(&self.sql, tx, cutoff, limit, now))
    }
}
