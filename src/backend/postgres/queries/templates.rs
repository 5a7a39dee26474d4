//! The SQL statements of the PostgreSQL backend, in the order of a job's
//! life: after enqueue (`enqueue.rs`), lease, settle
//! (complete/fail/snooze/discard/release), heartbeat, rescue, then
//! inspection and maintenance. Same order and names as `sqlite/queries.rs`;
//! each difference is commented right above.
//!
//! These are templates: `{jobs}`, `{history}` and `{queues}` become the
//! (schema-qualified, prefixed) table names when the queue connects
//! ([`Queries::render`](super::Queries::render)), never later, and never
//! from a caller's value.
//!
//! Time: the engine's `now` is not the clock these statements use. `{now}`
//! is the database server's clock in unix µs, unless `$1` carries a manual
//! clock's time (tests), and every absolute time the engine computed is bound
//! as an offset from its own `now` and added to `{now}` (see the module doc
//! of `backend`). So nodes whose clocks disagree still agree on leases and
//! schedules.

/// The server's now in unix µs, or the manual clock's time bound as `$1`.
/// `now()` is the transaction's start, exact to the µs in PostgreSQL >= 14
/// (where `extract` returns numeric).
pub(super) const NOW: &str = "COALESCE($1::int8, (extract(epoch from now()) * 1000000)::int8)";

/// A fresh random lease token of 63 bits (31 + 32), never negative.
/// Differs from SQLite's `random()` in that PostgreSQL's `random()` is a
/// float, so two draws make the bits.
pub(super) const TOKEN: &str =
    "(((random() * 2147483647)::int8 << 32) | (random() * 4294967295)::int8)";

// ---- lease -----------------------------------------------------------------

/// Claims up to `$6` jobs of one queue (`$4`) in one statement: `attempts + 1`,
/// a fresh random token per row, the lease expiry (`$2`, µs from now) and the
/// worker (`$3`). `$5` is the kinds to claim, or NULL for any. With `$7`,
/// limited queues are skipped: a lease of one locks its row first, see
/// `postgres/limits.rs`.
///
/// Differs from SQLite in that the candidates are locked with `FOR UPDATE
/// SKIP LOCKED` (SQLite has one writer; here many nodes claim at once, and
/// each skips the rows another is claiming instead of waiting on them), and
/// that they are picked in a `MATERIALIZED` CTE: as an `IN (..)` sub-select
/// with `LIMIT` the planner may run it more than once, and claim more rows.
/// The walk of `{prefix}jobs_lease` stops after `$6` rows; the rows come
/// back in no particular order and are sorted by the caller.
///
/// The claimed rows are found by their ids as an array (`= ANY(ARRAY(..))`),
/// one primary-key probe each. As `IN (SELECT id FROM picked)` the planner
/// joins the CTE to the table, and for a batch of a hundred or so (the
/// default worker's look-ahead) over a table of tens of thousands of jobs,
/// or for any `LIMIT` it cannot read (the limited queues' claims, whose
/// room is computed), it guesses a tenth of the table and hashes the whole
/// table, scanned, for every claim.
pub const LEASE: &str = "
WITH picked AS MATERIALIZED (
    SELECT id FROM {jobs}
    WHERE queue = $4 AND lease_token IS NULL AND available_at <= {now}
      AND ($5::text[] IS NULL OR kind = ANY($5::text[]))
      AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = $4 
              AND (paused OR ($7::bool AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL))))
    ORDER BY priority DESC, available_at, id
    LIMIT $6
    FOR UPDATE SKIP LOCKED)
UPDATE {jobs}
SET attempts = attempts + 1, lease_token = {token}, lease_until = {now} + $2, locked_by = $3,
    first_leased_at = COALESCE(first_leased_at, {now}), updated_at = {now}
WHERE id = ANY(ARRAY(SELECT id FROM picked))
RETURNING {leased_columns}";

/// [`LEASE`] over several queues (`$4`, an array): one index walk per queue,
/// each stopping after `$6` rows, merged, and the first `$6` claimed.
///
/// As on SQLite, one walk per queue because one index walk cannot return
/// `queue = ANY(..)` rows in claim order: the planner would sort every
/// available job. Rows a walk locked but the merge left out stay locked
/// until this statement commits; other workers skip them meanwhile.
pub const LEASE_QUEUES: &str = "
WITH picked AS MATERIALIZED (
    SELECT c.id FROM unnest($4::text[]) AS q (name)
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at FROM {jobs}
        WHERE queue = q.name AND lease_token IS NULL AND available_at <= {now}
          AND ($5::text[] IS NULL OR kind = ANY($5::text[]))
          AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = q.name 
              AND (paused OR ($7::bool AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL))))
        ORDER BY priority DESC, available_at, id
        LIMIT $6
        FOR UPDATE SKIP LOCKED) AS c
    ORDER BY c.priority DESC, c.available_at, c.id
    LIMIT $6)
UPDATE {jobs}
SET attempts = attempts + 1, lease_token = {token}, lease_until = {now} + $2, locked_by = $3,
    first_leased_at = COALESCE(first_leased_at, {now}), updated_at = {now}
WHERE id = ANY(ARRAY(SELECT id FROM picked))
RETURNING {leased_columns}";

/// How long after now the next job of the queues in `$2` (an array) that is
/// not due yet comes due: the fetcher sleeps until then. One seek of
/// `{prefix}jobs_scheduled` per queue. Differs from SQLite's `NEXT_DUE` in
/// that the jobs not due yet are told apart by `available_at` (no `due`
/// flag, see `migrations/postgres/V2__due.sql`), and in that it answers
/// relative to the server's now.
pub const NEXT_DUE: &str = "
SELECT min(d.at) - {now} FROM unnest($2::text[]) AS q (name)
CROSS JOIN LATERAL (
    SELECT min(available_at) AS at FROM {jobs}
    WHERE queue = q.name AND lease_token IS NULL AND available_at > {now}) AS d";

/// What a lease returns, in the order `jobs::leased_job` reads it.
/// Differs from SQLite in that the JSONB payload is read back as text.
pub const LEASED_COLUMNS: &str = "id, lease_token, queue, kind, priority, unique_key, \
     payload::text, attempts, max_attempts, available_at, lease_until, created_at";

// ---- settle ----------------------------------------------------------------

/// `$errors` with the entry `$entry` (JSONB, or NULL for none) appended,
/// keeping the last 20. The entry's `at` is restamped with `{now}`, the clock
/// every other time of the row comes from.
macro_rules! append_error {
    ($errors:literal, $entry:literal) => {
        concat!(
            "CASE WHEN ",
            $entry,
            " IS NULL THEN ",
            $errors,
            "
                  WHEN jsonb_array_length(",
            $errors,
            ") >= 20
                  THEN (",
            $errors,
            " - 0) || jsonb_build_array(jsonb_set(",
            $entry,
            "::jsonb, '{at}', to_jsonb({now})))
                  ELSE ",
            $errors,
            " || jsonb_build_array(jsonb_set(",
            $entry,
            "::jsonb, '{at}', to_jsonb({now}))) END"
        )
    };
}

/// Moves live jobs into history with their final status, fenced on their
/// tokens (a NULL token matches only a job that is not leased: an operator's
/// cancel). Parameters: `$1` now override, then arrays of id, token, status,
/// result JSON text, error entry JSON text. Returns the ids moved, each with
/// the ids of the batches whose counters the statement updated (the same
/// array on every row; see `batches.rs`).
///
/// Differs from SQLite in that one statement moves many rows: a
/// data-modifying CTE deletes the live rows and inserts what it deleted, so
/// the copy and the delete cannot disagree and a batch is one round trip;
/// the batch members among them are counted in the same statement
/// (`counted`), so a job in no batch costs no round trip more, and so are
/// the finished counts (`tallied`, as `counts.rs`' `COUNT_MOVED`: delta
/// rows appended, so concurrent finishes lock no shared bucket row): a
/// separate statement halved the burn-down's throughput.
pub const FINISH_TO_HISTORY: &str = concat!(
    "
WITH done AS (
    SELECT * FROM unnest($2::int8[], $3::int8[], $4::text[], $5::text[], $6::text[])
        AS d (id, token, status, result, error)),
moved AS (
    DELETE FROM {jobs} AS j USING done
    WHERE j.id = done.id AND j.lease_token IS NOT DISTINCT FROM done.token
    RETURNING j.*, done.status AS new_status, done.result AS new_result,
              done.error AS new_error),
copied AS (
    INSERT INTO {history}
        (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
         errors, cancel_requested, created_at, updated_at, result, status, processed_by,
         started_at, finished_at, progress)
    SELECT id, queue, kind, priority, unique_key, payload, attempts, max_attempts,
           available_at, ",
    append_error!("errors", "new_error"),
    ", cancel_requested, created_at, {now}, new_result::jsonb, new_status, locked_by,
           first_leased_at, {now}, progress
    FROM moved
    RETURNING id, queue, kind, status, finished_at),
tallied AS (
    INSERT INTO {finished_counts} AS c (span, bucket, queue, kind, status, n)
    SELECT s.span, i.finished_at - i.finished_at % (s.span * 1000000), i.queue, i.kind,
           i.status, count(*)
    FROM copied AS i CROSS JOIN (VALUES (60::int8), (3600::int8)) AS s (span)
    GROUP BY 1, 2, 3, 4, 5),
gone AS (
    DELETE FROM {batch_jobs} AS m USING moved
    WHERE m.job_id = moved.id
    RETURNING m.batch_id, moved.new_status AS status),
counted AS (
    UPDATE {batches} AS b
    SET completed = b.completed + c.completed, discarded = b.discarded + c.discarded,
        cancelled = b.cancelled + c.cancelled, dead = b.dead + c.dead, updated_at = {now}
    FROM (SELECT batch_id,
                 count(*) FILTER (WHERE status = 'completed') AS completed,
                 count(*) FILTER (WHERE status = 'discarded') AS discarded,
                 count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
                 count(*) FILTER (WHERE status = 'dead') AS dead
          FROM gone GROUP BY batch_id) AS c
    WHERE b.id = c.batch_id
    RETURNING b.id)
SELECT id, ARRAY(SELECT id FROM counted) FROM copied"
);

/// Removes a live row (an operator's delete).
///
/// Differs from SQLite in that finishing does not use it:
/// [`FINISH_TO_HISTORY`] deletes as it copies.
pub const DELETE_LIVE: &str = "DELETE FROM {jobs} WHERE id = $1";

/// Unleases jobs and schedules their next runs, fenced on their tokens.
/// Parameters: `$1` now override, then arrays of id, token, delay (µs from
/// now), attempts to give back (0 or 1), error entry JSON text (or NULL), and
/// whether to keep the job's place in line (`LEAST(available_at, now)`,
/// the rescuer's reschedule; the delay is ignored then). Returns, per job
/// unleased, whether a cancel was requested meanwhile, so the caller can
/// honour it instead.
///
/// Differs from SQLite in that it takes a batch, and in the place-keeping
/// flag: the rescuer's "not later than now" must be the server's now, not the
/// engine's.
pub const RESCHEDULE: &str = concat!(
    "
UPDATE {jobs} AS j
SET lease_token = NULL, lease_until = NULL, locked_by = NULL,
    available_at = CASE WHEN r.keep_place THEN LEAST(j.available_at, {now})
                        ELSE {now} + r.delay END,
    attempts = j.attempts - r.refund, updated_at = {now}, errors = ",
    append_error!("j.errors", "r.error"),
    "
FROM unnest($2::int8[], $3::int8[], $4::int8[], $5::int4[], $6::text[], $7::bool[])
    AS r (id, token, delay, refund, error, keep_place)
WHERE j.id = r.id AND j.lease_token = r.token
RETURNING j.id, j.cancel_requested"
);

/// Whether a lease is still held: the fence a transactional completion checks
/// before the caller's effects run. Parameters: `$1` id, `$2` token.
///
/// Differs from SQLite in that it locks the row (`FOR UPDATE`) until the
/// transaction ends: a rescuer or another claim skips it meanwhile, so the
/// fence still holds at commit (SQLite's single writer gives that for free).
pub const LEASE_HELD: &str = "SELECT 1 FROM {jobs} WHERE id = $1 AND lease_token = $2 FOR UPDATE";

/// Writes running jobs' progress, fenced on their leases. Parameters: `$1`
/// now override, then arrays of id, token, progress JSON text. Returns the
/// ids written.
///
/// Differs from SQLite in that it takes a batch, and skips a row another
/// transaction holds (a handler's `ctx.transaction(..)` committing it)
/// instead of waiting for it, as the heartbeat does: that progress is
/// written with a later heartbeat or before the job settles.
pub const WRITE_PROGRESS: &str = "
WITH w AS (
    SELECT * FROM unnest($2::int8[], $3::int8[], $4::text[]) AS w (id, token, progress)),
free AS (
    SELECT j.id FROM {jobs} AS j JOIN w ON j.id = w.id AND j.lease_token = w.token
    FOR NO KEY UPDATE OF j SKIP LOCKED)
UPDATE {jobs} AS j SET progress = w.progress, updated_at = {now}
FROM w JOIN free ON free.id = w.id
WHERE j.id = w.id
RETURNING j.id";

/// [`WRITE_PROGRESS`] waiting for a row another transaction holds: the
/// write before a settle, which must not leave an older value behind.
pub const WRITE_PROGRESS_WAIT: &str = "
UPDATE {jobs} AS j SET progress = w.progress, updated_at = {now}
FROM unnest($2::int8[], $3::int8[], $4::text[]) AS w (id, token, progress)
WHERE j.id = w.id AND j.lease_token = w.token
RETURNING j.id";

// ---- heartbeat -------------------------------------------------------------

/// Extends every given lease still held to `$2` (µs from now), in one
/// statement. `$3` and `$4` are the ids and tokens; a pair that matches no
/// row was lost. Returns the leases held, and whether each job was asked to
/// cancel.
///
/// Differs from SQLite in that the pairs come as two arrays, not JSON, and
/// in the locked rows: a row whose transactional completion (or an
/// operator's action) holds its lock is skipped, not waited for, and
/// reported as held, as it still is. Waiting would stall every other lease
/// of the worker behind one handler's transaction; and no rescuer can take
/// a locked row either (it skips locked rows too).
pub const HEARTBEAT: &str = "
WITH held AS (
    SELECT * FROM unnest($3::int8[], $4::int8[]) AS h (id, token)),
free AS (
    SELECT j.id FROM {jobs} AS j JOIN held ON j.id = held.id AND j.lease_token = held.token
    FOR NO KEY UPDATE OF j SKIP LOCKED),
extended AS (
    UPDATE {jobs} AS j SET lease_until = {now} + $2, updated_at = {now}
    FROM free WHERE j.id = free.id
    RETURNING j.id, j.lease_token, j.cancel_requested)
SELECT id, lease_token, cancel_requested FROM extended
UNION ALL
SELECT j.id, j.lease_token, j.cancel_requested
FROM {jobs} AS j JOIN held ON j.id = held.id AND j.lease_token = held.token
WHERE j.id NOT IN (SELECT id FROM free)";

// ---- rescue ----------------------------------------------------------------

/// Leases that expired before now, oldest first, at most `$2`, read from
/// `{prefix}jobs_expiry`. No payloads.
///
/// Differs from SQLite in that the rows are locked, skipping locked ones:
/// rescuers on several nodes take disjoint batches, and a job whose
/// transactional completion holds its row is left to finish.
pub const EXPIRED_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested FROM {jobs}
WHERE lease_token IS NOT NULL AND lease_until < {now}
ORDER BY lease_until LIMIT $2
FOR UPDATE SKIP LOCKED";

/// The leases of worker `$1` whose ids are not in `$2` (the ids it holds),
/// by id: claims whose answer never reached it. No payloads.
///
/// Differs from SQLite in that the rows are locked, skipping locked ones: a
/// job whose transactional completion holds its row is left to finish.
pub const UNHELD_LEASES: &str = "
SELECT id, lease_token, attempts, max_attempts, available_at, cancel_requested FROM {jobs}
WHERE lease_token IS NOT NULL AND locked_by = $1 AND id <> ALL($2::int8[])
ORDER BY id
FOR UPDATE SKIP LOCKED";

// ---- inspect ---------------------------------------------------------------

/// A live job as a record; `state` is derived at now.
/// Differs from SQLite in that JSONB columns are read back as text and the
/// NULL columns are typed.
pub const LIVE_COLUMNS: &str = concat!(
    "id, queue, kind, priority, unique_key, payload::text, attempts, \
     max_attempts, available_at, errors::text, locked_by, lease_until, first_leased_at, \
     cancel_requested, NULL::text AS result, NULL::int8 AS finished_at, created_at, updated_at, ",
    crate::backend::live_state::state_case!("{now}"),
    " AS state, progress, NULL::text AS group_key, NULL::int8 AS aggregated_into"
);

/// A finished job as a record, in the same column order as [`LIVE_COLUMNS`].
pub const HISTORY_COLUMNS: &str = "id, queue, kind, priority, unique_key, payload::text, \
     attempts, max_attempts, available_at, errors::text, processed_by, NULL::int8 AS lease_until, \
     started_at, cancel_requested, result::text, finished_at, created_at, updated_at, \
     status AS state, progress, group_key, aggregated_into";

// The live-state conditions are `backend/live_state.rs`'s; the operator's
// statements (counts, retry, run now, pause, ...) are `inspect.rs`'s.

/// Unleased jobs per queue and derived state at now, in two parts, each an
/// index walk instead of a scan of the table and its payloads: the jobs due
/// now, counted from `{prefix}jobs_scheduled` (`queue`, `available_at`)
/// alone ...
///
/// Differs from SQLite in that there is no `due` flag: the two parts are
/// told apart by `available_at`, and each row is `(queue, state, count)` so
/// that [`COUNT_WAITING_DUE`] to [`COUNT_DEAD`] run as one statement (one
/// snapshot, one round trip; see `Queries::depth`). A job due now needs no
/// `attempts` (it is available either way), so this part reads no table row
/// where the visibility map allows an index-only scan.
pub const COUNT_WAITING_DUE: &str = "
SELECT queue, 'available' AS state, count(*) FROM {jobs}
WHERE lease_token IS NULL AND available_at <= {now} GROUP BY queue";

/// ... and the jobs not due yet, walked in the same index and each looked
/// up for its `attempts` (retrying or scheduled).
pub const COUNT_WAITING_LATER: &str = "
SELECT queue, CASE WHEN attempts > 0 THEN 'retrying' ELSE 'scheduled' END AS state, count(*)
FROM {jobs} WHERE lease_token IS NULL AND available_at > {now} GROUP BY 1, 2";

/// Leased jobs per queue, through `{prefix}jobs_expiry`.
pub const COUNT_RUNNING: &str = "
SELECT queue, 'running' AS state, count(*) FROM {jobs} WHERE lease_token IS NOT NULL
GROUP BY queue";

/// Dead jobs per queue: the dead-letter count. Walks only the `dead` range
/// of `{prefix}history_finished`, never the rest of history.
pub const COUNT_DEAD: &str = "
SELECT queue, 'dead' AS state, count(*) FROM {history} WHERE status = 'dead' GROUP BY queue";

// ---- copy ------------------------------------------------------------------

/// Inserts a live job copied from another database, keeping its id, unless
/// the id is taken (live or finished) or its unique key is held: then nothing
/// changes. Not leased: a job leased at copy time arrives available.
/// Parameters: `$1` id, `$2` queue, `$3` kind, `$4` priority, `$5` unique
/// key, `$6` payload, `$7` attempts, `$8` max attempts, `$9` available_at,
/// `$10` first leased at, `$11` errors, `$12` cancel requested, `$13`
/// created_at, `$14` updated_at, `$15` progress.
///
/// Differs from SQLite in that the JSON texts are parsed into JSONB. The
/// times are copied as they are: they are absolute, whichever clock made
/// them.
pub const IMPORT_LIVE: &str = "
INSERT INTO {jobs}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     first_leased_at, errors, cancel_requested, created_at, updated_at, progress)
SELECT $1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11::text::jsonb, $12, $13, $14,
       $15
WHERE NOT EXISTS (SELECT 1 FROM {history} WHERE id = $1)
ON CONFLICT DO NOTHING";

/// Inserts a finished job copied from another database, keeping its id,
/// unless the id is taken. Parameters as [`IMPORT_LIVE`], then `$15` result,
/// `$16` status, `$17` processed by, `$18` finished_at (`$10` is started_at),
/// `$19` progress, `$20` group key, `$21` aggregated into.
pub const IMPORT_HISTORY: &str = "
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     started_at, errors, cancel_requested, created_at, updated_at, result, status,
     processed_by, finished_at, progress, group_key, aggregated_into)
SELECT $1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11::text::jsonb, $12, $13, $14,
       $15::text::jsonb, $16, $17, $18, $19, $20, $21
WHERE NOT EXISTS (SELECT 1 FROM {jobs} WHERE id = $1)
ON CONFLICT DO NOTHING";

/// Inserts a waiting group member copied from another database, keeping its
/// id, unless the id is taken. Parameters: `$1` id, `$2` queue, `$3` kind,
/// `$4` group key, `$5` priority, `$6` payload, `$7` max attempts, `$8`
/// created_at.
pub const IMPORT_GROUPED: &str = "
INSERT INTO {group_members}
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
SELECT $1, $2, $3, $4, $5, $6::text::jsonb, $7, $8
WHERE NOT EXISTS (SELECT 1 FROM {jobs} WHERE id = $1)
  AND NOT EXISTS (SELECT 1 FROM {history} WHERE id = $1)
ON CONFLICT DO NOTHING";

/// Makes new ids start above `$1`, the highest copied id.
///
/// Differs from SQLite (two statements on `sqlite_sequence`) in that the
/// id sequence is moved with `setval`, never backwards.
pub const RAISE_NEXT_ID: &str = "
SELECT setval(s, GREATEST($1, COALESCE(pg_sequence_last_value(s), 0)))
FROM (SELECT pg_get_serial_sequence('{jobs}', 'id')::regclass AS s) AS seq";

// ---- groups ----------------------------------------------------------------

/// Inserts a member into its group's waiting room, with an id from the jobs'
/// sequence. Parameters: `$1` now override, `$2` queue, `$3` kind, `$4`
/// group key, `$5` priority, `$6` payload, `$7` max attempts.
///
/// Differs from SQLite in that `nextval` hands out the id directly (SQLite
/// inserts a live row and moves it).
pub const JOIN_GROUP_MEMBER: &str = "
INSERT INTO {group_members}
    (id, queue, kind, group_key, priority, payload, max_attempts, created_at)
VALUES (nextval(pg_get_serial_sequence('{jobs}', 'id')), $2, $3, $4, $5, $6::text::jsonb, $7,
        {now})
RETURNING id";

/// Counts a new member into its group, creating the group, and sets the
/// group's policy and when it is ready (see SQLite's). Parameters: `$1` now
/// override, `$2` queue, `$3` kind, `$4` group key, `$5` max size, `$6`
/// grace, `$7` max delay (µs). A group row another transaction is combining
/// is waited for (it commits in one short transaction); if that one deleted
/// it, this inserts it afresh.
pub const JOIN_GROUP: &str = "
INSERT INTO {groups} AS g
    (queue, kind, group_key, max_size, grace_us, max_delay_us, size, first_at, last_at, ready_at)
VALUES ($2, $3, $4, $5::int4, $6::int8, $7::int8, 1, {now}, {now},
        CASE WHEN $5::int4 <= 1 THEN {now} ELSE {now} + LEAST($6::int8, $7::int8) END)
ON CONFLICT (queue, kind, group_key) DO UPDATE SET
    max_size = excluded.max_size, grace_us = excluded.grace_us,
    max_delay_us = excluded.max_delay_us, size = g.size + 1, last_at = excluded.last_at,
    ready_at = CASE WHEN g.size + 1 >= excluded.max_size THEN excluded.last_at
                    ELSE LEAST(excluded.last_at + excluded.grace_us,
                               g.first_at + excluded.max_delay_us) END";

/// Up to `$2` groups ready now, the longest ready first, locked. Differs
/// from SQLite in the lock: aggregators on several nodes skip each other's
/// groups, so a group is combined by one of them at a time.
pub const READY_GROUPS: &str = "
SELECT queue, kind, group_key, max_size FROM {groups}
WHERE ready_at <= {now} ORDER BY ready_at LIMIT $2
FOR UPDATE SKIP LOCKED";

/// A group's oldest `$4` members.
pub const GROUP_MEMBERS: &str = "
SELECT id, priority, payload::text, max_attempts FROM {group_members}
WHERE queue = $1 AND kind = $2 AND group_key = $3 ORDER BY id LIMIT $4";

/// Moves the members `$2` (ids) to history as `aggregated` into job `$3`.
/// Differs from SQLite in that one statement deletes and copies (a
/// data-modifying CTE, as [`FINISH_TO_HISTORY`]), and in that the members
/// are named by id: a member another transaction adds meanwhile is not
/// taken (it waits, with the lock on its group, for this one to commit).
pub const AGGREGATE_TO_HISTORY: &str = "
WITH moved AS (
    DELETE FROM {group_members} WHERE id = ANY($2::int8[]) RETURNING *)
INSERT INTO {history}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress, group_key, aggregated_into)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, created_at,
       '[]'::jsonb, FALSE, created_at, {now}, NULL, 'aggregated', NULL, NULL, {now}, NULL,
       group_key, $3
FROM moved";

/// What is left of a group after a combination.
pub const GROUP_LEFT: &str = "
SELECT count(*), min(created_at) FROM {group_members}
WHERE queue = $1 AND kind = $2 AND group_key = $3";

/// Removes a group with no member left.
pub const DELETE_GROUP: &str =
    "DELETE FROM {groups} WHERE queue = $1 AND kind = $2 AND group_key = $3";

/// Re-arms a group that kept members: `$5` left, the oldest joined at `$6`.
pub const REARM_GROUP: &str = "
UPDATE {groups}
SET size = $5::int4, first_at = $6::int8,
    ready_at = CASE WHEN $5::int4 >= max_size THEN {now}
                    ELSE LEAST(last_at + grace_us, $6::int8 + max_delay_us) END
WHERE queue = $2 AND kind = $3 AND group_key = $4";

/// How long until the next group is ready (µs, negative when one is).
pub const NEXT_GROUP_READY: &str = "SELECT min(ready_at) - {now} FROM {groups}";

/// A job waiting in its group as a record, in [`LIVE_COLUMNS`] order.
pub const GROUPED_COLUMNS: &str = "id, queue, kind, priority, NULL::text AS unique_key, \
     payload::text, 0 AS attempts, max_attempts, created_at AS available_at, \
     '[]' AS errors, NULL::text AS locked_by, NULL::int8 AS lease_until, \
     NULL::int8 AS first_leased_at, FALSE AS cancel_requested, NULL::text AS result, \
     NULL::int8 AS finished_at, created_at, created_at AS updated_at, 'grouped' AS state, \
     NULL::text AS progress, group_key, NULL::int8 AS aggregated_into";

/// Waiting group members per queue.
pub const COUNT_GROUPED: &str =
    "SELECT queue, 'grouped', count(*) FROM {group_members} GROUP BY queue";

// ---- maintenance -----------------------------------------------------------

/// Deletes up to `$4` finished jobs of status `$2` that finished before `$3`
/// (µs from now, negative), oldest first, through `{prefix}history_finished`,
/// keeping those a pending or live job depends on; with them their edges,
/// their workflow steps, and each workflow whose last step they were (as
/// SQLite's `PRUNE_HISTORY`, `PRUNE_EDGES`, `PRUNE_STEP` and
/// `PRUNE_WORKFLOW`). Returns how many jobs it deleted.
///
/// Differs from SQLite in that rows another node is pruning are skipped, and
/// in that it is one statement: every part reads one snapshot, so the
/// workflow's other steps are those not deleted here, and an edge between
/// two pruned jobs is deleted by `edges_out` only. Two nodes pruning the
/// last steps of one workflow at the same instant each see the other's step
/// still there and keep its row (a name and a time); no step is left.
pub const PRUNE_HISTORY: &str = "
WITH gone AS (
    DELETE FROM {history} WHERE id IN (
        SELECT h.id FROM {history} AS h WHERE h.status = $2 AND h.finished_at < {now} + $3
          AND NOT EXISTS (
            SELECT 1 FROM {dependencies} AS e
            WHERE e.dependency = h.id
              AND (EXISTS (SELECT 1 FROM {pending} AS p WHERE p.id = e.dependent)
                   OR EXISTS (SELECT 1 FROM {jobs} AS j WHERE j.id = e.dependent)))
        ORDER BY h.finished_at LIMIT $4
        FOR UPDATE SKIP LOCKED)
    RETURNING id
), edges_out AS (
    DELETE FROM {dependencies} AS e USING gone WHERE e.dependency = gone.id
), edges_in AS (
    DELETE FROM {dependencies} AS e USING gone
    WHERE e.dependent = gone.id AND e.dependency NOT IN (SELECT id FROM gone)
), steps AS (
    DELETE FROM {workflow_steps} AS s USING gone WHERE s.job_id = gone.id
    RETURNING s.workflow_id
), keys AS (
    DELETE FROM {sequence_jobs} AS k USING gone WHERE k.job_id = gone.id
), flows AS (
    DELETE FROM {workflows} AS w WHERE w.id IN (SELECT workflow_id FROM steps)
      AND NOT EXISTS (
        SELECT 1 FROM {workflow_steps} AS s
        WHERE s.workflow_id = w.id AND s.job_id NOT IN (SELECT id FROM gone))
)
SELECT count(*) FROM gone";

/// Subscribes a connection to the queue's channel.
///
/// Differs from SQLite (`PRAGMA data_version`) in that the server pushes a
/// notification at every committed enqueue; nothing is polled.
pub const LISTEN: &str = "LISTEN \"{channel}\"";
