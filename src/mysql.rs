//! What only MySQL and MariaDB have: their transaction type, for enqueueing
//! and completing inside your own transactions.
//!
//! Open the queue with [`Queue::connect`](crate::Queue::connect) on a `mysql://user:pass@host/db`
//! URL (MySQL 8.0.1 or later, MariaDB 10.6 or later: both have `SKIP
//! LOCKED`; an older server is refused with
//! [`Error::UnsupportedServer`](crate::Error::UnsupportedServer)), bring the extension traits into scope, and
//! the queue and the job context gain the transactional calls on
//! [`mysql::Transaction`]:
//!
//! ```no_run
//! use backlog::mysql::{mysql, QueueExt};
//! use backlog::{NewJob, Queue};
//! use mysql::prelude::Queryable;
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "mysql://app@127.0.0.1:3306/shop";
//! let queue = Queue::connect(url)?;
//! let pool = mysql::Pool::new(url)?;
//!
//! let mut tx = pool.start_transaction(mysql::TxOpts::default())?;
//! tx.exec_drop("INSERT INTO orders (id) VALUES (?)", (7,))?;
//! queue.enqueue_in(&mut tx, NewJob::new("charge", json!({"order": 7})))?;
//! tx.commit()?; // the order and its job, or neither
//! # Ok(())
//! # }
//! ```
//!
//! A handler commits its effects and its job's completion together with
//! [`JobContextExt::transaction`]:
//!
//! ```no_run
//! use backlog::mysql::{mysql::prelude::Queryable, JobContextExt};
//! use backlog::{JobContext, JobError};
//!
//! fn charge(order: i64, ctx: &JobContext) -> Result<(), JobError> {
//!     ctx.transaction(|tx| {
//!         tx.exec_drop("UPDATE orders SET paid = 1 WHERE id = ?", (order,))?;
//!         Ok(())
//!     })
//! }
//! ```
//!
//! A program written for SQLite changes only its import (`backlog::sqlite`
//! to `backlog::mysql`), the open call, and the transaction type its
//! handlers receive (`&rusqlite::Transaction` to `&mut mysql::Transaction`).
//!
//! Times come from the database server's clock, so nodes whose clocks
//! disagree still agree on leases and schedules. The tables are
//! `backlog_jobs`, `backlog_history`, `backlog_queues` (see
//! [`QueueOptions::table_prefix`](crate::QueueOptions::table_prefix)) in the
//! URL's database, which must be named. Workers on other nodes notice new
//! jobs by polling the newest job id every 25 ms (MySQL has no
//! LISTEN/NOTIFY).
//!
//! Tested against MariaDB 10.11 only. The SQL keeps to what MySQL 8
//! documents (JSON_TABLE, SKIP LOCKED, descending indexes, generated
//! columns), but no MySQL 8 server has run the suites: treat MySQL as
//! untested until one does.

use crate::app_transaction::{mysql_db, transactional_calls};
use crate::backend::mysql as db;
use crate::queue::run_then_complete;

/// The `mysql` crate backlog is built with. Use it for the transactions you
/// pass to [`QueueExt::enqueue_in`] and friends.
pub use ::mysql;

/// A transaction of the application's, or the queue's own, as
/// [`QueueExt::transaction`] and [`JobContextExt::transaction`] hand it to a
/// closure.
pub type Transaction<'a> = ::mysql::Transaction<'a>;

transactional_calls! {
    /// Transactional calls of a [`Queue`](crate::Queue) on MySQL/MariaDB.
    ///
    /// Each `*_in` call runs inside the caller's transaction, which may be on
    /// any connection to the queue's server (the statements name the queue's
    /// database). Nothing is committed by these calls and no events are sent:
    /// the caller owns the commit.
    trait QueueExt;

    /// Completes a leased job inside the caller's transaction: the completion
    /// commits if and only if the caller's transaction does, together with
    /// the caller's effects. The job's row stays locked until then.
    ///
    /// On `Err(LeaseLost)` nothing was changed and **the caller's transaction
    /// must not commit** its effects: another worker owns the job now. Using
    /// `?` does this for you, since a `mysql::Transaction` dropped without
    /// `commit()` rolls back; [`QueueExt::transaction`] also rolls back on any
    /// `Err`. Call it first in the transaction (fence first) to learn of a
    /// lost lease before doing the work.
    fn complete_in;

    /// Runs `f` in a transaction on one of the queue's pooled connections,
    /// committing on `Ok` and rolling back on `Err`:
    ///
    /// ```no_run
    /// # use backlog::mysql::{mysql::prelude::Queryable, QueueExt};
    /// # fn demo(queue: &backlog::Queue, job: &backlog::Job) -> backlog::Result<()> {
    /// queue.transaction(|tx| {
    ///     queue.complete_in(tx, job, None)?; // fence first: LeaseLost rolls back
    ///     tx.exec_drop("UPDATE orders SET paid = 1 WHERE id = ?", (7,))?;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// The session reads committed data (READ COMMITTED). The closure runs
    /// once; only getting a working connection is retried. Inside the
    /// closure the queue's other writes and a nested `transaction` return
    /// [`Error::InsideTransaction`](crate::Error::InsideTransaction) at once (they could wait for the row
    /// locks of this transaction); reads work on another pooled connection,
    /// or answer `InsideTransaction` at once when none is free (see
    /// [`Queue`](crate::Queue)); the `_in` forms join it.
    fn transaction = |queue, f| mysql_db(queue)?.transaction(f);

    /// Transactional completion for handlers on MySQL/MariaDB.
    trait JobContextExt;

    /// Runs `f` in a transaction on one of the queue's connections and
    /// completes the job in the same transaction: the effects `f` writes and
    /// the completion commit together, or not at all.
    ///
    /// The lease is checked and the job's row locked first (fence first),
    /// then `f` runs, then the job is completed with `f`'s value as its
    /// result (a value that serializes to JSON `null`, such as `()`, stores
    /// none) and the transaction commits. When the lease was lost — it
    /// expired and another worker claimed the job — nothing commits and the
    /// error says so ([`JobError::is_lease_lost`](crate::JobError::is_lease_lost)); the effects are never
    /// applied twice. On any error from `f` the transaction rolls back.
    ///
    /// A job completed this way is not completed again by the worker,
    /// whatever the handler returns afterwards. The job's row is locked while
    /// `f` runs, so its heartbeat waits for the commit: keep `f` well within
    /// the lease's TTL, and enqueue follow-up jobs with
    /// [`QueueExt::enqueue_in`]`(tx, ..)`: [`Queue::enqueue`](crate::Queue::enqueue), every other
    /// write of the queue and [`JobContext::heartbeat`](crate::JobContext::heartbeat) return
    /// [`Error::InsideTransaction`](crate::Error::InsideTransaction) at once inside `f`; reads work (see
    /// [`Queue`](crate::Queue)).
    fn transaction = |ctx, f| {
        let queue = ctx.source();
        let db = mysql_db(queue)?;
        ctx.complete_transactionally(|| {
            db.transaction(|tx| {
                db::jobs::check_lease(&db.sql, tx, ctx.job().lease())?;
                run_then_complete(ctx, tx, f, |tx, result| {
                    queue.complete_in(tx, ctx.job(), result)
                })
            })
        })
    };
}
