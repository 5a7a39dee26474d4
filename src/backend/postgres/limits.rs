//! Queue limits on PostgreSQL: stored in `{queues}`, checked by a lease in
//! its own transaction. A lease of a limited queue first locks the queue's
//! row (`FOR UPDATE`), so concurrent leases of that queue on any node take
//! turns: each counts the running jobs and the rate window after the
//! previous one committed, and none over-admits. Leases of unlimited queues
//! take no lock and skip limited queues (see `LEASE`'s `$7`).

use postgres::GenericClient;

use super::connection::Tx;
use super::jobs;
use super::queries::{Queries, Tables, LEASE};
use crate::backend::params::LeaseParams;
use crate::error::Result;
use crate::lease::Job;
use crate::limits::{LimitState, QueueLimits};

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

/// Stores queue `$1`'s rate window: start `$2` (unix µs), count `$3`.
const SET_RATE_WINDOW: &str = "
UPDATE {queues} SET rate_window_start = $2, rate_window_count = $3 WHERE name = $1";

/// The statements above, rendered for the queue's tables.
#[derive(Debug)]
pub(crate) struct LimitQueries {
    set_limits: String,
    limits: String,
    lock_limited: String,
    pub(crate) lease_limited: String,
    pub(crate) lease_handed: String,
    set_rate_window: String,
}

impl LimitQueries {
    pub(crate) fn render(tables: &Tables) -> LimitQueries {
        LimitQueries {
            set_limits: tables.render(SET_LIMITS),
            limits: tables.render(LIMITS),
            lock_limited: tables.render(LOCK_LIMITED),
            lease_limited: tables.render(&lease_limited()),
            lease_handed: tables.render(&lease_handed()),
            set_rate_window: tables.render(SET_RATE_WINDOW),
        }
    }
}

pub(crate) fn set_limits<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    queue: &str,
    limits: &QueueLimits,
    now: i64,
) -> Result<()> {
    let (concurrency, rate, period) = limits.to_stored();
    let (concurrency, rate, period) = (
        concurrency.map(to_i32),
        rate.map(to_i32),
        period.map(to_i32),
    );
    tx.execute(
        &q.limits.set_limits,
        &[&q.now_override(now), &queue, &concurrency, &rate, &period],
    )?;
    Ok(())
}

/// Validated limits (and a week in ms) fit an `INTEGER` column.
fn to_i32(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(crate) fn limits<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
) -> Result<Vec<(String, QueueLimits)>> {
    tx.query(&q.limits.limits, &[])?
        .iter()
        .map(|r| {
            Ok((
                r.try_get(0)?,
                QueueLimits::from_stored(r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)?,
            ))
        })
        .collect()
}

/// A lease in the transaction that settled jobs first, where some of the
/// queues may be limited: the places the settles `freed` pass to claims of
/// their queues without the queues' locks, the rest goes to [`lease`].
pub(crate) fn lease_handing_on<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    freed: &[(String, usize)],
) -> Result<Vec<Job>> {
    crate::limits::lease_handing_on(
        tx,
        p,
        freed,
        |tx, part| jobs::lease_handed(tx, q, part),
        |tx, rest| lease(tx, q, rest),
    )
}

/// A lease where some of the queues may be limited, in the caller's
/// transaction: locks the limited queues' rows, claims each up to its room
/// and the others with what is left, and stores the rate windows.
pub(crate) fn lease<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
) -> Result<Vec<Job>> {
    let rows = tx.query(&q.limits.lock_limited, &[&q.now_override(p.now), &p.queues])?;
    let mut now = p.now; // a cap alone needs no clock
    let mut limited = Vec::with_capacity(rows.len());
    for r in &rows {
        now = r.try_get(6)?;
        limited.push(LimitState {
            queue: r.try_get(0)?,
            limits: QueueLimits::from_stored(r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)?,
            window_start: r.try_get(4)?,
            window_count: r.try_get(5)?,
            running: 0,
        });
    }
    if limited.is_empty() && p.caps.is_empty() {
        // Limits set since this lease began are skipped by `skip_limited`.
        return jobs::lease(tx, q, p, true);
    }
    // The engine sees the rate limits and the caps; each limited queue's
    // claim counts its own concurrency room (`lease_limited`).
    let by_rate: Vec<LimitState> = limited.iter().map(LimitState::rate_only).collect();
    let (jobs, windows) = crate::limits::lease_within(
        p.queues,
        p.limit,
        &by_rate,
        p.caps,
        now,
        |queues, limit, at| {
            let one_limited = match queues {
                [one] => limited.iter().find(|s| &s.queue == one),
                _ => None,
            };
            let part = LeaseParams {
                queues,
                limit,
                ..*p
            };
            // A claim moved past the transaction's now (`lease_time`) is
            // stamped at that time.
            let pin = (at != now).then_some(at);
            match one_limited {
                // This transaction holds the queue's row: its claim may
                // take it, up to the room its concurrency limit leaves.
                Some(state) => jobs::lease_limited_at(
                    tx,
                    q,
                    &part,
                    state.limits.concurrency.map(i64::from),
                    pin,
                ),
                // The others' claims skip any queue limited meanwhile.
                None => jobs::lease_at(tx, q, &part, true, pin),
            }
        },
    )?;
    for w in &windows {
        tx.execute(&q.limits.set_rate_window, &[&w.queue, &w.start, &w.count])?;
    }
    Ok(jobs)
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
    }
}
