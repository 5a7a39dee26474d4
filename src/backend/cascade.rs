//! The servers' cancel cascade of jobs that did not complete, a level of
//! the graph at a time: which dependents a level's ends cancel (and by
//! which edge), which run-anyway edges count down or hand a sequence on,
//! and what the next level is. Each server's `flows/cascade.rs` implements
//! [`Level`], its statements and driver calls; the decisions are made here
//! once.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result};
use crate::outcome::FinalStatus;
use crate::sequence::Chain;

/// One cancel: the dependency whose end cancels `dependent`, and the
/// dependent's errors (the JSON text of a one-entry array).
pub(crate) type Cancel = (i64, i64, String);

/// What a server runs for one level of a cascade, inside the transaction
/// of the jobs' ends.
pub(crate) trait Level {
    /// The edges out of `ids` (ascending): dependency, dependent,
    /// run-anyway, by dependency then dependent.
    fn dependents(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64, bool)>>;
    /// Moves the dependents of `cancels` (ascending by dependent) that are
    /// still pending to history, cancelled with their errors, and marks
    /// each one's edge from its dependency as the one that cancelled it;
    /// the jobs moved. A dependent no longer pending (released, or ended by
    /// another edge) is left as it is.
    fn cancel_pending(&mut self, cancels: &[Cancel]) -> Result<Vec<i64>>;
    /// Counts pending `dependent` down by one; what it has left, `None`
    /// when it is not pending.
    fn count_down(&mut self, dependent: i64) -> Result<Option<i64>>;
    /// Moves pending `dependent` to live, runnable now.
    fn release(&mut self, dependent: i64) -> Result<()>;
    /// The sequences, for a hand-over on a run-anyway edge.
    fn sequences(&mut self) -> impl Chain + '_;
}

/// What the jobs of `level`, which ended without completing, do to what
/// waits on them, a level at a time: each level's edges read in one
/// statement, its pending dependents on cancelling edges cancelled (and
/// their edges marked) at once; those are the next level. A dependent with
/// several cancelling edges in one level is cancelled by the lowest
/// dependency. The run-anyway edges (a sequence's among them) count down or
/// hand the sequence on one edge at a time, after the level's cancels, as
/// the job-at-a-time path did: a count-down never reaches 0 while a
/// cancelling edge of the same job is still to come, so the order changes
/// nothing. Returns how many jobs were released.
pub(crate) fn cascade(
    db: &mut impl Level,
    mut level: Vec<(i64, FinalStatus)>,
    now: i64,
) -> Result<usize> {
    let mut released = 0;
    while !level.is_empty() {
        let status_of: HashMap<i64, FinalStatus> = level.iter().copied().collect();
        let mut ids: Vec<i64> = status_of.keys().copied().collect();
        ids.sort_unstable();
        let mut cancels: BTreeMap<i64, (i64, String)> = BTreeMap::new();
        let mut anyway = Vec::new();
        for (dependency, dependent, run_anyway) in db.dependents(&ids)? {
            let status = status_of
                .get(&dependency)
                .copied()
                .ok_or_else(|| Error::Database("an edge of another job".into()))?;
            if run_anyway {
                anyway.push((dependency, dependent));
            } else if let Entry::Vacant(entry) = cancels.entry(dependent) {
                let error = crate::flow::cancelled_error(dependency, status.as_str(), now);
                entry.insert((dependency, serde_json::to_string(&[error])?));
            }
        }
        let mut next = Vec::new();
        if !cancels.is_empty() {
            let cancels: Vec<Cancel> = cancels
                .into_iter()
                .map(|(dependent, (dependency, errors))| (dependency, dependent, errors))
                .collect();
            let moved = db.cancel_pending(&cancels)?;
            next.extend(moved.into_iter().map(|id| (id, FinalStatus::Cancelled)));
        }
        for (dependency, dependent) in anyway {
            if crate::sequence::handoff(&mut db.sequences(), dependency, dependent)? {
                continue;
            }
            if db.count_down(dependent)? == Some(0) {
                db.release(dependent)?;
                released += 1;
            }
        }
        level = next;
    }
    Ok(released)
}
