//! Enqueueing inside a `sqlx::Transaction<'_, Postgres>` (feature
//! `sqlx-postgres`) with [`QueueExt`]. See [the module above](super) for
//! what is and is not offered.
//!
//! The statements are the PostgreSQL backend's own (`ENQUEUE_NOTIFY`,
//! `ENQUEUE_BATCH`, the unique look-ups), rendered for the queue's schema
//! and prefix; their `$n` parameters are sqlx's too, so they run unchanged,
//! each bound with the same Rust type as on backlog's own connection.
//! The job's notification is part of the inserting statement, which
//! PostgreSQL delivers when the transaction commits, and never if it rolls
//! back.

use ::sqlx::postgres::{PgConnection, PgRow};
use ::sqlx::{AssertSqlSafe, Postgres, Row};

pub use super::QueueExt;
use super::{refuse_own_path_only, Call};
use crate::adapter_flow::{Conflict, EnqueueFlow, Next, Step};
use crate::app_transaction::postgres_db_or;
use crate::backend::params::EnqueueParams;
use crate::backend::postgres::enqueue::batch_enqueued;
use crate::backend::postgres::queries::Queries;
use crate::backend::postgres::Db;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::queue::Queue;

impl super::Driver for Postgres {
    /// As the backend's `jobs::enqueue_all` without groups: one statement
    /// for a batch without unique keys, else one per job.
    async fn enqueue_all(call: Call<'_, Self>) -> Result<Vec<Enqueued>> {
        let q = database(call.queue)?.queries();
        refuse_own_path_only(call.jobs)?;
        let (conn, jobs) = (call.conn, call.jobs);
        if jobs.len() > 1 && jobs.iter().all(|p| p.unique_key.is_none()) {
            return enqueue_batch(conn, q, jobs).await;
        }
        let mut ids = Vec::with_capacity(jobs.len());
        for p in jobs {
            ids.push(enqueue(conn, q, p).await?);
        }
        Ok(ids)
    }
}

/// The insert that notifies, or the job already holding the unique key:
/// the adapters' one flow ([`crate::adapter_flow`]), each step one of the
/// backend's statements.
async fn enqueue(conn: &mut PgConnection, q: &Queries, p: &EnqueueParams<'_>) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    let max_attempts = i32::try_from(p.max_attempts)
        .map_err(|_| Error::InvalidArgument("max_attempts out of range".into()))?;
    let delay = p.available_at.saturating_sub(p.now);
    let (mut flow, mut step) = EnqueueFlow::start(p, Conflict::Retry);
    loop {
        let query = match step {
            Step::FindInHistory { .. } => {
                ::sqlx::query(AssertSqlSafe(q.find_history_unique.as_str()))
                    .bind(now)
                    .bind(p.queue)
                    .bind(p.unique_key)
                    .bind(p.unique_history_since.map(|s| s.saturating_sub(p.now)))
                    .bind(p.unique_statuses)
            }
            Step::Insert => ::sqlx::query(AssertSqlSafe(q.enqueue_notify.as_str()))
                .bind(now)
                .bind(p.queue)
                .bind(p.kind)
                .bind(p.priority)
                .bind(p.unique_key)
                .bind(p.payload)
                .bind(max_attempts)
                .bind(delay)
                .bind(q.channel.as_str()),
            Step::DeleteLive(id) => ::sqlx::query(AssertSqlSafe(q.delete_live.as_str())).bind(id),
            Step::FindLive => ::sqlx::query(AssertSqlSafe(q.find_live_unique.as_str()))
                .bind(p.queue)
                .bind(p.unique_key),
        };
        let row = query.fetch_optional(&mut *conn).await.map_err(from_sqlx)?;
        match flow.answer(row.as_ref().map(id_of).transpose()?)? {
            Next::Run(next) => step = next,
            Next::Done(enqueued) => return Ok(enqueued),
        }
    }
}

/// As the backend's `enqueue::enqueue_batch`: jobs without unique keys in one
/// statement that notifies once; ids in input order.
async fn enqueue_batch(
    conn: &mut PgConnection,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
) -> Result<Vec<Enqueued>> {
    let now = q.now_override(jobs.first().map_or(0, |p| p.now));
    let queues: Vec<&str> = jobs.iter().map(|p| p.queue).collect();
    let kinds: Vec<&str> = jobs.iter().map(|p| p.kind).collect();
    let priorities: Vec<i32> = jobs.iter().map(|p| p.priority).collect();
    let payloads: Vec<&str> = jobs.iter().map(|p| p.payload).collect();
    let max_attempts = jobs
        .iter()
        .map(|p| {
            i32::try_from(p.max_attempts)
                .map_err(|_| Error::InvalidArgument("max_attempts out of range".into()))
        })
        .collect::<Result<Vec<i32>>>()?;
    let delays: Vec<i64> = jobs
        .iter()
        .map(|p| p.available_at.saturating_sub(p.now))
        .collect();
    let row = ::sqlx::query(AssertSqlSafe(q.enqueue_batch.as_str()))
        .bind(now)
        .bind(queues)
        .bind(kinds)
        .bind(priorities)
        .bind(payloads)
        .bind(max_attempts)
        .bind(delays)
        .bind(q.channel.as_str())
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    // One row: the ids as an array.
    let ids: Vec<i64> = match row {
        Some(row) => row.try_get(0).map_err(from_sqlx)?,
        None => Vec::new(),
    };
    batch_enqueued(ids, jobs.len())
}

fn id_of(row: &PgRow) -> Result<i64> {
    row.try_get::<i64, _>(0).map_err(from_sqlx)
}

/// A sqlx error as backlog's own PostgreSQL errors are mapped: a deadlock,
/// serialization failure or lock timeout is [`Error::Busy`] (the
/// application's transaction is aborted and must be rolled back), a full
/// disk [`Error::StorageFull`], a payload JSONB cannot hold
/// [`Error::InvalidPayload`].
fn from_sqlx(e: ::sqlx::Error) -> Error {
    let code = e
        .as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()));
    match code.as_deref() {
        Some("40001" | "40P01" | "55P03") => Error::Busy,
        Some("53100") => Error::StorageFull,
        Some("22P05") => Error::InvalidPayload(format!(
            "PostgreSQL cannot store this JSON: {}",
            e.as_database_error().map_or("", |d| d.message())
        )),
        _ => Error::Database(Box::new(e)),
    }
}

/// The PostgreSQL database of `queue`, or a typed error for a queue on
/// another backend.
fn database(queue: &Queue) -> Result<&Db> {
    postgres_db_or(
        queue,
        "this queue is not on PostgreSQL: backlog::sqlx::postgres needs a queue opened with a postgres:// URL",
    )
}
