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
//! [`Queue::connect`]: crate::Queue::connect
//! [`Queue::enqueue`]: crate::Queue::enqueue

use crate::backend::params::EnqueueParams;
use crate::error::Error;
use crate::job::Enqueued;

/// The sqlx backlog is built with: use its `Transaction` type.
pub use ::sqlx;

#[cfg(feature = "sqlx-mysql")]
pub mod mysql;
#[cfg(feature = "sqlx-postgres")]
pub mod postgres;

/// A job only backlog's own drivers can enqueue (see
/// `EnqueueParams::own_path_only`), refused before anything is sent.
fn refuse_own_path_only(jobs: &[EnqueueParams<'_>]) -> crate::error::Result<()> {
    match jobs.iter().find_map(EnqueueParams::own_path_only) {
        Some(what) => Err(Error::InvalidArgument(format!(
            "{what} cannot be enqueued through sqlx: use Queue::enqueue or the \
             synchronous enqueue_in of backlog::postgres / backlog::mysql"
        ))),
        None => Ok(()),
    }
}

/// The one id `enqueue_in` asked for.
fn single(mut ids: Vec<Enqueued>) -> crate::error::Result<Enqueued> {
    ids.pop()
        .ok_or_else(|| Error::Database("enqueue returned no id".into()))
}
