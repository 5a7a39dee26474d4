//! What only SQLite has: its transaction type for enqueueing and completing
//! inside your own transactions, its durability pragma, and its diagnostics
//! (the write-ahead log's size, [`probe_sqlite_file`]; see [`QueueExt`]).
//!
//! Bring the extension traits into scope and the queue and the job context
//! gain the transactional calls on `rusqlite` types:
//!
//! ```
//! use backlog::sqlite::{rusqlite, QueueExt};
//! use backlog::{NewJob, Queue};
//! use rusqlite::TransactionBehavior;
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("app.db");
//! let queue = Queue::open(&path)?;
//! let mut conn = rusqlite::Connection::open(&path)?;
//! conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")?;
//!
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders (id) VALUES (7)", [])?;
//! queue.enqueue_in(&tx, NewJob::new("charge", json!({"order": 7})))?;
//! tx.commit()?; // the order and its job, or neither
//! # Ok(())
//! # }
//! ```
//!
//! # The application's own connections
//!
//! A queue call (`queue.enqueue(..)`) made on a thread that holds a write
//! transaction on the queue's file through a connection of the
//! application's would wait for that thread's own lock. backlog sees such a
//! lock only on connections that go through its shim VFS, which it never
//! imposes on the process (SQLite's default VFS stays the default). Open
//! yours with [`open_connection`] (or call [`make_default_vfs`] once, before
//! opening them) and such a call answers [`Error::InsideTransaction`] at
//! once, writing nothing; otherwise it waits, up to the queue's write
//! deadline, then [`Error::Busy`]. Either way `enqueue_in(&tx, ..)` is the
//! call that joins your transaction.
//!
//! ```
//! use backlog::{Error, NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("app.db");
//! let queue = Queue::open(&path)?;
//! let conn = backlog::sqlite::open_connection(&path)?;
//! conn.execute_batch("BEGIN IMMEDIATE")?;
//! let refused = queue.enqueue(NewJob::new("charge", json!({"order": 7})));
//! # #[cfg(unix)]
//! assert!(matches!(refused, Err(Error::InsideTransaction)));
//! conn.execute_batch("ROLLBACK")?;
//! # Ok(())
//! # }
//! ```
//!
//! A program moves to PostgreSQL or MySQL by changing this module's import
//! to `backlog::postgres` or `backlog::mysql`, the open call to
//! [`Queue::connect`], and the transaction type its handlers receive.

pub(crate) mod diagnostics;

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::backend::{sqlite as db, Backend};
use crate::batch::{self, Batch, BatchBuilder};
use crate::error::{Error, Result};
use crate::job::{Enqueued, IntoNewJob};
use crate::lease::Job;
use crate::outcome::Outcome;
use crate::queue::{params, run_then_complete, Queue};
use crate::worker::{JobContext, JobError};

pub use diagnostics::{probe_sqlite_file, probe_sqlite_file_with_key, SqliteFile};

/// The `rusqlite` backlog is built with. Use it for the connections you pass
/// to [`QueueExt::enqueue_in`] and friends: a second `rusqlite` version in
/// one program fails to build (`links = "sqlite3"`).
pub use rusqlite;

/// A SQLite connection or transaction of the application's (a
/// `rusqlite::Transaction` derefs to one).
pub type Connection = rusqlite::Connection;

/// The queue's own transaction, as [`QueueExt::transaction`] and
/// [`JobContextExt::transaction`] hand it to a closure.
pub type Transaction<'a> = rusqlite::Transaction<'a>;

/// Opens a connection to the SQLite database at `path` (created if missing,
/// as [`rusqlite::Connection::open`] does) through backlog's shim VFS, so
/// that a queue call on a thread holding this connection's write
/// transaction on a queue's file answers [`Error::InsideTransaction`] at
/// once instead of waiting for it (see the [module docs](self)).
///
/// The shim forwards every call to the VFS that was the default when it
/// was registered (the first `Queue::open`, `open_connection` or
/// [`make_default_vfs`] of the process) and changes nothing else: the
/// connection is an ordinary `rusqlite` connection. Off unix there is no
/// shim and this is `rusqlite::Connection::open`.
pub fn open_connection(path: impl AsRef<Path>) -> Result<Connection> {
    Ok(db::write_path::vfs::open(
        path.as_ref(),
        rusqlite::OpenFlags::default(),
    )?)
}

/// Makes backlog's shim VFS the process's default SQLite VFS: every SQLite
/// connection opened afterwards without a VFS name, by any library over
/// this `libsqlite3-sys` (rusqlite, diesel, sqlx), goes through it, as with
/// [`open_connection`]. Connections opened before the call are not
/// covered, and a VFS the application makes the default later replaces it.
/// Call it once, early, if your connections are not opened with
/// [`open_connection`]; backlog never calls it itself.
///
/// Returns whether the shim is now the default: `false` off unix (no shim)
/// or if SQLite refused to register it; queue calls inside the
/// application's transactions then wait, bounded by the write deadline.
pub fn make_default_vfs() -> bool {
    db::write_path::vfs::make_default()
}

/// Transactional calls of a [`Queue`] on SQLite.
///
/// Each `*_in` call runs inside the caller's transaction on `conn`, which
/// must be open on the queue's database file and inside a transaction
/// (`Error::NotInTransaction` otherwise); start it with `BEGIN IMMEDIATE`
/// (`TransactionBehavior::Immediate`) so it cannot fail with BUSY halfway.
/// Nothing is committed by these calls and no events are sent: the caller
/// owns the commit.
///
/// Its other calls read what only SQLite has ([`QueueExt::synchronous`],
/// [`QueueExt::wal_size`]). On a queue that is not on SQLite the calls
/// answer [`Error::InvalidArgument`] and write nothing (the `_in` calls
/// check their jobs first, so a bad job is refused as such).
pub trait QueueExt: crate::sealed::Sealed {
    /// Enqueues a job inside the caller's transaction: the job exists if and
    /// only if that transaction commits.
    fn enqueue_in(&self, conn: &Connection, job: impl IntoNewJob) -> Result<Enqueued>;

    /// Enqueues many jobs inside the caller's transaction.
    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        conn: &Connection,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>>;

    /// Enqueues a workflow inside the caller's transaction (see
    /// [`Queue::enqueue_workflow`]): its steps exist if and only if that
    /// transaction commits.
    fn enqueue_workflow_in(
        &self,
        conn: &Connection,
        workflow: crate::Workflow,
    ) -> Result<crate::EnqueuedWorkflow>;

    /// Creates an open batch inside the caller's transaction (see
    /// [`crate::batch`]): it exists if and only if that transaction commits.
    fn create_batch_in(&self, conn: &Connection, batch: BatchBuilder<'_>) -> Result<Batch>;

    /// Seals a batch inside the caller's transaction, enqueueing its
    /// callbacks there when every member has finished (see
    /// [`Queue::seal_batch`]).
    fn seal_batch_in(&self, conn: &Connection, id: i64) -> Result<()>;

    /// Completes a leased job inside the caller's transaction: the seed
    /// design's transactional Ack. The completion commits if and only if the
    /// caller's transaction does, together with the caller's effects.
    ///
    /// On `Err(LeaseLost)` nothing was changed and **the caller's transaction
    /// must not commit** its effects: another worker owns the job now. Using
    /// `?` does this for you, since a `rusqlite::Transaction` dropped without
    /// `commit()` rolls back; [`QueueExt::transaction`] also rolls back on any
    /// `Err`. Call it first in the transaction (fence first) to learn of a
    /// lost lease before doing the work.
    fn complete_in(&self, conn: &Connection, job: &Job, result: Option<Value>) -> Result<()>;

    /// Records a failed attempt inside the caller's transaction: the seed
    /// design's transactional Nack. Same rules as [`QueueExt::complete_in`].
    fn fail_in(&self, conn: &Connection, job: &Job, error: impl Into<String>) -> Result<()>;

    /// Applies any outcome inside the caller's transaction.
    fn settle_in(&self, conn: &Connection, job: &Job, outcome: Outcome) -> Result<()>;

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the queue's write
    /// connection, committing on `Ok` and rolling back on `Err`. Pair it with
    /// [`QueueExt::complete_in`] to commit a job's effects and its completion
    /// together:
    ///
    /// ```no_run
    /// # use backlog::sqlite::QueueExt;
    /// # fn demo(queue: &backlog::Queue, job: &backlog::Job) -> backlog::Result<()> {
    /// queue.transaction(|tx| {
    ///     queue.complete_in(tx, job, None)?; // fence first: LeaseLost rolls back
    ///     tx.execute("UPDATE orders SET paid = 1 WHERE id = ?1", [7])?;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// The write connection is held for the closure's run: keep it short. Only
    /// taking the lock is retried, up to the queue's write deadline. Inside
    /// the closure the queue's other writes, a nested `transaction` and
    /// [`QueueExt::synchronous`] return [`Error::InsideTransaction`] at once;
    /// reads and the `_in` forms work (see [`Queue`]).
    fn transaction<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>;

    /// The `synchronous` pragma in force on the queue's write connection, read
    /// back from SQLite: 2 (FULL) for [`Durability::Full`](crate::Durability),
    /// 1 (NORMAL) for [`Durability::Fast`](crate::Durability). The setting is
    /// per connection, so another connection to the file cannot observe it.
    fn synchronous(&self) -> Result<i64>;

    /// The size of the queue's write-ahead log (`PATH-wal`) in bytes, 0 when
    /// there is none. [`Error::InvalidArgument`] for a queue on a server,
    /// which has no such file.
    fn wal_size(&self) -> Result<u64>;

    /// The longest the engine's maintenance held this queue's write gate at
    /// once (a rescue or prune transaction of a worker, a slice of WAL
    /// truncation, a checkpoint catching up), for benchmarks and tests.
    /// [`Error::InvalidArgument`] for a queue on a server.
    #[doc(hidden)]
    fn longest_maintenance_hold(&self) -> Result<Duration>;
}

impl QueueExt for Queue {
    fn enqueue_in(&self, conn: &Connection, job: impl IntoNewJob) -> Result<Enqueued> {
        let mut ids = self.enqueue_many_in(conn, [job])?;
        ids.pop()
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    }

    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        conn: &Connection,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>> {
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now)?;
        check_caller_connection(self, conn)?;
        db::jobs::enqueue_all(conn, &params(&prepared, now))
    }

    fn enqueue_workflow_in(
        &self,
        conn: &Connection,
        workflow: crate::Workflow,
    ) -> Result<crate::EnqueuedWorkflow> {
        let now = self.now_micros();
        let planned = self.plan_workflow(workflow, now)?;
        check_caller_connection(self, conn)?;
        let (id, ids) =
            db::workflows::enqueue_workflow(conn, &planned.params(now), &planned.jobs(now))?;
        Ok(planned.enqueued(id, &ids))
    }

    fn create_batch_in(&self, conn: &Connection, batch: BatchBuilder<'_>) -> Result<Batch> {
        let p = batch.params()?;
        check_caller_connection(self, conn)?;
        let id = db::batches::create(conn, &p.borrowed())?;
        Ok(Batch { id })
    }

    fn seal_batch_in(&self, conn: &Connection, id: i64) -> Result<()> {
        check_caller_connection(self, conn)?;
        let found = db::batches::seal(conn, id, self.now_micros(), db::jobs::enqueue_all)?;
        batch::join_verdict(id, found.map(|_| false))
    }

    fn complete_in(&self, conn: &Connection, job: &Job, result: Option<Value>) -> Result<()> {
        self.settle_in(conn, job, Outcome::Complete(result))
    }

    fn fail_in(&self, conn: &Connection, job: &Job, error: impl Into<String>) -> Result<()> {
        self.settle_in(conn, job, Outcome::fail(error))
    }

    fn settle_in(&self, conn: &Connection, job: &Job, outcome: Outcome) -> Result<()> {
        check_caller_connection(self, conn)?;
        let params = self.settle_params(job, outcome, self.now_micros())?;
        db::jobs::settle(conn, &params)?;
        self.note_settled_in(job.lease());
        Ok(())
    }

    fn transaction<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        connections(self)?.transaction(f)
    }

    fn synchronous(&self) -> Result<i64> {
        connections(self)?.synchronous()
    }

    fn wal_size(&self) -> Result<u64> {
        diagnostics::wal_size(self)
    }

    fn longest_maintenance_hold(&self) -> Result<Duration> {
        diagnostics::longest_maintenance_hold(self)
    }
}

/// Transactional completion for handlers on SQLite.
pub trait JobContextExt: crate::sealed::Sealed {
    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the queue's database and
    /// completes the job in the same transaction: the effects `f` writes and
    /// the completion commit together, or not at all.
    ///
    /// The lease is checked first (fence first), then `f` runs, then the job
    /// is completed with `f`'s value as its result (a value that serializes to
    /// JSON `null`, such as `()`, stores none) and the transaction commits.
    /// When the lease was lost — it expired and another worker claimed the
    /// job — nothing commits and the error says so
    /// ([`JobError::is_lease_lost`]); the effects are never applied twice.
    /// On any error from `f` the transaction rolls back.
    ///
    /// ```no_run
    /// use backlog::sqlite::JobContextExt;
    /// use backlog::{JobContext, JobError};
    ///
    /// fn charge(order: i64, ctx: &JobContext) -> Result<(), JobError> {
    ///     ctx.transaction(|tx| {
    ///         tx.execute("UPDATE orders SET paid = 1 WHERE id = ?1", [order])?;
    ///         Ok(())
    ///     })
    /// }
    /// ```
    ///
    /// A job completed this way is not completed again by the worker, whatever
    /// the handler returns afterwards. The queue's write connection is held
    /// while `f` runs: keep it short, and enqueue follow-up jobs with
    /// [`QueueExt::enqueue_in`]`(tx, ..)`; [`Queue::enqueue`] and every other
    /// call that writes through the queue's own connection (and
    /// [`JobContext::heartbeat`]) return [`Error::InsideTransaction`] at once
    /// there (they would wait for this transaction); reads work (see
    /// [`Queue`]'s rule for calls inside its transactions).
    fn transaction<T, F>(&self, f: F) -> std::result::Result<T, JobError>
    where
        T: Serialize,
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, JobError>;
}

impl JobContextExt for JobContext {
    fn transaction<T, F>(&self, f: F) -> std::result::Result<T, JobError>
    where
        T: Serialize,
        F: FnOnce(&Transaction<'_>) -> std::result::Result<T, JobError>,
    {
        let queue = self.source();
        self.complete_transactionally(|| {
            queue.transaction(|tx| {
                check_caller_connection(queue, tx)?;
                db::jobs::check_lease(tx, self.job().lease())?;
                // A shared `&Transaction` here: the helper takes it by `&mut`.
                let mut tx = tx;
                run_then_complete(
                    self,
                    &mut tx,
                    |tx| f(tx),
                    |tx, result| queue.complete_in(tx, self.job(), result),
                )
            })
        })
    }
}

/// The SQLite connections of `queue`, or a typed error for a queue on a
/// server.
fn connections(queue: &Queue) -> Result<&db::Connections> {
    match queue.backend() {
        Backend::Sqlite(db) => Ok(db),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidArgument(
            "this queue is not on SQLite: use the transaction calls of its database's module"
                .into(),
        )),
    }
}

/// Refuses a connection that is not in a transaction or is open on another
/// database file.
fn check_caller_connection(queue: &Queue, conn: &Connection) -> Result<()> {
    connections(queue)?;
    if conn.is_autocommit() {
        return Err(Error::NotInTransaction);
    }
    check_same_database(queue, conn)
}

/// Refuses a connection open on another database file than the queue's (or
/// a queue that is not on SQLite).
pub(crate) fn check_same_database(queue: &Queue, conn: &Connection) -> Result<()> {
    connections(queue)?;
    let (path, canonical) = queue.paths();
    let theirs = conn.path().map(Path::new);
    let same = match theirs {
        Some(p) if Some(p) == path => true,
        Some(p) => p.canonicalize().ok().as_deref() == canonical,
        None => false,
    };
    if !same {
        return Err(Error::InvalidArgument(format!(
            "connection is open on {theirs:?}, not on the queue's database {path:?}"
        )));
    }
    Ok(())
}
