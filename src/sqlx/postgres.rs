//! Enqueueing inside a `sqlx::Transaction<'_, Postgres>` (feature
//! `sqlx-postgres`). See [the module above](super) for what is and is not
//! offered.
//!
//! The statements are the PostgreSQL backend's own (`ENQUEUE_NOTIFY`,
//! `ENQUEUE_BATCH`, the unique look-ups), rendered for the queue's schema
//! and prefix; their `$n` parameters are sqlx's too, so they run unchanged,
//! each bound with the same Rust type as on backlog's own connection.
//! The job's notification is part of the inserting statement, which
//! PostgreSQL delivers when the transaction commits, and never if it rolls
//! back.

use std::future::Future;

use ::sqlx::postgres::{PgConnection, PgRow};
use ::sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use crate::backend::params::EnqueueParams;
use crate::backend::postgres::queries::Queries;
use crate::backend::postgres::Db;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::job::{Enqueued, IntoNewJob};
use crate::queue::{params, Queue};

/// Enqueueing of a [`Queue`] on PostgreSQL inside the application's sqlx
/// transaction.
///
/// Nothing is committed by these calls: the caller owns the commit. The job
/// exists, and listening workers wake, when and only if the transaction
/// commits. The transaction must be on the queue's database; the
/// statements name the queue's schema, so its `search_path` does not
/// matter.
pub trait QueueExt {
    /// Enqueues a job inside `tx`. A bad job is refused with a typed error
    /// before anything is sent. With a unique key already held by a live
    /// job (or a finished one, per the key's scope), the existing job's id
    /// comes back with `existed: true`; a key held by another transaction
    /// not yet committed waits for it, up to your `lock_timeout`.
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Enqueues many jobs inside `tx`, ids in input order. Jobs without
    /// unique keys go in one statement.
    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
}

impl QueueExt for Queue {
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        let ids = self.enqueue_many_in(tx, [job]);
        async move { super::single(ids.await?) }
    }

    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        // Validated and encoded now, before the first await: the future
        // holds no job of the caller's type.
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now);
        let conn: &mut PgConnection = tx;
        async move {
            let prepared = prepared?;
            let db = database(self)?;
            let jobs = params(&prepared, now);
            super::refuse_own_path_only(&jobs)?;
            enqueue_all(conn, db.queries(), &jobs).await
        }
    }
}

/// As the backend's `jobs::enqueue_all` without groups: one statement for a
/// batch without unique keys, else one per job.
async fn enqueue_all(
    conn: &mut PgConnection,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
) -> Result<Vec<Enqueued>> {
    if jobs.len() > 1 && jobs.iter().all(|p| p.unique_key.is_none()) {
        return enqueue_batch(conn, q, jobs).await;
    }
    let mut ids = Vec::with_capacity(jobs.len());
    for p in jobs {
        ids.push(enqueue(conn, q, p).await?);
    }
    Ok(ids)
}

/// As the backend's `jobs::enqueue`: the insert that notifies, or the job
/// already holding the unique key.
async fn enqueue(conn: &mut PgConnection, q: &Queries, p: &EnqueueParams<'_>) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    if let Some(id) = find_in_history(conn, q, p).await? {
        return Ok(Enqueued { id, existed: true });
    }
    let max_attempts = i32::try_from(p.max_attempts)
        .map_err(|_| Error::InvalidArgument("max_attempts out of range".into()))?;
    let delay = p.available_at.saturating_sub(p.now);
    // The job holding the key may finish between the insert that conflicted
    // and the look-up: then the insert is tried again (as the backend).
    for _ in 0..3 {
        let inserted = ::sqlx::query(AssertSqlSafe(q.enqueue_notify.as_str()))
            .bind(now)
            .bind(p.queue)
            .bind(p.kind)
            .bind(p.priority)
            .bind(p.unique_key)
            .bind(p.payload)
            .bind(max_attempts)
            .bind(delay)
            .bind(q.channel.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        if let Some(row) = inserted {
            let id = id_of(&row)?;
            // As the backend: a period-scoped key is looked at again after
            // the insert, which reads every commit before it, and the row
            // just inserted is taken back if a finished job now holds it.
            if let Some(found) = find_in_history(conn, q, p).await? {
                ::sqlx::query(AssertSqlSafe(q.delete_live.as_str()))
                    .bind(id)
                    .execute(&mut *conn)
                    .await
                    .map_err(from_sqlx)?;
                return Ok(Enqueued {
                    id: found,
                    existed: true,
                });
            }
            return Ok(Enqueued { id, existed: false });
        }
        let key = p.unique_key.ok_or_else(|| {
            Error::Database("insert ignored without a unique key conflict".into())
        })?;
        let live = ::sqlx::query(AssertSqlSafe(q.find_live_unique.as_str()))
            .bind(p.queue)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        if let Some(row) = live {
            return Ok(Enqueued {
                id: id_of(&row)?,
                existed: true,
            });
        }
    }
    Err(Error::Busy)
}

/// With a unique key scoped to recent history: the finished job holding it
/// (per the key's statuses), as the backend's look-up.
async fn find_in_history(
    conn: &mut PgConnection,
    q: &Queries,
    p: &EnqueueParams<'_>,
) -> Result<Option<i64>> {
    let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) else {
        return Ok(None);
    };
    let found = ::sqlx::query(AssertSqlSafe(q.find_history_unique.as_str()))
        .bind(q.now_override(p.now))
        .bind(p.queue)
        .bind(key)
        .bind(since.saturating_sub(p.now))
        .bind(p.unique_statuses)
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    found.as_ref().map(id_of).transpose()
}

/// As the backend's `jobs::enqueue_batch`: jobs without unique keys in one
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
    let rows = ::sqlx::query(AssertSqlSafe(q.enqueue_batch.as_str()))
        .bind(now)
        .bind(queues)
        .bind(kinds)
        .bind(priorities)
        .bind(payloads)
        .bind(max_attempts)
        .bind(delays)
        .bind(q.channel.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    let mut ids = rows.iter().map(id_of).collect::<Result<Vec<i64>>>()?;
    if ids.len() != jobs.len() {
        return Err(Error::Database(
            format!("inserted {} of {} jobs", ids.len(), jobs.len()).into(),
        ));
    }
    // Rows were inserted in input order, so their ids increase with it.
    ids.sort_unstable();
    Ok(ids
        .into_iter()
        .map(|id| Enqueued { id, existed: false })
        .collect())
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
    match queue.backend() {
        Backend::Postgres(db) => Ok(db),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidArgument(
            "this queue is not on PostgreSQL: backlog::sqlx::postgres needs a queue opened \
             with a postgres:// URL"
                .into(),
        )),
    }
}
