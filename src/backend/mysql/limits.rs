//! Queue limits on MySQL: stored in `{queues}`, checked by a lease in its
//! own transaction. A lease of a limited queue first locks the queue's row
//! (`FOR UPDATE`), so concurrent leases of that queue on any node take turns:
//! each counts the running jobs and the rate window after the previous one
//! committed (READ COMMITTED: every statement reads the latest commits), and
//! none over-admits. Leases of unlimited queues take no lock and skip
//! limited queues (the walk's `:skip_limited`).
//!
//! # The running bound
//!
//! Counting a queue's running jobs is what a limited lease pays for on
//! InnoDB, not the row lock: while other transactions write the running
//! entries, the count reads each one again (BENCHMARKS.md, issue 20's
//! limits). So the queue's row also keeps `running_bound` (V14), an upper
//! bound of its running jobs, read with the lock and written by the claim
//! (`jobs::lease_limited`). A lease that wants `n` jobs of a queue with
//! concurrency limit `c` claims without counting when `running_bound + n <=
//! c`, and stores `running_bound + claimed`; otherwise (the bound NULL, or
//! too high) it counts as before, claims up to `c - running`, and stores
//! `running + claimed`. A lease that claims nothing stores nothing.
//!
//! Invariant: at every commit, a queue's `running_bound`, when not NULL, is
//! at least the number of its jobs leased. Every way a job of a queue with
//! a concurrency limit becomes leased on MySQL:
//!
//! - a lease on the locked path (this module, manual leases included): it
//!   holds the row from reading the bound until it commits, so no other
//!   such lease raises the count meanwhile, and it adds what it claims;
//! - a claim that hands on the places its own transaction's settles freed
//!   ([`lease_handing_on`]): it takes no more than those settles ended, and
//!   commits with them, so the count never rises by it;
//! - a lease while the queue had no concurrency limit (the plain walk, or a
//!   rate limit alone): its jobs are not in the bound, but the limit was set
//!   since, and [`set_limits`] stores NULL, so the next lease counts them.
//!
//! Settles, releases and rescues only lower the count; the bound stays, too
//! high, which is safe: it only makes a lease count sooner, and a count sets
//! it back to the truth. A rolled-back lease rolls its write back with it.
//!
//! One window stays as it was before the bound: a plain lease that read the
//! queue as unlimited just before `set_limits` committed, and commits its
//! claims just after the next locked lease counted, is counted by neither.
//! Without the bound the lease after that counts them; with it, a lease
//! counts again once the bound reaches the limit, so the queue may run over
//! its limit by that plain lease's claims until then, as it could for one
//! lease before.

use mysql::prelude::Queryable;
use mysql::{params, Params, Row, Value};

use super::db::{take, Now};
use super::jobs;
use super::queries::Sql;
use crate::backend::params::LeaseParams;
use crate::error::Result;
use crate::lease::Job;
use crate::limits::{LimitState, QueueLimits};

/// Sets a queue's limits (NULL for none). As SQLite's `SET_LIMITS`; differs
/// in that `ON DUPLICATE KEY` stands for `ON CONFLICT`, and in that the
/// queue's running bound is forgotten: jobs leased while the queue had no
/// concurrency limit are not in it (see the module's docs).
const SET_LIMITS: &str = "
INSERT INTO {queues} (name, concurrency_limit, rate_limit, rate_period_ms, updated_at)
VALUES (:name, :concurrency, :rate, :period, {now})
ON DUPLICATE KEY UPDATE concurrency_limit = :concurrency, rate_limit = :rate,
    rate_period_ms = :period, running_bound = NULL, updated_at = {now}";

/// Every queue with a limit, by name.
const LIMITS: &str = "
SELECT name, concurrency_limit, rate_limit, rate_period_ms FROM {queues}
WHERE concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL ORDER BY name";

/// The limited, unpaused queues among `:q0..`, locked in name order (two
/// leases lock them in the same order, so they cannot deadlock), with their
/// rate windows, their running bounds and the server's now, which the
/// claims of this lease then use as theirs (MySQL's now changes from
/// statement to statement).
///
/// MySQL only: SQLite's single writer needs no lock.
fn lock_limited(queue_count: usize) -> String {
    let names: Vec<String> = (0..queue_count).map(|i| format!(":q{i}")).collect();
    format!(
        "SELECT name, concurrency_limit, rate_limit, rate_period_ms, rate_window_start,
                rate_window_count, running_bound, {{now}}
         FROM {{queues}}
         WHERE name IN ({}) AND NOT paused
           AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL)
         ORDER BY name
         FOR UPDATE",
        names.join(", ")
    )
}

/// Stores a queue's rate window: its start (unix µs) and count.
const SET_RATE_WINDOW: &str = "
UPDATE {queues} SET rate_window_start = :start, rate_window_count = :count WHERE name = :name";

pub(crate) fn set_limits(
    sql: &Sql,
    q: &mut impl Queryable,
    queue: &str,
    limits: &QueueLimits,
    now: Now,
) -> Result<()> {
    let (concurrency, rate, period) = limits.to_stored();
    q.exec_drop(
        sql.tables.render(SET_LIMITS),
        params! {
            "name" => queue, "concurrency" => concurrency, "rate" => rate, "period" => period,
            "now" => now.param(),
        },
    )?;
    Ok(())
}

pub(crate) fn limits(sql: &Sql, q: &mut impl Queryable) -> Result<Vec<(String, QueueLimits)>> {
    let rows: Vec<Row> = q.exec(sql.tables.render(LIMITS), ())?;
    rows.into_iter()
        .map(|mut r| {
            let name: String = take(&mut r, 0)?;
            let limits =
                QueueLimits::from_stored(take(&mut r, 1)?, take(&mut r, 2)?, take(&mut r, 3)?)?;
            Ok((name, limits))
        })
        .collect()
}

/// A lease in the transaction that settled jobs first, where some of the
/// queues may be limited: the places the settles `freed` pass to claims of
/// their queues without the queues' locks, the rest goes to [`lease`].
pub(crate) fn lease_handing_on<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    p: &LeaseParams<'_>,
    now: Now,
    freed: &[(String, usize)],
) -> Result<Vec<Job>> {
    crate::limits::lease_handing_on(
        q,
        p,
        freed,
        |q, part| jobs::lease_handed(sql, q, part, now),
        |q, rest| lease(sql, q, rest, now),
    )
}

/// A lease where some of the queues may be limited, in the caller's
/// transaction: locks the limited queues' rows, claims each up to its room
/// and the others with what is left, and stores the rate windows.
pub(crate) fn lease(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
) -> Result<Vec<Job>> {
    let mut named: Vec<(String, Value)> = p
        .queues
        .iter()
        .enumerate()
        .map(|(i, queue)| (format!("q{i}"), queue.as_str().into()))
        .collect();
    named.push(("now".into(), now.param().into()));
    let rows: Vec<Row> = q.exec(
        sql.tables.render(&lock_limited(p.queues.len())),
        Params::from(named),
    )?;
    let mut server_now = None;
    let mut limited = Vec::with_capacity(rows.len());
    // Each locked queue's running bound (the module's docs).
    let mut bounds: Vec<(String, Option<i64>)> = Vec::with_capacity(rows.len());
    for mut r in rows {
        let limits =
            QueueLimits::from_stored(take(&mut r, 1)?, take(&mut r, 2)?, take(&mut r, 3)?)?;
        let queue: String = take(&mut r, 0)?;
        bounds.push((queue.clone(), take(&mut r, 6)?));
        limited.push(LimitState {
            queue,
            limits,
            window_start: take(&mut r, 4)?,
            window_count: take(&mut r, 5)?,
            running: 0,
        });
        server_now = Some(take::<i64>(&mut r, 7)?);
    }
    if limited.is_empty() && p.caps.is_empty() {
        // Limits set since this lease began are skipped by `skip_limited`.
        return jobs::lease(sql, q, p, now, true);
    }
    // Every claim of this lease at the now the limits were read at, so a
    // job's start time falls in the window that counted it. (A cap alone
    // needs no clock.) Each limited queue's walk counts its own
    // concurrency room (`jobs::lease_limited`).
    let at = server_now.unwrap_or(p.now);
    let (jobs, windows) =
        crate::limits::lease_locked(p, &limited, at, |queues, limit, t, one_limited| {
            let (pinned, lease_until) = match server_now {
                Some(_) => (
                    Now::new(t, true),
                    t.saturating_add(now.offset(p.lease_until)),
                ),
                None => (now, p.lease_until),
            };
            let part = LeaseParams {
                queues,
                limit,
                now: t,
                lease_until,
                ..*p
            };
            match one_limited.map(|s| (s.limits.concurrency, &s.queue)) {
                // This transaction holds the queue's row: its claim may
                // take it, up to the room its concurrency limit leaves.
                Some((Some(n), queue)) => {
                    let bound = bounds
                        .iter()
                        .find(|(b, _)| b == queue)
                        .and_then(|(_, b)| *b);
                    jobs::lease_limited(sql, q, &part, pinned, i64::from(n), bound)
                }
                Some((None, _)) => jobs::lease(sql, q, &part, pinned, false),
                // The others' claims skip any queue limited meanwhile.
                None => jobs::lease(sql, q, &part, pinned, true),
            }
        })?;
    let set_window = sql.tables.render(SET_RATE_WINDOW);
    for w in &windows {
        q.exec_drop(
            &set_window,
            params! { "name" => &w.queue, "start" => w.start, "count" => w.count },
        )?;
    }
    Ok(jobs)
}
