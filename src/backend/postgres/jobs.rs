//! The job operations on one PostgreSQL client: enqueue (its inserts in
//! `enqueue.rs`), lease, settle, heartbeat, expired-lease listing. Each runs
//! on the client its caller chose: the queue's own transaction or
//! connection, or the application's transaction (`enqueue_in`,
//! `complete_in`).
//!
//! Times: `$1` of each statement is the manual clock's now or NULL (then the
//! server's clock is used), and every absolute time from the engine is bound
//! as its offset from the engine's `now` (see `queries`).

use std::collections::HashSet;

use postgres::types::ToSql;
use postgres::{GenericClient, Row};

use super::connection::Tx;
use super::queries::Queries;
use crate::backend::params::{
    bigint, EnqueueParams, ExpiredLease, HeartbeatParams, LeaseParams, ProgressWrite, SettleParams,
};
use crate::clock;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job, Lease};
use crate::outcome::{error_json, AttemptError, FinalStatus, Transition};

/// Inserts jobs in order, each one or the id of the job already holding its
/// unique key, and notifies the queue's listeners when one was inserted (at
/// commit: a rolled-back enqueue wakes nobody), in the inserting statement
/// itself where it can. Members of a batch join it (`batches.rs`).
pub(crate) fn enqueue_all<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
) -> Result<Vec<Enqueued>> {
    let ids = super::batches::enqueue(tx, q, jobs, super::enqueue::insert_all)?;
    super::flows::wait_all(tx, q, jobs, ids, |tx, id, error, now| {
        finish_one(tx, q, id, FinalStatus::Cancelled, Some(error), now)
    })
}

/// Claims up to `limit` jobs in one statement and returns them in claim
/// order.
pub(crate) fn lease<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    skip_limited: bool,
) -> Result<Vec<Job>> {
    lease_at(tx, q, p, skip_limited, None)
}

/// [`lease`] with its now pinned to `at` (unix µs on the server's clock)
/// instead of the transaction's.
pub(crate) fn lease_at<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    skip_limited: bool,
    at: Option<i64>,
) -> Result<Vec<Job>> {
    let mut args = LeaseArgs::new(q, p, skip_limited);
    if at.is_some() {
        args.now = at;
    }
    let Some(params) = args.params() else {
        return Ok(Vec::new());
    };
    let rows = tx.query(args.sql, &params)?;
    sorted_jobs(&rows)
}

/// [`lease_at`] of one limited queue whose row this transaction holds
/// locked: the claim stops at the room `concurrency` leaves (`None`: no
/// concurrency limit), counting the queue's running jobs itself.
pub(crate) fn lease_limited_at<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    concurrency: Option<i64>,
    at: Option<i64>,
) -> Result<Vec<Job>> {
    let mut args = LeaseArgs::new(q, p, false);
    if at.is_some() {
        args.now = at;
    }
    let Some(params) = args.params() else {
        return Ok(Vec::new());
    };
    let params: Vec<&(dyn ToSql + Sync)> = params.into_iter().chain([&concurrency as _]).collect();
    let rows = tx.query(&q.limits.lease_limited, &params)?;
    sorted_jobs(&rows)
}

/// A claim of one limited queue that the settles of this transaction pay
/// for, up to `p.limit` (the places they freed), without the queue's lock:
/// see `limits::HANDED_ROOM`.
pub(crate) fn lease_handed<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
) -> Result<Vec<Job>> {
    lease_limited_by(tx, q, p, &q.limits.lease_handed)
}

/// A claim of one queue limited by concurrency alone before its lock is
/// taken: see `limits::AHEAD_ROOM` and `limits::lease_ahead`.
pub(crate) fn lease_ahead<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
) -> Result<Vec<Job>> {
    lease_limited_by(tx, q, p, &q.limits.lease_ahead)
}

/// A claim of one queue with a rate limit before its lock is taken: see
/// `limits::AHEAD_RATED_ROOM` and `limits::lease_ahead_rated`.
pub(crate) fn lease_ahead_rated<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
) -> Result<Vec<Job>> {
    lease_limited_by(tx, q, p, &q.limits.lease_ahead_rated)
}

/// A claim of one limited queue by `sql`, a [`LEASE`] whose `LIMIT` reads
/// the queue's limit and counts its running jobs by itself.
///
/// [`LEASE`]: super::queries::LEASE
fn lease_limited_by<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
    sql: &str,
) -> Result<Vec<Job>> {
    let args = LeaseArgs::new(q, p, false);
    let Some(params) = args.params() else {
        return Ok(Vec::new());
    };
    let rows = tx.query(sql, &params)?;
    sorted_jobs(&rows)
}

/// Leased rows in claim order.
fn sorted_jobs(rows: &[Row]) -> Result<Vec<Job>> {
    let mut jobs = rows.iter().map(leased_job).collect::<Result<Vec<Job>>>()?;
    Job::sort_claimed(&mut jobs);
    Ok(jobs)
}

/// How long after now the next not-yet-due job of `queues` comes due, in
/// µs, on the server's clock; `None` when none is waiting.
pub(crate) fn next_due<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    queues: &[String],
    now: i64,
) -> Result<Option<i64>> {
    let row = tx.query_opt(&q.next_due, &[&q.now_override(now), &queues])?;
    Ok(match row {
        Some(row) => row.try_get::<_, Option<i64>>(0)?.map(|d| d.max(0)),
        None => None,
    })
}

/// The plan of the lease statement for `p` (`EXPLAIN`, with `p`'s values
/// bound), one line per plan node. Nothing is claimed: `EXPLAIN` without
/// `ANALYZE` does not run the statement.
pub(crate) fn explain_lease<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &LeaseParams<'_>,
) -> Result<Vec<String>> {
    let args = LeaseArgs::new(q, p, true);
    let Some(params) = args.params() else {
        return Ok(Vec::new());
    };
    let rows = tx.query_text(&format!("EXPLAIN (COSTS OFF) {}", args.sql), &params)?;
    Ok(rows
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<std::result::Result<_, _>>()?)
}

/// The statement of a lease and its parameters: `$1` now override, `$2`
/// TTL, `$3` worker, `$4` the queue (or an array of several), `$5` kinds,
/// `$6` limit, `$7` whether to skip limited queues.
struct LeaseArgs<'a> {
    sql: &'a str,
    now: Option<i64>,
    ttl: i64,
    worker: &'a str,
    queue: Option<&'a str>,
    queues: Vec<&'a str>,
    kinds: Option<Vec<&'a str>>,
    limit: i64,
    skip_limited: bool,
}

impl<'a> LeaseArgs<'a> {
    fn new(q: &'a Queries, p: &'a LeaseParams<'_>, skip_limited: bool) -> Self {
        let one = p.queues.len() == 1;
        LeaseArgs {
            sql: if one { &q.lease } else { &q.lease_queues },
            now: q.now_override(p.now),
            ttl: p.lease_until.saturating_sub(p.now),
            worker: p.worker_id,
            queue: p.queues.first().map(String::as_str),
            queues: p.queues.iter().map(String::as_str).collect(),
            kinds: p.kinds.map(|k| k.iter().map(String::as_str).collect()),
            limit: bigint(p.limit),
            skip_limited,
        }
    }

    /// `None` when no queue is asked for: nothing to claim.
    fn params(&self) -> Option<[&(dyn ToSql + Sync); 7]> {
        let queues: &(dyn ToSql + Sync) = match (self.queues.len(), &self.queue) {
            (0, _) | (_, None) => return None,
            (1, Some(one)) => one,
            _ => &self.queues,
        };
        Some([
            &self.now,
            &self.ttl,
            &self.worker,
            queues,
            &self.kinds,
            &self.limit,
            &self.skip_limited,
        ])
    }
}

/// Reads a row in [`LEASED_COLUMNS`](super::queries::LEASED_COLUMNS) order.
fn leased_job(r: &Row) -> Result<Job> {
    Ok(Job {
        id: r.try_get(0)?,
        lease_token: r.try_get(1)?,
        queue: r.try_get(2)?,
        kind: r.try_get(3)?,
        priority: r.try_get(4)?,
        unique_key: r.try_get(5)?,
        payload: canonical_json(r.try_get(6)?),
        attempt: to_u32(r.try_get(7)?),
        max_attempts: to_u32(r.try_get(8)?),
        available_at: clock::at(r.try_get(9)?),
        lease_until: clock::at(r.try_get(10)?),
        created_at: clock::at(r.try_get(11)?),
    })
}

/// A job to move to history.
struct Finish {
    id: i64,
    /// `None` matches only a job that is not leased.
    token: Option<i64>,
    status: FinalStatus,
    result: Option<String>,
    error: Option<String>,
}

/// Applies decided transitions, fenced on their leases, in as few statements
/// as the batch allows. Each item's result: `Ok(true)` when a cancel
/// requested while the job ran won over its reschedule (it went to history as
/// `cancelled`), `Err(LeaseLost)` when its lease was no longer held (nothing
/// changed for it). `keep_place` reschedules not later than the job's due
/// time (the rescuer's reschedule) instead of at the transition's time.
pub(crate) fn settle_all<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    items: &[&SettleParams],
    keep_place: bool,
) -> Result<Vec<Result<bool>>> {
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    let now = first.now;
    let mut finishes = Vec::new();
    let mut reschedules = Vec::new();
    for (i, p) in items.iter().enumerate() {
        match &p.transition {
            Transition::Finish {
                status,
                result,
                error,
            } => finishes.push((
                i,
                Finish {
                    id: p.lease.job_id,
                    token: Some(p.lease.token),
                    status: *status,
                    result: result.clone(),
                    error: error_json(error.as_ref())?,
                },
            )),
            Transition::Reschedule { .. } => reschedules.push(i),
        }
    }
    let mut results: Vec<Result<bool>> = items
        .iter()
        .map(|p| {
            Err(Error::LeaseLost {
                job_id: p.lease.job_id,
            })
        })
        .collect();
    // An id listed twice is credited once: the second item finds the job
    // gone, as it would one statement later.
    let mut moved = finish(tx, q, now, finishes.iter().map(|(_, f)| f))?;
    for (i, f) in &finishes {
        if moved.remove(&f.id) {
            results[*i] = Ok(false);
        }
    }
    if !reschedules.is_empty() {
        let mut unleased = reschedule(tx, q, now, &reschedules, items, keep_place)?;
        let mut cancels = Vec::new();
        for &i in &reschedules {
            let id = items[i].lease.job_id;
            match unleased.remove(&id) {
                None => {}
                Some(false) => results[i] = Ok(false),
                // A cancel requested while it ran wins over running it again.
                Some(true) => cancels.push((i, id)),
            }
        }
        let cancelled = finish(
            tx,
            q,
            now,
            cancels.iter().map(|&(_, id)| Finish {
                id,
                token: None,
                status: FinalStatus::Cancelled,
                result: None,
                error: None,
            }),
        )?;
        for (i, id) in cancels {
            if cancelled.contains(&id) {
                results[i] = Ok(true);
            }
        }
    }
    Ok(results)
}

/// Moves jobs to history; returns the ids moved.
fn finish<C, F>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
    jobs: impl IntoIterator<Item = F>,
) -> Result<HashSet<i64>>
where
    C: GenericClient,
    F: std::borrow::Borrow<Finish>,
{
    let mut ids = Vec::new();
    let mut tokens = Vec::new();
    let mut statuses = Vec::new();
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for f in jobs {
        let f = f.borrow();
        ids.push(f.id);
        tokens.push(f.token);
        statuses.push(f.status.as_str());
        results.push(f.result.clone());
        errors.push(f.error.clone());
    }
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let rows = tx.query(
        &q.finish_to_history,
        &[
            &q.now_override(now),
            &ids,
            &tokens,
            &statuses,
            &results,
            &errors,
        ],
    )?;
    let moved = rows
        .iter()
        .map(|r| Ok(r.try_get::<_, i64>(0)?))
        .collect::<Result<HashSet<i64>>>()?;
    let ended = ids
        .iter()
        .zip(&statuses)
        .filter(|(id, _)| moved.contains(id))
        .filter_map(|(id, s)| Some((*id, FinalStatus::parse(s)?)))
        .collect();
    super::flows::finished(tx, q, ended, now)?;
    if let Some(row) = rows.first() {
        let batches = row.try_get::<_, Vec<i64>>(1)?;
        super::batches::counted(tx, q, now, &batches, enqueue_all)?;
    }
    Ok(moved)
}

/// Unleases the jobs at `indexes` of `items`; returns, per job unleased,
/// whether a cancel was requested meanwhile.
fn reschedule<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
    indexes: &[usize],
    items: &[&SettleParams],
    keep_place: bool,
) -> Result<std::collections::HashMap<i64, bool>> {
    let (mut ids, mut tokens, mut delays, mut refunds, mut errors, mut keep) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for &i in indexes {
        let p = items[i];
        if let Transition::Reschedule {
            available_at,
            error,
            refund_attempt,
        } = &p.transition
        {
            ids.push(p.lease.job_id);
            tokens.push(p.lease.token);
            delays.push(available_at.saturating_sub(p.now));
            refunds.push(i32::from(*refund_attempt));
            errors.push(error_json(error.as_ref())?);
            keep.push(keep_place);
        }
    }
    let rows = tx.query(
        &q.reschedule,
        &[
            &q.now_override(now),
            &ids,
            &tokens,
            &delays,
            &refunds,
            &errors,
            &keep,
        ],
    )?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// Moves one live job to history: an operator's cancel (`token` `None`, the
/// job must not be leased). `LeaseLost` when nothing matched.
pub(crate) fn finish_one<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    job_id: i64,
    status: FinalStatus,
    error: Option<&AttemptError>,
    now: i64,
) -> Result<()> {
    let moved = finish(
        tx,
        q,
        now,
        [Finish {
            id: job_id,
            token: None,
            status,
            result: None,
            error: error_json(error)?,
        }],
    )?;
    if moved.contains(&job_id) {
        Ok(())
    } else {
        Err(Error::LeaseLost { job_id })
    }
}

/// `Ok` when the lease is still held, `LeaseLost` otherwise, and the row
/// locked until the transaction ends.
pub(crate) fn check_lease<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    lease: Lease,
) -> Result<()> {
    tx.query_opt(&q.lease_held, &[&lease.job_id, &lease.token])?
        .map(|_| ())
        .ok_or(Error::LeaseLost {
            job_id: lease.job_id,
        })
}

/// Extends the given leases; reports which were lost and which jobs were asked
/// to cancel.
pub(crate) fn heartbeat<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &HeartbeatParams<'_>,
) -> Result<HeartbeatReport> {
    let ids: Vec<i64> = p.leases.iter().map(|l| l.job_id).collect();
    let tokens: Vec<i64> = p.leases.iter().map(|l| l.token).collect();
    let ttl = p.lease_until.saturating_sub(p.now);
    let rows = tx.query(&q.heartbeat, &[&q.now_override(p.now), &ttl, &ids, &tokens])?;
    let extended = rows
        .iter()
        .map(|r| {
            let lease = Lease {
                job_id: r.try_get(0)?,
                token: r.try_get(1)?,
            };
            Ok((lease, r.try_get::<_, bool>(2)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(HeartbeatReport::of(p.leases, extended))
}

/// Writes each job's progress, fenced on its lease; returns the ids written
/// (rows another transaction holds are skipped).
pub(crate) fn write_progress<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    writes: &[ProgressWrite],
    now: i64,
    wait: bool,
) -> Result<Vec<i64>> {
    let ids: Vec<i64> = writes.iter().map(|w| w.lease.job_id).collect();
    let tokens: Vec<i64> = writes.iter().map(|w| w.lease.token).collect();
    let progress: Vec<&str> = writes.iter().map(|w| w.progress.as_str()).collect();
    let sql = if wait {
        &q.write_progress_wait
    } else {
        &q.write_progress
    };
    let rows = tx.query(sql, &[&q.now_override(now), &ids, &tokens, &progress])?;
    rows.iter().map(|r| Ok(r.try_get::<_, i64>(0)?)).collect()
}

/// Up to `limit` leases that expired before now, locked (others' locked rows
/// skipped) until the transaction ends.
pub(crate) fn expired_leases<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
    limit: usize,
) -> Result<Vec<ExpiredLease>> {
    let limit = bigint(limit);
    let rows = tx.query(&q.expired_leases, &[&q.now_override(now), &limit])?;
    rows.iter().map(leased_row).collect()
}

/// The leases of `worker_id` whose ids are not in `held`, by id, locked
/// (rows another transaction holds skipped) until the transaction ends.
pub(crate) fn unheld_leases<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    worker_id: &str,
    held: &[i64],
) -> Result<Vec<ExpiredLease>> {
    let rows = tx.query(&q.unheld_leases, &[&worker_id, &held])?;
    rows.iter().map(leased_row).collect()
}

/// Reads a row of `EXPIRED_LEASES` or `UNHELD_LEASES`.
fn leased_row(r: &Row) -> Result<ExpiredLease> {
    Ok(ExpiredLease {
        lease: Lease {
            job_id: r.try_get(0)?,
            token: r.try_get(1)?,
        },
        attempts: to_u32(r.try_get(2)?),
        max_attempts: to_u32(r.try_get(3)?),
        available_at: r.try_get(4)?,
        cancel_requested: r.try_get(5)?,
    })
}

/// Settles each listed lease as `decide` says, each in its place in line
/// when rescheduled, and wakes the listeners when any was: a rescue's or
/// a release of unheld leases' second half.
pub(crate) fn settle_listed<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    listed: Vec<ExpiredLease>,
    decide: &dyn Fn(&ExpiredLease) -> SettleParams,
) -> Result<Vec<(ExpiredLease, SettleParams)>> {
    let decided: Vec<SettleParams> = listed.iter().map(decide).collect();
    let refs: Vec<&SettleParams> = decided.iter().collect();
    // The rows are locked by this transaction: every item applies.
    for result in settle_all(tx, q, &refs, true)? {
        result?;
    }
    if !listed.is_empty() {
        tx.query(&q.notify, &[&q.channel])?;
    }
    Ok(listed.into_iter().zip(decided).collect())
}

/// JSON text as the engine writes it (serde_json's compact form), from
/// JSONB's output (`{"a": 1}`, keys reordered): a payload or result reads
/// back as the same text on every backend. Text that does not parse is left
/// as it is.
pub(crate) fn canonical_json(text: String) -> String {
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(value) => serde_json::to_string(&value).unwrap_or(text),
        Err(_) => text,
    }
}

/// A count stored as INTEGER; the schema never stores a negative one.
pub(crate) fn to_u32(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}
