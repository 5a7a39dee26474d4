//! The statements of an operator's calls on PostgreSQL (`inspect.rs`: the
//! counts, retry, delete, run now, cancel, pause, update, the look-up of a
//! unique key), in the order of `sqlite/queries.rs`' inspect part:
//! PostgreSQL's [`InspectTexts`], which `queries/mod.rs` renders once at
//! connect. The record's columns and the depth's counts, which only
//! PostgreSQL composes this way, stay in `templates.rs`.

use super::Queries;
use crate::backend::statements::InspectTexts;

impl InspectTexts for Queries {
    /// Finished jobs per queue and status.
    const COUNT_HISTORY: &'static str =
        "SELECT queue, status, count(*) FROM {history} GROUP BY 1, 2";

    /// Moves a finished job (`$2`) back to live, attempts reset, due now.
    const RETRY_FROM_HISTORY: &'static str = "
INSERT INTO {jobs}
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at)
SELECT id, queue, kind, priority, unique_key, payload, 0, max_attempts, {now},
       errors, FALSE, created_at, {now}
FROM {history} WHERE id = $2
ON CONFLICT DO NOTHING";

    /// Removes a finished job.
    const DELETE_HISTORY: &'static str = "DELETE FROM {history} WHERE id = $1";

    /// Makes an unleased live job (`$2`) due now, unless it is due already: a
    /// job keeps its place in line.
    const RUN_NOW: &'static str = "UPDATE {jobs} SET available_at = LEAST(available_at, {now}), \
     updated_at = {now} WHERE id = $2 AND lease_token IS NULL";

    /// Flags a running job (`$2`) for cancellation; the next heartbeat reports it.
    const REQUEST_CANCEL: &'static str =
        "UPDATE {jobs} SET cancel_requested = TRUE, updated_at = {now} \
     WHERE id = $2 AND lease_token IS NOT NULL";

    /// The lease state of a live job: its token (NULL when not leased).
    /// Differs from SQLite in that the row is locked for the operator's action
    /// that follows, so a lease cannot claim it in between.
    const LIVE_LEASE: &'static str = "SELECT lease_token FROM {jobs} WHERE id = $1 FOR UPDATE";

    /// A finished job's status, locked like [`Self::LIVE_LEASE`].
    const HISTORY_STATUS: &'static str = "SELECT status FROM {history} WHERE id = $1 FOR UPDATE";

    /// Pauses or resumes a queue. Parameters: `$1` now override, `$2` queue,
    /// `$3` paused.
    const SET_PAUSED: &'static str = "
INSERT INTO {queues} (name, paused, updated_at) VALUES ($2, $3, {now})
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at";

    /// Queues that are paused.
    const PAUSED_QUEUES: &'static str = "SELECT name FROM {queues} WHERE paused ORDER BY name";

    /// Changes an unleased live job; a NULL parameter keeps the column.
    /// Parameters: `$1` now override, `$2` id, `$3` priority, `$4` delay (µs
    /// from now) of the new `available_at`, `$5` queue.
    ///
    /// Differs from SQLite in that there is no `due` flag to keep in step (the
    /// lease index holds every unleased job, see `V2__due.sql`), the time is the
    /// server's, and in the unique key: PostgreSQL has no `UPDATE OR IGNORE`, so
    /// a move onto a key the target queue already holds is left out by the
    /// `NOT EXISTS` (no row changed, and the caller reports it); a clash with a
    /// job inserted meanwhile, which the snapshot cannot see, fails on the
    /// unique index instead, and the caller reports that alike.
    const UPDATE_WAITING: &'static str = "
UPDATE {jobs} AS j
SET priority = COALESCE($3::int4, j.priority),
    available_at = COALESCE({now} + $4::int8, j.available_at),
    queue = COALESCE($5::text, j.queue), updated_at = {now}
WHERE j.id = $2 AND j.lease_token IS NULL
  AND ($5::text IS NULL OR j.unique_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM {jobs} AS o
      WHERE o.queue = $5::text AND o.unique_key = j.unique_key AND o.id <> j.id))";

    /// Completed jobs per queue since `$2` (µs from now, negative), and since
    /// `$3` (a later time), from the `completed` range of
    /// `{prefix}history_finished`.
    ///
    /// Differs from SQLite in that both times are offsets from the server's
    /// now, as every other time here.
    const COUNT_RECENT_COMPLETIONS: &'static str = "
SELECT queue, count(*), count(*) FILTER (WHERE finished_at >= {now} + $3::int8) FROM {history}
WHERE status = 'completed' AND finished_at >= {now} + $2::int8 GROUP BY queue";

    /// Finished jobs per queue, status and minute ago since `{now} + $2` (an
    /// offset, as in [`Self::COUNT_RECENT_COMPLETIONS`]). The `status IN` list lets
    /// the `(status, finished_at)` index serve it.
    const COUNT_FINISHED_PER_MINUTE: &'static str = "
SELECT queue, status, GREATEST({now} - finished_at, 0) / 60000000, count(*) FROM {history}
WHERE status IN ('completed', 'discarded', 'cancelled', 'dead') AND finished_at >= {now} + $2::int8
GROUP BY 1, 2, 3";

    /// The jobs holding unique key `$2` in queue `$1`: the live one, then up
    /// to `$3` finished ones, most recent first; both through the unique indexes.
    const FIND_UNIQUE: &'static str = "
(SELECT id FROM {jobs} WHERE queue = $1 AND unique_key = $2)
UNION ALL
(SELECT id FROM {history} WHERE queue = $1 AND unique_key = $2
 ORDER BY finished_at DESC LIMIT $3)";
}
