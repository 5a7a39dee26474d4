//! The statements of `flows.rs` and `workflows.rs` (job dependencies and
//! workflows on PostgreSQL, in the order of SQLite's), and
//! [`FlowQueries`], which renders them once at connect. Here, below the files
//! that run them, so that `queries/mod.rs` composes them without naming
//! those.

// ---- enqueue ---------------------------------------------------------------

/// As SQLite's `DEPENDENCY_STATE`, one table per statement, each row
/// locked `FOR SHARE`. Parameter: `$1` id.
pub const PENDING_FOR_SHARE: &str = "SELECT 1 FROM {pending} WHERE id = $1 FOR SHARE";
/// See [`PENDING_FOR_SHARE`].
pub const LIVE_FOR_SHARE: &str = "SELECT 1 FROM {jobs} WHERE id = $1 FOR SHARE";
/// See [`PENDING_FOR_SHARE`].
pub const HISTORY_STATUS: &str = "SELECT status FROM {history} WHERE id = $1";

/// The set forms of the three above, for a batch's dependencies (`$1` ids,
/// ascending): the rows locked in id order, so two batches sharing
/// dependencies take them in the same order.
pub const PENDING_MANY_FOR_SHARE: &str =
    "SELECT id, 'pending' FROM {pending} WHERE id = ANY($1) ORDER BY id FOR SHARE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const LIVE_MANY_FOR_SHARE: &str =
    "SELECT id, 'live' FROM {jobs} WHERE id = ANY($1) ORDER BY id FOR SHARE";
/// See [`PENDING_MANY_FOR_SHARE`].
pub const HISTORY_MANY_STATUS: &str = "SELECT id, status FROM {history} WHERE id = ANY($1)";

/// As SQLite's.
pub const INSERT_EDGE: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING";

/// [`INSERT_EDGE`] for a batch's edges, one array per column.
pub const INSERT_EDGES: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled)
SELECT * FROM unnest($1::int8[], $2::int8[], $3::bool[], $4::bool[])
ON CONFLICT DO NOTHING";

/// As SQLite's, moving the row in one statement.
pub const LIVE_TO_PENDING: &str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = $1 RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, $2, created_at
FROM moved";

/// [`LIVE_TO_PENDING`] for a batch: `$1` ids, `$2` their counters.
pub const LIVE_TO_PENDING_MANY: &str = "
WITH moved AS (DELETE FROM {jobs} WHERE id = ANY($1) RETURNING *)
INSERT INTO {pending}
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT m.id, m.queue, m.kind, m.priority, m.payload, m.max_attempts, m.available_at,
       w.remaining, m.created_at
FROM moved AS m JOIN unnest($1::int8[], $2::int4[]) AS w (id, remaining) ON w.id = m.id";

// ---- release ---------------------------------------------------------------

/// As SQLite's.
pub const DEPENDENTS: &str =
    "SELECT dependent, run_anyway FROM {dependencies} WHERE dependency = $1";

/// As SQLite's.
pub const COUNT_DOWN: &str =
    "UPDATE {pending} SET remaining = remaining - 1 WHERE id = $1 RETURNING remaining";

/// [`COUNT_DOWN`] for every dependent of the completed jobs `$1`, by as many
/// as it has edges among them. The rows are locked first in id order (two
/// completers sharing dependents take them in the same order); the
/// `UPDATE` then counts on the latest version of each.
pub const COUNT_DOWN_MANY: &str = "
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
pub const RELEASE_MANY: &str = "
WITH moved AS (DELETE FROM {pending} WHERE id = ANY($2) RETURNING *)
INSERT INTO {jobs}
    (id, queue, kind, priority, payload, max_attempts, available_at, created_at, updated_at)
SELECT id, queue, kind, priority, payload, max_attempts, GREATEST(available_at, {now}),
       created_at, {now}
FROM moved";

/// [`RELEASE_MANY`] for one job (SQLite's `RELEASE`), `$2` its id: derived,
/// not copied, so a change to the release reaches both.
fn release() -> String {
    RELEASE_MANY.replacen("WHERE id = ANY($2)", "WHERE id = $2", 1)
}

/// As SQLite's, moving the row in one statement. `$1` now override, `$2`
/// id, `$3` status, `$4` errors (JSON text).
pub const PENDING_TO_HISTORY: &str = "
WITH moved AS (DELETE FROM {pending} WHERE id = $2 RETURNING *)
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at,
       $4::text::jsonb, FALSE, created_at, {now}, NULL, $3, NULL, NULL, {now}, NULL
FROM moved";

// ---- retry -----------------------------------------------------------------

/// As SQLite's.
pub const CANCELLED_DEPENDENTS: &str =
    "SELECT dependent FROM {dependencies} WHERE dependency = $1 AND cancelled";

/// As SQLite's.
pub const UNMARK_CANCELLED: &str =
    "UPDATE {dependencies} SET cancelled = FALSE WHERE dependency = $1 AND dependent = $2";

/// As SQLite's, moving the row in one statement.
pub const HISTORY_TO_PENDING: &str = "
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

// ---- workflows and inspection ----------------------------------------------

/// As SQLite's. `$1` now override, `$2` name.
pub const INSERT_WORKFLOW: &str =
    "INSERT INTO {workflows} (name, created_at) VALUES ($2, {now}) RETURNING id";

/// As SQLite's.
pub const INSERT_STEP: &str =
    "INSERT INTO {workflow_steps} (workflow_id, step, job_id) VALUES ($1, $2, $3)";

/// As SQLite's.
pub const WORKFLOW: &str = "
SELECT id, name, created_at FROM {workflows}
WHERE id = $1 OR ($1::int8 IS NULL AND name = $2)
ORDER BY id DESC LIMIT 1";

/// As SQLite's.
pub const STEPS: &str =
    "SELECT step, job_id FROM {workflow_steps} WHERE workflow_id = $1 ORDER BY job_id";

/// As SQLite's.
pub const DEPENDENCIES: &str = "
SELECT e.dependency, s.step, h.status, h.result::text
FROM {dependencies} AS e
LEFT JOIN {workflow_steps} AS s ON s.job_id = e.dependency
LEFT JOIN {history} AS h ON h.id = e.dependency
WHERE e.dependent = $1
ORDER BY e.dependency";

/// As SQLite's.
pub const JOB_WORKFLOW: &str = "
SELECT w.id, w.name, s.step
FROM {workflow_steps} AS s JOIN {workflows} AS w ON w.id = s.workflow_id
WHERE s.job_id = $1";

/// As SQLite's.
pub const JOB_BATCH: &str = "SELECT batch_id FROM {batch_jobs} WHERE job_id = $1";

/// As SQLite's.
pub const IS_PENDING: &str = "SELECT 1 FROM {pending} WHERE id = $1";

/// As SQLite's, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL::text AS unique_key, \
     payload::text, 0 AS attempts, max_attempts, available_at, '[]' AS errors, \
     NULL::text AS locked_by, NULL::int8 AS lease_until, NULL::int8 AS first_leased_at, \
     FALSE AS cancel_requested, NULL::text AS result, NULL::int8 AS finished_at, created_at, \
     created_at AS updated_at, 'pending' AS state, NULL::text AS progress, \
     NULL::text AS group_key, NULL::int8 AS aggregated_into";

/// As SQLite's.
pub const COUNT_PENDING: &str = "SELECT queue, 'pending', count(*) FROM {pending} GROUP BY queue";

// ---- the cancel cascade (`flows/cascade.rs`) ------------------------------

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

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub(crate) struct FlowQueries {
    pub pending_for_share: String,
    pub live_for_share: String,
    pub history_status: String,
    pub pending_many_for_share: String,
    pub live_many_for_share: String,
    pub history_many_status: String,
    pub insert_edge: String,
    pub insert_edges: String,
    pub live_to_pending: String,
    pub live_to_pending_many: String,
    pub dependents: String,
    pub count_down: String,
    pub count_down_many: String,
    pub release: String,
    pub release_many: String,
    pub pending_to_history: String,
    pub dependents_many: String,
    pub cancel_pending_many: String,
    pub cancelled_dependents: String,
    pub unmark_cancelled: String,
    pub history_to_pending: String,
    pub insert_workflow: String,
    pub insert_step: String,
    pub workflow: String,
    pub steps: String,
    pub dependencies: String,
    pub job_workflow: String,
    pub job_batch: String,
    pub is_pending: String,
    pub get_pending: String,
    pub list_pending: String,
    pub count_pending: String,
}

impl FlowQueries {
    pub(crate) fn render(r: impl Fn(&str) -> String) -> FlowQueries {
        FlowQueries {
            pending_for_share: r(PENDING_FOR_SHARE),
            live_for_share: r(LIVE_FOR_SHARE),
            history_status: r(HISTORY_STATUS),
            pending_many_for_share: r(PENDING_MANY_FOR_SHARE),
            live_many_for_share: r(LIVE_MANY_FOR_SHARE),
            history_many_status: r(HISTORY_MANY_STATUS),
            insert_edge: r(INSERT_EDGE),
            insert_edges: r(INSERT_EDGES),
            live_to_pending: r(LIVE_TO_PENDING),
            live_to_pending_many: r(LIVE_TO_PENDING_MANY),
            dependents: r(DEPENDENTS),
            count_down: r(COUNT_DOWN),
            count_down_many: r(COUNT_DOWN_MANY),
            release: r(&release()),
            release_many: r(RELEASE_MANY),
            pending_to_history: r(PENDING_TO_HISTORY),
            dependents_many: r(DEPENDENTS_MANY),
            cancel_pending_many: r(CANCEL_PENDING_MANY),
            cancelled_dependents: r(CANCELLED_DEPENDENTS),
            unmark_cancelled: r(UNMARK_CANCELLED),
            history_to_pending: r(HISTORY_TO_PENDING),
            insert_workflow: r(INSERT_WORKFLOW),
            insert_step: r(INSERT_STEP),
            workflow: r(WORKFLOW),
            steps: r(STEPS),
            dependencies: r(DEPENDENCIES),
            job_workflow: r(JOB_WORKFLOW),
            job_batch: r(JOB_BATCH),
            is_pending: r(IS_PENDING),
            get_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE id = $1"
            )),
            list_pending: r(&format!(
                "SELECT {PENDING_COLUMNS} FROM {{pending}} WHERE ($1::text IS NULL OR queue = $1)
                 AND ($2::text IS NULL OR kind = $2) AND id > $3 ORDER BY id LIMIT $4"
            )),
            count_pending: r(COUNT_PENDING),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_release_of_one_job_is_the_release_of_many_for_one_id() {
        let one = super::release();
        assert!(
            one.contains("DELETE FROM {pending} WHERE id = $2 RETURNING"),
            "{one}"
        );
        assert!(!one.contains("ANY("), "{one}");
        assert_eq!(
            one.replace("WHERE id = $2", "WHERE id = ANY($2)"),
            super::RELEASE_MANY
        );
    }
}
