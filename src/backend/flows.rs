//! A job's dependencies, walked the same way on every database: what an
//! enqueue writes for a job that waits ([`wait`]), what an operator's
//! cancel, discard, delete or retry does to what waits on the job
//! ([`end_by_operator`], [`deleting`], [`retried`]), and what a workflow's
//! enqueue writes ([`enqueue_workflow`]). The decisions are made here (and
//! in [`crate::flow`] and [`crate::sequence`]); each database's `flows.rs`
//! implements [`Steps`], and its `workflows.rs` [`Workflows`], their
//! statements and driver calls, inside the caller's transaction.
//!
//! Neither trait finishes or enqueues a job itself: [`wait`] hands back the
//! cancel it decided, and [`Workflows::enqueue_all`] is the database's
//! whole enqueue. So a database's `flows.rs` sits below its `jobs.rs`,
//! whose finish and enqueue recurse through it, and never names it.

use crate::backend::params::{EnqueueParams, JobLinksRow, WorkflowParams};
use crate::error::Result;
use crate::job::Enqueued;
use crate::outcome::{AttemptError, FinalStatus};
use crate::sequence::{self, Chain};

/// An edge: dependency, dependent, run-anyway, cancelled (the dependency's
/// end cancelled the dependent).
pub(crate) type Edge = (i64, i64, bool, bool);

/// What a database runs for a job's dependencies, in one transaction.
pub(crate) trait Steps {
    /// The sequences, for a sequenced job's enqueue.
    fn sequences(&mut self) -> impl Chain + '_;
    /// Where job `id` is: `pending`, `live`, a history status, or `None`
    /// (on a server, its row share-locked), looked up as a sequence's tail
    /// is.
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        self.sequences().state_of(id)
    }
    /// Records an edge: `dependent` waits on `dependency`.
    fn insert_edge(&mut self, edge: Edge) -> Result<()>;
    /// Moves live job `id` to pending, waiting on `remaining` dependencies.
    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()>;
    /// Moves pending job `id` to history as `status` with `errors` (the
    /// JSON text of its errors); whether it was pending.
    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool>;
    /// Deletes pending job `id`'s row.
    fn delete_pending(&mut self, id: i64) -> Result<()>;
    /// Applies job `id`'s end as `status` to what waits on it; how many
    /// jobs were released.
    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize>;
    /// The jobs whose edge from `id` is marked as the one that cancelled
    /// them.
    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>>;
    /// Unmarks the edge from `dependency` to `dependent` as cancelling.
    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()>;
    /// Moves cancelled job `id` from history back to pending, waiting on
    /// its dependencies that have not counted for it; whether it moved.
    fn history_to_pending(&mut self, id: i64) -> Result<bool>;
}

/// Makes a job just enqueued (`e`, `p`) wait for its dependencies: records
/// each edge, then leaves it live when every dependency counts already,
/// moves it to pending when some have not finished, or finishes it as
/// `cancelled` when one ended other than completed on a cancelling edge.
/// `earlier` holds the batch's jobs enqueued before it. A job that existed
/// (its unique key was held) is left as it was. A sequenced job also waits
/// on the job before it in its sequence (`crate::sequence`).
///
/// Returns the error to finish the job with, as `cancelled`, when a
/// dependency's end cancels it: the caller finishes it then, as any end of
/// a live job, the last step of its wait.
#[must_use = "a job a dependency cancelled is to be finished"]
pub(crate) fn wait(
    db: &mut impl Steps,
    p: &EnqueueParams<'_>,
    e: Enqueued,
    earlier: &[Enqueued],
) -> Result<Option<AttemptError>> {
    if (p.depends_on.is_empty() && p.sequence.is_none()) || e.existed {
        return Ok(None);
    }
    let tail = sequence::swap(&mut db.sequences(), p, e.id)?;
    let waiting = crate::flow::waiting(p.depends_on, earlier, tail, |dependency| {
        db.state_of(dependency)
    })?;
    for &(dependency, run_anyway, cancels) in &waiting.edges {
        db.insert_edge((dependency, e.id, run_anyway, cancels))?;
    }
    if let Some(link) = sequence::link(p, e.id, tail, &waiting) {
        sequence::write(&mut db.sequences(), link)?;
    }
    let cancelled = waiting.cancelled_error(p.now);
    if cancelled.is_none() && waiting.remaining > 0 {
        db.live_to_pending(e.id, waiting.remaining)?;
    }
    Ok(cancelled)
}

/// An operator's cancel or discard of a pending job: moves it to history as
/// `status` with `error`, and applies that to what waits on it. Whether it
/// was pending (otherwise nothing was done).
pub(crate) fn end_by_operator(
    db: &mut impl Steps,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
) -> Result<bool> {
    let errors = serde_json::to_string(&[error])?;
    if !db.end_pending(id, status, &errors)? {
        return Ok(false);
    }
    db.finished(id, status)?;
    Ok(true)
}

/// Before an operator's delete of `id`: a live or pending job counts as
/// cancelled for what waits on it, and a pending row is removed. Whether
/// there was a pending row.
pub(crate) fn deleting(db: &mut impl Steps, id: i64) -> Result<bool> {
    let state = db.state_of(id)?;
    let pending = state.as_deref() == Some("pending");
    if pending {
        db.delete_pending(id)?;
    }
    if matches!(state.as_deref(), Some("pending" | "live")) {
        db.finished(id, FinalStatus::Cancelled)?;
    }
    Ok(pending)
}

/// After an operator's retry moved `id` back to live: brings back the jobs
/// its end cancelled (and theirs, and so on) to pending, each waiting for
/// the dependencies that have not counted for it yet (`id` among them).
pub(crate) fn retried(db: &mut impl Steps, id: i64) -> Result<()> {
    let mut back = vec![id];
    while let Some(id) = back.pop() {
        for dependent in db.cancelled_dependents(id)? {
            db.unmark_cancelled(id, dependent)?;
            if db.history_to_pending(dependent)? {
                back.push(dependent);
            }
        }
    }
    Ok(())
}

/// What a database runs for a workflow's enqueue, in one transaction.
pub(crate) trait Workflows {
    /// Inserts the workflow's row; its id.
    fn insert_workflow(&mut self, name: &str, now: i64) -> Result<i64>;
    /// Enqueues `jobs` as the database's `enqueue_all` does (batches,
    /// groups, dependencies and all).
    fn enqueue_all(&mut self, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>>;
    /// Records job `job` as step `step` of `workflow`.
    fn insert_step(&mut self, workflow: i64, step: &str, job: i64) -> Result<()>;
}

/// A workflow's enqueue: its row, its jobs, then each job's step (the
/// steps are in the jobs' order). The workflow's id and the jobs'.
pub(crate) fn enqueue_workflow(
    db: &mut impl Workflows,
    w: &WorkflowParams<'_>,
    jobs: &[EnqueueParams<'_>],
) -> Result<(i64, Vec<Enqueued>)> {
    let workflow = db.insert_workflow(w.name, w.now)?;
    let ids = db.enqueue_all(jobs)?;
    for (step, e) in w.steps.iter().zip(&ids) {
        db.insert_step(workflow, step, e.id)?;
    }
    Ok((workflow, ids))
}

/// A job's links as read: its workflow and step, its batch, and its
/// dependents (in any order; listed by id).
pub(crate) fn links(
    workflow: Option<(i64, String, String)>,
    batch: Option<i64>,
    mut dependents: Vec<i64>,
) -> JobLinksRow {
    dependents.sort_unstable();
    JobLinksRow {
        workflow,
        batch,
        dependents,
    }
}

/// The seam's [`Flows`](crate::backend::Flows) on database type `$db`,
/// stated once: each method runs the function of its name in the invoking
/// `workflows.rs`, the enqueue in a write transaction and the reads on a
/// read connection. `$this` is the `self` of the invocation, `$c` the
/// transaction or connection the calls are handed; `args` are the
/// arguments each function takes before its own (`$c` and the database's
/// statements, in that database's order), and `now`, when given, turns the
/// engine's now into the one the enqueue takes last (MySQL's `Now`).
macro_rules! impl_flows {
    ($db:ty, $this:ident, $c:ident => read: [$($read:tt)*], write: [$($write:tt)*],
        args: [$($arg:tt)*] $(, now: [$($now:tt)*])?) => {
        impl $crate::backend::Flows for $db {
            fn enqueue_workflow(
                &$this,
                w: &$crate::backend::params::WorkflowParams<'_>,
                jobs: &[$crate::backend::params::EnqueueParams<'_>],
            ) -> $crate::error::Result<(i64, Vec<$crate::job::Enqueued>)> {
                $($write)*(|$c| enqueue_workflow($($arg)*, w, jobs $(, $($now)*(w.now))?))
            }

            fn workflow(
                &$this,
                id: Option<i64>,
                name: Option<&str>,
            ) -> $crate::error::Result<Option<$crate::backend::params::WorkflowRow>> {
                $($read)*(|$c| workflow($($arg)*, id, name))
            }

            fn dependencies(
                &$this,
                job_id: i64,
            ) -> $crate::error::Result<Vec<$crate::backend::params::DependencyRow>> {
                $($read)*(|$c| dependencies($($arg)*, job_id))
            }

            fn links(&$this, job_id: i64) -> $crate::error::Result<$crate::backend::params::JobLinksRow> {
                $($read)*(|$c| links($($arg)*, job_id))
            }
        }
    };
}
pub(crate) use impl_flows;
