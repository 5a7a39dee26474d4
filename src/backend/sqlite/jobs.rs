//! The job operations on one SQLite connection: enqueue, lease, settle,
//! heartbeat, expired-lease listing. Each runs inside a transaction its caller
//! opened (the write gate's, or the application's own).

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{limits, queries};
use crate::backend::params::{
    bigint, EnqueueParams, ExpiredLease, HeartbeatParams, LeaseParams, ProgressWrite, SettleParams,
};
use crate::clock;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::lease::{HeartbeatReport, Job, Lease};
use crate::outcome::{error_json, AttemptError, FinalStatus, Transition};

/// Inserts jobs in order, each one or the id of the job already holding its
/// unique key, the members of a batch joining it (`batches.rs`).
pub(crate) fn enqueue_all(conn: &Connection, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
    super::batches::enqueue(conn, jobs, insert_all)
}

/// [`enqueue_all`] without batches. The insert is looked up in the statement
/// cache once per call, not once per job: that lookup hashes the SQL text.
fn insert_all(conn: &Connection, jobs: &[EnqueueParams<'_>]) -> Result<Vec<Enqueued>> {
    let mut insert = conn.prepare_cached(queries::ENQUEUE)?;
    let mut ids = Vec::with_capacity(jobs.len());
    for p in jobs {
        let e = match &p.group {
            Some(group) => super::groups::join(conn, p, group)?,
            None => enqueue(conn, &mut insert, p)?,
        };
        if let Some(error) = super::flows::wait(conn, p, e, &ids)? {
            finish(
                conn,
                e.id,
                None,
                FinalStatus::Cancelled,
                None,
                Some(&error),
                p.now,
            )?;
        }
        ids.push(e);
    }
    Ok(ids)
}

/// Inserts a job, or finds the job already holding its unique key.
fn enqueue(
    conn: &Connection,
    insert: &mut rusqlite::CachedStatement<'_>,
    p: &EnqueueParams<'_>,
) -> Result<Enqueued> {
    if let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) {
        let mut find = conn.prepare_cached(queries::FIND_HISTORY_UNIQUE)?;
        if let Some(id) = find
            .query_row(params![p.queue, key, since, p.unique_statuses], |r| {
                r.get(0)
            })
            .optional()?
        {
            return Ok(Enqueued { id, existed: true });
        }
    }
    let inserted = insert.execute(params![
        p.queue,
        p.kind,
        p.priority,
        p.unique_key,
        p.payload,
        p.max_attempts,
        p.available_at,
        p.now
    ])?;
    if inserted == 1 {
        // The table has no triggers, so this is the row just inserted.
        return Ok(Enqueued {
            id: conn.last_insert_rowid(),
            existed: false,
        });
    }
    // Nothing inserted: only the unique index can refuse a row.
    let key = p
        .unique_key
        .ok_or_else(|| Error::Database("insert ignored without a unique key conflict".into()))?;
    let mut find = conn.prepare_cached(queries::FIND_LIVE_UNIQUE)?;
    let id = find.query_row(params![p.queue, key], |r| r.get(0))?;
    Ok(Enqueued { id, existed: true })
}

/// Jobs promoted into the lease indexes per lease at most, so a backlog
/// that came due at once (after downtime) is let in over several leases
/// instead of one long write.
const PROMOTE_BATCH: i64 = 1000;

/// Claims up to `limit` jobs and returns them in claim order. First promotes
/// jobs whose time came, leaves paused queues out of the walks, and claims
/// no more of a limited queue's jobs than its limits allow (`crate::limits`).
pub(crate) fn lease(conn: &Connection, p: &LeaseParams<'_>) -> Result<Vec<Job>> {
    conn.prepare_cached(queries::PROMOTE_DUE)?
        .execute(params![p.now, PROMOTE_BATCH])?;
    let (paused, mut limited) = limits::controls(conn)?;
    limited.retain(|s| p.queues.contains(&s.queue));
    let queues: Vec<String> = p
        .queues
        .iter()
        .filter(|q| !paused.contains(q))
        .cloned()
        .collect();
    if limited.is_empty() && p.caps.is_empty() {
        return claim(conn, p, &queues, p.limit);
    }
    limits::count_running(conn, &mut limited)?;
    let (jobs, windows) = crate::limits::lease_within(
        &queues,
        p.limit,
        &limited,
        p.caps,
        p.now,
        |queues, limit, at| {
            let pinned = LeaseParams {
                now: at,
                lease_until: p.lease_until.saturating_add(at - p.now),
                ..*p
            };
            claim(conn, &pinned, queues, limit)
        },
    )?;
    limits::store_windows(conn, &windows)?;
    Ok(jobs)
}

/// Claims up to `limit` jobs of `queues` (none paused) for `p`, in claim
/// order.
fn claim(
    conn: &Connection,
    p: &LeaseParams<'_>,
    queues: &[String],
    limit: usize,
) -> Result<Vec<Job>> {
    if queues.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let kinds: &[String] = p.kinds.unwrap_or(&[]);
    let sql = queries::lease(queues.len(), kinds.len());
    let mut stmt = conn.prepare_cached(&sql)?;
    let limit = bigint(limit);
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![&p.now, &p.lease_until, &p.worker_id, &limit];
    values.extend(queues.iter().map(|q| q as &dyn rusqlite::ToSql));
    values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
    let mut jobs = stmt
        .query_map(values.as_slice(), leased_job)?
        .collect::<rusqlite::Result<Vec<Job>>>()?;
    Job::sort_claimed(&mut jobs);
    Ok(jobs)
}

/// The paused queues.
pub(crate) fn paused_queues(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(queries::PAUSED_QUEUES)?;
    let names = stmt.query_map([], |r| r.get(0))?;
    Ok(names.collect::<rusqlite::Result<_>>()?)
}

/// How long after `now` the next not-yet-due job of `queues` comes due, in
/// µs; `None` when none is waiting.
pub(crate) fn next_due(conn: &Connection, queues: &[String], now: i64) -> Result<Option<i64>> {
    let queues = serde_json::to_string(queues)?;
    let due: Option<i64> = conn
        .prepare_cached(queries::NEXT_DUE)?
        .query_row(params![queues], |r| r.get(0))?;
    // One already due waits only for the next lease to promote it.
    Ok(due.map(|at| at.saturating_sub(now).max(0)))
}

/// The `EXPLAIN QUERY PLAN` of the lease statement for `p`, with `p`'s values
/// bound (the planner may use them once `ANALYZE` has run), one line per plan
/// node, indented two spaces per level. Nothing is claimed.
pub(crate) fn explain_lease(conn: &Connection, p: &LeaseParams<'_>) -> Result<Vec<String>> {
    let paused = paused_queues(conn)?;
    let queues: Vec<&String> = p.queues.iter().filter(|q| !paused.contains(q)).collect();
    if queues.is_empty() {
        return Ok(Vec::new());
    }
    let kinds: &[String] = p.kinds.unwrap_or(&[]);
    let sql = format!(
        "EXPLAIN QUERY PLAN {}",
        queries::lease(queues.len(), kinds.len())
    );
    let mut stmt = conn.prepare(&sql)?;
    let limit = bigint(p.limit);
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![&p.now, &p.lease_until, &p.worker_id, &limit];
    values.extend(queues.iter().map(|q| *q as &dyn rusqlite::ToSql));
    values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
    let rows = stmt
        .query_map(values.as_slice(), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut depths: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    Ok(rows
        .into_iter()
        .map(|(id, parent, detail)| {
            let depth = depths.get(&parent).map_or(0, |d| d + 1);
            depths.insert(id, depth);
            format!("{}{detail}", "  ".repeat(depth))
        })
        .collect())
}

/// Reads a row in [`queries::LEASED_COLUMNS`] order.
fn leased_job(r: &Row<'_>) -> rusqlite::Result<Job> {
    Ok(Job {
        id: r.get(0)?,
        lease_token: r.get(1)?,
        queue: r.get(2)?,
        kind: r.get(3)?,
        priority: r.get(4)?,
        unique_key: r.get(5)?,
        payload: r.get(6)?,
        attempt: r.get(7)?,
        max_attempts: r.get(8)?,
        available_at: clock::at(r.get(9)?),
        lease_until: clock::at(r.get(10)?),
        created_at: clock::at(r.get(11)?),
    })
}

/// Applies a decided transition, fenced on the lease. `LeaseLost` when the
/// lease is no longer held; nothing is changed then.
pub(crate) fn settle(conn: &Connection, p: &SettleParams) -> Result<()> {
    settle_reporting(conn, p).map(|_| ())
}

/// [`settle`], telling whether a cancel requested while the job ran won over
/// a reschedule (`Ok(true)`: the job went to history as `cancelled`).
pub(crate) fn settle_reporting(conn: &Connection, p: &SettleParams) -> Result<bool> {
    match &p.transition {
        Transition::Finish {
            status,
            result,
            error,
        } => finish(
            conn,
            p.lease.job_id,
            Some(p.lease.token),
            *status,
            result.as_deref(),
            error.as_ref(),
            p.now,
        )
        .map(|()| false),
        Transition::Reschedule {
            available_at,
            error,
            refund_attempt,
        } => {
            let mut stmt = conn.prepare_cached(queries::RESCHEDULE)?;
            let cancel_requested: Option<bool> = stmt
                .query_row(
                    params![
                        p.lease.job_id,
                        p.lease.token,
                        available_at,
                        i64::from(*refund_attempt),
                        error_json(error.as_ref())?,
                        p.now
                    ],
                    |r| r.get(0),
                )
                .optional()?;
            match cancel_requested {
                None => Err(Error::LeaseLost {
                    job_id: p.lease.job_id,
                }),
                // A cancel requested while it ran wins over running it again.
                Some(true) => finish(
                    conn,
                    p.lease.job_id,
                    None,
                    FinalStatus::Cancelled,
                    None,
                    None,
                    p.now,
                )
                .map(|()| true),
                Some(false) => Ok(false),
            }
        }
    }
}

/// `Ok` when the lease is still held, `LeaseLost` otherwise. Changes nothing.
pub(crate) fn check_lease(conn: &Connection, lease: Lease) -> Result<()> {
    let held = conn
        .prepare_cached(queries::LEASE_HELD)?
        .query_row(params![lease.job_id, lease.token], |_| Ok(()))
        .optional()?;
    held.ok_or(Error::LeaseLost {
        job_id: lease.job_id,
    })
}

/// Moves a live job to history. `token` fences a leased job; `None` matches
/// only a job that is not leased.
pub(crate) fn finish(
    conn: &Connection,
    job_id: i64,
    token: Option<i64>,
    status: FinalStatus,
    result: Option<&str>,
    error: Option<&AttemptError>,
    now: i64,
) -> Result<()> {
    let mut copy = conn.prepare_cached(queries::FINISH_TO_HISTORY)?;
    let copied = copy.execute(params![
        job_id,
        token,
        now,
        result,
        status.as_str(),
        error_json(error)?
    ])?;
    if copied == 0 {
        return Err(Error::LeaseLost { job_id });
    }
    conn.prepare_cached(queries::DELETE_LIVE)?
        .execute([job_id])?;
    super::counts::count_moved(conn, &[job_id])?;
    super::flows::finished(conn, job_id, status, now)?;
    super::batches::finished(conn, job_id, status, now, enqueue_all)
}

/// Extends the given leases; reports which were lost and which jobs were asked
/// to cancel.
pub(crate) fn heartbeat(conn: &Connection, p: &HeartbeatParams<'_>) -> Result<HeartbeatReport> {
    let pairs: Vec<[i64; 2]> = p.leases.iter().map(|l| [l.job_id, l.token]).collect();
    let pairs = serde_json::to_string(&pairs)?;
    let mut stmt = conn.prepare_cached(queries::HEARTBEAT)?;
    let rows = stmt.query_map(params![p.lease_until, p.now, pairs], |r| {
        Ok((
            Lease {
                job_id: r.get(0)?,
                token: r.get(1)?,
            },
            r.get::<_, bool>(2)?,
        ))
    })?;
    let extended = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(HeartbeatReport::of(p.leases, extended))
}

/// Writes each job's progress, fenced on its lease; returns the ids of the
/// jobs whose lease was held (and so written).
pub(crate) fn write_progress(
    conn: &Connection,
    writes: &[ProgressWrite],
    now: i64,
) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(queries::WRITE_PROGRESS)?;
    let mut written = Vec::new();
    for w in writes {
        if stmt.execute(params![w.lease.job_id, w.lease.token, w.progress, now])? == 1 {
            written.push(w.lease.job_id);
        }
    }
    Ok(written)
}

/// Up to `limit` leases that expired before `now`.
pub(crate) fn expired_leases(
    conn: &Connection,
    now: i64,
    limit: usize,
) -> Result<Vec<ExpiredLease>> {
    let mut stmt = conn.prepare_cached(queries::EXPIRED_LEASES)?;
    let limit = bigint(limit);
    let rows = stmt.query_map(params![now, limit], leased_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The leases of `worker_id` whose ids are not in `held`, by id.
pub(crate) fn unheld_leases(
    conn: &Connection,
    worker_id: &str,
    held: &[i64],
) -> Result<Vec<ExpiredLease>> {
    let mut stmt = conn.prepare_cached(queries::UNHELD_LEASES)?;
    let held = serde_json::to_string(held)?;
    let rows = stmt.query_map(params![worker_id, held], leased_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Reads a row of [`queries::EXPIRED_LEASES`] or [`queries::UNHELD_LEASES`].
fn leased_row(r: &Row<'_>) -> rusqlite::Result<ExpiredLease> {
    Ok(ExpiredLease {
        lease: Lease {
            job_id: r.get(0)?,
            token: r.get(1)?,
        },
        attempts: r.get(2)?,
        max_attempts: r.get(3)?,
        available_at: r.get(4)?,
        cancel_requested: r.get(5)?,
    })
}
