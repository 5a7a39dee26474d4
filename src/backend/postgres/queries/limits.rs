//! The statements of `limits.rs` (queue limits on PostgreSQL), and
//! [`LimitQueries`], which renders them once at connect, below the file
//! that runs them.

use super::templates::LEASE;

/// Sets queue `$2`'s limits: `$3` concurrency, `$4` rate, `$5` period (ms),
/// NULL for none. `$1` is the now override. As SQLite's `SET_LIMITS`.
const SET_LIMITS: &str = "
INSERT INTO {queues} (name, concurrency_limit, rate_limit, rate_period_ms, updated_at)
VALUES ($2, $3, $4, $5, {now})
ON CONFLICT (name) DO UPDATE SET concurrency_limit = excluded.concurrency_limit,
    rate_limit = excluded.rate_limit, rate_period_ms = excluded.rate_period_ms,
    updated_at = excluded.updated_at";

/// Every queue with a limit, by name.
const LIMITS: &str = "
SELECT name, concurrency_limit::int8, rate_limit::int8, rate_period_ms::int8 FROM {queues}
WHERE concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL ORDER BY name";

/// The limited, unpaused queues among `$2` (an array), locked in name order
/// (two leases lock them in the same order, so they cannot deadlock), with
/// their rate windows and the server's now (the transaction's start, which
/// the lease statements of this transaction use too).
///
/// PostgreSQL only: SQLite's single writer needs no lock.
const LOCK_LIMITED: &str = "
SELECT name, concurrency_limit::int8, rate_limit::int8, rate_period_ms::int8,
       rate_window_start, rate_window_count, {now}
FROM {queues}
WHERE name = ANY($2::text[]) AND NOT paused
  AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL)
ORDER BY name
FOR UPDATE";

/// The `LIMIT` of [`LEASE`] for one limited queue (`$4`): the claim stops
/// at the queue's room under its concurrency limit (`$8`, NULL for none):
/// the limit minus its running jobs, counted by this statement.
/// Parameters otherwise as `LEASE`'s.
///
/// The count is in the claim, not in [`LOCK_LIMITED`], because under READ
/// COMMITTED a statement reads the snapshot taken when it began: a count in
/// the statement that waited for the queue's row would miss the claims its
/// previous holder committed meanwhile, and over-admit. This statement
/// begins after the lock is held, so it counts every claim committed before
/// it, in one round trip fewer than a separate count (each round trip here
/// is paid with the queue's row locked, by every lease of the queue in
/// turn).
///
/// PostgreSQL only: SQLite's single writer counts in the lease's
/// transaction without a lock.
const LIMITED_ROOM: &str = "LIMIT GREATEST(0, LEAST($6, $8::int8
        - (SELECT count(*) FROM {jobs} WHERE queue = $4 AND lease_token IS NOT NULL)))";

/// [`LEASE`] with its `LIMIT $6` replaced by [`LIMITED_ROOM`]: derived, not
/// copied, so a change to the lease reaches limited queues too.
fn lease_limited() -> String {
    LEASE.replacen("LIMIT $6\n", &format!("{LIMITED_ROOM}\n"), 1)
}

/// The `LIMIT` of [`LEASE`] for a claim of one limited queue (`$4`) that the
/// settles of its own transaction pay for (`$6`, the places they freed, at
/// most): see [`crate::limits::lease_handing_on`]. It takes no lock, and
/// reads the queue's limit itself: nothing when the queue has a rate limit
/// by now (its starts are counted under the queue's lock) or no concurrency
/// limit any more (the next lease takes the usual path), and no more than
/// the room a lowered limit leaves. Those reads may be a commit behind the
/// lock's holder; over-admission is ruled out by `$6` alone, which the
/// statement never exceeds.
///
/// PostgreSQL only, like [`LIMITED_ROOM`].
const HANDED_ROOM: &str = "LIMIT GREATEST(0, LEAST($6, COALESCE((SELECT concurrency_limit
        FROM {queues} WHERE name = $4 AND rate_limit IS NULL), 0)::int8
        - (SELECT count(*) FROM {jobs} WHERE queue = $4 AND lease_token IS NOT NULL)))";

/// [`LEASE`] with its `LIMIT $6` replaced by [`HANDED_ROOM`].
fn lease_handed() -> String {
    LEASE.replacen("LIMIT $6\n", &format!("{HANDED_ROOM}\n"), 1)
}

/// The `LIMIT` of [`LEASE`] for a claim of one queue limited by concurrency
/// alone (`$4`) made before the queue's lock is taken (see
/// `limits::lease_ahead`): all `$6` asked for when the queue's room, as this
/// statement sees it, is at least four times that, and nothing otherwise
/// (the caller then takes the lock first, as [`LIMITED_ROOM`]'s lease
/// does). The room is only a guess here (claims not yet committed are not
/// counted): it keeps a claim that would probably overshoot from being
/// made and undone. Exactness comes from the count under the lock that
/// follows ([`LOCK_QUEUE`], [`RUNNING`]). Nothing either when the queue
/// has a rate limit by now or no concurrency limit any more.
///
/// PostgreSQL only, like [`LIMITED_ROOM`].
const AHEAD_ROOM: &str = "LIMIT CASE WHEN COALESCE((SELECT concurrency_limit
        FROM {queues} WHERE name = $4 AND rate_limit IS NULL), 0)::int8
        - (SELECT count(*) FROM {jobs} WHERE queue = $4 AND lease_token IS NOT NULL)
        >= 4 * $6::int8 THEN $6::int8 ELSE 0 END";

/// [`LEASE`] with its `LIMIT $6` replaced by [`AHEAD_ROOM`].
fn lease_ahead() -> String {
    LEASE.replacen("LIMIT $6\n", &format!("{AHEAD_ROOM}\n"), 1)
}

/// The `LIMIT` of [`LEASE`] for a claim of one queue with a rate limit
/// (`$4`) made before the queue's lock is taken (see
/// `limits::lease_ahead_rated`): all `$6` asked for when the queue's room,
/// as this statement sees it, is at least four times that under its rate
/// (the starts left in the current window) and under its concurrency limit
/// if it has one, and nothing otherwise (the caller then takes the locked
/// path). A guess, as [`AHEAD_ROOM`]'s: exactness comes from
/// [`COUNT_STARTS`] under the lock, and [`RUNNING`] after it. Nothing when
/// the queue has no rate limit by now.
///
/// The window is `[k·period, (k+1)·period)` as the engine's `window_of`
/// cuts it (for a now at or after the epoch, where `%` is `rem_euclid`).
///
/// PostgreSQL only, like [`LIMITED_ROOM`].
const AHEAD_RATED_ROOM: &str = "LIMIT CASE WHEN COALESCE((SELECT LEAST(
            CASE WHEN concurrency_limit IS NULL THEN $6::int8 * 4
                 ELSE concurrency_limit::int8 - (SELECT count(*) FROM {jobs}
                     WHERE queue = $4 AND lease_token IS NOT NULL) END,
            rate_limit::int8 - CASE
                WHEN rate_window_start = {now} - {now} % (rate_period_ms * 1000::int8)
                THEN rate_window_count ELSE 0 END)
        FROM {queues} WHERE name = $4 AND rate_limit IS NOT NULL), 0)
        >= 4 * $6::int8 THEN $6::int8 ELSE 0 END";

/// [`LEASE`] with its `LIMIT $6` replaced by [`AHEAD_RATED_ROOM`].
fn lease_ahead_rated() -> String {
    LEASE.replacen("LIMIT $6\n", &format!("{AHEAD_RATED_ROOM}\n"), 1)
}

/// Counts `$3` starts, claimed ahead of the lock, in queue `$2`'s rate
/// window at now, locking the queue's row: only when they fit in what is
/// left of the window, the queue is not paused and still has a rate
/// limit, and no later lease has moved the window past now's; no row
/// otherwise, and the caller undoes the claim. Returns the queue's
/// concurrency limit, for the count that follows ([`RUNNING`]).
///
/// One statement locks, checks and writes: under READ COMMITTED an update
/// that waited for the row rechecks its conditions on the version the
/// holder before committed, so it counts every start committed in the
/// window before it, as [`LOCK_LIMITED`]'s lock does for the locked path.
const COUNT_STARTS: &str = "
UPDATE {queues}
SET rate_window_count = CASE
        WHEN rate_window_start = {now} - {now} % (rate_period_ms * 1000::int8)
        THEN rate_window_count + $3::int8 ELSE $3::int8 END,
    rate_window_start = {now} - {now} % (rate_period_ms * 1000::int8)
WHERE name = $2 AND NOT paused AND rate_limit IS NOT NULL
  AND (rate_window_start IS NULL
       OR rate_window_start <= {now} - {now} % (rate_period_ms * 1000::int8))
  AND CASE WHEN rate_window_start = {now} - {now} % (rate_period_ms * 1000::int8)
           THEN rate_window_count + $3::int8 ELSE $3::int8 END <= rate_limit
RETURNING concurrency_limit::int8";

/// Locks queue `$1`'s row after a claim made ahead of the lock: its
/// concurrency limit, and whether that claim must be undone whatever the
/// count (the queue was paused or given a rate limit meanwhile). Under READ
/// COMMITTED the row read is its latest version, the one the lock holder
/// before committed.
const LOCK_QUEUE: &str = "
SELECT concurrency_limit::int8, paused OR rate_limit IS NOT NULL
FROM {queues} WHERE name = $1 FOR UPDATE";

/// Queue `$1`'s running jobs, counted by a statement that begins after
/// [`LOCK_QUEUE`] holds the row: it sees every claim committed by the lock's
/// holders before, and this transaction's own.
const RUNNING: &str = "
SELECT count(*) FROM {jobs} WHERE queue = $1 AND lease_token IS NOT NULL";

/// Stores queue `$1`'s rate window: start `$2` (unix µs), count `$3`.
const SET_RATE_WINDOW: &str = "
UPDATE {queues} SET rate_window_start = $2, rate_window_count = $3 WHERE name = $1";

/// The statements above, rendered for the queue's tables.
#[derive(Debug)]
pub(crate) struct LimitQueries {
    pub set_limits: String,
    pub limits: String,
    pub lock_limited: String,
    pub lease_limited: String,
    pub lease_handed: String,
    pub lease_ahead: String,
    pub lease_ahead_rated: String,
    pub count_starts: String,
    pub lock_queue: String,
    pub running: String,
    pub set_rate_window: String,
}

impl LimitQueries {
    pub(crate) fn render(r: impl Fn(&str) -> String) -> LimitQueries {
        LimitQueries {
            set_limits: r(SET_LIMITS),
            limits: r(LIMITS),
            lock_limited: r(LOCK_LIMITED),
            lease_limited: r(&lease_limited()),
            lease_handed: r(&lease_handed()),
            lease_ahead: r(&lease_ahead()),
            lease_ahead_rated: r(&lease_ahead_rated()),
            count_starts: r(COUNT_STARTS),
            lock_queue: r(LOCK_QUEUE),
            running: r(RUNNING),
            set_rate_window: r(SET_RATE_WINDOW),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_limited_lease_is_the_lease_with_the_room_as_its_limit() {
        let limited = super::lease_limited();
        assert!(limited.contains(super::LIMITED_ROOM), "{limited}");
        assert!(!limited.contains("LIMIT $6\n"), "{limited}");
        let handed = super::lease_handed();
        assert!(handed.contains(super::HANDED_ROOM), "{handed}");
        assert!(!handed.contains("LIMIT $6\n"), "{handed}");
        let ahead = super::lease_ahead();
        assert!(ahead.contains(super::AHEAD_ROOM), "{ahead}");
        assert!(!ahead.contains("LIMIT $6\n"), "{ahead}");
        let rated = super::lease_ahead_rated();
        assert!(rated.contains(super::AHEAD_RATED_ROOM), "{rated}");
        assert!(!rated.contains("LIMIT $6\n"), "{rated}");
    }
}
