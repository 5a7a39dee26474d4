//! Every SQL statement of the MySQL/MariaDB backend, in the order of a job's
//! life: enqueue, lease, settle (complete/fail/snooze/discard/release),
//! heartbeat, rescue, then inspection and maintenance. The same constants,
//! in the same order, as `sqlite/queries.rs`; each difference is commented.
//!
//! The statements are templates: `{jobs}`, `{history}` and `{queues}` become
//! the queue's tables (under its prefix, qualified by the URL's database, so
//! a caller's transaction on another default database still reaches them),
//! and `{now}` the server's clock. [`Sql`](super::Sql) renders them once at connect.
//!
//! Differs from SQLite in how time is bound (see `backend/mod.rs`): `:now`
//! is NULL unless the queue's clock is manual, and `{now}` reads
//! `COALESCE(:now, <server now in µs>)`; every absolute time of the engine
//! is bound as an offset from its `now` (`:available_in`, `:lease_for`) and
//! added to `{now}`. Values are named parameters (`:name`), never spliced
//! into the text.

use crate::backend::record;

/// The server's clock in unix µs, unless `:now` overrides it. Differs from
/// the usual `UNIX_TIMESTAMP(NOW(6))` in that no session `time_zone` enters
/// it: `UTC_TIMESTAMP` ignores it and `TIMESTAMPDIFF` is plain arithmetic,
/// so it is right on a caller's connection too (`enqueue_in`). Constant
/// within one statement. The epoch is a typed literal, converted once when
/// the statement is prepared: as a string MariaDB 10.11 parses it again on
/// every evaluation, three per row of a multi-row insert, which cost about
/// a third of `enqueue_many`'s time (BENCHMARKS.md, issue 20's enqueue).
pub const NOW: &str =
    "COALESCE(:now, TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)))";

/// [`NOW`] without the override (the same text inside it): the server's clock alone, for a statement
/// that binds the engine's now in its place when the clock is manual
/// ([`enqueue_rows`](super::enqueue_rows)).
pub const SERVER_NOW: &str =
    "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

// ---- enqueue ---------------------------------------------------------------

/// Inserts one job; a unique-key conflict inserts nothing (no row changed).
/// Differs from SQLite in that `INSERT IGNORE` stands for `ON CONFLICT DO
/// NOTHING` (the only conflict possible is the unique key: the values are
/// validated, and strict mode is on), and `errors` has no default.
///
/// The clock is read once a row: `updated_at` and `available_at` are
/// computed from `created_at`, a column set earlier in the same row (MySQL
/// and MariaDB evaluate a row's values left to right, and a column named in
/// a later value reads the value just set). `{now}` three times read the
/// server's clock three times a row (BENCHMARKS.md, issue 20's enqueue).
pub const ENQUEUE: &str = "
INSERT IGNORE INTO {jobs}
    (queue, kind, priority, unique_key, payload, errors, max_attempts, created_at,
     updated_at, available_at)
VALUES (:queue, :kind, :priority, :unique_key, :payload, '[]', :max_attempts, {now},
        created_at, created_at + :available_in)";

/// The live job holding a unique key. Differs from SQLite in that the seek
/// is on the key's hash (the indexed column; the key itself is compared
/// too), and in that it is a locking read: in a caller's REPEATABLE READ
/// transaction a plain read would use a snapshot older than the row the
/// insert collided with. The insert holds that lock already. (`LOCK IN SHARE
/// MODE`: MariaDB has no `FOR SHARE`. The index is forced: see [`CLAIM`].)
pub const FIND_LIVE_UNIQUE: &str = "
SELECT id FROM {jobs} FORCE INDEX (jobs_unique)
WHERE queue = :queue AND unique_hash = UNHEX(SHA2(:unique_key, 256)) AND unique_key = :unique_key
LOCK IN SHARE MODE";

/// The most recent finished job holding a unique key since a time
/// (`:since_in`, an offset from now).
pub const FIND_HISTORY_UNIQUE: &str = "
SELECT id FROM {history}
WHERE queue = :queue AND unique_hash = UNHEX(SHA2(:unique_key, 256)) AND unique_key = :unique_key
  AND finished_at >= {now} + :since_in
  AND (:statuses IS NULL OR JSON_CONTAINS(:statuses, JSON_QUOTE(status)))
ORDER BY finished_at DESC LIMIT 1";

// ---- lease -----------------------------------------------------------------

/// The candidates of one queue (`:q{i}`): a walk of `jobs_lease` in claim
/// order that stops after `:limit` rows, locking them and skipping rows other
/// claims hold. `:k0..` are the wanted kinds, when filtering by kind.
///
/// Differs from SQLite in that it locks (`FOR UPDATE SKIP LOCKED`: many
/// nodes claim at once, and none waits on another's rows), reads the whole
/// job and the server's now (no `RETURNING` in MySQL: the update that
/// follows is applied from these values, so no third statement reads them
/// back), and seeks `lease_queue`, the column that stands for the partial
/// index. The index is forced: on a small table, or with a kind filter, the
/// optimizer may prefer a scan and a sort, which would lock every available
/// job of the queue before sorting them. The paused-queue sub-select takes no lock.
/// With `:skip_limited`, limited queues are skipped too: a lease of one
/// locks its row first, see `mysql/limits.rs`.
pub fn lease_candidates(queue: usize, kinds: usize) -> String {
    let kinds = if kinds == 0 {
        String::new()
    } else {
        let names: Vec<String> = (0..kinds).map(|i| format!(":k{i}")).collect();
        format!("AND kind IN ({})", names.join(", "))
    };
    format!(
        "SELECT {LEASED_COLUMNS}, {{now}} AS now FROM {{jobs}} FORCE INDEX (jobs_lease)
         WHERE lease_queue = :q{queue} AND available_at <= {{now}} {kinds}
           AND NOT EXISTS (SELECT 1 FROM {{queues}} WHERE name = :q{queue}
               AND (paused OR (:skip_limited
                    AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL))))
         ORDER BY priority DESC, available_at, id LIMIT :limit
         FOR UPDATE SKIP LOCKED"
    )
}

/// [`lease_candidates`] of one limited queue (`:q0`) whose row the lease's
/// transaction holds locked, with the queue's running jobs counted
/// (`jobs_running`) as one more column: the caller claims no more than its
/// concurrency limit leaves. The count is a plain read, not a locking one
/// (checked on MariaDB 10.11: it does not wait for a running job another
/// transaction holds), and reads the commits made before this statement
/// began, so every claim of the lock's previous holders. One round trip
/// fewer with the queue's row locked than a separate count.
///
/// What the count costs is not how often it runs (once a walk: `r_loops` 1
/// in MariaDB 10.11's `ANALYZE`, with the parameters bound as the library
/// binds them) but its visibility checks: while another worker's settle or
/// claim is open on the index page it reads, InnoDB looks up every running
/// entry in the primary key and rebuilds the versions this read must not
/// see. During a drain that is most walks: thousands of pages and a few ms,
/// against 3 or 4 pages otherwise. A count in its own statement reads the
/// same way; so a lease whose queue's `running_bound` leaves room walks
/// [`lease_candidates`] instead, and counts only when the bound is unknown
/// or too high (`mysql/limits.rs`).
pub fn lease_candidates_counting(kinds: usize) -> String {
    lease_candidates(0, kinds).replacen(
        " AS now FROM",
        " AS now, (SELECT count(*) FROM {jobs} FORCE INDEX (jobs_running)
             WHERE queue = :q0 AND lease_token IS NOT NULL) AS running FROM",
        1,
    )
}

/// [`lease_candidates_counting`] for a claim that the settles of its own
/// transaction pay for (see `crate::limits::lease_handing_on`): it takes no
/// lock on the queue's row, and reads the queue's concurrency limit as one
/// more column, NULL when the queue has a rate limit by now (its starts are
/// counted under the queue's lock) or no concurrency limit any more: the
/// caller then claims nothing. `:limit` is at most the places the settles
/// freed, which the caller never exceeds; the limit and the count only keep
/// a lowered limit honoured.
pub fn lease_candidates_handed(kinds: usize) -> String {
    lease_candidates_counting(kinds).replacen(
        " AS running FROM",
        " AS running, (SELECT concurrency_limit FROM {queues}
             WHERE name = :q0 AND rate_limit IS NULL) AS place_limit FROM",
        1,
    )
}

/// Picks the candidates of `queue_count` queues in claim order. Each queue
/// gets its own walk, merged here, because one index walk cannot read
/// `lease_queue IN (..)` in order: it would sort every available job (as on
/// SQLite). Differs from SQLite in that a walk's rows beyond the merged
/// limit stay locked until the claim commits (other claims skip them for
/// those few milliseconds).
pub fn lease(queue_count: usize, kinds: usize) -> String {
    if queue_count == 1 {
        return lease_candidates(0, kinds);
    }
    let walks: Vec<String> = (0..queue_count)
        .map(|i| format!("({})", lease_candidates(i, kinds)))
        .collect();
    format!(
        "{} ORDER BY priority DESC, available_at, id LIMIT :limit",
        walks.join(" UNION ALL ")
    )
}

/// What the candidate walk returns, in the order `jobs::leased_job` reads
/// it. Differs from SQLite in that the values are read before the claim
/// (`attempts` and the lease are set from them).
pub const LEASED_COLUMNS: &str = "id, queue, kind, priority, unique_key, payload, attempts, \
     max_attempts, available_at, created_at";

/// Claims the picked jobs: `attempts + 1`, each its own random token, the
/// lease expiry and the worker. `:claims` is a JSON array of `[id, token]`;
/// `:now` and `:lease_until` are absolute, from the server's now read by the
/// walk. Differs from SQLite in that it is a second statement of the claim's
/// transaction (the rows are locked since the walk), and tokens come from
/// the engine's random source (MySQL's `RAND()` has 53 bits).
///
/// Every join on a `JSON_TABLE` here and below is `STRAIGHT_JOIN` (the
/// pairs drive) and forces the primary key: on a small table the optimizer
/// otherwise scans `{jobs}` for each pair, and a locking scan waits on every
/// row another transaction holds (another node's claim, a handler's
/// transaction), not just on the rows named.
pub const CLAIM: &str = "
UPDATE JSON_TABLE(:claims, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS c
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = c.id
SET j.attempts = j.attempts + 1, j.lease_token = c.token, j.lease_until = :lease_until,
    j.locked_by = :worker_id, j.first_leased_at = COALESCE(j.first_leased_at, :now),
    j.updated_at = :now";

/// [`CLAIM`] by a lease of one limited queue (`:queue`), whose row the
/// lease's transaction holds locked, that also stores the queue's new
/// upper bound of its running jobs (`:running_bound`, `mysql/limits.rs`):
/// folded into the claim, so keeping the bound costs no round trip. Only in
/// MySQL. The queue's row is joined once per claimed job and written once
/// (a multi-table `UPDATE` changes each row at most once).
pub const CLAIM_BOUNDING: &str = "
UPDATE JSON_TABLE(:claims, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS c
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = c.id
STRAIGHT_JOIN {queues} AS q FORCE INDEX (PRIMARY) ON q.name = :queue
SET j.attempts = j.attempts + 1, j.lease_token = c.token, j.lease_until = :lease_until,
    j.locked_by = :worker_id, j.first_leased_at = COALESCE(j.first_leased_at, :now),
    j.updated_at = :now, q.running_bound = :running_bound";

/// How long after now the next unleased job of `queue_count` queues
/// (`:q0..`) that is not due yet comes due, in µs on the server's clock;
/// NULL when none waits. One seek of `jobs_scheduled` per queue. Differs
/// from SQLite's `NEXT_DUE` in that the jobs not due yet are told apart by
/// `available_at` (no `due` flag, see `migrations/mysql/V2__due.sql`), and
/// in that it answers relative to the server's now.
pub fn next_due(queue_count: usize) -> String {
    let seeks: Vec<String> = (0..queue_count)
        .map(|i| {
            format!(
                "(SELECT MIN(available_at) AS at FROM {{jobs}} FORCE INDEX (jobs_scheduled)
                  WHERE lease_queue = :q{i} AND available_at > {{now}})"
            )
        })
        .collect();
    format!(
        "SELECT MIN(at) - {{now}} FROM ({}) AS due",
        seeks.join(" UNION ALL ")
    )
}

// ---- settle ----------------------------------------------------------------

/// `errors` with `:error` appended (when not NULL), keeping the last 20.
/// Differs from SQLite in that the entry's `at` is the server's now.
macro_rules! append_error {
    () => {
        "CASE WHEN :error IS NULL THEN errors
              WHEN JSON_LENGTH(errors) >= 20
              THEN JSON_ARRAY_APPEND(JSON_REMOVE(errors, '$[0]'), '$', JSON_SET(:error, '$.at', {now}))
              ELSE JSON_ARRAY_APPEND(errors, '$', JSON_SET(:error, '$.at', {now})) END"
    };
}

/// Copies a live job into history with its final status. Fenced: `:token`
/// is the lease token, or NULL for a job that is not leased (operator
/// cancel). Differs from SQLite in `<=>` (MySQL's `IS`), and in `FOR
/// UPDATE`: under READ COMMITTED an `INSERT .. SELECT` reads its source
/// without a lock, and a claim committing in between would let a stale
/// worker finish a job leased again; locked, the fence holds until commit.
pub const FINISH_TO_HISTORY: &str = concat!(
    "INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at, ",
    append_error!(),
    ", cancel_requested, created_at, {now}, :result, :status, locked_by, first_leased_at, {now},
       progress
FROM {jobs} WHERE id = :id AND lease_token <=> :token
FOR UPDATE"
);

/// The leases of `:leases` (a JSON array of `[id, token]`) still held,
/// locked: the fence of a batch of completions. Only in MySQL (see
/// [`COMPLETE_MANY_TO_HISTORY`]). Each with its batch, if it is a member
/// (`batches.rs`): a batch of completions with no member in it costs no
/// statement more.
pub const LOCK_HELD: &str = "
SELECT j.id, m.batch_id
FROM JSON_TABLE(:leases, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS held
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = held.id AND j.lease_token = held.token
LEFT JOIN {batch_jobs} AS m ON m.job_id = j.id
FOR UPDATE";

/// Copies a batch of completed jobs into history in one statement.
/// `:completions` is a JSON array of `[id, token]` or `[id, token, result
/// text]`. Only in MySQL: SQLite runs [`FINISH_TO_HISTORY`] per job, cheap
/// in-process, while here each statement is a round trip to the server; the
/// batch (the worker's completer) is fenced by [`LOCK_HELD`] first, and its
/// live rows deleted by [`DELETE_MANY_LIVE`].
pub const COMPLETE_MANY_TO_HISTORY: &str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT j.id, j.queue, j.kind, j.priority, j.unique_key, j.payload, j.attempts, j.max_attempts,
       j.available_at, j.errors, j.cancel_requested, j.created_at, {now}, c.result, 'completed',
       j.locked_by, j.first_leased_at, {now}, j.progress
FROM JSON_TABLE(:completions, '$[*]' COLUMNS (
         id BIGINT PATH '$[0]', token BIGINT PATH '$[1]', result LONGTEXT PATH '$[2]')) AS c
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = c.id AND j.lease_token = c.token";

/// Removes the live rows of a batch [`COMPLETE_MANY_TO_HISTORY`] copied.
/// Only in MySQL.
pub const DELETE_MANY_LIVE: &str = "
DELETE j
FROM JSON_TABLE(:leases, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS held
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = held.id AND j.lease_token = held.token";

/// Removes the live row after [`FINISH_TO_HISTORY`] copied it.
pub const DELETE_LIVE: &str = "DELETE FROM {jobs} WHERE id = :id";

/// Unleases a job and schedules its next run, `:available_in` from now, or
/// with `:keep_place` (a rescue) at `LEAST(available_at, now)`: its place in
/// line, from the server's clock. Fenced on the token. `:refund` gives an
/// attempt back (0 or 1).
///
/// Differs from SQLite in that it has no `RETURNING cancel_requested`: it
/// skips a job whose cancel was requested, and the caller, on zero rows,
/// reads [`CANCEL_REQUESTED`] to tell that from a lost lease. MySQL assigns
/// left to right: nothing here reads a column assigned before it.
pub const RESCHEDULE: &str = concat!(
    "UPDATE {jobs}
SET lease_token = NULL, lease_until = NULL, locked_by = NULL,
    available_at = IF(:keep_place, LEAST(available_at, {now}), {now} + :available_in),
    attempts = attempts - :refund, updated_at = {now}, errors = ",
    append_error!(),
    "
WHERE id = :id AND lease_token = :token AND NOT cancel_requested"
);

/// Whether a held lease's job was asked to cancel; no row when the lease is
/// lost. Only in MySQL (see [`RESCHEDULE`]).
pub const CANCEL_REQUESTED: &str =
    "SELECT cancel_requested FROM {jobs} WHERE id = :id AND lease_token = :token FOR UPDATE";

/// Whether a lease is still held: the fence a transactional completion
/// checks before the caller's effects run. Differs from SQLite in that it
/// locks the row until the caller's transaction ends (SQLite's single writer
/// does that by itself).
pub const LEASE_HELD: &str =
    "SELECT 1 FROM {jobs} WHERE id = :id AND lease_token = :token FOR UPDATE";

/// Locks a running job's row for [`WRITE_PROGRESS`] when its lease is still
/// held and no other transaction holds the row. Only in MySQL, for the
/// reason of [`HEARTBEAT_LOCK`]: a progress write rides with the heartbeat
/// and must not wait for a handler's own transaction.
pub const PROGRESS_LOCK: &str = "
SELECT id FROM {jobs} WHERE id = :id AND lease_token = :token FOR UPDATE SKIP LOCKED";

/// [`PROGRESS_LOCK`] waiting for a row another transaction holds: the
/// write before a settle, which must not leave an older value behind.
pub const PROGRESS_LOCK_WAIT: &str = "
SELECT id FROM {jobs} WHERE id = :id AND lease_token = :token FOR UPDATE";

/// Writes a running job's progress (JSON text), fenced on its lease.
pub const WRITE_PROGRESS: &str = "
UPDATE {jobs} SET progress = :progress, updated_at = {now}
WHERE id = :id AND lease_token = :token";

// ---- heartbeat -------------------------------------------------------------

/// The given leases still held whose rows no other transaction holds,
/// locked for [`HEARTBEAT`]. `:leases` is a JSON array of `[id, token]`
/// pairs. Only in MySQL: a heartbeat must not wait for a handler's
/// `ctx.transaction(..)`, which holds its job's row until it commits (and
/// the heartbeat extends every lease of the worker at once); a row skipped
/// here is looked at by [`HEARTBEAT_HELD`].
pub const HEARTBEAT_LOCK: &str = "
SELECT j.id, j.lease_token, j.cancel_requested
FROM JSON_TABLE(:leases, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS held
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = held.id AND j.lease_token = held.token
FOR UPDATE SKIP LOCKED";

/// Extends the leases [`HEARTBEAT_LOCK`] locked, in one statement, to
/// `:lease_for` from now. Differs from SQLite in that `JSON_TABLE` stands
/// for `json_each` and drives the join (one primary-key seek per pair), and
/// in that which pairs matched was read before (no `RETURNING`).
pub const HEARTBEAT: &str = "
UPDATE JSON_TABLE(:leases, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS held
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = held.id AND j.lease_token = held.token
SET j.lease_until = {now} + :lease_for, j.updated_at = {now}";

/// Which of the leases [`HEARTBEAT_LOCK`] skipped are still held, by their
/// last committed state (a read that waits for no lock): those are busy,
/// neither extended nor lost; the rest are lost. Only in MySQL.
pub const HEARTBEAT_HELD: &str = "
SELECT j.id, j.lease_token, j.cancel_requested
FROM JSON_TABLE(:leases, '$[*]' COLUMNS (id BIGINT PATH '$[0]', token BIGINT PATH '$[1]')) AS held
STRAIGHT_JOIN {jobs} AS j FORCE INDEX (PRIMARY) ON j.id = held.id AND j.lease_token = held.token";

// ---- rescue ----------------------------------------------------------------

/// Leases that expired before now, oldest first, at most `:limit`, read from
/// `jobs_expiry`. No payloads. Differs from SQLite in that it locks them and
/// skips rows other nodes hold (many nodes rescue at once), and in that the
/// index is forced (a scan would lock what it reads).
pub const EXPIRED_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested
FROM {jobs} FORCE INDEX (jobs_expiry)
WHERE lease_until < {now} AND lease_token IS NOT NULL
ORDER BY lease_until LIMIT :limit
FOR UPDATE SKIP LOCKED";

/// The leases of worker `:worker_id` whose ids are not in `:held` (a JSON
/// array of the ids it holds), by id: claims whose answer never reached it.
/// No payloads. Differs from SQLite in that it locks them and skips rows
/// another transaction holds (a handler's transactional completion), and in
/// that the index is forced (a scan would lock what it reads).
pub const UNHELD_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested
FROM {jobs} FORCE INDEX (jobs_expiry)
WHERE lease_until IS NOT NULL AND lease_token IS NOT NULL AND locked_by = :worker_id
  AND id NOT IN (SELECT held.id FROM JSON_TABLE(:held, '$[*]' COLUMNS (id BIGINT PATH '$')) AS held)
ORDER BY id
FOR UPDATE SKIP LOCKED";

// ---- inspect ---------------------------------------------------------------

/// A live job as a record; `state` is derived at `{now}`. The record's
/// columns and their reader are `backend/record.rs`'s, one for every
/// database.
pub const LIVE_COLUMNS: &str = record::live_columns!("{now}");

/// A finished job as a record, in the same column order as [`LIVE_COLUMNS`].
pub const HISTORY_COLUMNS: &str = record::HISTORY_COLUMNS;

/// A job waiting in its group as a record, in [`LIVE_COLUMNS`] order.
pub const GROUPED_COLUMNS: &str = record::GROUPED_COLUMNS;

/// Waiting group members per queue.
pub const COUNT_GROUPED: &str =
    "\nSELECT queue, 'grouped', COUNT(*) FROM {group_members} GROUP BY queue";

// The live-state conditions are `backend/live_state.rs`'s; the operator's
// statements (counts, retry, run now, pause, ...) are `inspect.rs`'s.

/// Unleased jobs per queue that are due now, as `(queue, state, count)`
/// rows like the three below: a walk of `jobs_scheduled` that reads the
/// index alone (`lease_queue` is NULL for a leased job, so the range holds
/// exactly the unleased ones) ...
///
/// Differs from SQLite in that the due jobs are told apart by `available_at`
/// (no `due` flag, no separate index of them), and in the shape of its rows:
/// [`depth`] sends the four counts as one `UNION ALL`, one statement, so
/// they share one server now and one read view (under READ COMMITTED each
/// statement reads its own; a job claimed between two of them would be
/// counted twice or not at all), in one round trip.
pub const COUNT_WAITING_DUE: &str = "
SELECT lease_queue, 'available', COUNT(*) FROM {jobs} FORCE INDEX (jobs_scheduled)
WHERE lease_queue IS NOT NULL AND available_at <= {now} GROUP BY lease_queue";

/// ... and the jobs not due yet, from the same index, each looked up for its
/// `attempts` (scheduled or retrying) once the index said it is not due.
/// Differs from SQLite as [`COUNT_WAITING_DUE`] does.
pub const COUNT_WAITING_LATER: &str = "
SELECT lease_queue, IF(attempts > 0, 'retrying', 'scheduled'), COUNT(*)
FROM {jobs} FORCE INDEX (jobs_scheduled)
WHERE lease_queue IS NOT NULL AND available_at > {now} GROUP BY 1, 2";

/// Leased jobs per queue, through `jobs_expiry` (every claim sets
/// `lease_until`; an unleased job has none). Differs from SQLite in that
/// the index is forced: on a small table the optimizer may scan instead.
pub const COUNT_RUNNING: &str = "
SELECT queue, 'running', COUNT(*) FROM {jobs} FORCE INDEX (jobs_expiry)
WHERE lease_until IS NOT NULL AND lease_token IS NOT NULL GROUP BY queue";

/// Dead jobs per queue: the dead-letter count. Walks only the `dead` range
/// of `history_finished`, never the rest of history. Differs from SQLite in
/// that the index is forced (see [`COUNT_RUNNING`]).
pub const COUNT_DEAD: &str = "
SELECT queue, 'dead', COUNT(*) FROM {history} FORCE INDEX (history_finished)
WHERE status = 'dead' GROUP BY queue";

/// The four counts above as one statement. Only in MySQL (see
/// [`COUNT_WAITING_DUE`]).
pub fn depth() -> String {
    [
        COUNT_WAITING_DUE,
        COUNT_WAITING_LATER,
        COUNT_RUNNING,
        COUNT_GROUPED,
        COUNT_DEAD,
    ]
    .join("\nUNION ALL")
}

// ---- groups ----------------------------------------------------------------

/// Moves a job [`ENQUEUE`] just inserted (`:id`, so that it has an id from
/// the jobs' AUTO_INCREMENT) into its group `:group_key`; [`DELETE_LIVE`]
/// then removes the live row, in the same transaction. As SQLite's.
pub const JOIN_GROUP_MEMBER: &str = "
INSERT INTO {group_members}
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
SELECT id, queue, kind, :group_key, priority, payload, max_attempts, created_at
FROM {jobs} WHERE id = :id";

/// Counts a new member into its group, creating the group, and sets the
/// group's policy and when it is ready (see SQLite's). Differs from SQLite
/// in `ON DUPLICATE KEY UPDATE`, whose assignments see the ones before them:
/// `ready_at` is computed first, from the old size and first time. A group
/// row another transaction is combining is waited for.
pub const JOIN_GROUP: &str = "
INSERT INTO {groups}
    (queue, kind, group_key, max_size, grace_us, max_delay_us, size, first_at, last_at, ready_at)
VALUES (:queue, :kind, :group_key, :max_size, :grace_us, :max_delay_us, 1, {now}, {now},
        IF(:max_size <= 1, {now}, {now} + LEAST(:grace_us, :max_delay_us)))
ON DUPLICATE KEY UPDATE
    ready_at = IF(size + 1 >= VALUES(max_size), VALUES(last_at),
                  LEAST(VALUES(last_at) + VALUES(grace_us), first_at + VALUES(max_delay_us))),
    size = size + 1, last_at = VALUES(last_at), max_size = VALUES(max_size),
    grace_us = VALUES(grace_us), max_delay_us = VALUES(max_delay_us)";

/// Up to `:limit` groups ready now, the longest ready first, locked;
/// aggregators on other nodes skip them (as PostgreSQL's).
pub const READY_GROUPS: &str = "
SELECT queue, kind, group_key, max_size FROM {groups} FORCE INDEX (groups_ready)
WHERE ready_at <= {now} ORDER BY ready_at LIMIT :limit
FOR UPDATE SKIP LOCKED";

/// A group's oldest `:limit` members.
pub const GROUP_MEMBERS: &str = "
SELECT id, priority, payload, max_attempts FROM {group_members}
WHERE queue = :queue AND kind = :kind AND group_key = :group_key ORDER BY id LIMIT :limit";

/// Copies the members `:ids` (a JSON array) to history as `aggregated` into
/// job `:into`; [`DELETE_AGGREGATED`] removes them. Named by id, as on
/// PostgreSQL: a member added meanwhile is not taken.
pub const AGGREGATE_TO_HISTORY: &str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress, group_key, aggregated_into)
SELECT m.id, m.queue, m.kind, m.priority, NULL, m.payload, 0, m.max_attempts, m.created_at,
       '[]', FALSE, m.created_at, {now}, NULL, 'aggregated', NULL, NULL, {now}, NULL,
       m.group_key, :into
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS taken
STRAIGHT_JOIN {group_members} AS m ON m.id = taken.id";

/// Removes the members [`AGGREGATE_TO_HISTORY`] copied.
pub const DELETE_AGGREGATED: &str = "
DELETE m FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS taken
STRAIGHT_JOIN {group_members} AS m ON m.id = taken.id";

/// What is left of a group after a combination.
pub const GROUP_LEFT: &str = "
SELECT COUNT(*), MIN(created_at) FROM {group_members}
WHERE queue = :queue AND kind = :kind AND group_key = :group_key";

/// Removes a group with no member left.
pub const DELETE_GROUP: &str =
    "DELETE FROM {groups} WHERE queue = :queue AND kind = :kind AND group_key = :group_key";

/// Re-arms a group that kept members: `:size` left, the oldest joined at
/// `:first_at`. `ready_at` first: MySQL's assignments see the ones before.
pub const REARM_GROUP: &str = "
UPDATE {groups}
SET ready_at = IF(:size >= max_size, {now}, LEAST(last_at + grace_us, :first_at + max_delay_us)),
    size = :size, first_at = :first_at
WHERE queue = :queue AND kind = :kind AND group_key = :group_key";

/// How long until the next group is ready (µs, negative when one is).
pub const NEXT_GROUP_READY: &str = "SELECT MIN(ready_at) - {now} FROM {groups}";

/// Inserts a waiting group member copied from another database, keeping its
/// id, unless the id is taken; [`JOIN_GROUP`] then counts it in.
pub const IMPORT_GROUPED: &str = "
INSERT IGNORE INTO {group_members}
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
SELECT :id, :queue, :kind, :group_key, :priority, :payload, :max_attempts, :created_at
FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {jobs} WHERE id = :id)
  AND NOT EXISTS (SELECT 1 FROM {history} WHERE id = :id)";

// ---- copy ------------------------------------------------------------------

/// Inserts a live job copied from another database, keeping its id, unless
/// the id is taken (live or finished) or its unique key is held: then nothing
/// changes. Not leased: a job leased at copy time arrives available. Times
/// are the copied values, not offsets. Differs from SQLite in `INSERT
/// IGNORE` (see [`ENQUEUE`]) and `FROM DUAL`.
pub const IMPORT_LIVE: &str = "
INSERT IGNORE INTO {jobs}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     first_leased_at, errors, cancel_requested, created_at, updated_at, progress)
SELECT :id, :queue, :kind, :priority, :unique_key, :payload, :attempts, :max_attempts,
       :available_at, :started_at, :errors, :cancel_requested, :created_at, :updated_at,
       :progress
FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {history} WHERE id = :id)";

/// Inserts a finished job copied from another database, keeping its id,
/// unless the id is taken.
pub const IMPORT_HISTORY: &str = "
INSERT IGNORE INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     started_at, errors, cancel_requested, created_at, updated_at, result, status,
     processed_by, finished_at, progress, group_key, aggregated_into)
SELECT :id, :queue, :kind, :priority, :unique_key, :payload, :attempts, :max_attempts,
       :available_at, :started_at, :errors, :cancel_requested, :created_at, :updated_at,
       :result, :status, :processed_by, :finished_at, :progress, :group_key, :aggregated_into
FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {jobs} WHERE id = :id)";

/// Makes new ids start above `:id`. Differs from SQLite (which raises
/// `sqlite_sequence`) in that InnoDB raises the AUTO_INCREMENT counter past
/// any id inserted explicitly, and never lowers it: a placeholder row (kind
/// `''`, which no job can have) is inserted at `:id`, unless a live job holds
/// it, and deleted by [`DROP_ID_PLACEHOLDER`]. (`ALTER TABLE .. AUTO_INCREMENT`
/// would commit the copy's transaction, and could lower the counter.)
pub const RAISE_NEXT_ID: &str = "
INSERT IGNORE INTO {jobs}
    (id, queue, kind, payload, errors, available_at, created_at, updated_at)
VALUES (:id, '', '', 'null', '[]', 0, 0, 0)";

/// Removes [`RAISE_NEXT_ID`]'s placeholder. Only in MySQL.
pub const DROP_ID_PLACEHOLDER: &str = "DELETE FROM {jobs} WHERE id = :id AND kind = ''";

// ---- maintenance -----------------------------------------------------------

/// As SQLite's `PRUNE_HISTORY`: up to `:limit` finished jobs of `:status`
/// that finished before `:cutoff_in` from now, oldest first, through
/// `history_finished`, but those a pending or live job depends on. Differs
/// from SQLite in that it only selects and locks them (skipping rows
/// another node is pruning): MySQL has no `DELETE .. RETURNING`, and the
/// statements below need the ids.
pub const PRUNE_HISTORY: &str = "
SELECT h.id FROM {history} AS h
WHERE h.status = :status AND h.finished_at < {now} + :cutoff_in
  AND NOT EXISTS (
    SELECT 1 FROM {dependencies} AS e
    WHERE e.dependency = h.id
      AND (EXISTS (SELECT 1 FROM {pending} AS p WHERE p.id = e.dependent)
           OR EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.id = e.dependent)))
ORDER BY h.finished_at LIMIT :limit
FOR UPDATE SKIP LOCKED";

/// Deletes the jobs [`PRUNE_HISTORY`] selected (`:ids`, a JSON array).
pub const PRUNE_JOBS: &str = "
DELETE h
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {history} AS h ON h.id = g.id";

/// As SQLite's `PRUNE_EDGES`, in two statements (an `OR` of the two keys
/// would not seek both): the edges from the pruned jobs ...
pub const PRUNE_EDGES_OUT: &str = "
DELETE e
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (PRIMARY) ON e.dependency = g.id";

/// ... and the edges to them.
pub const PRUNE_EDGES_IN: &str = "
DELETE e
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {dependencies} AS e FORCE INDEX (dependencies_dependent) ON e.dependent = g.id";

/// As SQLite's `PRUNE_STEP`, in two statements: the pruned jobs' workflows,
/// their rows locked so that two nodes pruning the last steps of one
/// workflow take turns (the second then sees the first's steps gone) ...
pub const PRUNE_STEPS_OF: &str = "
SELECT w.id
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {workflow_steps} AS s FORCE INDEX (workflow_steps_job) ON s.job_id = g.id
STRAIGHT_JOIN {workflows} AS w ON w.id = s.workflow_id
FOR UPDATE";

/// ... and their steps deleted.
pub const PRUNE_STEPS: &str = "
DELETE s
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {workflow_steps} AS s FORCE INDEX (workflow_steps_job) ON s.job_id = g.id";

/// As SQLite's `PRUNE_WORKFLOW`, for the workflows of `:ids` (a JSON
/// array).
pub const PRUNE_WORKFLOWS: &str = "
DELETE w
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS f
STRAIGHT_JOIN {workflows} AS w ON w.id = f.id
WHERE NOT EXISTS (SELECT 1 FROM {workflow_steps} AS s WHERE s.workflow_id = w.id)";

/// The newest job's id, and the count of transactions that released jobs
/// waiting for their dependencies (`flows.rs`; a released job keeps an
/// older id): how a worker notices another node's enqueue or release.
/// Differs from SQLite's `PRAGMA data_version` in that it sees only these
/// (other changes wait for the idle poll), and is read every few tens of
/// milliseconds, not on every watch tick. The optimizer answers it from the
/// primary keys' last entries.
pub const LATEST_JOB: &str =
    "SELECT (SELECT MAX(id) FROM {jobs}), (SELECT n FROM {releases} WHERE one = 1)";

/// The server's version, checked at connect.
pub const VERSION: &str = "SELECT VERSION()";
