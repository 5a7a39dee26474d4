//! Workflows on PostgreSQL, in the order of `sqlite/workflows.rs`: a
//! workflow's row and steps, written with its jobs' enqueue
//! (`crate::backend::flows` decides the order), and what a handler or an
//! operator reads of them. And the seam's [`Batches`] on [`Db`], whose seal
//! may enqueue a batch's callbacks. Both enqueue through `jobs.rs`, so this
//! file sits above it; `flows.rs` and `batches.rs`, below it, are handed
//! that enqueue.

use postgres::GenericClient;

use super::connection::Tx;
use super::db::Db;
use super::queries::Queries;
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

/// As SQLite's: [`flows::enqueue_workflow`] in `tx`.
pub(crate) fn enqueue_workflow<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
) -> Result<(i64, Vec<Enqueued>)> {
    flows::enqueue_workflow(&mut Steps { tx, q }, w, jobs)
}

/// [`Workflows`] in a transaction.
struct Steps<'a, 't, C: GenericClient> {
    tx: &'a mut Tx<'t, C>,
    q: &'a Queries,
}

impl<C: GenericClient> Workflows for Steps<'_, '_, C> {
    fn insert_workflow(&mut self, name: &str, now: i64) -> Result<i64> {
        let row = self
            .tx
            .query_opt(
                &self.q.flows.insert_workflow,
                &[&self.q.now_override(now), &name],
            )?
            .ok_or_else(|| Error::Database("insert returned no id".into()))?;
        Ok(row.try_get(0)?)
    }

    fn enqueue_all(&mut self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
        jobs::enqueue_all(self.tx, self.q, jobs)
    }

    fn insert_step(&mut self, workflow: i64, step: &str, job: i64) -> Result<()> {
        self.tx
            .execute(&self.q.flows.insert_step, &[&workflow, &step, &job])?;
        Ok(())
    }
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
                result: r.try_get::<_, Option<String>>(3)?.map(jobs::canonical_json),
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
    let dependents = tx
        .query(&q.flows.dependents, &[&job_id])?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect::<Result<Vec<i64>>>()?;
    Ok(flows::links(workflow, batch, dependents))
}

flows::impl_flows!(Db, self, tx => read: [self.pool.read], write: [self.pool.write],
    args: [tx, &self.q]);

impl Batches for Db {
    fn create_batch(&self, p: &CreateBatchParams<'_>) -> Result<i64> {
        self.pool.write(|tx| batches::create(tx, &self.q, p))
    }

    fn seal_batch(&self, id: i64, now: i64) -> Result<Option<BatchRow>> {
        self.pool
            .write(|tx| batches::seal(tx, &self.q, id, now, jobs::enqueue_all))
    }

    fn batch(&self, id: i64) -> Result<Option<BatchRow>> {
        self.pool.read(|tx| batches::get(tx, &self.q, id))
    }

    fn prune_batches(&self, cutoff: i64, limit: usize) -> Result<usize> {
        let now = self.clock.now_micros();
        self.pool
            .write(|tx| batches::prune(tx, &self.q, cutoff, limit, now))
    }
}
