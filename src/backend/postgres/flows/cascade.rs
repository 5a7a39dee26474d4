//! The cancel cascade of jobs that did not complete, on PostgreSQL, a
//! level of the graph at a time: each level's edges read in one statement,
//! its pending dependents cancelled in one.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};

use postgres::GenericClient;

use super::super::connection::Tx;
use super::super::queries::Queries;
use crate::error::{Error, Result};
use crate::outcome::FinalStatus;

/// The edges out of the jobs `$1` that ended without completing, by
/// dependency then dependent: one level of a cancel cascade.
pub const DEPENDENTS_MANY: &str = "
SELECT dependency, dependent, run_anyway FROM {dependencies}
WHERE dependency = ANY($1) ORDER BY dependency, dependent";

/// `flows.rs`' `PENDING_TO_HISTORY` and SQLite's `MARK_CANCELLED` for one
/// level of a cancel cascade: the pending jobs among the dependents `$3`
/// cancelled
/// with their errors `$4` (JSON text), each by its dependency `$2`, whose
/// edge is marked as the one that cancelled it; returns the jobs moved.
/// `$1` now override. The pending rows are locked first in id order (two
/// cascades sharing dependents take them in the same order); a dependent no
/// longer pending (released, or ended by another edge) is left as it is.
pub const CANCEL_PENDING_MANY: &str = "
WITH w AS (
    SELECT * FROM unnest($2::int8[], $3::int8[], $4::text[]) AS w (dependency, dependent, errors)
), locked AS (
    SELECT p.id FROM {pending} AS p JOIN w ON w.dependent = p.id
    ORDER BY p.id FOR UPDATE OF p
), moved AS (
    DELETE FROM {pending} AS p USING locked WHERE p.id = locked.id RETURNING p.*
), marked AS (
    UPDATE {dependencies} AS e SET cancelled = TRUE
    FROM moved JOIN w ON w.dependent = moved.id
    WHERE e.dependency = w.dependency AND e.dependent = w.dependent
)
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT m.id, m.queue, m.kind, m.priority, NULL, m.payload, 0, m.max_attempts, m.available_at,
       w.errors::jsonb, FALSE, m.created_at, {now}, NULL, 'cancelled', NULL, NULL, {now}, NULL
FROM moved AS m JOIN w ON w.dependent = m.id
RETURNING id";

/// What the jobs of `level`, which ended without completing, do to what
/// waits on them, a level at a time: each level's edges read in one
/// statement, its pending dependents on cancelling edges cancelled and
/// their edges marked in one ([`CANCEL_PENDING_MANY`]); those are the next
/// level. A dependent with several cancelling edges in one level is
/// cancelled by the lowest dependency. The run-anyway edges (a sequence's
/// among them) count down or hand the sequence on one edge at a time, after
/// the level's cancels, as the job-at-a-time path did: a count-down never
/// reaches 0 while a cancelling edge of the same job is still to come, so
/// the order changes nothing. Returns how many jobs were released.
pub(super) fn cascade<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    mut level: Vec<(i64, FinalStatus)>,
    now: i64,
) -> Result<usize> {
    let f = &q.flows;
    let now_override = q.now_override(now);
    let mut released = 0;
    while !level.is_empty() {
        let status_of: HashMap<i64, FinalStatus> = level.iter().copied().collect();
        let ids: Vec<i64> = status_of.keys().copied().collect();
        let mut cancels: BTreeMap<i64, (i64, String)> = BTreeMap::new();
        let mut anyway = Vec::new();
        for row in tx.query(&f.dependents_many, &[&ids])? {
            let (dependency, dependent, run_anyway): (i64, i64, bool) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
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
            let (mut dependencies, mut dependents, mut errors) =
                (Vec::new(), Vec::new(), Vec::new());
            for (dependent, (dependency, error)) in cancels {
                dependencies.push(dependency);
                dependents.push(dependent);
                errors.push(error);
            }
            for row in tx.query(
                &f.cancel_pending_many,
                &[&now_override, &dependencies, &dependents, &errors],
            )? {
                next.push((row.try_get(0)?, FinalStatus::Cancelled));
            }
        }
        for (dependency, dependent) in anyway {
            if super::super::sequences::handoff(tx, q, dependency, dependent)? {
                continue;
            }
            let left: Option<i32> = match tx.query_opt(&f.count_down, &[&dependent])? {
                Some(row) => Some(row.try_get(0)?),
                None => None,
            };
            if left == Some(0) {
                tx.execute(&f.release, &[&now_override, &dependent])?;
                released += 1;
            }
        }
        level = next;
    }
    Ok(released)
}
