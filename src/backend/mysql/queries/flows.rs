//! The statements of `flows.rs` and `workflows.rs` (job dependencies and
//! workflows on MySQL/MariaDB, in the order of SQLite's): the ones both
//! servers run as MySQL's [`FlowTexts`], then MySQL's own, which
//! [`OwnFlows`] renders once at connect. Here, below the files that run
//! them, so that `queries/mod.rs` composes them without naming those.

use super::Sql;
use crate::backend::statements::FlowTexts;

/// As SQLite's, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL AS unique_key, payload, \
     0 AS attempts, max_attempts, available_at, '[]' AS errors, NULL AS locked_by, \
     NULL AS lease_until, NULL AS first_leased_at, FALSE AS cancel_requested, NULL AS result, \
     NULL AS finished_at, created_at, created_at AS updated_at, 'pending' AS state, \
     NULL AS progress, NULL AS group_key, NULL AS aggregated_into";

impl FlowTexts for Sql {
    // ---- enqueue -------------------------------------------------------
    /// As SQLite's `DEPENDENCY_STATE`, one table per statement, each row
    /// share-locked.
    const PENDING_FOR_SHARE: &'static str =
        "SELECT 1 FROM {pending} WHERE id = :id LOCK IN SHARE MODE";

    /// See [`Self::PENDING_FOR_SHARE`].
    const LIVE_FOR_SHARE: &'static str = "SELECT 1 FROM {jobs} WHERE id = :id LOCK IN SHARE MODE";

    /// See [`Self::PENDING_FOR_SHARE`].
    const HISTORY_STATUS: &'static str = "SELECT status FROM {history} WHERE id = :id";

    /// The set forms of the three above, for a batch's dependencies (`:ids`, a
    /// JSON array, ascending: the rows are locked in id order).
    const PENDING_MANY_FOR_SHARE: &'static str = "
SELECT p.id, 'pending' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = d.id
LOCK IN SHARE MODE";

    /// See [`Self::PENDING_MANY_FOR_SHARE`].
    const LIVE_MANY_FOR_SHARE: &'static str = "
SELECT j.id, 'live' FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = d.id
LOCK IN SHARE MODE";

    /// See [`Self::PENDING_MANY_FOR_SHARE`].
    const HISTORY_MANY_STATUS: &'static str = "
SELECT h.id, h.status FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {history} AS h FORCE INDEX (PRIMARY) ON h.id = d.id";

    /// As SQLite's; `INSERT IGNORE` for `ON CONFLICT DO NOTHING`.
    const INSERT_EDGE: &'static str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
VALUES (:dependency, :dependent, :run_anyway, :cancelled)";

    /// [`Self::INSERT_EDGE`] for a batch's edges: `:edges` a JSON array of
    /// `[dependency, dependent, run_anyway, cancelled]` (the flags 0 or 1).
    const INSERT_EDGES: &'static str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
SELECT e.dependency, e.dependent, e.run_anyway, e.cancelled
FROM JSON_TABLE(:edges, '$[*]' COLUMNS (
    dependency BIGINT PATH '$[0]', dependent BIGINT PATH '$[1]',
    run_anyway TINYINT PATH '$[2]', cancelled TINYINT PATH '$[3]')) AS e";

    /// As SQLite's.
    const LIVE_TO_PENDING: &'static str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, :remaining, created_at
FROM {jobs} WHERE id = :id";

    /// [`Self::LIVE_TO_PENDING`] for a batch: `:waits` a JSON array of
    /// `[id, remaining]`; [`DELETE_LIVE_MANY`] then removes the live rows.
    const LIVE_TO_PENDING_MANY: &'static str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT j.id, j.queue, j.kind, j.priority, j.payload, j.max_attempts, j.available_at,
       w.remaining, j.created_at
FROM JSON_TABLE(:waits, '$[*]' COLUMNS (id BIGINT PATH '$[0]', remaining INT PATH '$[1]')) AS w
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = w.id";

    // ---- release -------------------------------------------------------
    /// As SQLite's.
    const DEPENDENTS: &'static str =
        "SELECT dependent, run_anyway FROM {dependencies} WHERE dependency = :id";

    /// As SQLite's, without `RETURNING` (MariaDB has none for `UPDATE`):
    /// [`REMAINING`] reads the count back, under the row lock this takes.
    const COUNT_DOWN: &'static str =
        "UPDATE {pending} SET remaining = remaining - 1 WHERE id = :id";

    /// [`Self::COUNT_DOWN`] for every dependent of the completed jobs `:ids` (a
    /// JSON array), by as many as it has edges among them (a multi-table
    /// `UPDATE` changes a row once however many rows it joins, hence the `GROUP
    /// BY`); [`FREED`] reads back the ones at 0, under the row locks this
    /// takes.
    const COUNT_DOWN_MANY: &'static str = "
UPDATE (SELECT e.dependent, COUNT(*) AS n
        FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
        STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
        GROUP BY e.dependent) AS c
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = c.dependent
SET p.remaining = p.remaining - c.n";

    /// As SQLite's.
    fn release() -> String {
        "
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, errors, max_attempts, available_at, created_at,
     updated_at)
SELECT id, queue, kind, priority, payload, '[]', max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM {pending} WHERE id = :id"
            .into()
    }

    /// [`Self::release`] for a batch: `:ids` a JSON array;
    /// [`DELETE_PENDING_MANY`] then removes the pending rows.
    const RELEASE_MANY: &'static str = "
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, errors, max_attempts, available_at, created_at,
     updated_at)
SELECT p.id, p.queue, p.kind, p.priority, p.payload, '[]', p.max_attempts,
       GREATEST(p.available_at, {now}), p.created_at, {now}
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS r
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = r.id";

    /// As SQLite's. `:errors` is the JSON array of one entry.
    const PENDING_TO_HISTORY: &'static str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at, :errors, FALSE,
       created_at, {now}, NULL, :status, NULL, NULL, {now}, NULL
FROM {pending} WHERE id = :id";

    /// As SQLite's.
    const DELETE_PENDING: &'static str = "DELETE FROM {pending} WHERE id = :id";

    // ---- retry ---------------------------------------------------------
    /// As SQLite's.
    const CANCELLED_DEPENDENTS: &'static str =
        "SELECT dependent FROM {dependencies} WHERE dependency = :id AND cancelled";

    /// As SQLite's.
    const UNMARK_CANCELLED: &'static str = "
UPDATE {dependencies} SET cancelled = FALSE
WHERE dependency = :dependency AND dependent = :dependent";

    /// As SQLite's.
    const HISTORY_TO_PENDING: &'static str = "
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT h.id, h.queue, h.kind, h.priority, h.payload, h.max_attempts, h.available_at,
       (SELECT COUNT(*) FROM {dependencies} AS e
        LEFT JOIN {history} AS d ON d.id = e.dependency
        WHERE e.dependent = h.id
          AND (d.id IS NULL OR (d.status <> 'completed' AND NOT e.run_anyway))),
       h.created_at
FROM {history} AS h WHERE h.id = :id AND h.status = 'cancelled'";

    // ---- workflows and inspection --------------------------------------
    /// As SQLite's.
    const INSERT_WORKFLOW: &'static str =
        "INSERT INTO {workflows} (name, created_at) VALUES (:name, {now})";

    /// As SQLite's.
    const INSERT_STEP: &'static str = "
INSERT INTO {workflow_steps} (workflow_id, step, job_id) VALUES (:workflow, :step, :job)";

    /// As SQLite's.
    const WORKFLOW: &'static str = "
SELECT id, name, created_at FROM {workflows}
WHERE id = :id OR (:id IS NULL AND name = :name)
ORDER BY id DESC LIMIT 1";

    /// As SQLite's.
    const STEPS: &'static str =
        "SELECT step, job_id FROM {workflow_steps} WHERE workflow_id = :id ORDER BY job_id";

    /// As SQLite's.
    const DEPENDENCIES: &'static str = "
SELECT e.dependency, s.step, h.status, h.result
FROM {dependencies} AS e
LEFT JOIN {workflow_steps} AS s ON s.job_id = e.dependency
LEFT JOIN {history} AS h ON h.id = e.dependency
WHERE e.dependent = :id
ORDER BY e.dependency";

    /// As SQLite's.
    const JOB_WORKFLOW: &'static str = "
SELECT w.id, w.name, s.step
FROM {workflow_steps} AS s JOIN {workflows} AS w ON w.id = s.workflow_id
WHERE s.job_id = :id";

    /// As SQLite's.
    const JOB_BATCH: &'static str = "SELECT batch_id FROM {batch_jobs} WHERE job_id = :id";

    /// As SQLite's.
    const IS_PENDING: &'static str = "SELECT 1 FROM {pending} WHERE id = :id";

    /// As SQLite's.
    const COUNT_PENDING: &'static str =
        "\nSELECT queue, 'pending', COUNT(*) FROM {pending} GROUP BY queue";

    // ---- the cancel cascade (`flows/cascade.rs`) ----------------------
    /// The edges out of the jobs `:ids` (a JSON array) that ended without
    /// completing, by dependency then dependent: one level of a cancel cascade.
    const DEPENDENTS_MANY: &'static str = "
SELECT e.dependency, e.dependent, e.run_anyway
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
ORDER BY e.dependency, e.dependent";
}

// ---- MySQL's own: what PostgreSQL's `RETURNING` and statements in a `WITH`
// do there ------------------------------------------------------------------

/// See [`Sql::LIVE_TO_PENDING_MANY`].
pub const DELETE_LIVE_MANY: &str = "
DELETE j FROM JSON_TABLE(:waits, '$[*]' COLUMNS (id BIGINT PATH '$[0]')) AS w
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = w.id";

/// See [`Sql::COUNT_DOWN`].
pub const REMAINING: &str = "SELECT remaining FROM {pending} WHERE id = :id";

/// See [`Sql::COUNT_DOWN_MANY`].
pub const FREED: &str = "
SELECT DISTINCT p.id FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS d
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = d.id
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = e.dependent
WHERE p.remaining = 0";

/// See [`Sql::RELEASE_MANY`].
pub const DELETE_PENDING_MANY: &str = "
DELETE p FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS r
STRAIGHT_JOIN {pending} AS p FORCE INDEX (PRIMARY) ON p.id = r.id";

/// Counts a transaction that released jobs, for other nodes' pollers.
pub const BUMP_RELEASES: &str = "
INSERT INTO {releases} (one, n) VALUES (1, 1) ON DUPLICATE KEY UPDATE n = n + 1";

/// As SQLite's.
pub const DELETE_HISTORY: &str = "DELETE FROM {history} WHERE id = :id";

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

/// MySQL's own statements of flows, rendered once at connect: the `own`
/// of its `FlowStatements`. The pending reads are here too, built from
/// [`PENDING_COLUMNS`] rather than written out.
#[derive(Debug)]
pub struct OwnFlows {
    pub delete_live_many: String,
    pub remaining: String,
    pub freed: String,
    pub delete_pending_many: String,
    pub bump_releases: String,
    pub delete_history: String,
    pub lock_pending_many: String,
    pub pending_to_history_many: String,
    pub mark_cancelled_many: String,
    pub get_pending: String,
    pub list_pending: String,
}

impl OwnFlows {
    pub fn new(r: impl Fn(&str) -> String) -> OwnFlows {
        OwnFlows {
            delete_live_many: r(DELETE_LIVE_MANY),
            remaining: r(REMAINING),
            freed: r(FREED),
            delete_pending_many: r(DELETE_PENDING_MANY),
            bump_releases: r(BUMP_RELEASES),
            delete_history: r(DELETE_HISTORY),
            lock_pending_many: r(LOCK_PENDING_MANY),
            pending_to_history_many: r(PENDING_TO_HISTORY_MANY),
            mark_cancelled_many: r(MARK_CANCELLED_MANY),
            get_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE id = :id"
            )),
            list_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}}
                 WHERE (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 AND id > :after ORDER BY id LIMIT :limit"
            )),
        }
    }
}
