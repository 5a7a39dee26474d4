//! The statements of `flows.rs` and `workflows.rs` (job dependencies and
//! workflows on PostgreSQL, in the order of SQLite's): the ones both servers
//! run as PostgreSQL's [`FlowTexts`], then PostgreSQL's own, which
//! [`OwnFlows`] renders once at connect. Here, below the files that run
//! them, so that `queries/mod.rs` composes them without naming those.

use super::Queries;
use crate::backend::statements::FlowTexts;

/// As SQLite's, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL::text AS unique_key, \
     payload::text, 0 AS attempts, max_attempts, available_at, '[]' AS errors, \
     NULL::text AS locked_by, NULL::int8 AS lease_until, NULL::int8 AS first_leased_at, \
     FALSE AS cancel_requested, NULL::text AS result, NULL::int8 AS finished_at, created_at, \
     created_at AS updated_at, 'pending' AS state, NULL::text AS progress, \
     NULL::text AS group_key, NULL::int8 AS aggregated_into";

impl FlowTexts for Queries {
    // ---- enqueue -------------------------------------------------------
    /// As SQLite's `DEPENDENCY_STATE`, one table per statement, each row
    /// locked `FOR SHARE`. Parameter: `$1` id.
    const PENDING_FOR_SHARE: &'static str = "SELECT 1 FROM {pending} WHERE id = $1 FOR SHARE";

    /// See [`Self::PENDING_FOR_SHARE`].
    const LIVE_FOR_SHARE: &'static str = "SELECT 1 FROM {jobs} WHERE id = $1 FOR SHARE";

    /// See [`Self::PENDING_FOR_SHARE`].
    const HISTORY_STATUS: &'static str = "SELECT status FROM {history} WHERE id = $1";

    /// The set forms of the three above, for a batch's dependencies (`$1` ids,
    /// ascending): the rows locked in id order, so two batches sharing
    /// dependencies take them in the same order.
    const PENDING_MANY_FOR_SHARE: &'static str =
        "SELECT id, 'pending' FROM {pending} WHERE id = ANY($1) ORDER BY id FOR SHARE";

    /// See [`Self::PENDING_MANY_FOR_SHARE`].
    const LIVE_MANY_FOR_SHARE: &'static str =
        "SELECT id, 'live' FROM {jobs} WHERE id = ANY($1) ORDER BY id FOR SHARE";

    /// See [`Self::PENDING_MANY_FOR_SHARE`].
    const HISTORY_MANY_STATUS: &'static str = "SELECT id, status FROM {history} WHERE id = ANY($1)";

    /// As SQLite's.
    const INSERT_EDGE: &'static str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING";

    /// [`Self::INSERT_EDGE`] for a batch's edges, one array per column.
    const INSERT_EDGES: &'static str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
SELECT * FROM unnest($1::int8[], $2::int8[], $3::bool[], $4::bool[])
ON CONFLICT DO NOTHING";

    /// As SQLite's, moving the row in one statement.
    const LIVE_TO_PENDING: &'static str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = $1 RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, $2, created_at
FROM moved";

    /// [`Self::LIVE_TO_PENDING`] for a batch: `$1` ids, `$2` their counters.
    const LIVE_TO_PENDING_MANY: &'static str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = ANY($1) RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT m.id, m.queue, m.kind, m.priority, m.payload, m.max_attempts, m.available_at,
       w.remaining, m.created_at
FROM moved AS m JOIN unnest($1::int8[], $2::int4[]) AS w (id, remaining) ON w.id = m.id";

    // ---- release -------------------------------------------------------
    /// As SQLite's.
    const DEPENDENTS: &'static str =
        "SELECT dependent, run_anyway FROM {dependencies} WHERE dependency = $1";

    /// As SQLite's.
    const COUNT_DOWN: &'static str =
        "UPDATE {pending} SET remaining = remaining - 1 WHERE id = $1 RETURNING remaining";

    /// [`Self::COUNT_DOWN`] for every dependent of the completed jobs `$1`, by
    /// as many as it has edges among them. The rows are locked first in id
    /// order (two completers sharing dependents take them in the same order);
    /// the `UPDATE` then counts on the latest version of each.
    const COUNT_DOWN_MANY: &'static str = "
WITH e AS (
    SELECT dependent, count(*)::int4 AS n FROM {dependencies}
    WHERE dependency = ANY($1) GROUP BY dependent
), locked AS (
    SELECT p.id FROM {pending} AS p JOIN e ON e.dependent = p.id
    ORDER BY p.id FOR UPDATE OF p
)
UPDATE {pending} AS p SET remaining = p.remaining - e.n
FROM e JOIN locked ON locked.id = e.dependent
WHERE p.id = e.dependent
RETURNING p.id, p.remaining";

    /// As SQLite's `RELEASE`, moving the row in one statement, for a batch:
    /// `$1` now override, `$2` ids.
    const RELEASE_MANY: &'static str = "
WITH moved AS (DELETE FROM {pending} WHERE id = ANY($2) RETURNING *)
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, max_attempts, available_at, created_at, updated_at)
SELECT id, queue, kind, priority, payload, max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM moved";

    /// [`Self::RELEASE_MANY`] for one job (SQLite's `RELEASE`), `$2` its id:
    /// derived, not copied, so a change to the release reaches both.
    fn release() -> String {
        Self::RELEASE_MANY.replacen("WHERE id = ANY($2)", "WHERE id = $2", 1)
    }

    /// As SQLite's, moving the row in one statement. `$1` now override, `$2`
    /// id, `$3` status, `$4` errors (JSON text).
    const PENDING_TO_HISTORY: &'static str = "
WITH moved AS (DELETE FROM {pending} WHERE id = $2 RETURNING *)
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at,
       $4::text::jsonb, FALSE, created_at, {now}, NULL, $3, NULL, NULL, {now}, NULL
FROM moved";

    /// As SQLite's. Parameter: `$1` id.
    const DELETE_PENDING: &'static str = "DELETE FROM {pending} WHERE id = $1";

    // ---- retry ---------------------------------------------------------
    /// As SQLite's.
    const CANCELLED_DEPENDENTS: &'static str =
        "SELECT dependent FROM {dependencies} WHERE dependency = $1 AND cancelled";

    /// As SQLite's.
    const UNMARK_CANCELLED: &'static str =
        "UPDATE {dependencies} SET cancelled = FALSE WHERE dependency = $1 AND dependent = $2";

    /// As SQLite's, moving the row in one statement.
    const HISTORY_TO_PENDING: &'static str = "
WITH moved AS (DELETE FROM {history} WHERE id = $1 AND status = 'cancelled' RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT m.id, m.queue, m.kind, m.priority, m.payload, m.max_attempts, m.available_at,
       (SELECT count(*) FROM {dependencies} AS e
        LEFT JOIN {history} AS d ON d.id = e.dependency
        WHERE e.dependent = m.id
          AND (d.id IS NULL OR (d.status <> 'completed' AND NOT e.run_anyway))),
       m.created_at
FROM moved AS m";

    // ---- workflows and inspection --------------------------------------
    /// As SQLite's. `$1` now override, `$2` name.
    const INSERT_WORKFLOW: &'static str =
        "INSERT INTO {workflows} (name, created_at) VALUES ($2, {now}) RETURNING id";

    /// As SQLite's.
    const INSERT_STEP: &'static str =
        "INSERT INTO {workflow_steps} (workflow_id, step, job_id) VALUES ($1, $2, $3)";

    /// As SQLite's.
    const WORKFLOW: &'static str = "
SELECT id, name, created_at FROM {workflows}
WHERE id = $1 OR ($1::int8 IS NULL AND name = $2)
ORDER BY id DESC LIMIT 1";

    /// As SQLite's.
    const STEPS: &'static str =
        "SELECT step, job_id FROM {workflow_steps} WHERE workflow_id = $1 ORDER BY job_id";

    /// As SQLite's.
    const DEPENDENCIES: &'static str = "
SELECT e.dependency, s.step, h.status, h.result::text
FROM {dependencies} AS e
LEFT JOIN {workflow_steps} AS s ON s.job_id = e.dependency
LEFT JOIN {history} AS h ON h.id = e.dependency
WHERE e.dependent = $1
ORDER BY e.dependency";

    /// As SQLite's.
    const JOB_WORKFLOW: &'static str = "
SELECT w.id, w.name, s.step
FROM {workflow_steps} AS s JOIN {workflows} AS w ON w.id = s.workflow_id
WHERE s.job_id = $1";

    /// As SQLite's.
    const JOB_BATCH: &'static str = "SELECT batch_id FROM {batch_jobs} WHERE job_id = $1";

    /// As SQLite's.
    const IS_PENDING: &'static str = "SELECT 1 FROM {pending} WHERE id = $1";

    /// As SQLite's.
    const COUNT_PENDING: &'static str =
        "SELECT queue, 'pending', count(*) FROM {pending} GROUP BY queue";

    // ---- the cancel cascade (`flows/cascade.rs`) ----------------------
    /// The edges out of the jobs `$1` that ended without completing, by
    /// dependency then dependent: one level of a cancel cascade.
    const DEPENDENTS_MANY: &'static str = "
SELECT dependency, dependent, run_anyway FROM {dependencies}
WHERE dependency = ANY($1) ORDER BY dependency, dependent";
}

// ---- PostgreSQL's own ------------------------------------------------------

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

/// PostgreSQL's own statements of flows, rendered once at connect: the `own`
/// of its `FlowStatements`. The pending reads are here too, built from
/// [`PENDING_COLUMNS`] rather than written out.
#[derive(Debug)]
pub(crate) struct OwnFlows {
    pub cancel_pending_many: String,
    pub get_pending: String,
    pub list_pending: String,
}

impl OwnFlows {
    pub(crate) fn render(r: impl Fn(&str) -> String) -> OwnFlows {
        OwnFlows {
            cancel_pending_many: r(CANCEL_PENDING_MANY),
            get_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE id = $1"
            )),
            list_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE ($1::text IS NULL OR queue = $1)
                 AND ($2::text IS NULL OR kind = $2) AND id > $3 ORDER BY id LIMIT $4"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::statements::FlowTexts;

    #[test]
    fn the_release_of_one_job_is_the_release_of_many_for_one_id() {
        let one = <super::Queries as FlowTexts>::release();
        assert!(
            one.contains("DELETE FROM {pending} WHERE id = $2 RETURNING"),
            "{one}"
        );
        assert!(!one.contains("ANY("), "{one}");
        assert_eq!(
            one.replace("WHERE id = $2", "WHERE id = ANY($2)"),
            super::Queries::RELEASE_MANY
        );
    }
}
