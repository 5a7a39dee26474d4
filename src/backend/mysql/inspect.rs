//! Inspection and operator actions on MySQL: get, list, counts, retry,
//! cancel, delete, pause, prune.

use mysql::prelude::Queryable;
use mysql::{params, Params, Row};

use super::queries::Sql;
use super::{jobs, take, Now};
use crate::error::{Error, Result};
use crate::inspect::{CancelOutcome, JobFilter, JobRecord, JobState, Page, StateCount};
use crate::outcome::{AttemptError, FinalStatus};

/// A job by id, live or finished.
pub(crate) fn get(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<JobRecord> {
    let live: Option<Row> =
        q.exec_first(&sql.get_live, params! { "id" => id, "now" => now.param() })?;
    if let Some(row) = live {
        return record(row);
    }
    let finished: Option<Row> = q.exec_first(&sql.get_history, params! { "id" => id })?;
    finished
        .map(record)
        .unwrap_or(Err(Error::NotFound { job_id: id }))
}

/// One page of jobs in a state, by ascending id.
pub(crate) fn list(
    sql: &Sql,
    q: &mut impl Queryable,
    filter: &JobFilter,
    now: Now,
) -> Result<Page> {
    let (text, status) = match filter.state {
        JobState::Finished(status) => (sql.list(None), Some(status.as_str())),
        live => (sql.list(Some(live.as_str())), None),
    };
    let limit = u64::try_from(filter.limit).unwrap_or(u64::MAX);
    let rows: Vec<Row> = q.exec(
        text,
        params! {
            "status" => status, "now" => now.param(),
            "queue" => filter.queue.as_deref(), "kind" => filter.kind.as_deref(),
            "after" => filter.after_id.unwrap_or(i64::MIN), "limit" => limit,
        },
    )?;
    let jobs = rows.into_iter().map(record).collect::<Result<Vec<_>>>()?;
    let next_after = if jobs.len() == filter.limit {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    Ok(Page { jobs, next_after })
}

/// Reads a row in `LIVE_COLUMNS` / `HISTORY_COLUMNS` order.
fn record(mut r: Row) -> Result<JobRecord> {
    let errors: String = take(&mut r, 9)?;
    let state: String = take(&mut r, 18)?;
    Ok(JobRecord {
        id: take(&mut r, 0)?,
        queue: take(&mut r, 1)?,
        kind: take(&mut r, 2)?,
        priority: take(&mut r, 3)?,
        unique_key: take(&mut r, 4)?,
        payload: take(&mut r, 5)?,
        attempts: take(&mut r, 6)?,
        max_attempts: take(&mut r, 7)?,
        available_at: take(&mut r, 8)?,
        errors: serde_json::from_str::<Vec<AttemptError>>(&errors).unwrap_or_default(),
        worker: take(&mut r, 10)?,
        lease_until: take(&mut r, 11)?,
        started_at: take(&mut r, 12)?,
        cancel_requested: take(&mut r, 13)?,
        result: take(&mut r, 14)?,
        finished_at: take(&mut r, 15)?,
        created_at: take(&mut r, 16)?,
        updated_at: take(&mut r, 17)?,
        state: JobState::parse(&state)
            .ok_or_else(|| Error::Database(format!("unknown job state {state:?}").into()))?,
    })
}

/// Jobs per queue and state (states with no jobs are left out).
pub(crate) fn counts(sql: &Sql, q: &mut impl Queryable, now: Now) -> Result<Vec<StateCount>> {
    let mut rows: Vec<Row> = q.exec(&sql.count_live, params! { "now" => now.param() })?;
    rows.extend(q.exec::<Row, _, _>(&sql.count_history, ())?);
    let mut out = Vec::new();
    for mut r in rows {
        let (queue, state, count): (String, String, i64) =
            (take(&mut r, 0)?, take(&mut r, 1)?, take(&mut r, 2)?);
        if let Some(state) = JobState::parse(&state) {
            out.push(StateCount {
                queue,
                state,
                count: count.max(0) as u64,
            });
        }
    }
    out.sort_by(|a, b| {
        (a.queue.as_str(), state_rank(a.state)).cmp(&(b.queue.as_str(), state_rank(b.state)))
    });
    Ok(out)
}

fn state_rank(state: JobState) -> usize {
    JobState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or(usize::MAX)
}

/// Makes a dead, discarded or cancelled job live again with attempts reset.
pub(crate) fn retry(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<()> {
    match live_lease(sql, q, id)? {
        Some(Some(_)) => return Err(live_job(id, "running")),
        Some(None) => return Err(live_job(id, "waiting to run; run_now makes it due at once")),
        None => {}
    }
    match history_status(sql, q, id)? {
        None => Err(Error::NotFound { job_id: id }),
        Some(FinalStatus::Completed) => Err(Error::InvalidState {
            job_id: id,
            reason: "job completed; only dead, discarded or cancelled jobs can be retried".into(),
        }),
        Some(_) => {
            let moved = q
                .exec_iter(
                    &sql.retry_from_history,
                    params! { "id" => id, "now" => now.param() },
                )?
                .affected_rows();
            if moved == 0 {
                return Err(Error::InvalidState {
                    job_id: id,
                    reason: "a live job already holds its unique key".into(),
                });
            }
            q.exec_drop(&sql.delete_history, params! { "id" => id })?;
            Ok(())
        }
    }
}

/// Makes a scheduled or retrying job (one not running) due now, keeping its
/// attempts.
pub(crate) fn run_now(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<()> {
    match live_lease(sql, q, id)? {
        Some(Some(_)) => Err(live_job(id, "running")),
        Some(None) => {
            q.exec_drop(&sql.run_now, params! { "id" => id, "now" => now.param() })?;
            Ok(())
        }
        None => match history_status(sql, q, id)? {
            None => Err(Error::NotFound { job_id: id }),
            Some(status) => Err(Error::InvalidState {
                job_id: id,
                reason: format!(
                    "job already finished ({}); retry brings a finished job back",
                    status.as_str()
                ),
            }),
        },
    }
}

fn live_job(id: i64, what: &str) -> Error {
    Error::InvalidState {
        job_id: id,
        reason: format!("job is {what}"),
    }
}

/// Cancels a job: at once when it is not running, by request when it is.
pub(crate) fn cancel(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    now: Now,
) -> Result<CancelOutcome> {
    match live_lease(sql, q, id)? {
        Some(Some(_)) => {
            q.exec_drop(
                &sql.request_cancel,
                params! { "id" => id, "now" => now.param() },
            )?;
            Ok(CancelOutcome::Requested)
        }
        Some(None) => {
            let error = AttemptError {
                attempt: 0,
                at: 0, // the server's now, set in SQL
                message: "cancelled by request".into(),
            };
            jobs::finish(
                sql,
                q,
                id,
                None,
                FinalStatus::Cancelled,
                None,
                Some(&error),
                now,
            )?;
            Ok(CancelOutcome::Cancelled)
        }
        None => match history_status(sql, q, id)? {
            None => Err(Error::NotFound { job_id: id }),
            Some(status) => Err(Error::InvalidState {
                job_id: id,
                reason: format!("job already finished ({})", status.as_str()),
            }),
        },
    }
}

/// Deletes a job, live or finished. A worker running it gets `LeaseLost`.
pub(crate) fn delete(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<()> {
    let live = q
        .exec_iter(&sql.delete_live, params! { "id" => id })?
        .affected_rows();
    let finished = q
        .exec_iter(&sql.delete_history, params! { "id" => id })?
        .affected_rows();
    if live + finished == 0 {
        return Err(Error::NotFound { job_id: id });
    }
    Ok(())
}

/// `Some(token)` for a live job (token `None` when not leased), `None` when
/// there is no live job with this id. Locks the row.
fn live_lease(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<Option<Option<i64>>> {
    let row: Option<Row> = q.exec_first(&sql.live_lease, params! { "id" => id })?;
    row.map(|mut r| take::<Option<i64>>(&mut r, 0)).transpose()
}

fn history_status(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<Option<FinalStatus>> {
    let status: Option<String> = q.exec_first(&sql.history_status, params! { "id" => id })?;
    Ok(status.as_deref().and_then(FinalStatus::parse))
}

/// Inserts jobs copied from another database (see [`crate::copy`]), keeping
/// their ids; returns how many were written (the others were already there).
pub(crate) fn import(sql: &Sql, q: &mut impl Queryable, records: &[JobRecord]) -> Result<usize> {
    let mut written = 0;
    let mut highest = 0;
    for r in records {
        let mut values = params! {
            "id" => r.id, "queue" => &r.queue, "kind" => &r.kind, "priority" => r.priority,
            "unique_key" => r.unique_key.as_deref(), "payload" => &r.payload,
            "attempts" => r.attempts, "max_attempts" => r.max_attempts,
            "available_at" => r.available_at, "started_at" => r.started_at,
            "errors" => serde_json::to_string(&r.errors)?,
            "cancel_requested" => r.cancel_requested, "created_at" => r.created_at,
            "updated_at" => r.updated_at,
        };
        let statement = match r.state {
            JobState::Finished(status) => {
                if let Params::Named(map) = &mut values {
                    map.insert(b"result".to_vec(), r.result.as_deref().into());
                    map.insert(b"status".to_vec(), status.as_str().into());
                    map.insert(b"processed_by".to_vec(), r.worker.as_deref().into());
                    map.insert(
                        b"finished_at".to_vec(),
                        r.finished_at.unwrap_or(r.updated_at).into(),
                    );
                }
                &sql.import_history
            }
            _ => &sql.import_live,
        };
        written += q.exec_iter(statement, values)?.affected_rows();
        highest = highest.max(r.id);
    }
    if highest > 0 {
        q.exec_drop(&sql.raise_next_id, params! { "id" => highest })?;
        q.exec_drop(&sql.drop_id_placeholder, params! { "id" => highest })?;
    }
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

/// Pauses (`true`) or resumes (`false`) a queue.
pub(crate) fn set_paused(
    sql: &Sql,
    q: &mut impl Queryable,
    queue: &str,
    paused: bool,
    now: Now,
) -> Result<()> {
    q.exec_drop(
        &sql.set_paused,
        params! { "name" => queue, "paused" => paused, "now" => now.param() },
    )?;
    Ok(())
}

/// The paused queues.
pub(crate) fn paused_queues(sql: &Sql, q: &mut impl Queryable) -> Result<Vec<String>> {
    let rows: Vec<Row> = q.exec(&sql.paused_queues, ())?;
    rows.into_iter().map(|mut r| take(&mut r, 0)).collect()
}

/// Deletes up to `limit` finished jobs of `status` that finished before `cutoff`.
pub(crate) fn prune(
    sql: &Sql,
    q: &mut impl Queryable,
    status: FinalStatus,
    cutoff: i64,
    limit: usize,
    now: Now,
) -> Result<usize> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let deleted = q
        .exec_iter(
            &sql.prune_history,
            params! {
                "status" => status.as_str(), "cutoff_in" => now.offset(cutoff),
                "limit" => limit, "now" => now.param(),
            },
        )?
        .affected_rows();
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}
