//! The job operations on one MySQL session past enqueue: lease, settle,
//! heartbeat, rescue. Each runs inside a transaction its caller opened (the
//! queue's own, or the application's `mysql::Transaction`).

use std::collections::HashMap;

use mysql::prelude::Queryable;
use mysql::{params, Params, Row, Value};

use super::db::{take, Now};
use super::queries::Sql;
use crate::backend::params::{
    bigint, EnqueueParams, ExpiredLease, HeartbeatParams, LeaseParams, ProgressWrite, SettleParams,
};
use crate::clock;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job, Lease};
use crate::outcome::{error_json, AttemptError, FinalStatus, Transition};

/// Inserts jobs in order, each one or the id of the job already holding its
/// unique key (`enqueue.rs`), the members of a batch joining it
/// (`batches.rs`), the jobs with dependencies made to wait (`flows.rs`);
/// a job a dependency's end cancelled is finished here.
pub(crate) fn enqueue_all<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    jobs: &[EnqueueParams<'_>],
    now: Now,
) -> Result<Vec<Enqueued>> {
    let ids = super::batches::enqueue(sql, q, jobs, now, super::enqueue::insert_all)?;
    super::flows::wait_all(sql, q, jobs, ids, now, |q, id, error| {
        let cancelled = FinalStatus::Cancelled;
        finish(sql, q, id, None, cancelled, None, Some(error), now)
    })
}

/// The walk's parameters for `p`: `:q0..`, `:k0..`, `:limit`, `:now`,
/// `:skip_limited`.
fn lease_params(p: &LeaseParams<'_>, now: Now, skip_limited: bool) -> Params {
    let mut named: HashMap<Vec<u8>, Value> = HashMap::new();
    for (i, queue) in p.queues.iter().enumerate() {
        named.insert(format!("q{i}").into_bytes(), queue.as_str().into());
    }
    for (i, kind) in p.kinds.unwrap_or_default().iter().enumerate() {
        named.insert(format!("k{i}").into_bytes(), kind.as_str().into());
    }
    let limit = u64::try_from(p.limit).unwrap_or(u64::MAX);
    named.insert(b"limit".to_vec(), limit.into());
    named.insert(b"now".to_vec(), now.param().into());
    named.insert(b"skip_limited".to_vec(), skip_limited.into());
    Params::Named(named)
}

/// A job as the walk reads it, before its claim.
struct Candidate {
    job: Job,
    server_now: i64,
}

/// Reads a row in [`super::queries::LEASED_COLUMNS`] order, then `now`.
fn candidate(mut r: Row) -> Result<Candidate> {
    let attempts: u32 = take(&mut r, 6)?;
    Ok(Candidate {
        job: Job {
            id: take(&mut r, 0)?,
            lease_token: 0,
            queue: take(&mut r, 1)?,
            kind: take(&mut r, 2)?,
            priority: take(&mut r, 3)?,
            unique_key: take(&mut r, 4)?,
            payload: take(&mut r, 5)?,
            attempt: attempts.saturating_add(1),
            max_attempts: take(&mut r, 7)?,
            available_at: clock::at(take(&mut r, 8)?),
            lease_until: clock::at(0),
            created_at: clock::at(take(&mut r, 9)?),
        },
        server_now: take(&mut r, 10)?,
    })
}

/// Claims up to `limit` jobs and returns them in claim order: the walk locks
/// the candidates, then one update claims them.
pub(crate) fn lease(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
    skip_limited: bool,
) -> Result<Vec<Job>> {
    if p.queues.is_empty() || p.limit == 0 {
        return Ok(Vec::new());
    }
    let kinds = p.kinds.map_or(0, <[String]>::len);
    let rows: Vec<Row> = q.exec(
        sql.lease(p.queues.len(), kinds),
        lease_params(p, now, skip_limited),
    )?;
    let candidates = rows
        .into_iter()
        .map(candidate)
        .collect::<Result<Vec<_>>>()?;
    claim(sql, q, p, now, candidates, None)
}

/// [`lease`] of one limited queue whose row this transaction holds locked:
/// claims no more than `concurrency` minus its running jobs. Those are
/// counted by the walk itself, unless `bound` (the queue's `running_bound`,
/// read under the lock) leaves room for the whole walk: then the walk does
/// not count, and trusts the bound. The claim stores the new bound, the
/// running jobs this lease knew of (counted, or the bound) plus those it
/// claimed (see `mysql/limits.rs` for why it stays an upper bound).
/// Candidates beyond the room stay locked, unclaimed, until the commit;
/// every other lease of this queue waits for its row meanwhile.
pub(crate) fn lease_limited(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
    concurrency: i64,
    bound: Option<i64>,
) -> Result<Vec<Job>> {
    let walk = LeaseParams {
        limit: p
            .limit
            .min(usize::try_from(concurrency).unwrap_or(usize::MAX)),
        ..*p
    };
    let [queue] = walk.queues else {
        return Ok(Vec::new());
    };
    if walk.limit == 0 {
        return Ok(Vec::new());
    }
    let kinds = walk.kinds.map_or(0, <[String]>::len);
    let asked = bigint(walk.limit);
    let (running, candidates) = match bound {
        Some(bound) if bound.saturating_add(asked) <= concurrency => {
            let rows: Vec<Row> = q.exec(sql.lease(1, kinds), lease_params(&walk, now, false))?;
            let candidates = rows
                .into_iter()
                .map(candidate)
                .collect::<Result<Vec<_>>>()?;
            (bound, candidates)
        }
        _ => {
            let rows: Vec<Row> =
                q.exec(sql.lease_counting(kinds), lease_params(&walk, now, false))?;
            let mut running = 0;
            let mut candidates = Vec::with_capacity(rows.len());
            for mut r in rows {
                running = take::<i64>(&mut r, 11)?;
                candidates.push(candidate(r)?);
            }
            let room = usize::try_from(concurrency.saturating_sub(running)).unwrap_or(0);
            candidates.truncate(room);
            (running, candidates)
        }
    };
    let claimed = bigint(candidates.len());
    let bound = (queue.as_str(), running.saturating_add(claimed));
    claim(sql, q, p, now, candidates, Some(bound))
}

/// A claim of one limited queue that the settles of this transaction pay
/// for, up to `p.limit` (the places they freed), without the queue's lock:
/// see `lease_candidates_handed`.
pub(crate) fn lease_handed(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
) -> Result<Vec<Job>> {
    if p.queues.len() != 1 || p.limit == 0 {
        return Ok(Vec::new());
    }
    let kinds = p.kinds.map_or(0, <[String]>::len);
    let rows: Vec<Row> = q.exec(sql.lease_handed(kinds), lease_params(p, now, false))?;
    let mut room = 0;
    let mut candidates = Vec::with_capacity(rows.len());
    for mut r in rows {
        let running = take::<i64>(&mut r, 11)?;
        let limit = take::<Option<i64>>(&mut r, 12)?.unwrap_or(0);
        room = usize::try_from(limit.saturating_sub(running)).unwrap_or(0);
        candidates.push(candidate(r)?);
    }
    candidates.truncate(room.min(p.limit));
    claim(sql, q, p, now, candidates, None)
}

/// Claims the locked candidates in one update; the jobs in claim order.
/// With `bound`, the same update stores a queue's new `running_bound` (its
/// row locked by the caller); nothing is stored when nothing is claimed.
fn claim(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
    candidates: Vec<Candidate>,
    bound: Option<(&str, i64)>,
) -> Result<Vec<Job>> {
    let Some(server_now) = candidates.first().map(|c| c.server_now) else {
        return Ok(Vec::new());
    };
    let lease_until = server_now.saturating_add(now.offset(p.lease_until));
    let mut jobs: Vec<Job> = candidates
        .into_iter()
        .map(|c| Job {
            // 63 random bits: a token is never negative, never reused by
            // chance.
            lease_token: rand::random::<i64>() & i64::MAX,
            lease_until: clock::at(lease_until),
            ..c.job
        })
        .collect();
    let claims: Vec<[i64; 2]> = jobs.iter().map(|j| [j.id, j.lease_token]).collect();
    let claims = serde_json::to_string(&claims)?;
    match bound {
        None => q.exec_drop(
            &sql.claim,
            params! {
                "claims" => claims, "lease_until" => lease_until,
                "worker_id" => p.worker_id, "now" => server_now,
            },
        )?,
        Some((queue, running_bound)) => q.exec_drop(
            &sql.claim_bounding,
            params! {
                "claims" => claims, "lease_until" => lease_until,
                "worker_id" => p.worker_id, "now" => server_now,
                "queue" => queue, "running_bound" => running_bound,
            },
        )?,
    }
    Job::sort_claimed(&mut jobs);
    Ok(jobs)
}

/// How long after now the next not-yet-due job of `queues` comes due, in
/// µs of the server's clock; `None` when none is waiting.
pub(crate) fn next_due(
    sql: &Sql,
    q: &mut impl Queryable,
    queues: &[String],
    now: Now,
) -> Result<Option<i64>> {
    if queues.is_empty() {
        return Ok(None);
    }
    let mut named: HashMap<Vec<u8>, Value> = HashMap::new();
    for (i, queue) in queues.iter().enumerate() {
        named.insert(format!("q{i}").into_bytes(), queue.as_str().into());
    }
    named.insert(b"now".to_vec(), now.param().into());
    let due: Option<Option<i64>> =
        q.exec_first(sql.next_due(queues.len()), Params::Named(named))?;
    Ok(due.flatten().map(|after| after.max(0)))
}

/// The server's `EXPLAIN` of the lease walk for `p`, with `p`'s values
/// bound, one line per plan row: `table type key rows extra`. Claims and
/// locks nothing.
pub(crate) fn explain_lease(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &LeaseParams<'_>,
    now: Now,
) -> Result<Vec<String>> {
    let kinds = p.kinds.map_or(0, <[String]>::len);
    let text = format!("EXPLAIN {}", sql.lease(p.queues.len(), kinds));
    let rows: Vec<Row> = q.exec(text, lease_params(p, now, true))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let field = |name: &str| -> String {
                let value = r
                    .columns_ref()
                    .iter()
                    .position(|c| c.name_str().eq_ignore_ascii_case(name))
                    .and_then(|i| r.as_ref(i));
                match value {
                    Some(Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(Value::NULL) | None => String::new(),
                    Some(Value::Int(i)) => i.to_string(),
                    Some(Value::UInt(u)) => u.to_string(),
                    Some(other) => format!("{other:?}"),
                }
            };
            format!(
                "{} {} table={} type={} key={} rows={} {}",
                field("id"),
                field("select_type"),
                field("table"),
                field("type"),
                field("key"),
                field("rows"),
                field("Extra")
            )
            .trim_end()
            .to_owned()
        })
        .collect())
}

/// Applies a decided transition, fenced on the lease. `LeaseLost` when the
/// lease is no longer held; nothing is changed then.
pub(crate) fn settle(sql: &Sql, q: &mut impl Queryable, p: &SettleParams, now: Now) -> Result<()> {
    settle_reporting(sql, q, p, now).map(|_| ())
}

/// [`settle`], telling whether a cancel requested while the job ran won over
/// a reschedule (`Ok(true)`: the job went to history as `cancelled`).
pub(crate) fn settle_reporting(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &SettleParams,
    now: Now,
) -> Result<bool> {
    match &p.transition {
        Transition::Finish {
            status,
            result,
            error,
        } => finish(
            sql,
            q,
            p.lease.job_id,
            Some(p.lease.token),
            *status,
            result.as_deref(),
            error.as_ref(),
            now,
        )
        .map(|()| false),
        Transition::Reschedule {
            available_at,
            error,
            refund_attempt,
        } => reschedule(
            sql,
            q,
            p.lease,
            Some(*available_at),
            *refund_attempt,
            error.as_ref(),
            now,
        ),
    }
}

/// Completes many leased jobs (completions without an error) in three
/// statements, whatever their number: fence and lock, copy to history,
/// delete. Returns each job's outcome in `items` order: `Ok(false)`, or
/// `LeaseLost` for a lease no longer held (that job is left as it was).
pub(crate) fn complete_many(
    sql: &Sql,
    q: &mut impl Queryable,
    items: &[(Lease, Option<&str>)],
    now: Now,
) -> Result<Vec<Result<bool>>> {
    let mut leases: Vec<[i64; 2]> = items.iter().map(|(l, _)| [l.job_id, l.token]).collect();
    leases.sort_unstable();
    let leases = serde_json::to_string(&leases)?;
    let held: Vec<(i64, Option<i64>)> = q.exec(&sql.lock_held, params! { "leases" => &leases })?;
    let members = held.iter().any(|(_, batch)| batch.is_some());
    let held: std::collections::HashSet<i64> = held.into_iter().map(|(id, _)| id).collect();
    if !held.is_empty() {
        let completions: Vec<serde_json::Value> = items
            .iter()
            .filter(|(l, _)| held.contains(&l.job_id))
            .map(|(l, result)| match result {
                Some(text) => serde_json::json!([l.job_id, l.token, text]),
                None => serde_json::json!([l.job_id, l.token]),
            })
            .collect();
        q.exec_drop(
            &sql.complete_many_to_history,
            params! {
                "completions" => serde_json::to_string(&completions)?, "now" => now.param(),
            },
        )?;
        q.exec_drop(&sql.delete_many_live, params! { "leases" => &leases })?;
        super::counts::count_moved(sql, q, &held.iter().copied().collect::<Vec<_>>())?;
        let ended: Vec<(i64, FinalStatus)> = held
            .iter()
            .map(|&id| (id, FinalStatus::Completed))
            .collect();
        if members {
            super::batches::finished(sql, q, &ended, now, enqueue_all)?;
        }
        super::flows::finished(sql, q, ended, now)?;
    }
    Ok(items
        .iter()
        .map(|(l, _)| {
            if held.contains(&l.job_id) {
                Ok(false)
            } else {
                Err(Error::LeaseLost { job_id: l.job_id })
            }
        })
        .collect())
}

/// Unleases a job: due at `available_at`, or (`None`, a rescue) in its place
/// in line. A cancel requested while it ran wins: the job is finished as
/// cancelled instead (`Ok(true)`).
fn reschedule(
    sql: &Sql,
    q: &mut impl Queryable,
    lease: Lease,
    available_at: Option<i64>,
    refund_attempt: bool,
    error: Option<&AttemptError>,
    now: Now,
) -> Result<bool> {
    let updated = q
        .exec_iter(
            &sql.reschedule,
            params! {
                "id" => lease.job_id, "token" => lease.token,
                "keep_place" => available_at.is_none(),
                "available_in" => now.offset(available_at.unwrap_or(0)),
                "refund" => i64::from(refund_attempt),
                "error" => error_json(error)?, "now" => now.param(),
            },
        )?
        .affected_rows();
    if updated == 1 {
        return Ok(false);
    }
    let cancel_requested: Option<bool> = q.exec_first(
        &sql.cancel_requested,
        params! { "id" => lease.job_id, "token" => lease.token },
    )?;
    match cancel_requested {
        None => Err(Error::LeaseLost {
            job_id: lease.job_id,
        }),
        // Still leased (the update skipped it): finished under its own
        // token, with this attempt's error, as SQLite's reschedule-then-
        // cancel leaves it.
        Some(true) => finish(
            sql,
            q,
            lease.job_id,
            Some(lease.token),
            FinalStatus::Cancelled,
            None,
            error,
            now,
        )
        .map(|()| true),
        // The row matched the fence and was not cancelled, yet the update
        // missed it: only a concurrent change can do that. Run it again.
        Some(false) => Err(Error::Busy),
    }
}

/// `Ok` when the lease is still held, `LeaseLost` otherwise. Locks the row
/// until the caller's transaction ends.
pub(crate) fn check_lease(sql: &Sql, q: &mut impl Queryable, lease: Lease) -> Result<()> {
    let held: Option<i64> = q.exec_first(
        &sql.lease_held,
        params! { "id" => lease.job_id, "token" => lease.token },
    )?;
    held.map(|_| ()).ok_or(Error::LeaseLost {
        job_id: lease.job_id,
    })
}

/// Moves a live job to history. `token` fences a leased job; `None` matches
/// only a job that is not leased.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish(
    sql: &Sql,
    q: &mut impl Queryable,
    job_id: i64,
    token: Option<i64>,
    status: FinalStatus,
    result: Option<&str>,
    error: Option<&AttemptError>,
    now: Now,
) -> Result<()> {
    let copied = q
        .exec_iter(
            &sql.finish_to_history,
            params! {
                "id" => job_id, "token" => token, "result" => result,
                "status" => status.as_str(), "error" => error_json(error)?,
                "now" => now.param(),
            },
        )?
        .affected_rows();
    if copied == 0 {
        return Err(Error::LeaseLost { job_id });
    }
    q.exec_drop(&sql.delete_live, params! { "id" => job_id })?;
    super::counts::count_moved(sql, q, &[job_id])?;
    super::flows::finished(sql, q, vec![(job_id, status)], now)?;
    super::batches::finished(sql, q, &[(job_id, status)], now, enqueue_all)
}

/// Writes each job's progress, fenced on its lease; returns the ids written
/// (rows another transaction holds are skipped).
pub(crate) fn write_progress(
    sql: &Sql,
    q: &mut impl Queryable,
    writes: &[ProgressWrite],
    now: Now,
    wait: bool,
) -> Result<Vec<i64>> {
    let lock = if wait {
        &sql.progress_lock_wait
    } else {
        &sql.progress_lock
    };
    let mut sorted: Vec<&ProgressWrite> = writes.iter().collect();
    // Locked in id order, like settle batches.
    sorted.sort_unstable_by_key(|w| w.lease.job_id);
    let mut written = Vec::new();
    for w in sorted {
        let (id, token) = (w.lease.job_id, w.lease.token);
        let held: Option<i64> = q.exec_first(lock, params! { "id" => id, "token" => token })?;
        if held.is_some() {
            q.exec_drop(
                &sql.write_progress,
                params! {
                    "id" => id, "token" => token, "progress" => &w.progress,
                    "now" => now.param(),
                },
            )?;
            written.push(id);
        }
    }
    Ok(written)
}

/// Extends the given leases; reports which were lost and which jobs were asked
/// to cancel. A lease whose row another transaction holds (a handler's
/// `ctx.transaction(..)` committing its job) is not waited for: still held,
/// it is reported neither extended nor lost, and the next heartbeat extends
/// it.
pub(crate) fn heartbeat(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &HeartbeatParams<'_>,
    now: Now,
) -> Result<HeartbeatReport> {
    let json = |leases: &[Lease]| {
        let mut pairs: Vec<[i64; 2]> = leases.iter().map(|l| [l.job_id, l.token]).collect();
        // Locked in id order, like settle batches.
        pairs.sort_unstable();
        serde_json::to_string(&pairs)
    };
    let read = |rows: Vec<Row>| -> Result<Vec<(Lease, bool)>> {
        rows.into_iter()
            .map(|mut r| {
                let lease = Lease {
                    job_id: take(&mut r, 0)?,
                    token: take(&mut r, 1)?,
                };
                Ok((lease, take::<bool>(&mut r, 2)?))
            })
            .collect()
    };
    let locked = read(q.exec(&sql.heartbeat_lock, params! { "leases" => json(p.leases)? })?)?;
    if !locked.is_empty() {
        let leases: Vec<Lease> = locked.iter().map(|(l, _)| *l).collect();
        q.exec_drop(
            &sql.heartbeat,
            params! {
                "leases" => json(&leases)?, "lease_for" => now.offset(p.lease_until),
                "now" => now.param(),
            },
        )?;
    }
    let mut report = HeartbeatReport::of(p.leases, locked);
    let skipped = std::mem::take(&mut report.lost);
    if skipped.is_empty() {
        return Ok(report);
    }
    let busy = read(q.exec(&sql.heartbeat_held, params! { "leases" => json(&skipped)? })?)?;
    for (lease, cancel) in &busy {
        if *cancel {
            report.cancel_requested.push(lease.job_id);
        }
    }
    report.lost = skipped
        .into_iter()
        .filter(|l| !busy.iter().any(|(b, _)| b == l))
        .collect();
    Ok(report)
}

/// Up to `limit` leases that expired before now, locked (other nodes'
/// rescuers skip them), each settled as `decide` says. A rescheduled job
/// keeps its place in line by the server's clock, whatever `available_at`
/// the decision carries.
pub(crate) fn rescue(
    sql: &Sql,
    q: &mut impl Queryable,
    now: Now,
    limit: usize,
    decide: &dyn Fn(&ExpiredLease) -> SettleParams,
) -> Result<Vec<(ExpiredLease, SettleParams)>> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let rows: Vec<Row> = q.exec(
        &sql.expired_leases,
        params! { "limit" => limit, "now" => now.param() },
    )?;
    settle_listed(sql, q, rows, now, decide)
}

/// The leases of `worker_id` whose ids are not in `held`, locked (rows
/// another transaction holds skipped), each settled as `decide` says, in
/// its place in line when rescheduled.
pub(crate) fn release_unheld(
    sql: &Sql,
    q: &mut impl Queryable,
    worker_id: &str,
    held: &[i64],
    now: Now,
    decide: &dyn Fn(&ExpiredLease) -> SettleParams,
) -> Result<Vec<(ExpiredLease, SettleParams)>> {
    let rows: Vec<Row> = q.exec(
        &sql.unheld_leases,
        params! { "worker_id" => worker_id, "held" => serde_json::to_string(held)? },
    )?;
    settle_listed(sql, q, rows, now, decide)
}

/// Settles each row of `EXPIRED_LEASES` or `UNHELD_LEASES` as `decide`
/// says: a rescue's or a release of unheld leases' second half.
fn settle_listed(
    sql: &Sql,
    q: &mut impl Queryable,
    rows: Vec<Row>,
    now: Now,
    decide: &dyn Fn(&ExpiredLease) -> SettleParams,
) -> Result<Vec<(ExpiredLease, SettleParams)>> {
    let mut done = Vec::with_capacity(rows.len());
    for mut r in rows {
        let expired = ExpiredLease {
            lease: Lease {
                job_id: take(&mut r, 0)?,
                token: take(&mut r, 1)?,
            },
            attempts: take(&mut r, 2)?,
            max_attempts: take(&mut r, 3)?,
            available_at: take(&mut r, 4)?,
            cancel_requested: take(&mut r, 5)?,
        };
        let settle = decide(&expired);
        match &settle.transition {
            Transition::Reschedule {
                error,
                refund_attempt,
                ..
            } => {
                reschedule(
                    sql,
                    q,
                    expired.lease,
                    None,
                    *refund_attempt,
                    error.as_ref(),
                    now,
                )?;
            }
            Transition::Finish { .. } => self::settle(sql, q, &settle, now)?,
        }
        done.push((expired, settle));
    }
    Ok(done)
}
