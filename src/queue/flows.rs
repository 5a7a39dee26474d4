//! The [`Queue`]'s workflow calls: enqueueing one (validated and encoded
//! first, [`PlannedWorkflow`]), reading it back, cancelling it, and a job's
//! dependencies and links. What a workflow is, and the rules every backend
//! applies to dependencies, are [`crate::flow`]'s.

use crate::action;
use crate::backend::params::{DependencyRow, EnqueueParams, WorkflowParams, WorkflowRow};
use crate::clock;
use crate::error::{Error, Result};
use crate::flow::{
    Dependency, EnqueuedWorkflow, JobLinks, StepOf, Workflow, WorkflowInfo, WorkflowRef,
    WorkflowStep,
};
use crate::inspect::{BulkReport, CancelOutcome};
use crate::job::Enqueued;
use crate::outcome::FinalStatus;

use super::{Prepared, Queue};

/// A workflow validated and encoded, ready for a backend.
pub(crate) struct PlannedWorkflow {
    name: String,
    steps: Vec<String>,
    prepared: Vec<Prepared>,
}

impl PlannedWorkflow {
    /// The workflow's row.
    pub(crate) fn params(&self, now: i64) -> WorkflowParams<'_> {
        WorkflowParams {
            name: &self.name,
            steps: &self.steps,
            now,
        }
    }

    /// Its steps' jobs, in order.
    pub(crate) fn jobs(&self, now: i64) -> Vec<EnqueueParams<'_>> {
        super::params(&self.prepared, now)
    }

    /// What the caller gets back.
    pub(crate) fn enqueued(self, id: i64, ids: &[Enqueued]) -> EnqueuedWorkflow {
        EnqueuedWorkflow {
            id,
            steps: self
                .steps
                .into_iter()
                .zip(ids.iter().map(|e| e.id))
                .collect(),
        }
    }
}

impl Queue {
    /// Enqueues every step of `workflow` in one transaction: all or none.
    /// Each step's job is validated first; a duplicate or unknown step name
    /// or a cycle is [`Error::InvalidWorkflow`], with nothing written.
    pub fn enqueue_workflow(&self, workflow: Workflow) -> Result<EnqueuedWorkflow> {
        let now = self.now_micros();
        let planned = self.plan_workflow(workflow, now)?;
        let (id, ids) = self
            .store()
            .enqueue_workflow(&planned.params(now), &planned.jobs(now))?;
        self.enqueued(&planned.prepared, &ids);
        Ok(planned.enqueued(id, &ids))
    }

    /// Validates and encodes every step of `workflow`, writing nothing.
    pub(crate) fn plan_workflow(&self, workflow: Workflow, now: i64) -> Result<PlannedWorkflow> {
        let (name, steps, jobs) = workflow.plan()?;
        let prepared = self.prepare_all(jobs, now)?;
        Ok(PlannedWorkflow {
            name,
            steps,
            prepared,
        })
    }

    /// A workflow and the states of its steps; `None` when there is none.
    pub fn workflow(&self, which: impl Into<WorkflowRef>) -> Result<Option<WorkflowInfo>> {
        self.workflow_row(which.into())?
            .map(|row| self.workflow_info(row))
            .transpose()
    }

    fn workflow_row(&self, which: WorkflowRef) -> Result<Option<WorkflowRow>> {
        match which {
            WorkflowRef::Id(id) => self.store().workflow(Some(id), None),
            WorkflowRef::Name(name) => self.store().workflow(None, Some(&name)),
        }
    }

    fn workflow_info(&self, row: WorkflowRow) -> Result<WorkflowInfo> {
        let mut steps = Vec::with_capacity(row.steps.len());
        for (name, job_id) in row.steps {
            match self.get(job_id) {
                Ok(record) => steps.push(WorkflowStep {
                    name,
                    job_id,
                    state: record.state,
                }),
                // Deleted (or pruned from history): not a step any more.
                Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(WorkflowInfo {
            id: row.id,
            name: row.name,
            created_at: clock::at(row.created_at),
            steps,
        })
    }

    /// Cancels every step of a workflow that has not finished: a waiting
    /// or pending one moves to history as `cancelled` (and so does what
    /// comes after it), a running one is asked to stop. Returns how many
    /// were cancelled (of them, how many were running and asked) and how many
    /// had finished meanwhile (cancelled by an earlier step's cascade); an
    /// unknown workflow cancels nothing. One transaction: it first looks at
    /// every step (on the servers, locking each), so a step that finished
    /// before is left alone and one that finishes concurrently waits for it;
    /// then it cancels the others in the order they were enqueued. An error
    /// midway cancels none.
    pub fn cancel_workflow(&self, which: impl Into<WorkflowRef>) -> Result<BulkReport> {
        let mut report = BulkReport::default();
        let Some(row) = self.workflow_row(which.into())? else {
            return Ok(report);
        };
        let ids: Vec<i64> = row.steps.iter().map(|(_, id)| *id).collect();
        let acted = self.store().cancel_steps(&ids, self.now_micros())?;
        for (id, acted) in ids.into_iter().zip(acted) {
            // Finished (or deleted) before the cancel: not its to count.
            let Some(acted) = acted else { continue };
            match action::Action::cancel_verdict(id, acted) {
                Ok(CancelOutcome::Cancelled) => report.done += 1,
                Ok(CancelOutcome::Requested) => {
                    report.done += 1;
                    report.requested += 1;
                }
                // Cancelled by an earlier step's cascade in this transaction.
                Err(Error::InvalidState { .. } | Error::NotFound { .. }) => report.skipped += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    /// The jobs job `id` depends on, with how they ended and their results,
    /// by id. Empty for a job without dependencies.
    pub fn dependencies(&self, id: i64) -> Result<Vec<Dependency>> {
        let rows = self.store().dependencies(id)?;
        Ok(rows.into_iter().map(dependency).collect())
    }
}

fn dependency(row: DependencyRow) -> Dependency {
    Dependency {
        job_id: row.job_id,
        step: row.step,
        status: row.status.as_deref().and_then(FinalStatus::parse),
        result: row.result,
    }
}

impl Queue {
    /// Job `id`'s workflow and step, its batch, and the jobs that depend on
    /// it: what `backlog show` and the dashboard's job page link to. Three
    /// reads by key; all empty for a job that has none (or an id no job
    /// has: use [`Queue::get`] for whether it exists).
    pub fn job_links(&self, id: i64) -> Result<JobLinks> {
        let row = self.store().links(id)?;
        Ok(JobLinks {
            workflow: row.workflow.map(|(workflow_id, workflow, step)| StepOf {
                workflow_id,
                workflow,
                step,
            }),
            batch: row.batch,
            dependents: row.dependents,
        })
    }
}
