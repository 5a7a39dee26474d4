//! The job operations of `backlog::diesel::postgres` on an application's
//! diesel `PgConnection`: the statements of [`super::queries`], the very
//! texts the queue's own connections run, sent with `diesel::sql_query` and
//! typed binds in their `$n` order.
//!
//! The control flow mirrors [`super::jobs`] (`enqueue`, `finish`) for the one
//! reason that its `Tx` speaks the `postgres` crate's rows and binds, and
//! diesel's connection is libpq's: each step below names the function it
//! follows, so a change there is made here too. Differs from it in that a
//! batch goes one statement per job (no arrays bound through diesel), and
//! grouped jobs are refused by the caller before anything runs.

use ::diesel::pg::PgConnection;
use ::diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};
use ::diesel::{sql_query, QueryableByName, RunQueryDsl};

use super::queries::Queries;
use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::lease::Lease;
use crate::outcome::{FinalStatus, Transition};

/// A statement's one `id` column.
#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// One job inserted (notifying the queue's channel, delivered at commit), or
/// the job already holding its unique key. Follows `jobs::enqueue`.
pub(crate) fn enqueue(
    conn: &mut PgConnection,
    q: &Queries,
    p: &EnqueueParams<'_>,
) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    if let Some(id) = find_in_history(conn, q, p)? {
        return Ok(Enqueued { id, existed: true });
    }
    let max_attempts = i32::try_from(p.max_attempts)
        .map_err(|_| Error::InvalidArgument("max_attempts is out of range".into()))?;
    let delay = p.available_at.saturating_sub(p.now);
    for _ in 0..3 {
        let inserted: Option<Id> = sql_query(&q.enqueue_notify)
            .bind::<Nullable<BigInt>, _>(now)
            .bind::<Text, _>(p.queue)
            .bind::<Text, _>(p.kind)
            .bind::<Integer, _>(p.priority)
            .bind::<Nullable<Text>, _>(p.unique_key)
            .bind::<Text, _>(p.payload)
            .bind::<Integer, _>(max_attempts)
            .bind::<BigInt, _>(delay)
            .bind::<Text, _>(&q.channel)
            .get_result(conn)
            .map(Some)
            .or_else(not_found_is_none)?;
        if let Some(row) = inserted {
            // As `jobs::enqueue`: a period-scoped key is looked at again
            // after the insert, and the row taken back if a finished job
            // now holds it.
            if let Some(found) = find_in_history(conn, q, p)? {
                sql_query(&q.delete_live)
                    .bind::<BigInt, _>(row.id)
                    .execute(conn)
                    .map_err(db_error)?;
                return Ok(Enqueued {
                    id: found,
                    existed: true,
                });
            }
            return Ok(Enqueued {
                id: row.id,
                existed: false,
            });
        }
        let key = p.unique_key.ok_or_else(|| {
            Error::Database("insert ignored without a unique key conflict".into())
        })?;
        let live: Option<Id> = sql_query(&q.find_live_unique)
            .bind::<Text, _>(p.queue)
            .bind::<Text, _>(key)
            .get_result(conn)
            .map(Some)
            .or_else(not_found_is_none)?;
        if let Some(row) = live {
            return Ok(Enqueued {
                id: row.id,
                existed: true,
            });
        }
    }
    Err(Error::Busy)
}

/// With a unique key scoped to recent history: the finished job holding it
/// (of the key's statuses). Follows `jobs::enqueue`'s look-up.
fn find_in_history(
    conn: &mut PgConnection,
    q: &Queries,
    p: &EnqueueParams<'_>,
) -> Result<Option<i64>> {
    let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) else {
        return Ok(None);
    };
    let found: Option<Id> = sql_query(&q.find_history_unique)
        .bind::<Nullable<BigInt>, _>(q.now_override(p.now))
        .bind::<Text, _>(p.queue)
        .bind::<Text, _>(key)
        .bind::<BigInt, _>(since.saturating_sub(p.now))
        .bind::<Nullable<Text>, _>(p.unique_statuses)
        .get_result(conn)
        .map(Some)
        .or_else(not_found_is_none)?;
    Ok(found.map(|row| row.id))
}

/// Refuses to finish a job that is a batch member or that other jobs
/// depend on, before anything is written: its batch's callbacks and its
/// dependents' release run only on backlog's own driver.
fn refuse_followed(conn: &mut PgConnection, q: &Queries, job_id: i64) -> Result<()> {
    let (schema, prefix) = (&q.tables.schema, &q.tables.prefix);
    let followed: Vec<Id> = sql_query(format!(
        "SELECT job_id AS id FROM {schema}{prefix}batch_jobs WHERE job_id = $1
         UNION ALL
         SELECT dependency AS id FROM {schema}{prefix}dependencies WHERE dependency = $1
         LIMIT 1"
    ))
    .bind::<BigInt, _>(job_id)
    .load(conn)
    .map_err(db_error)?;
    if followed.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "job {job_id} is a batch member or other jobs depend on it: settle it with \
             backlog::postgres::QueueExt or the worker, not through diesel"
        )))
    }
}

/// Checks `lease` is held and locks its row (fence first). Follows
/// `jobs::check_lease`.
pub(crate) fn check_lease(conn: &mut PgConnection, q: &Queries, lease: Lease) -> Result<()> {
    // A SELECT's count is its rows (libpq's `PQcmdTuples`).
    let held = sql_query(&q.lease_held)
        .bind::<BigInt, _>(lease.job_id)
        .bind::<BigInt, _>(lease.token)
        .execute(conn)
        .map_err(db_error)?;
    if held == 1 {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            job_id: lease.job_id,
        })
    }
}

/// Moves a leased job to history as the engine decided, fenced on its
/// lease: `LeaseLost` when another worker holds it now. Follows
/// `jobs::finish` for one job. A reschedule (a retry, a snooze) is refused
/// before anything runs: only finishing transitions go through diesel.
pub(crate) fn finish(
    conn: &mut PgConnection,
    q: &Queries,
    lease: Lease,
    transition: &Transition,
    now: i64,
) -> Result<()> {
    let Transition::Finish {
        status,
        result,
        error,
    } = transition
    else {
        return Err(Error::InvalidArgument(
            "only finishing outcomes (complete, discard, cancel, dead) settle through diesel"
                .into(),
        ));
    };
    refuse_followed(conn, q, lease.job_id)?;
    let error = error.as_ref().map(serde_json::to_string).transpose()?;
    let status: &str = FinalStatus::as_str(*status);
    let moved: Vec<Id> = sql_query(&q.finish_to_history)
        .bind::<Nullable<BigInt>, _>(q.now_override(now))
        .bind::<Array<BigInt>, _>(vec![lease.job_id])
        .bind::<Array<Nullable<BigInt>>, _>(vec![Some(lease.token)])
        .bind::<Array<Text>, _>(vec![status])
        .bind::<Array<Nullable<Text>>, _>(vec![result.as_deref()])
        .bind::<Array<Nullable<Text>>, _>(vec![error.as_deref()])
        .load(conn)
        .map_err(db_error)?;
    if moved.iter().any(|row| row.id == lease.job_id) {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            job_id: lease.job_id,
        })
    }
}

/// `get_result` answers `NotFound` for no row: here that is an answer.
fn not_found_is_none<T>(e: ::diesel::result::Error) -> Result<Option<T>> {
    match e {
        ::diesel::result::Error::NotFound => Ok(None),
        e => Err(db_error(e)),
    }
}

/// A diesel error as backlog's: the caller's transaction is now aborted on
/// the server, and rolls back.
pub(crate) fn db_error(e: ::diesel::result::Error) -> Error {
    Error::from(e)
}
