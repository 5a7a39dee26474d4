//! The servers' waits of a whole `enqueue_many` at once: which dependencies
//! to read, then (from their states, read in one set statement per table)
//! every edge to write, every job to move to pending and every job
//! cancelled at enqueue, in [`wait_all`]. Each server's `flows.rs` reads
//! and writes ([`Batch`]); the decisions are [`crate::flow::waiting`]'s, as
//! for one job.
//!
//! A job of the batch that another one of it depends on is not read back:
//! its state is the one this plan gave it (`live`, `pending`, or
//! `cancelled` when a dependency's end cancelled it), which is where the
//! job-at-a-time path would have found it.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::backend::flows::{self, Steps};
use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::outcome::AttemptError;

/// One edge to insert: dependency, dependent, run-anyway, cancelled.
pub(crate) type EdgeRow = (i64, i64, bool, bool);

/// Where [`states`] looks, in the order of a job's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The pending table, rows share-locked: state `pending`.
    Pending,
    /// The live table, rows share-locked: state `live`.
    Live,
    /// History: the state is the row's status.
    History,
}

/// The states of `ids` (ascending), as the job-at-a-time `state_of` reads
/// one: `read` gets a place and the ids not found in the places before it,
/// one statement each, and returns the `(id, state)` it found. A job moving
/// on while it is read is waited for by the locking read and found in the
/// next place, which a later statement reads (READ COMMITTED).
pub(crate) fn states(
    ids: &[i64],
    mut read: impl FnMut(Place, &[i64]) -> Result<Vec<(i64, String)>>,
) -> Result<HashMap<i64, String>> {
    let mut states = HashMap::with_capacity(ids.len());
    for place in [Place::Pending, Place::Live, Place::History] {
        let rest: Vec<i64> = ids
            .iter()
            .filter(|id| !states.contains_key(*id))
            .copied()
            .collect();
        if rest.is_empty() {
            break;
        }
        states.extend(read(place, &rest)?);
    }
    Ok(states)
}

/// What a batch's waits write, in this order: `cancelled` first (each
/// finished as one job, while no edge of the batch points at it yet), then
/// `edges` in one statement, then `pending` in one.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// The jobs a dependency's end cancels at enqueue, with their error and
    /// their enqueue's now.
    pub cancelled: Vec<(i64, AttemptError, i64)>,
    /// Every edge of the batch.
    pub edges: Vec<EdgeRow>,
    /// The jobs that wait, with their `remaining` counters.
    pub pending: Vec<(i64, i32)>,
}

/// Whether the batch's waits can be planned at once: a sequenced job reads
/// and writes its sequence's tail as it goes (`sequences.rs`), so a batch
/// holding one takes the job-at-a-time path.
pub(crate) fn at_once(jobs: &[EnqueueParams<'_>]) -> bool {
    jobs.iter().all(|p| p.sequence.is_none())
}

/// Whether job `i` waits on anything (a duplicate of an existing job does
/// not: it was not inserted).
fn waits(p: &EnqueueParams<'_>, e: &Enqueued) -> bool {
    !p.depends_on.is_empty() && !e.existed
}

/// The ids of the jobs the batch depends on that are not its own new jobs,
/// ascending (the order the servers lock them in), each once. An edge that
/// does not resolve is the same error as the job-at-a-time path's.
pub(crate) fn to_read(jobs: &[EnqueueParams<'_>], ids: &[Enqueued]) -> Result<Vec<i64>> {
    let fresh = fresh(ids);
    let mut read = BTreeSet::new();
    for (i, p) in jobs.iter().enumerate() {
        if !waits(p, &ids[i]) {
            continue;
        }
        crate::flow::waiting(p.depends_on, &ids[..i], None, |dependency| {
            if !fresh.contains(&dependency) {
                read.insert(dependency);
            }
            Ok(Some("live".into()))
        })?;
    }
    Ok(read.into_iter().collect())
}

/// The batch's waits, from `states`: where each id of [`to_read`] is
/// (`pending`, `live` or a history status; absent when no job has it).
pub(crate) fn plan(
    jobs: &[EnqueueParams<'_>],
    ids: &[Enqueued],
    states: &HashMap<i64, String>,
) -> Result<Plan> {
    let fresh = fresh(ids);
    let mut own: HashMap<i64, &'static str> = HashMap::new();
    let mut plan = Plan::default();
    for (i, p) in jobs.iter().enumerate() {
        let e = ids[i];
        if !waits(p, &e) {
            continue;
        }
        let waiting = crate::flow::waiting(p.depends_on, &ids[..i], None, |dependency| {
            Ok(if fresh.contains(&dependency) {
                Some(own.get(&dependency).copied().unwrap_or("live").into())
            } else {
                states.get(&dependency).cloned()
            })
        })?;
        plan.edges.extend(
            waiting
                .edges
                .iter()
                .map(|&(dependency, run_anyway, cancels)| (dependency, e.id, run_anyway, cancels)),
        );
        if let Some(error) = waiting.cancelled_error(p.now) {
            own.insert(e.id, "cancelled");
            plan.cancelled.push((e.id, error, p.now));
        } else if waiting.remaining > 0 {
            let remaining = i32::try_from(waiting.remaining)
                .map_err(|_| Error::InvalidArgument("too many dependencies".into()))?;
            own.insert(e.id, "pending");
            plan.pending.push((e.id, remaining));
        }
    }
    Ok(plan)
}

/// What a server runs for a batch's waits, in the enqueue's transaction.
pub(crate) trait Batch {
    /// One job's steps, for a job enqueued at `now`: the job-at-a-time path.
    fn steps(&mut self, now: i64) -> impl Steps + '_;
    /// The `(id, state)` of those of `ids` (ascending) that are in `place`,
    /// in one statement, each row share-locked as `state_of` locks one (see
    /// [`states`]).
    fn states_in(&mut self, place: Place, ids: &[i64]) -> Result<Vec<(i64, String)>>;
    /// Finishes live job `id`, which a dependency's end cancelled, with
    /// `error`, at `now`: `jobs.rs`' finish, whose own end recurses through
    /// `flows.rs`.
    fn cancel(&mut self, id: i64, error: &AttemptError, now: i64) -> Result<()>;
    /// Records the batch's edges, in one statement.
    fn insert_edges(&mut self, edges: &[EdgeRow]) -> Result<()>;
    /// Moves the batch's waiting jobs to pending, each with its
    /// `remaining` counter, in one statement.
    fn live_to_pending(&mut self, pending: &[(i64, i32)]) -> Result<()>;
}

/// As SQLite's `wait`, for a whole batch (`ids` are the batch's, every job
/// inserted): the dependencies' states read in at most three statements,
/// the jobs cancelled at enqueue finished, then every edge in one statement
/// and every waiting job moved in one. A batch with a sequenced job goes one
/// job at a time, in order: a job's `Earlier` dependencies come before it,
/// so they are settled first.
pub(crate) fn wait_all(
    db: &mut impl Batch,
    jobs: &[EnqueueParams<'_>],
    ids: Vec<Enqueued>,
) -> Result<Vec<Enqueued>> {
    if !at_once(jobs) {
        for (i, p) in jobs.iter().enumerate() {
            let cancelled = flows::wait(&mut db.steps(p.now), p, ids[i], &ids[..i])?;
            if let Some(error) = cancelled {
                db.cancel(ids[i].id, &error, p.now)?;
            }
        }
        return Ok(ids);
    }
    let read = to_read(jobs, &ids)?;
    let states = states(&read, |place, ids| db.states_in(place, ids))?;
    let plan = plan(jobs, &ids, &states)?;
    for (id, error, now) in &plan.cancelled {
        db.cancel(*id, error, *now)?;
    }
    if !plan.edges.is_empty() {
        db.insert_edges(&plan.edges)?;
    }
    if !plan.pending.is_empty() {
        db.live_to_pending(&plan.pending)?;
    }
    Ok(ids)
}

/// The ids the batch inserted.
fn fresh(ids: &[Enqueued]) -> HashSet<i64> {
    ids.iter().filter(|e| !e.existed).map(|e| e.id).collect()
}
