//! The cancel cascade of jobs that did not complete, on MySQL/MariaDB, a
//! level of the graph at a time (as `postgres/flows/cascade.rs`): in a
//! module of its own, `flows.rs` being long enough.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};

use mysql::params;
use mysql::prelude::Queryable;

use super::super::queries::Sql;
use super::super::Now;
use crate::error::{Error, Result};
use crate::outcome::FinalStatus;

/// The edges out of the jobs `:ids` (a JSON array) that ended without
/// completing, by dependency then dependent: one level of a cancel cascade.
pub const DEPENDENTS_MANY: &str = "
SELECT e.dependency, e.dependent, e.run_anyway
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
ORDER BY e.dependency, e.dependent";

/// `flows.rs`' `PENDING_TO_HISTORY` for one level of a cancel cascade, in
/// four statements (MySQL has no `DELETE .. RETURNING`): the dependents of
/// `:cancels` (a JSON array of `[dependency, dependent, errors]`, `errors`
/// the JSON text of the job's errors) that are still pending, locked in id
/// order (two cascades sharing dependents take them in the same order) ...
pub const LOCK_PENDING_MANY: &str = "
SELECT p.id FROM JSON_TABLE(:cancels, '$[*]' COLUMNS (dependent BIGINT PATH '$[1]')) AS c
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = c.dependent
ORDER BY p.id FOR UPDATE";

/// ... copied to history, cancelled (then `flows.rs`' `DELETE_PENDING_MANY`
/// removes their pending rows) ...
pub const PENDING_TO_HISTORY_MANY: &str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT p.id, p.queue, p.kind, p.priority, NULL, p.payload, 0, p.max_attempts, p.available_at,
       c.errors, FALSE, p.created_at, {now}, NULL, 'cancelled', NULL, NULL, {now}, NULL
FROM JSON_TABLE(:cancels, '$[*]' COLUMNS (
         dependent BIGINT PATH '$[1]', errors LONGTEXT PATH '$[2]')) AS c
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = c.dependent";

/// ... and each one's edge from `dependency` marked as the one that
/// cancelled it (SQLite's `MARK_CANCELLED`).
pub const MARK_CANCELLED_MANY: &str = "
UPDATE JSON_TABLE(:cancels, '$[*]' COLUMNS (
           dependency BIGINT PATH '$[0]', dependent BIGINT PATH '$[1]')) AS c
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY)
    ON e.dependency = c.dependency AND e.dependent = c.dependent
SET e.cancelled = TRUE";

/// As PostgreSQL's `cascade`: a level of the graph at a time, its edges
/// read in one statement ([`DEPENDENTS_MANY`]), its pending dependents on
/// cancelling edges cancelled in four ([`LOCK_PENDING_MANY`],
/// [`PENDING_TO_HISTORY_MANY`], `DELETE_PENDING_MANY`,
/// [`MARK_CANCELLED_MANY`]), each by its lowest dependency of the level; the run-anyway
/// edges (a sequence's among them) one at a time, after the level's
/// cancels. Returns how many jobs were released.
pub(super) fn cascade(
    sql: &Sql,
    q: &mut impl Queryable,
    mut level: Vec<(i64, FinalStatus)>,
    now: Now,
) -> Result<usize> {
    let f = &sql.flows;
    let mut released = 0;
    while !level.is_empty() {
        let status_of: HashMap<i64, FinalStatus> = level.iter().copied().collect();
        let mut ids: Vec<i64> = status_of.keys().copied().collect();
        ids.sort_unstable();
        let edges: Vec<(i64, i64, bool)> = q.exec(
            &f.dependents_many,
            params! { "ids" => serde_json::to_string(&ids)? },
        )?;
        let mut cancels: BTreeMap<i64, (i64, String)> = BTreeMap::new();
        let mut anyway = Vec::new();
        for (dependency, dependent, run_anyway) in edges {
            let status = status_of
                .get(&dependency)
                .copied()
                .ok_or_else(|| Error::Database("an edge of another job".into()))?;
            if run_anyway {
                anyway.push((dependency, dependent));
            } else if let Entry::Vacant(entry) = cancels.entry(dependent) {
                let error = crate::flow::cancelled_error(dependency, status.as_str(), now.engine);
                entry.insert((dependency, serde_json::to_string(&[error])?));
            }
        }
        let mut next = Vec::new();
        if !cancels.is_empty() {
            let all: Vec<(i64, i64, &str)> = cancels
                .iter()
                .map(|(&dependent, (dependency, errors))| (*dependency, dependent, errors.as_str()))
                .collect();
            let pending: Vec<i64> = q.exec(
                &f.lock_pending_many,
                params! { "cancels" => serde_json::to_string(&all)? },
            )?;
            if !pending.is_empty() {
                let still: HashSet<i64> = pending.iter().copied().collect();
                let moved: Vec<&(i64, i64, &str)> =
                    all.iter().filter(|c| still.contains(&c.1)).collect();
                let moved = serde_json::to_string(&moved)?;
                q.exec_drop(
                    &f.pending_to_history_many,
                    params! { "cancels" => &moved, "now" => now.param() },
                )?;
                q.exec_drop(
                    &f.delete_pending_many,
                    params! { "ids" => serde_json::to_string(&pending)? },
                )?;
                q.exec_drop(&f.mark_cancelled_many, params! { "cancels" => &moved })?;
                next.extend(pending.into_iter().map(|id| (id, FinalStatus::Cancelled)));
            }
        }
        for (dependency, dependent) in anyway {
            if super::super::sequences::handoff(sql, q, dependency, dependent)? {
                continue;
            }
            let counted = q
                .exec_iter(&f.count_down, params! { "id" => dependent })?
                .affected_rows();
            if counted == 0 {
                continue;
            }
            let left: Option<i64> = q.exec_first(&f.remaining, params! { "id" => dependent })?;
            if left == Some(0) {
                q.exec_drop(
                    &f.release,
                    params! { "id" => dependent, "now" => now.param() },
                )?;
                q.exec_drop(&f.delete_pending, params! { "id" => dependent })?;
                released += 1;
            }
        }
        level = next;
    }
    Ok(released)
}
