//! Queue limits on PostgreSQL: stored in `{queues}`, checked by a lease in
//! its own transaction. A lease of a limited queue first locks the queue's
//! row (`FOR UPDATE`), so concurrent leases of that queue on any node take
//! turns: each counts the running jobs and the rate window after the
//! previous one committed, and none over-admits. A lease of one queue
//! limited by concurrency alone claims first and locks after, to count
//! ([`lease_ahead`]), so that only the count and the commit take turns; so
//! does a lease of one queue with a rate limit, which counts its starts in
//! the window under the lock ([`lease_ahead_rated`]).
//! Leases of unlimited queues take no lock and skip limited queues (see
//! `LEASE`'s `$7`).

use postgres::GenericClient;

use super::connection::Tx;
use super::jobs;
use super::queries::Queries;
use crate::backend::params::{bigint, LeaseParams};
use crate::error::Result;
use crate::lease::Job;
use crate::limits::{LimitState, QueueLimits};

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

/// A lease of `queue`, limited by concurrency alone at the last look, that
/// claims before it takes the queue's lock: the claim ([`jobs::lease_ahead`])
/// runs beside the other processes' claims, and the lock is held only for
/// the count of the running jobs that follows it, and the commit. Returns
/// the jobs and whether to commit: not when the count, which sees every
/// claim committed under the lock before and this one, exceeds the limit,
/// or when the queue was paused or given a rate limit meanwhile; the caller
/// then rolls back and takes the locked path ([`lease`]). A claim that
/// found no room as it saw it (or nothing due) took nothing, and that path
/// follows in this transaction.
///
/// Exact as [`lease`] is: every claim that can raise the queue's running
/// count (this one, [`lease`]'s) counts under the queue's lock, after the
/// commits of the lock's holders before it, and keeps the lock through its
/// commit. One made ahead of the lock counts itself too, so whichever of
/// two takes the lock second sees the first's jobs and its own. A claim by
/// hand ([`lease_handing_on`]) does not raise the count.
pub(crate) fn lease_ahead<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    queue: &str,
) -> Result<(Vec<Job>, bool)> {
    let jobs = jobs::lease_ahead(tx, q, p)?;
    if jobs.is_empty() {
        return Ok((lease(tx, q, p)?, true));
    }
    let Some(row) = tx.query_opt(&q.limits.lock_queue, &[&queue])? else {
        return Ok((jobs, true));
    };
    let (limit, undo): (Option<i64>, bool) = (row.try_get(0)?, row.try_get(1)?);
    if undo {
        return Ok((jobs, false));
    }
    let Some(limit) = limit else {
        return Ok((jobs, true));
    };
    Ok((jobs, within(tx, q, queue, limit)?))
}

/// A lease of `queue`, which had a rate limit at the last look, that claims
/// before it takes the queue's lock, as [`lease_ahead`] does: the claim
/// ([`jobs::lease_ahead_rated`]) runs beside the other processes' claims,
/// and the lock is held only for the count of its starts in the rate
/// window (`COUNT_STARTS`, which takes the lock), the count of the running
/// jobs when the queue has a concurrency limit too, and the commit. Returns
/// the jobs and whether to commit: not when the starts do not fit in the
/// window, a later lease moved the window on, the queue was paused or lost
/// its rate limit meanwhile, or the running jobs exceed the concurrency
/// limit; the caller then rolls back and takes the locked path ([`lease`]).
/// A claim that found no room as it saw it took nothing, and that path
/// follows in this transaction.
///
/// Exact as [`lease`] is: every claim that starts a job of a queue with a
/// rate limit (this one, [`lease`]'s; a claim by hand takes none of them)
/// counts its starts under the queue's lock, in the window as the lock's
/// holder before left it, and keeps the lock through its commit.
pub(crate) fn lease_ahead_rated<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    queue: &str,
) -> Result<(Vec<Job>, bool)> {
    let jobs = jobs::lease_ahead_rated(tx, q, p)?;
    if jobs.is_empty() {
        return Ok((lease(tx, q, p)?, true));
    }
    let started = bigint(jobs.len());
    let counted = tx.query_opt(
        &q.limits.count_starts,
        &[&q.now_override(p.now), &queue, &started],
    )?;
    let Some(row) = counted else {
        return Ok((jobs, false));
    };
    let Some(limit) = row.try_get::<_, Option<i64>>(0)? else {
        return Ok((jobs, true));
    };
    Ok((jobs, within(tx, q, queue, limit)?))
}

/// Whether `queue`'s running jobs, counted under its lock with the claim
/// made ahead of it, are within its concurrency `limit`: whether a claim
/// ahead may commit.
fn within<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    queue: &str,
    limit: i64,
) -> Result<bool> {
    let running: i64 = tx
        .query_opt(&q.limits.running, &[&queue])?
        .map_or(Ok(0), |r| r.try_get(0))?;
    Ok(running <= limit)
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
    // Each limited queue's claim counts its own concurrency room
    // (`lease_limited`).
    let (jobs, windows) =
        crate::limits::lease_locked(p, &limited, now, |queues, limit, at, one_limited| {
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
        })?;
    for w in &windows {
        tx.execute(&q.limits.set_rate_window, &[&w.queue, &w.start, &w.count])?;
    }
    Ok(jobs)
}
