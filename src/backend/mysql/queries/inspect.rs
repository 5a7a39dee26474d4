//! The statements of an operator's calls on MySQL (`inspect.rs`: the
//! counts, retry, delete, run now, cancel, pause, update, the look-up of a
//! unique key), in the order of `sqlite/queries.rs`' inspect part: MySQL's
//! [`InspectTexts`], which `queries/mod.rs` renders once at connect. The
//! record's columns and the depth's counts, which only MySQL composes this
//! way, stay in `templates.rs`.

use super::Sql;
use crate::backend::statements::InspectTexts;

impl InspectTexts for Sql {
    /// Finished jobs per queue and status.
    const COUNT_HISTORY: &'static str =
        "SELECT queue, status, count(*) FROM {history} GROUP BY 1, 2";

    /// Moves a finished job back to live, attempts reset, due now. Differs
    /// from SQLite in `INSERT IGNORE` (see [`ENQUEUE`](super::ENQUEUE)) and
    /// `FOR UPDATE` (see [`FINISH_TO_HISTORY`](super::FINISH_TO_HISTORY)).
    const RETRY_FROM_HISTORY: &'static str = "
INSERT IGNORE INTO {jobs}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at)
SELECT id, queue, kind, priority, unique_key, payload, 0, max_attempts, {now},
       errors, FALSE, created_at, {now}
FROM {history} WHERE id = :id
FOR UPDATE";

    /// Removes a finished job.
    const DELETE_HISTORY: &'static str = "DELETE FROM {history} WHERE id = :id";

    /// Makes an unleased live job due now, unless it is due already: a job keeps
    /// its place in line.
    const RUN_NOW: &'static str = "UPDATE {jobs} SET available_at = LEAST(available_at, {now}), \
     updated_at = {now} WHERE id = :id AND lease_token IS NULL";

    /// Flags a running job for cancellation; the next heartbeat reports it.
    const REQUEST_CANCEL: &'static str =
        "UPDATE {jobs} SET cancel_requested = TRUE, updated_at = {now} \
     WHERE id = :id AND lease_token IS NOT NULL";

    /// The lease state of a live job: its token (NULL when not leased). Differs
    /// from SQLite in that it locks the row for the operator action that follows.
    const LIVE_LEASE: &'static str = "SELECT lease_token FROM {jobs} WHERE id = :id FOR UPDATE";

    /// A finished job's status.
    const HISTORY_STATUS: &'static str = "SELECT status FROM {history} WHERE id = :id";

    /// Pauses or resumes a queue. Differs from SQLite in `ON DUPLICATE KEY
    /// UPDATE` (repeating the parameters: MySQL deprecates `VALUES()` there, and
    /// MariaDB has no row alias).
    const SET_PAUSED: &'static str = "
INSERT INTO {queues} (name, paused, updated_at) VALUES (:name, :paused, {now})
ON DUPLICATE KEY UPDATE paused = :paused, updated_at = {now}";

    /// Queues that are paused.
    const PAUSED_QUEUES: &'static str = "SELECT name FROM {queues} WHERE paused ORDER BY name";

    /// Changes an unleased live job; a NULL parameter keeps the column:
    /// `:priority`, `:available_in` (an offset from now), `:queue`.
    ///
    /// Differs from SQLite in that there is no `due` flag to follow the new time
    /// (see `migrations/mysql/V2__due.sql`: `lease_queue` keeps the job in
    /// `jobs_lease`, and `available_at` alone says when it can run), and in that
    /// it has no `OR IGNORE`: a move onto a unique key the target queue already
    /// holds fails with ER_DUP_ENTRY, which InnoDB rolls back alone (not the
    /// transaction), and the caller reports it. `UPDATE IGNORE` would also turn
    /// strict mode's errors into warnings, and its "no row changed" could not be
    /// told from an update that changed no value (MySQL counts changed rows, not
    /// matched ones). MySQL assigns left to right: nothing here reads a column
    /// assigned before it.
    const UPDATE_WAITING: &'static str = "
UPDATE {jobs}
SET priority = COALESCE(:priority, priority),
    available_at = COALESCE({now} + :available_in, available_at),
    queue = COALESCE(:queue, queue), updated_at = {now}
WHERE id = :id AND lease_token IS NULL";

    /// Completed jobs per queue since `:hour_in` from now (and since
    /// `:minute_in`, a later time), from the `completed` range of
    /// `history_finished`. Differs from SQLite in that the two times are
    /// offsets from the server's now, the index is forced (see
    /// [`COUNT_RUNNING`](super::COUNT_RUNNING)), and the second count is a
    /// `COUNT` (MySQL's `SUM` is a DECIMAL).
    const COUNT_RECENT_COMPLETIONS: &'static str = "
SELECT queue, COUNT(*), COUNT(CASE WHEN finished_at >= {now} + :minute_in THEN 1 END)
FROM {history} FORCE INDEX (history_finished)
WHERE status = 'completed' AND finished_at >= {now} + :hour_in GROUP BY queue";

    /// Finished jobs per queue, status and minute ago since `{now} + :since_in`
    /// (an offset, as in [`Self::COUNT_RECENT_COMPLETIONS`]), read through the
    /// `(status, finished_at)` index.
    const COUNT_FINISHED_PER_MINUTE: &'static str = "
SELECT queue, status, GREATEST({now} - finished_at, 0) DIV 60000000, COUNT(*)
FROM {history} FORCE INDEX (history_finished)
WHERE status IN ('completed', 'discarded', 'cancelled', 'dead') AND finished_at >= {now} + :since_in
GROUP BY 1, 2, 3";

    /// The jobs holding unique key `:unique_key` in `:queue`: the live one,
    /// then up to `:history` finished ones, most recent first. Differs from
    /// SQLite in finding the key through its hash, which the indexes hold.
    const FIND_UNIQUE: &'static str = "
(SELECT id FROM {jobs}
 WHERE queue = :queue AND unique_hash = UNHEX(SHA2(:unique_key, 256)) AND unique_key = :unique_key)
UNION ALL
(SELECT id FROM {history}
 WHERE queue = :queue AND unique_hash = UNHEX(SHA2(:unique_key, 256)) AND unique_key = :unique_key
 ORDER BY finished_at DESC LIMIT :history)";
}
