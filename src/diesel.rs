//! Enqueue and complete inside the application's own diesel transaction.
//!
//! [`QueueExt`] gives a [`Queue`] the `*_in` calls on a diesel connection
//! that is inside `conn.transaction(..)`: the job exists if and only if the
//! application's transaction commits. [`postgres`] (feature
//! `diesel-postgres`) on a `PgConnection`, whose commit wakes the workers
//! (never a rollback); [`mysql`] (feature `diesel-mysql`) on a
//! `MysqlConnection` (MySQL 8 / MariaDB 10.6+; tested on MariaDB 10.11),
//! whose workers see a committed job by their adaptive probe.
//!
//! The enqueue's control flow is the one `backlog::sqlx` runs too
//! (`src/adapter_flow.rs`); the diesel files only send its statements.
//!
//! SQLite through diesel is not offered; see the README's "diesel" section
//! for why, and for the combinations that link.
//!
//! [`Queue`]: crate::Queue

use ::diesel::connection::{Connection, TransactionManager};

use crate::error::{Error, Result};

/// Whether diesel has `conn` inside `conn.transaction(..)` (or a test
/// transaction): its transaction manager's depth, read locally, no round
/// trip. A transaction manager in error (a broken connection, a failed
/// rollback) is [`Error::Database`]. A transaction the application opened
/// with a raw `BEGIN` is not seen, and is answered `false`, as diesel
/// itself would (its `transaction` would then send a second `BEGIN`).
///
/// `transaction_manager_status_mut` is a public method of diesel's public
/// `TransactionManager` trait, documented only under diesel's
/// `i-implement-a-third-party-backend-and-opt-into-breaking-changes`
/// feature (hidden otherwise, not enabled here): callable in diesel 2.3
/// without it, but outside diesel's documented API, so a diesel release
/// could change it; the conformance scenarios' `NotInTransaction` checks
/// would then fail.
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> Result<bool> {
    let depth = C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map_err(Error::from)?;
    Ok(depth.is_some())
}

/// Maps diesel's errors, so that `?` works on both in a closure of
/// `conn.transaction::<_, backlog::Error, _>(..)`: a serialization failure
/// or a deadlock is [`Error::Busy`] (the transaction may be run again),
/// anything else is [`Error::Database`] with diesel's error inside.
impl From<::diesel::result::Error> for Error {
    fn from(e: ::diesel::result::Error) -> Self {
        use ::diesel::result::{DatabaseErrorKind, Error as DieselError};
        match e {
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => Error::Busy,
            e => Error::Database(Box::new(e)),
        }
    }
}

use serde_json::Value;

use crate::backend::params::{EnqueueParams, Finishing};
use crate::job::{Enqueued, IntoNewJob};
use crate::lease::{Job, Lease};
use crate::outcome::{error_json, Outcome, Transition};
use crate::queue::{params, Queue};

/// Transactional calls of a [`Queue`] on a diesel connection `C` inside
/// `conn.transaction(..)`: a `PgConnection` for a queue on PostgreSQL
/// ([`postgres`]), a `MysqlConnection` for one on MySQL/MariaDB
/// ([`mysql`]).
///
/// Nothing is committed by these calls and no event of this process's
/// queue is sent: the caller owns the commit. Outside `conn.transaction(..)`
/// each answers [`Error::NotInTransaction`] and writes nothing; a queue on
/// another database is [`Error::InvalidArgument`]. On `Err` the caller's
/// transaction may be aborted on the server (a failed statement aborts a
/// PostgreSQL transaction): return the error from the closure so diesel
/// rolls it back.
///
/// Differs from [`crate::postgres::QueueExt`] / [`crate::mysql::QueueExt`]
/// in that grouped jobs ([`NewJob::group`](crate::NewJob::group)) are
/// refused with [`Error::InvalidArgument`] before anything is written, a
/// batch goes one statement per job, and only finishing outcomes settle
/// here ([`QueueExt::complete_in`], [`QueueExt::settle_in`] with a complete,
/// discard or cancel); a retry is the worker's to record.
pub trait QueueExt<C>: crate::sealed::Sealed {
    /// Enqueues a job inside the caller's transaction: the job exists if
    /// and only if that transaction commits. Invalid jobs are refused
    /// before anything is sent.
    fn enqueue_in(&self, conn: &mut C, job: impl IntoNewJob) -> Result<Enqueued>;

    /// Enqueues many jobs inside the caller's transaction, in order. All
    /// are validated before the first is sent.
    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        conn: &mut C,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>>;

    /// Completes a leased job inside the caller's transaction: the
    /// completion commits if and only if the caller's transaction does,
    /// together with the caller's effects, and the worker does not
    /// complete it again.
    ///
    /// The lease is checked and the job's row locked first, so call it
    /// first in the transaction (fence first): on `Err(LeaseLost)`
    /// nothing was changed and **the transaction must not commit** its
    /// effects, another worker owns the job now; `?` in diesel's
    /// `transaction` closure rolls it back.
    fn complete_in(&self, conn: &mut C, job: &Job, result: Option<Value>) -> Result<()>;

    /// Applies a finishing outcome ([`Outcome::Complete`],
    /// [`Outcome::Discard`], [`Outcome::Cancel`], [`Outcome::Dead`], or a
    /// [`Outcome::Fail`] on the job's last attempt) inside the caller's
    /// transaction, as [`QueueExt::complete_in`]. An outcome that keeps the
    /// job live (a retry, a snooze) is refused with
    /// [`Error::InvalidArgument`] before anything is written.
    fn settle_in(&self, conn: &mut C, job: &Job, outcome: Outcome) -> Result<()>;
}

/// One database's statements on its diesel connection; the checks and
/// decisions around them are [`QueueExt`]'s, shared.
trait Adapter: Connection {
    /// The public module of the database's own queue calls, for errors.
    const MODULE: &'static str;
    fn enqueue(queue: &Queue, conn: &mut Self, p: &EnqueueParams<'_>, now: i64)
        -> Result<Enqueued>;
    /// Whether `lease` is held, its row locked until the transaction ends
    /// (the fence, first).
    fn lease_held(queue: &Queue, conn: &mut Self, lease: Lease) -> Result<bool>;
    /// Whether job `job_id` is a batch member or other jobs depend on it.
    fn followed(queue: &Queue, conn: &mut Self, job_id: i64) -> Result<bool>;
    /// Finishes the job as decided, fenced on its lease.
    fn finish(queue: &Queue, conn: &mut Self, finishing: &Finishing<'_>) -> Result<()>;
    /// Refuses a queue on another database before anything is sent.
    fn check_queue(queue: &Queue) -> Result<()>;
}

#[allow(private_bounds)]
impl<C: Adapter> QueueExt<C> for Queue {
    fn enqueue_in(&self, conn: &mut C, job: impl IntoNewJob) -> Result<Enqueued> {
        let mut ids = self.enqueue_many_in(conn, [job])?;
        ids.pop()
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    }

    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        conn: &mut C,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>> {
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now)?;
        let params = params(&prepared, now);
        if let Some(what) = params.iter().find_map(EnqueueParams::own_path_only) {
            return Err(Error::InvalidArgument(format!(
                "{what} cannot be enqueued through diesel: use backlog::postgres or backlog::mysql"
            )));
        }
        C::check_queue(self)?;
        if !in_transaction(conn)? {
            return Err(Error::NotInTransaction);
        }
        params
            .iter()
            .map(|p| C::enqueue(self, conn, p, now))
            .collect()
    }

    fn complete_in(&self, conn: &mut C, job: &Job, result: Option<Value>) -> Result<()> {
        self.settle_in(conn, job, Outcome::Complete(result))
    }

    fn settle_in(&self, conn: &mut C, job: &Job, outcome: Outcome) -> Result<()> {
        let now = self.now_micros();
        let params = self.settle_params(job, outcome, now)?;
        let Transition::Finish {
            status,
            result,
            error,
        } = &params.transition
        else {
            return Err(Error::InvalidArgument(
                "only finishing outcomes settle through diesel: a retry, snooze or release is the worker's to record".into(),
            ));
        };
        let finishing = Finishing {
            lease: params.lease,
            status: status.as_str(),
            result: result.as_deref(),
            error: error_json(error.as_ref())?,
            now,
        };
        C::check_queue(self)?;
        if !in_transaction(conn)? {
            return Err(Error::NotInTransaction);
        }
        let job_id = finishing.lease.job_id;
        if !C::lease_held(self, conn, finishing.lease)? {
            return Err(Error::LeaseLost { job_id });
        }
        // Its batch's callbacks and its dependents' release run only on
        // backlog's own driver: refused before anything is written.
        if C::followed(self, conn, job_id)? {
            return Err(Error::InvalidArgument(format!(
                "job {job_id} is a batch member or other jobs depend on it: settle it with \
                 {}::QueueExt or the worker, not through diesel",
                C::MODULE
            )));
        }
        C::finish(self, conn, &finishing)?;
        self.note_settled_in(job.lease());
        Ok(())
    }
}

#[cfg(feature = "diesel-postgres")]
pub mod postgres {
    //! A [`Queue`] on PostgreSQL, with the application's diesel
    //! `PgConnection`:
    //!
    //! ```no_run
    //! use backlog::diesel::postgres::QueueExt;
    //! use backlog::{NewJob, Queue};
    //! use diesel::{Connection, PgConnection, RunQueryDsl};
    //! use serde_json::json;
    //!
    //! # fn main() -> Result<(), Box<dyn std::error::Error>> {
    //! let url = "postgres://app@db.example/app";
    //! let queue = Queue::connect(url)?;
    //! let mut conn = PgConnection::establish(url)?;
    //!
    //! conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
    //!     diesel::sql_query("INSERT INTO orders (id) VALUES (7)").execute(conn)?;
    //!     queue.enqueue_in(conn, NewJob::new("charge", json!({"order": 7})))?;
    //!     Ok(())
    //! })?; // the order and its job, or neither
    //! # Ok(())
    //! # }
    //! ```
    //!
    //! The statements are the queue's own ([`crate::postgres`] runs the same
    //! texts), sent with `diesel::sql_query` and typed binds; they name the
    //! queue's schema and tables fully, so the connection's `search_path`
    //! does not matter. The `NOTIFY` that wakes listening workers is sent
    //! inside the transaction: PostgreSQL delivers it at commit, and drops it
    //! on rollback.
    //!
    //! Each call first reads diesel's own transaction depth of the
    //! connection (no round trip) and answers [`Error::NotInTransaction`](crate::Error::NotInTransaction),
    //! writing nothing, outside `conn.transaction(..)`. A call waits on the database only through
    //! the application's connection: as long as its statements take
    //! (diesel has no client timeout; set `statement_timeout` /
    //! `lock_timeout` on the connection to bound them). Two transactions
    //! enqueueing the same unique key: the second waits for the first's
    //! commit or rollback on the unique index, then returns the first's job
    //! (`existed: true`) or inserts its own.
    //!
    //! Differs from [`crate::postgres::QueueExt`] in that grouped jobs
    //! ([`NewJob::group`](crate::NewJob::group)) are refused with
    //! [`Error::InvalidArgument`](crate::Error::InvalidArgument) before anything is written, a batch goes
    //! one statement per job, and only finishing outcomes settle here
    //! ([`QueueExt::complete_in`], [`QueueExt::settle_in`] with a complete,
    //! discard or cancel); a retry is the worker's to record.

    use ::diesel::pg::PgConnection;

    use super::Adapter;
    pub use super::QueueExt;
    use crate::app_transaction::postgres_db_or;
    use crate::backend::params::{EnqueueParams, Finishing};
    use crate::backend::postgres::{via_diesel, Db};
    use crate::error::Result;
    use crate::job::Enqueued;
    use crate::lease::Lease;
    use crate::queue::Queue;

    impl Adapter for PgConnection {
        const MODULE: &'static str = "backlog::postgres";

        fn enqueue(
            queue: &Queue,
            conn: &mut Self,
            p: &EnqueueParams<'_>,
            _now: i64,
        ) -> Result<Enqueued> {
            via_diesel::enqueue(conn, database(queue)?.queries(), p)
        }

        fn lease_held(queue: &Queue, conn: &mut Self, lease: Lease) -> Result<bool> {
            via_diesel::lease_held(conn, database(queue)?.queries(), lease)
        }

        fn followed(queue: &Queue, conn: &mut Self, job_id: i64) -> Result<bool> {
            via_diesel::followed(conn, database(queue)?.queries(), job_id)
        }

        fn finish(queue: &Queue, conn: &mut Self, finishing: &Finishing<'_>) -> Result<()> {
            via_diesel::finish(conn, database(queue)?.queries(), finishing)
        }

        fn check_queue(queue: &Queue) -> Result<()> {
            database(queue).map(|_| ())
        }
    }

    /// The PostgreSQL database of `queue`, or a typed error for a queue on
    /// another backend.
    fn database(queue: &Queue) -> Result<&Db> {
        postgres_db_or(
            queue,
            "this queue is not on PostgreSQL: diesel's PgConnection joins only a PostgreSQL queue",
        )
    }
}

#[cfg(feature = "diesel-mysql")]
pub mod mysql {
    //! A [`Queue`] on MySQL 8 / MariaDB 10.6+, with the application's diesel
    //! `MysqlConnection`:
    //!
    //! ```no_run
    //! use backlog::diesel::mysql::QueueExt;
    //! use backlog::{NewJob, Queue};
    //! use diesel::{Connection, MysqlConnection, RunQueryDsl};
    //! use serde_json::json;
    //!
    //! # fn main() -> Result<(), Box<dyn std::error::Error>> {
    //! let url = "mysql://app@db.example/app";
    //! let queue = Queue::connect(url)?;
    //! let mut conn = MysqlConnection::establish(url)?;
    //!
    //! conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
    //!     diesel::sql_query("INSERT INTO orders (id) VALUES (7)").execute(conn)?;
    //!     queue.enqueue_in(conn, NewJob::new("charge", json!({"order": 7})))?;
    //!     Ok(())
    //! })?; // the order and its job, or neither
    //! # Ok(())
    //! # }
    //! ```
    //!
    //! The statements are the queue's own ([`crate::mysql`] runs the same
    //! texts), their named parameters translated to diesel's positional
    //! binds in one place; they name the queue's database and tables fully,
    //! so the connection's default database does not matter. MySQL has no
    //! notification: a worker on another connection sees the committed job
    //! by its adaptive probe of the newest id (within 25 ms when idle), and
    //! never sees a rolled-back one.
    //!
    //! Each call reads diesel's own transaction depth (no round trip) and
    //! answers [`Error::NotInTransaction`](crate::Error::NotInTransaction), writing nothing, outside
    //! `conn.transaction(..)`. An enqueue costs two statements (the insert,
    //! then `LAST_INSERT_ID()`), three or four with a unique key. A call
    //! waits on the database only through the application's connection: as
    //! long as its statements take (diesel has no client timeout; set
    //! `innodb_lock_wait_timeout` on the session to bound a wait on a row
    //! lock). Two transactions enqueueing the same unique key: the second
    //! waits on the unique index for the first's commit or rollback, then
    //! returns the first's job (`existed: true`) or inserts its own.
    //!
    //! Run the application's transaction at READ COMMITTED, as the queue's
    //! own connections do (`SET SESSION TRANSACTION ISOLATION LEVEL READ
    //! COMMITTED`): under REPEATABLE READ a unique key freed meanwhile can
    //! be seen as still held.
    //!
    //! [`Queue`]: crate::Queue

    use ::diesel::mysql::MysqlConnection;

    use super::Adapter;
    pub use super::QueueExt;
    use crate::app_transaction::mysql_db_or;
    use crate::backend::mysql::{via_diesel, Db, Now};
    use crate::backend::params::{EnqueueParams, Finishing};
    use crate::error::Result;
    use crate::job::Enqueued;
    use crate::lease::Lease;
    use crate::queue::Queue;

    impl Adapter for MysqlConnection {
        const MODULE: &'static str = "backlog::mysql";

        fn enqueue(
            queue: &Queue,
            conn: &mut Self,
            p: &EnqueueParams<'_>,
            now: i64,
        ) -> Result<Enqueued> {
            let db = database(queue)?;
            via_diesel::enqueue(conn, &db.sql, p, clocked(queue, now))
        }

        fn lease_held(queue: &Queue, conn: &mut Self, lease: Lease) -> Result<bool> {
            via_diesel::lease_held(conn, &database(queue)?.sql, lease)
        }

        fn followed(queue: &Queue, conn: &mut Self, job_id: i64) -> Result<bool> {
            via_diesel::followed(conn, &database(queue)?.sql, job_id)
        }

        fn finish(queue: &Queue, conn: &mut Self, finishing: &Finishing<'_>) -> Result<()> {
            let now = clocked(queue, finishing.now);
            via_diesel::finish(conn, &database(queue)?.sql, finishing, now)
        }

        fn check_queue(queue: &Queue) -> Result<()> {
            database(queue).map(|_| ())
        }
    }

    fn clocked(queue: &Queue, now: i64) -> Now {
        Now::new(now, queue.options().clock.is_manual())
    }

    /// The MySQL database of `queue`, or a typed error for a queue on
    /// another backend.
    fn database(queue: &Queue) -> Result<&Db> {
        mysql_db_or(
            queue,
            "this queue is not on MySQL: diesel's MysqlConnection joins only a MySQL/MariaDB queue",
        )
    }
}
