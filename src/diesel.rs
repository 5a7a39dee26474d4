//! Enqueue and complete inside the application's own diesel transaction.
//!
//! [`postgres`] (feature `diesel-postgres`) gives a [`Queue`] on PostgreSQL
//! the `*_in` calls on a diesel [`PgConnection`](::diesel::pg::PgConnection)
//! that is inside `conn.transaction(..)`: the job exists if and only if the
//! application's transaction commits, and the workers are woken by that
//! commit, never by a rollback.
//!
//! MySQL/MariaDB and SQLite through diesel are not offered; see the README's
//! "diesel" section for why, and for the combinations that link.
//!
//! [`Queue`]: crate::Queue

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
    //! Each call first asks the server whether the connection is inside a
    //! transaction block (one round trip: diesel keeps its own transaction
    //! depth private) and answers [`Error::NotInTransaction`], writing
    //! nothing, when it is not. A call waits on the database only through
    //! the application's connection: as long as its statements take
    //! (diesel has no client timeout; set `statement_timeout` /
    //! `lock_timeout` on the connection to bound them). Two transactions
    //! enqueueing the same unique key: the second waits for the first's
    //! commit or rollback on the unique index, then returns the first's job
    //! (`existed: true`) or inserts its own.
    //!
    //! Differs from [`crate::postgres::QueueExt`] in that grouped jobs
    //! ([`NewJob::group`](crate::NewJob::group)) are refused with
    //! [`Error::InvalidArgument`] before anything is written, a batch goes
    //! one statement per job, and only finishing outcomes settle here
    //! ([`QueueExt::complete_in`], [`QueueExt::settle_in`] with a complete,
    //! discard or cancel); a retry is the worker's to record.

    use ::diesel::pg::PgConnection;
    use serde_json::Value;

    use crate::backend::postgres::{via_diesel, Db};
    use crate::backend::Backend;
    use crate::error::{Error, Result};
    use crate::job::{Enqueued, IntoNewJob};
    use crate::lease::Job;
    use crate::outcome::{Outcome, Transition};
    use crate::queue::{params, Queue};

    /// Transactional calls of a [`Queue`] on PostgreSQL, on a diesel
    /// `PgConnection` inside `conn.transaction(..)`.
    ///
    /// Nothing is committed by these calls and no event of this process's
    /// queue is sent: the caller owns the commit. On `Err` the caller's
    /// transaction may be aborted on the server (a failed statement aborts
    /// a PostgreSQL transaction): return the error from the closure so
    /// diesel rolls it back.
    pub trait QueueExt {
        /// Enqueues a job inside the caller's transaction: the job exists if
        /// and only if that transaction commits. Invalid jobs are refused
        /// before anything is sent.
        fn enqueue_in(&self, conn: &mut PgConnection, job: impl IntoNewJob) -> Result<Enqueued>;

        /// Enqueues many jobs inside the caller's transaction, in order. All
        /// are validated before the first is sent.
        fn enqueue_many_in<J: IntoNewJob>(
            &self,
            conn: &mut PgConnection,
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
        fn complete_in(
            &self,
            conn: &mut PgConnection,
            job: &Job,
            result: Option<Value>,
        ) -> Result<()>;

        /// Applies a finishing outcome ([`Outcome::Complete`],
        /// [`Outcome::Discard`], [`Outcome::Cancel`], [`Outcome::Dead`], or a
        /// [`Outcome::Fail`] on the job's last attempt)
        /// inside the caller's transaction, as [`QueueExt::complete_in`]. An
        /// outcome that keeps the job live (a retry, a snooze) is refused
        /// with [`Error::InvalidArgument`] before anything is written.
        fn settle_in(&self, conn: &mut PgConnection, job: &Job, outcome: Outcome) -> Result<()>;
    }

    impl QueueExt for Queue {
        fn enqueue_in(&self, conn: &mut PgConnection, job: impl IntoNewJob) -> Result<Enqueued> {
            let mut ids = self.enqueue_many_in(conn, [job])?;
            ids.pop()
                .ok_or_else(|| Error::Database("enqueue returned no id".into()))
        }

        fn enqueue_many_in<J: IntoNewJob>(
            &self,
            conn: &mut PgConnection,
            jobs: impl IntoIterator<Item = J>,
        ) -> Result<Vec<Enqueued>> {
            let now = self.now_micros();
            let prepared = self.prepare_all(jobs, now)?;
            let params = params(&prepared, now);
            if params.iter().any(|p| p.group.is_some()) {
                return Err(Error::InvalidArgument(
                    "grouped jobs cannot be enqueued through diesel: use backlog::postgres".into(),
                ));
            }
            let db = database(self)?;
            if !via_diesel::in_transaction(conn)? {
                return Err(Error::NotInTransaction);
            }
            params
                .iter()
                .map(|p| via_diesel::enqueue(conn, db.queries(), p))
                .collect()
        }

        fn complete_in(
            &self,
            conn: &mut PgConnection,
            job: &Job,
            result: Option<Value>,
        ) -> Result<()> {
            self.settle_in(conn, job, Outcome::Complete(result))
        }

        fn settle_in(&self, conn: &mut PgConnection, job: &Job, outcome: Outcome) -> Result<()> {
            let now = self.now_micros();
            let params = self.settle_params(job, outcome, now)?;
            if !matches!(params.transition, Transition::Finish { .. }) {
                return Err(Error::InvalidArgument(
                    "only finishing outcomes settle through diesel: a retry, snooze or release is the worker's to record".into(),
                ));
            }
            let db = database(self)?;
            if !via_diesel::in_transaction(conn)? {
                return Err(Error::NotInTransaction);
            }
            via_diesel::check_lease(conn, db.queries(), params.lease)?;
            via_diesel::finish(conn, db.queries(), params.lease, &params.transition, now)?;
            self.note_settled_in(job.lease());
            Ok(())
        }
    }

    /// The PostgreSQL database of `queue`, or a typed error for a queue on
    /// another backend.
    fn database(queue: &Queue) -> Result<&Db> {
        match queue.backend() {
            Backend::Postgres(db) => Ok(db),
            #[allow(unreachable_patterns)]
            _ => Err(Error::InvalidArgument(
                "this queue is not on PostgreSQL: diesel's PgConnection joins only a PostgreSQL queue"
                    .into(),
            )),
        }
    }
}
