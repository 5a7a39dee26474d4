//! Every SQL statement of the SQLite backend, in the order of a job's life:
//! enqueue, lease, settle (complete/fail/snooze/discard/release), heartbeat,
//! rescue, then inspection and maintenance.
//!
//! Times are unix microseconds bound from the engine's clock; every value is a
//! bound parameter, never spliced into the text.

// ---- enqueue ---------------------------------------------------------------

/// Inserts one job, due (in the lease indexes) when `available_at <= now`;
/// a unique-key conflict inserts nothing (no row changed).
/// The id is read with `last_insert_rowid()`: a `RETURNING id` here makes
/// SQLite open an ephemeral table on every insert (about a third of
/// `enqueue_many`'s time in the benchmarks).
pub const ENQUEUE: &str = "
INSERT INTO backlog_jobs
    (queue, kind, priority, unique_key, payload, max_attempts, available_at, due, created_at,
     updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7 <= ?8, ?8, ?8)
ON CONFLICT DO NOTHING";

/// The live job holding a unique key.
pub const FIND_LIVE_UNIQUE: &str =
    "SELECT id FROM backlog_jobs WHERE queue = ?1 AND unique_key = ?2";

/// The most recent finished job holding a unique key since a time, of the
/// statuses of `?4` (a JSON array of status names; NULL: any).
pub const FIND_HISTORY_UNIQUE: &str = "
SELECT id FROM backlog_history
WHERE queue = ?1 AND unique_key = ?2 AND finished_at >= ?3
  AND (?4 IS NULL OR status IN (SELECT value FROM json_each(?4)))
ORDER BY finished_at DESC LIMIT 1";

// ---- lease -----------------------------------------------------------------

/// Moves up to `?2` jobs whose time came (`available_at <= ?1`) into the lease
/// indexes, oldest first: a seek of `backlog_jobs_scheduled` that finds
/// nothing when nothing came due. The first statement of every lease.
pub const PROMOTE_DUE: &str = "
UPDATE backlog_jobs SET due = 1
WHERE id IN (SELECT id FROM backlog_jobs
             WHERE lease_token IS NULL AND NOT due AND available_at <= ?1
             ORDER BY available_at LIMIT ?2)";

/// The names of the paused queues: a lease leaves them out before it walks.
pub const PAUSED_QUEUES: &str = "SELECT name FROM backlog_queues WHERE paused ORDER BY name";

/// The queues a lease must treat apart: paused ones (skipped) and limited
/// ones (claimed up to their room, see `crate::limits`). A handful of rows.
pub const QUEUE_CONTROLS: &str = "
SELECT name, paused, concurrency_limit, rate_limit, rate_period_ms, rate_window_start,
       rate_window_count
FROM backlog_queues
WHERE paused OR concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL";

/// The running jobs of queue `?1`, read from `backlog_jobs_running`.
pub const COUNT_QUEUE_RUNNING: &str = "
SELECT count(*) FROM backlog_jobs INDEXED BY backlog_jobs_running
WHERE queue = ?1 AND lease_token IS NOT NULL";

/// Stores queue `?1`'s rate window after a lease: its start `?2` (unix µs)
/// and the jobs started in it `?3`.
pub const SET_RATE_WINDOW: &str = "
UPDATE backlog_queues SET rate_window_start = ?2, rate_window_count = ?3 WHERE name = ?1";

/// The candidates of one walk: a queue (`?{queue}`), and a kind (`?{kind}`)
/// when the lease names kinds, in claim order, stopping after `?4` rows.
/// Parameters: `?1` now, `?4` limit.
///
/// Each (queue, kind) pair gets its own walk of `backlog_jobs_lease_kind` (or
/// each queue of `backlog_jobs_lease`), merged by [`lease`], because SQLite
/// cannot read one index in order across several `IN (..)` values: it would
/// sort every runnable job. Only due, unleased jobs are in these indexes, so
/// no walk passes a job it cannot claim (`available_at <= ?1` is a guard for
/// a clock set back by hand).
pub fn lease_candidates(queue: usize, kind: Option<usize>) -> String {
    let (index, kind) = match kind {
        Some(k) => ("backlog_jobs_lease_kind", format!("AND kind = ?{k}")),
        None => ("backlog_jobs_lease", String::new()),
    };
    format!(
        "SELECT id, priority, available_at FROM backlog_jobs INDEXED BY {index}
         WHERE queue = ?{queue} {kind} AND lease_token IS NULL AND due AND available_at <= ?1
         ORDER BY priority DESC, available_at, id LIMIT ?4"
    )
}

/// Claims the candidates in one statement: `attempts + 1`, a fresh random
/// token per row, the lease expiry and the worker. Parameters: `?1` now, `?2`
/// lease_until, `?3` worker id, `?4` limit, `?5..` the queues, then the
/// kinds (if any).
///
/// The single SQLite writer makes the sub-select and the update atomic; the
/// rows come back in no particular order and are sorted by the caller.
pub fn lease(queues: usize, kinds: usize) -> String {
    let walks: Vec<String> = (0..queues)
        .flat_map(|q| {
            let kinds: Vec<Option<usize>> = if kinds == 0 {
                vec![None]
            } else {
                (0..kinds).map(|k| Some(5 + queues + k)).collect()
            };
            kinds.into_iter().map(move |k| lease_candidates(5 + q, k))
        })
        .collect();
    let candidates = if walks.len() == 1 {
        walks.into_iter().next().unwrap_or_default()
    } else {
        // Merge the walks: at most limit × walks rows are sorted.
        let walks: Vec<String> = walks
            .into_iter()
            .map(|w| format!("SELECT * FROM ({w})"))
            .collect();
        format!(
            "SELECT id FROM ({}) ORDER BY priority DESC, available_at, id LIMIT ?4",
            walks.join(" UNION ALL ")
        )
    };
    format!(
        "UPDATE backlog_jobs
         SET attempts = attempts + 1, lease_token = random(), lease_until = ?2, locked_by = ?3,
             first_leased_at = COALESCE(first_leased_at, ?1), updated_at = ?1
         WHERE id IN (SELECT id FROM ({candidates}))
         RETURNING {LEASED_COLUMNS}"
    )
}

/// What a lease returns, in the order `jobs::leased_job` reads it.
pub const LEASED_COLUMNS: &str = "id, lease_token, queue, kind, priority, unique_key, payload, \
     attempts, max_attempts, available_at, lease_until, created_at";

/// When the next job of the queues in `?1` (a JSON array) that waits
/// outside the lease indexes comes due: the fetcher sleeps until then. A walk
/// of `backlog_jobs_scheduled` from its start, stopping at the first row of a
/// wanted queue.
pub const NEXT_DUE: &str = "
SELECT min(available_at) FROM backlog_jobs
WHERE lease_token IS NULL AND NOT due AND queue IN (SELECT value FROM json_each(?1))";

// ---- settle ----------------------------------------------------------------

/// `errors` with `?E` appended (when not NULL), keeping the last 20.
macro_rules! append_error {
    ($param:literal) => {
        concat!(
            "CASE WHEN ",
            $param,
            " IS NULL THEN errors
                  WHEN json_array_length(errors) >= 20
                  THEN json_insert(json_remove(errors, '$[0]'), '$[#]', json(",
            $param,
            "))
                  ELSE json_insert(errors, '$[#]', json(",
            $param,
            ")) END"
        )
    };
}

/// Copies a live job into history with its final status. Fenced: `?2` is the
/// lease token, or NULL for a job that is not leased (operator cancel).
/// Parameters: `?1` id, `?2` token, `?3` now, `?4` result, `?5` status,
/// `?6` error entry JSON or NULL.
pub const FINISH_TO_HISTORY: &str = concat!(
    "INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at, ",
    append_error!("?6"),
    ", cancel_requested, created_at, ?3, ?4, ?5, locked_by, first_leased_at, ?3, progress
FROM backlog_jobs WHERE id = ?1 AND lease_token IS ?2"
);

/// Removes the live row after [`FINISH_TO_HISTORY`] copied it.
pub const DELETE_LIVE: &str = "DELETE FROM backlog_jobs WHERE id = ?1";

/// Unleases a job and schedules its next run. Fenced on the token. Parameters:
/// `?1` id, `?2` token, `?3` available_at, `?4` attempts to give back (0 or 1),
/// `?5` error entry JSON or NULL, `?6` now. Returns whether a cancel was
/// requested meanwhile, so the caller can honour it instead.
pub const RESCHEDULE: &str = concat!(
    "UPDATE backlog_jobs
SET lease_token = NULL, lease_until = NULL, locked_by = NULL, available_at = ?3, due = ?3 <= ?6,
    attempts = attempts - ?4, updated_at = ?6, errors = ",
    append_error!("?5"),
    "
WHERE id = ?1 AND lease_token = ?2
RETURNING cancel_requested"
);

/// Whether a lease is still held: the fence a transactional completion checks
/// before the caller's effects run. Parameters: `?1` id, `?2` token.
pub const LEASE_HELD: &str = "SELECT 1 FROM backlog_jobs WHERE id = ?1 AND lease_token = ?2";

/// Writes a running job's progress (`?3`, JSON text), fenced on its lease:
/// no row changes when `?1`'s lease is no longer `?2`. `?4` is now.
pub const WRITE_PROGRESS: &str = "UPDATE backlog_jobs SET progress = ?3, updated_at = ?4 \
     WHERE id = ?1 AND lease_token = ?2";

// ---- heartbeat -------------------------------------------------------------

/// Extends every given lease still held, in one statement. `?3` is a JSON
/// array of `[id, token]` pairs; a pair that matches no row was lost.
pub const HEARTBEAT: &str = "
UPDATE backlog_jobs SET lease_until = ?1, updated_at = ?2
FROM (SELECT value ->> 0 AS id, value ->> 1 AS token FROM json_each(?3)) AS held
WHERE backlog_jobs.id = held.id AND backlog_jobs.lease_token = held.token
RETURNING backlog_jobs.id, backlog_jobs.lease_token, backlog_jobs.cancel_requested";

// ---- rescue ----------------------------------------------------------------

/// Leases that expired before `?1`, oldest first, at most `?2`, read from
/// `backlog_jobs_expiry`. No payloads.
pub const EXPIRED_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested FROM backlog_jobs
WHERE lease_token IS NOT NULL AND lease_until < ?1
ORDER BY lease_until LIMIT ?2";

/// The leases of worker `?1` whose ids are not in `?2` (a JSON array of the
/// ids it holds), by id: claims whose answer never reached it. Read from
/// `backlog_jobs_expiry`, which holds only leased jobs. No payloads.
pub const UNHELD_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested
FROM backlog_jobs INDEXED BY backlog_jobs_expiry
WHERE lease_token IS NOT NULL AND locked_by = ?1
  AND id NOT IN (SELECT value FROM json_each(?2))
ORDER BY id";

// ---- inspect ---------------------------------------------------------------

// A job's record columns are `backend/record.rs`'s.

/// Waiting group members per queue.
pub const COUNT_GROUPED: &str =
    "SELECT queue, 'grouped', count(*) FROM backlog_group_members GROUP BY queue";

// The live-state conditions and `COUNT_LIVE` are `backend/live_state.rs`'s.

/// Finished jobs per queue and status.
pub const COUNT_HISTORY: &str = "SELECT queue, status, count(*) FROM backlog_history GROUP BY 1, 2";

/// Moves a finished job back to live, attempts reset, due at `?2`.
pub const RETRY_FROM_HISTORY: &str = "
INSERT INTO backlog_jobs
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, due)
SELECT id, queue, kind, priority, unique_key, payload, 0, max_attempts, ?2,
       errors, 0, created_at, ?2, 1
FROM backlog_history WHERE id = ?1
ON CONFLICT DO NOTHING";

/// Removes a finished job.
pub const DELETE_HISTORY: &str = "DELETE FROM backlog_history WHERE id = ?1";

/// Makes an unleased live job due now (`?2`), unless it is due already: a
/// job keeps its place in line.
pub const RUN_NOW: &str = "UPDATE backlog_jobs SET available_at = min(available_at, ?2), \
     due = 1, updated_at = ?2 WHERE id = ?1 AND lease_token IS NULL";

/// Flags a running job for cancellation; the next heartbeat reports it.
pub const REQUEST_CANCEL: &str = "UPDATE backlog_jobs SET cancel_requested = 1, updated_at = ?2 \
     WHERE id = ?1 AND lease_token IS NOT NULL";

/// The lease state of a live job: its token (NULL when not leased).
pub const LIVE_LEASE: &str = "SELECT lease_token FROM backlog_jobs WHERE id = ?1";

/// A finished job's status.
pub const HISTORY_STATUS: &str = "SELECT status FROM backlog_history WHERE id = ?1";

/// Pauses or resumes a queue.
pub const SET_PAUSED: &str = "
INSERT INTO backlog_queues (name, paused, updated_at) VALUES (?1, ?2, ?3)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at";

/// Sets queue `?1`'s limits: `?2` concurrency, `?3` rate limit, `?4` rate
/// period (ms), NULL for none; `?5` now. The rate window is kept: a new
/// period starts a new window by itself (its start no longer matches).
pub const SET_LIMITS: &str = "
INSERT INTO backlog_queues (name, concurrency_limit, rate_limit, rate_period_ms, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit,
    rate_limit = excluded.rate_limit, rate_period_ms = excluded.rate_period_ms,
    updated_at = excluded.updated_at";

/// Every queue with a limit, by name.
pub const LIMITS: &str = "
SELECT name, concurrency_limit, rate_limit, rate_period_ms FROM backlog_queues
WHERE concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL ORDER BY name";

/// Changes an unleased live job; a NULL parameter keeps the column.
/// Parameters: `?1` id, `?2` priority, `?3` available_at, `?4` queue, `?5`
/// now. `due` follows the new time, so the job is in the lease indexes
/// exactly when it can run. `OR IGNORE`: a move onto a unique key the target
/// queue already holds changes no row instead of failing, and the caller
/// reports it.
pub const UPDATE_WAITING: &str = "
UPDATE OR IGNORE backlog_jobs
SET priority = coalesce(?2, priority), available_at = coalesce(?3, available_at),
    due = coalesce(?3, available_at) <= ?5, queue = coalesce(?4, queue), updated_at = ?5
WHERE id = ?1 AND lease_token IS NULL";

/// Unleased jobs per queue: how many are due at `?1`, how many of the rest
/// were attempted before (retrying), and all of them. In two parts, each read
/// from its own partial index instead of the table and its payloads (a scan
/// of the table, as `live_state::count`, costs several times more at a million
/// jobs): the due jobs from `backlog_jobs_lease`, which holds everything but
/// `attempts` (only a job due later, which a due job rarely is, is looked up
/// for it) ...
pub const COUNT_WAITING_DUE: &str = "
SELECT queue, sum(available_at <= ?1),
       sum(CASE WHEN available_at <= ?1 THEN 0 WHEN attempts > 0 THEN 1 ELSE 0 END), count(*)
FROM backlog_jobs WHERE lease_token IS NULL AND due GROUP BY queue";

/// ... and the jobs not due yet from `backlog_jobs_scheduled`, each looked
/// up for its queue.
pub const COUNT_WAITING_LATER: &str = "
SELECT queue, sum(available_at <= ?1),
       sum(CASE WHEN available_at <= ?1 THEN 0 WHEN attempts > 0 THEN 1 ELSE 0 END), count(*)
FROM backlog_jobs WHERE lease_token IS NULL AND NOT due GROUP BY queue";

/// Leased jobs per queue, through `backlog_jobs_running` (covering, in
/// queue order; V5).
pub const COUNT_RUNNING: &str = "
SELECT queue, 'running', count(*) FROM backlog_jobs WHERE lease_token IS NOT NULL GROUP BY queue";

/// Dead jobs per queue: the dead-letter count. Walks only the `dead` range
/// of `backlog_history_finished`, never the rest of history.
pub const COUNT_DEAD: &str = "
SELECT queue, 'dead', count(*) FROM backlog_history WHERE status = 'dead' GROUP BY queue";

/// Completed jobs per queue since `?1` (and since `?2`, a later time), from
/// the `completed` range of `backlog_history_finished`.
pub const COUNT_RECENT_COMPLETIONS: &str = "
SELECT queue, count(*), sum(finished_at >= ?2) FROM backlog_history
WHERE status = 'completed' AND finished_at >= ?1 GROUP BY queue";

/// Finished jobs per queue, status and minute ago since `?1`, at now `?2`.
/// The `status IN` list lets the `(status, finished_at)` index serve it.
pub const COUNT_FINISHED_PER_MINUTE: &str = "
SELECT queue, status, max(?2 - finished_at, 0) / 60000000, count(*) FROM backlog_history
WHERE status IN ('completed', 'discarded', 'cancelled', 'dead') AND finished_at >= ?1
GROUP BY 1, 2, 3";

/// The jobs holding unique key `?2` in queue `?1`: the live one, then up
/// to `?3` finished ones, most recent first; both through the unique indexes.
pub const FIND_UNIQUE: &str = "
SELECT id FROM backlog_jobs WHERE queue = ?1 AND unique_key = ?2
UNION ALL
SELECT id FROM (
    SELECT id FROM backlog_history WHERE queue = ?1 AND unique_key = ?2
    ORDER BY finished_at DESC LIMIT ?3
)";

/// How many of backlog's tables a file has, and how many tables in all: a
/// read-only look before a tool opens a file it must not convert.
pub const PROBE_TABLES: &str = "
SELECT count(*) FILTER (WHERE name IN ('backlog_jobs', 'backlog_history', 'backlog_queues')),
       count(*)
FROM sqlite_master WHERE type = 'table'";

// ---- groups ----------------------------------------------------------------

/// Moves a job [`ENQUEUE`] just inserted (`?1`, so that it has an id from the
/// jobs' sequence) into its group `?2`; [`DELETE_LIVE`] then removes the live
/// row, in the same transaction.
pub const JOIN_GROUP_MEMBER: &str = "
INSERT INTO backlog_group_members
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
SELECT id, queue, kind, ?2, priority, payload, max_attempts, created_at
FROM backlog_jobs WHERE id = ?1";

/// Counts a new member into its group, creating the group, and sets the
/// group's policy (the newest enqueue's) and when it is ready: now when it
/// is full, else the earlier of a grace period after this member and the
/// max delay after the first. Parameters: `?1` queue, `?2` kind, `?3` group
/// key, `?4` max size, `?5` grace (µs), `?6` max delay (µs), `?7` now.
pub const JOIN_GROUP: &str = "
INSERT INTO backlog_groups
    (queue, kind, group_key, max_size, grace_us, max_delay_us, size, first_at, last_at, ready_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?7, CASE WHEN ?4 <= 1 THEN ?7 ELSE ?7 + min(?5, ?6) END)
ON CONFLICT (queue, kind, group_key) DO UPDATE SET
    max_size = excluded.max_size, grace_us = excluded.grace_us,
    max_delay_us = excluded.max_delay_us, size = size + 1, last_at = excluded.last_at,
    ready_at = CASE WHEN size + 1 >= excluded.max_size THEN excluded.last_at
                    ELSE min(excluded.last_at + excluded.grace_us,
                             first_at + excluded.max_delay_us) END";

/// Up to `?2` groups ready at `?1`, the longest ready first, through
/// `backlog_groups_ready`.
pub const READY_GROUPS: &str = "
SELECT queue, kind, group_key, max_size FROM backlog_groups
WHERE ready_at <= ?1 ORDER BY ready_at LIMIT ?2";

/// A group's oldest `?4` members.
pub const GROUP_MEMBERS: &str = "
SELECT id, priority, payload, max_attempts FROM backlog_group_members
WHERE queue = ?1 AND kind = ?2 AND group_key = ?3 ORDER BY id LIMIT ?4";

/// Moves a group's members up to id `?4` to history as `aggregated` into job
/// `?6`, at `?5`. Never attempted: attempts 0, no worker, no start.
pub const AGGREGATE_TO_HISTORY: &str = "
INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress, group_key, aggregated_into)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, created_at,
       '[]', 0, created_at, ?5, NULL, 'aggregated', NULL, NULL, ?5, NULL, group_key, ?6
FROM backlog_group_members
WHERE queue = ?1 AND kind = ?2 AND group_key = ?3 AND id <= ?4";

/// Removes the members [`AGGREGATE_TO_HISTORY`] copied.
pub const DELETE_AGGREGATED: &str = "
DELETE FROM backlog_group_members
WHERE queue = ?1 AND kind = ?2 AND group_key = ?3 AND id <= ?4";

/// What is left of a group after a combination: its members and when the
/// oldest joined.
pub const GROUP_LEFT: &str = "
SELECT count(*), min(created_at) FROM backlog_group_members
WHERE queue = ?1 AND kind = ?2 AND group_key = ?3";

/// Removes a group with no member left.
pub const DELETE_GROUP: &str =
    "DELETE FROM backlog_groups WHERE queue = ?1 AND kind = ?2 AND group_key = ?3";

/// Re-arms a group that kept members (more than its max size had joined):
/// `?4` members, the oldest joined at `?5`; ready now (`?6`) when still full.
pub const REARM_GROUP: &str = "
UPDATE backlog_groups
SET size = ?4, first_at = ?5,
    ready_at = CASE WHEN ?4 >= max_size THEN ?6
                    ELSE min(last_at + grace_us, ?5 + max_delay_us) END
WHERE queue = ?1 AND kind = ?2 AND group_key = ?3";

/// When the next group is ready: the aggregator sleeps until then.
pub const NEXT_GROUP_READY: &str = "SELECT min(ready_at) FROM backlog_groups";

// ---- copy ------------------------------------------------------------------

/// Inserts a live job copied from another database, keeping its id, unless
/// the id is taken (live or finished) or its unique key is held: then nothing
/// changes. Not leased: a job leased at copy time arrives available. Not due
/// either: the next lease promotes it when its time has come.
/// Parameters: `?1` id, `?2` queue, `?3` kind, `?4` priority, `?5` unique
/// key, `?6` payload, `?7` attempts, `?8` max attempts, `?9` available_at,
/// `?10` first leased at, `?11` errors, `?12` cancel requested, `?13`
/// created_at, `?14` updated_at, `?15` progress.
pub const IMPORT_LIVE: &str = "
INSERT INTO backlog_jobs
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     first_leased_at, errors, cancel_requested, created_at, updated_at, progress)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15
WHERE NOT EXISTS (SELECT 1 FROM backlog_history WHERE id = ?1)
ON CONFLICT DO NOTHING";

/// Inserts a finished job copied from another database, keeping its id,
/// unless the id is taken. Parameters as [`IMPORT_LIVE`], then `?15` result,
/// `?16` status, `?17` processed by, `?18` finished_at (`?10` is started_at),
/// `?19` progress, `?20` group key, `?21` aggregated into.
pub const IMPORT_HISTORY: &str = "
INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     started_at, errors, cancel_requested, created_at, updated_at, result, status,
     processed_by, finished_at, progress, group_key, aggregated_into)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
       ?20, ?21
WHERE NOT EXISTS (SELECT 1 FROM backlog_jobs WHERE id = ?1)
ON CONFLICT DO NOTHING";

/// Inserts a waiting group member copied from another database, keeping its
/// id, unless the id is taken. Parameters: `?1` id, `?2` queue, `?3` kind,
/// `?4` group key, `?5` priority, `?6` payload, `?7` max attempts, `?8`
/// created_at. [`JOIN_GROUP`] then counts it into its group.
pub const IMPORT_GROUPED: &str = "
INSERT INTO backlog_group_members
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8
WHERE NOT EXISTS (SELECT 1 FROM backlog_jobs WHERE id = ?1)
  AND NOT EXISTS (SELECT 1 FROM backlog_history WHERE id = ?1)
ON CONFLICT DO NOTHING";

/// Makes new ids start above `?1`: `AUTOINCREMENT` keeps the highest id
/// handed out in `sqlite_sequence`, which a copied history id never touched.
/// This one makes sure the row exists ([`RAISE_NEXT_ID`] raises it).
pub const ENSURE_NEXT_ID: &str = "
INSERT INTO sqlite_sequence (name, seq)
SELECT 'backlog_jobs', ?1
WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'backlog_jobs')";

/// Raises the next id above `?1`.
pub const RAISE_NEXT_ID: &str =
    "UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'backlog_jobs'";

// ---- maintenance -----------------------------------------------------------

/// Deletes up to `?3` finished jobs of status `?1` that finished before `?2`,
/// oldest first, through `backlog_history_finished`; returns their ids. A job
/// that a pending or live job depends on is kept past its retention until
/// that job finishes too: its dependent's handler may read its result
/// (`result_of`). The check is a seek on `backlog_dependencies`' primary key
/// per candidate, and on the pending and live tables' per edge.
pub const PRUNE_HISTORY: &str = "
DELETE FROM backlog_history WHERE id IN (
    SELECT h.id FROM backlog_history AS h WHERE h.status = ?1 AND h.finished_at < ?2
      AND NOT EXISTS (
        SELECT 1 FROM backlog_dependencies AS e
        WHERE e.dependency = h.id
          AND (EXISTS (SELECT 1 FROM backlog_pending AS p WHERE p.id = e.dependent)
               OR EXISTS (SELECT 1 FROM backlog_jobs AS j WHERE j.id = e.dependent)))
    ORDER BY h.finished_at LIMIT ?3)
RETURNING id";

/// Deletes a pruned job's (`?1`) edges, both ways: what it depended on (it
/// will not run or be retried again) and what depended on it (every such
/// job has finished: [`PRUNE_HISTORY`] keeps it otherwise, and a retry of
/// one must not wait for a job that is gone).
pub const PRUNE_EDGES: &str = "
DELETE FROM backlog_dependencies WHERE dependency = ?1 OR dependent = ?1";

/// Deletes a pruned job's (`?1`) workflow step; returns its workflow.
pub const PRUNE_STEP: &str =
    "DELETE FROM backlog_workflow_steps WHERE job_id = ?1 RETURNING workflow_id";

/// Deletes workflow `?1` once its last step is pruned.
pub const PRUNE_WORKFLOW: &str = "
DELETE FROM backlog_workflows WHERE id = ?1
  AND NOT EXISTS (SELECT 1 FROM backlog_workflow_steps WHERE workflow_id = ?1)";

/// A counter that changes whenever another connection commits to the file:
/// how a worker notices another process's enqueue without reading a table.
pub const DATA_VERSION: &str = "PRAGMA data_version";

/// Copies WAL frames back into the database without waiting on readers or
/// writers (safe with other processes on the file). Returns `(busy, log
/// frames, checkpointed frames)`.
pub const WAL_CHECKPOINT: &str = "PRAGMA wal_checkpoint(PASSIVE)";

/// Copies every WAL frame back and makes the next writer start the log from
/// its beginning, waiting (busy handler) for a writer to finish and for
/// readers on older snapshots, and holding off new writers meanwhile.
pub const WAL_CHECKPOINT_RESTART: &str = "PRAGMA wal_checkpoint(RESTART)";

/// [`WAL_CHECKPOINT_RESTART`], and empties the log's file too: for a log
/// whose file grew past its bound.
pub const WAL_CHECKPOINT_TRUNCATE: &str = "PRAGMA wal_checkpoint(TRUNCATE)";
