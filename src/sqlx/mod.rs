//! Enqueueing inside the application's own **sqlx** transaction: the job
//! exists if and only if that transaction commits.
//!
//! An async service on sqlx keeps its writes and its jobs in one commit:
//!
//! ```no_run
//! # #[cfg(feature = "sqlx-postgres")]
//! # async fn demo(queue: &backlog::Queue, pool: &sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use backlog::sqlx::postgres::QueueExt;
//! use backlog::NewJob;
//! use serde_json::json;
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(7_i64).execute(&mut *tx).await?;
//! queue.enqueue_in(&mut tx, NewJob::new("charge", json!({"order": 7}))).await?;
//! tx.commit().await?; // the order and its job, or neither
//! # Ok(())
//! # }
//! ```
//!
//! - [`postgres`] (feature `sqlx-postgres`) takes a
//!   `sqlx::Transaction<'_, Postgres>`. The workers' notification is sent
//!   inside the transaction, so PostgreSQL delivers it at commit: a rolled
//!   back enqueue wakes nobody.
//! - [`mysql`] (feature `sqlx-mysql`) takes a `sqlx::Transaction<'_, MySql>`,
//!   on MySQL 8 or MariaDB 10.6+ (tested on MariaDB 10.11 only). Workers
//!   notice the committed job by their poll, as for every MySQL enqueue.
//!
//! The queue itself is opened as always, with [`Queue::connect`] on the same
//! database (backlog's own synchronous driver: the library stays
//! synchronous and brings no runtime). Only the enqueue statements run on
//! the application's connection; the engine validates and encodes the job
//! first, exactly as for [`Queue::enqueue`], so a bad job is refused with a
//! typed error before anything is sent, and the statements are the ones the
//! queue's own connection runs. Nothing here commits, rolls back or waits
//! for a lock beyond what the statements themselves wait for: a unique key
//! held by another open transaction waits for that transaction (as any
//! insert would), bounded by the application's own `lock_timeout` /
//! `innodb_lock_wait_timeout`, and a deadlock comes back as [`Error::Busy`]
//! with the application's transaction to roll back.
//!
//! **What is not offered.** Grouped jobs ([`NewJob::group`](crate::NewJob))
//! are refused with [`Error::InvalidArgument`] (enqueue them with
//! [`Queue::enqueue`] or the synchronous `backlog::postgres`/`backlog::mysql`
//! `enqueue_in`). There is no `complete_in` through sqlx: handlers are
//! blocking closures on backlog's own threads, and
//! `backlog::postgres::JobContextExt::transaction` (or `backlog::mysql`'s)
//! already commits a handler's effects and its completion together on the
//! same database, without a runtime inside the handler. SQLite through sqlx
//! is not supported: sqlx-sqlite 0.9 links `libsqlite3-sys` below 0.38 and
//! backlog's rusqlite links 0.38, and a program links only one
//! (`links = "sqlite3"`); Cargo refuses to build both.
//!
//! The transaction type must come from the same sqlx as backlog's
//! (0.9, re-exported here as [`sqlx`]); these features need
//! sqlx's minimum Rust, 1.94. Pick the runtime and TLS in your own
//! `sqlx` dependency (for example `runtime-tokio`, `tls-native-tls`); sqlx
//! reads libpq's `sslmode` and `sslrootcert` from the URL itself.
//!
//! One [`QueueExt`] serves both databases (its `DB` is the transaction's),
//! and one enqueue flow serves sqlx and diesel alike (`src/adapter_flow.rs`:
//! the look-ups, the insert and what a key conflict means, decided once);
//! each driver file only runs the flow's statements on its connection.
//!
//! [`Queue::connect`]: crate::Queue::connect
//! [`Queue::enqueue`]: crate::Queue::enqueue

use std::future::Future;

use ::sqlx::{Database, Transaction};

use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::{Enqueued, IntoNewJob};
use crate::queue::{params, Queue};

/// The sqlx backlog is built with: use its `Transaction` type.
pub use ::sqlx;

#[cfg(feature = "sqlx-mysql")]
pub mod mysql;
#[cfg(feature = "sqlx-postgres")]
pub mod postgres;

/// Enqueueing of a [`Queue`] inside the application's sqlx transaction on
/// `DB`: `sqlx::Postgres` (feature `sqlx-postgres`, see [`postgres`]) for a
/// queue on PostgreSQL, `sqlx::MySql` (feature `sqlx-mysql`, see [`mysql`])
/// for one on MySQL/MariaDB. `DB` is the transaction's: one import serves
/// both.
///
/// Nothing is committed by these calls: the caller owns the commit, and the
/// job exists (on PostgreSQL, listening workers wake) when and only if the
/// transaction commits. The statements name the queue's schema or database
/// and tables fully, so the connection's `search_path` or default database
/// does not matter. A queue on another database is
/// [`Error::InvalidArgument`].
pub trait QueueExt<DB: Database>: crate::sealed::Sealed {
    /// Enqueues a job inside `tx`. A bad job is refused with a typed error
    /// before anything is sent. With a unique key already held by a live
    /// job (or a finished one, per the key's scope), the existing job's id
    /// comes back with `existed: true`; a key held by another transaction
    /// not yet committed waits for it, up to your `lock_timeout`
    /// (PostgreSQL) or `innodb_lock_wait_timeout` (MySQL; [`Error::Busy`]
    /// then).
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, DB>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Enqueues many jobs inside `tx`, ids in input order. On PostgreSQL
    /// jobs without unique keys go in one statement; on MySQL, one insert
    /// each.
    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, DB>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
}

/// One database's statements on its sqlx connection; the checks around
/// them are [`QueueExt`]'s, shared.
trait Driver: Database {
    /// Inserts the jobs (refused first by [`refuse_own_path_only`] when
    /// only backlog's own path can enqueue them), ids in input order. A
    /// queue on another database is refused before anything is sent.
    fn enqueue_all(call: Call<'_, Self>)
        -> impl Future<Output = Result<Vec<Enqueued>>> + Send + '_;
}

/// One `enqueue_many_in` on a driver's connection.
struct Call<'a, DB: Database> {
    queue: &'a Queue,
    conn: &'a mut DB::Connection,
    jobs: &'a [EnqueueParams<'a>],
    /// The engine's now (MySQL binds it; PostgreSQL's jobs carry it).
    #[cfg_attr(not(feature = "sqlx-mysql"), allow(dead_code))]
    now: i64,
}

#[allow(private_bounds)]
impl<DB: Driver> QueueExt<DB> for Queue {
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, DB>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        let ids = self.enqueue_many_in(tx, [job]);
        async move {
            ids.await?
                .pop()
                .ok_or_else(|| Error::Database("enqueue returned no id".into()))
        }
    }

    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, DB>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        // Validated and encoded now, before the first await: the future
        // holds no job of the caller's type.
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now);
        let conn: &mut DB::Connection = tx;
        async move {
            let prepared = prepared?;
            let jobs = params(&prepared, now);
            let call = Call {
                queue: self,
                conn,
                jobs: &jobs,
                now,
            };
            DB::enqueue_all(call).await
        }
    }
}

/// A job only backlog's own drivers can enqueue (see
/// `EnqueueParams::own_path_only`), refused before anything is sent.
fn refuse_own_path_only(jobs: &[EnqueueParams<'_>]) -> Result<()> {
    match jobs.iter().find_map(EnqueueParams::own_path_only) {
        Some(what) => Err(Error::InvalidArgument(format!(
            "{what} cannot be enqueued through sqlx: use Queue::enqueue or the \
             synchronous enqueue_in of backlog::postgres / backlog::mysql"
        ))),
        None => Ok(()),
    }
}
