//! The crate's one error type.

use std::fmt;

/// A specialized `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in backlog.
///
/// Input errors (`Invalid*`, `PayloadTooLarge`) are returned before anything is
/// written. Database errors never panic; transient contention is retried
/// internally and only surfaces as [`Error::Busy`] once the write deadline passes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The job's lease is no longer held by this caller: it expired and was
    /// rescued, the job was deleted, or another claim replaced the lease token.
    /// Nothing was changed; a transaction this happened in must not commit.
    LeaseLost {
        /// The job whose lease was lost.
        job_id: i64,
    },
    /// The database stayed locked by another connection past the write deadline
    /// ([`QueueOptions::write_deadline`](crate::QueueOptions::write_deadline)).
    /// Also the answer of an `AsyncQueue` (feature `async`) whose line of
    /// calls is full: that call did nothing, try again later.
    Busy,
    /// The payload is not valid JSON, or nests deeper than the decoder accepts.
    InvalidPayload(String),
    /// The encoded payload is larger than
    /// [`QueueOptions::max_payload_bytes`](crate::QueueOptions::max_payload_bytes).
    /// Checked before any database call.
    PayloadTooLarge {
        /// The payload's size in bytes.
        size: usize,
        /// The configured cap in bytes.
        limit: usize,
    },
    /// A handler's progress ([`JobContext::set_progress`](crate::JobContext::set_progress))
    /// encodes to more than [`MAX_PROGRESS_BYTES`](crate::MAX_PROGRESS_BYTES).
    /// Nothing is kept or written; the last accepted progress stays.
    ProgressTooLarge {
        /// The encoded progress's size in bytes.
        size: usize,
        /// The cap in bytes.
        limit: usize,
    },
    /// A queue name, job kind, unique key, group key, worker id or schedule
    /// name is empty, too long or contains control characters.
    InvalidName {
        /// Which name: `"queue"`, `"kind"`, `"unique key"`, `"group key"`,
        /// `"worker id"` or `"schedule"`.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A delay is negative or not finite, or a run time is out of range.
    InvalidSchedule(String),
    /// Some other argument is out of range, such as `max_attempts = 0` or a
    /// lease of zero jobs.
    InvalidArgument(String),
    /// A periodic schedule cannot run: its cron expression does not parse or
    /// never matches, its time zone is unknown, or its interval is under a
    /// millisecond or over a year. Returned by the constructor
    /// (`Schedule::cron`, [`Schedule::every`](crate::Schedule::every)),
    /// before anything is written.
    InvalidPeriodic {
        /// The schedule's name.
        schedule: String,
        /// The expression as given (`"0 3 * * *"`, `"every 5s"`).
        expression: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A queue limit is zero, out of range, or not a rate
    /// ([`Queue::set_limits`](crate::Queue::set_limits), parsing a
    /// [`Rate`](crate::Rate)). Nothing was written.
    InvalidLimit(String),
    /// No live or finished job has this id.
    NotFound {
        /// The id that was looked up.
        job_id: i64,
    },
    /// A job was enqueued to depend on an id that no live, waiting or
    /// finished job has (a grouped job's id counts as unknown: its group
    /// decides when it ends). Nothing was written.
    UnknownDependency {
        /// The id depended on.
        job_id: i64,
    },
    /// A workflow's steps depend on each other in a circle, or a step depends
    /// on a step the workflow does not have. Returned by
    /// [`Queue::enqueue_workflow`](crate::Queue::enqueue_workflow) before
    /// anything is written.
    InvalidWorkflow {
        /// The workflow's name.
        workflow: String,
        /// What is wrong, naming the steps (`"cycle: a -> b -> a"`).
        reason: String,
    },
    /// An operation was asked of a job in a state that does not allow it, such
    /// as retrying a completed job.
    InvalidState {
        /// The job.
        job_id: i64,
        /// What was wrong.
        reason: String,
    },
    /// A `*_in` call was given a connection that is not inside a transaction
    /// (it is in autocommit mode).
    NotInTransaction,
    /// A call made by a thread inside one of the queue's own transactions
    /// (`ctx.transaction(..)`, or `QueueExt::transaction(..)` of
    /// `backlog::sqlite`, `backlog::postgres` or `backlog::mysql`, on the
    /// same queue or a clone of it) that would wait for that transaction.
    /// Returned at once, with nothing written, on every backend by:
    ///
    /// - every call that writes through the queue's own connections
    ///   (enqueue, lease, the settles, heartbeat, rescue, retry, cancel,
    ///   delete, pause, `set_limits`, `prune_history`, `migrate`,
    ///   `JobContext::heartbeat`, ...) and a second `transaction` inside the
    ///   first. On SQLite it would wait for the write connection the
    ///   transaction holds; on PostgreSQL and MySQL for a row lock it holds,
    ///   until `lock_timeout` / `innodb_lock_wait_timeout` (the write
    ///   deadline).
    /// - on PostgreSQL and MySQL, a read that finds no pooled connection
    ///   free and no room to open one: always with `pool_size(1)`, whose only
    ///   connection holds the transaction. Otherwise reads work there, on
    ///   another connection, waiting on no lock (they see what was committed,
    ///   not the transaction's own changes). On SQLite reads always work (the
    ///   read pool is apart from the write connection), but
    ///   `sqlite::QueueExt::synchronous` reads the write connection: refused.
    ///
    /// On SQLite (unix) the same holds for a write transaction the thread
    /// holds on the queue's file through another connection: the
    /// application's own `rusqlite` connection after `BEGIN IMMEDIATE` or a
    /// write in a deferred transaction, or another queue handle's
    /// transaction. That is seen for connections that go through backlog's
    /// shim VFS, which notes who holds the write lock: the queues' own, and
    /// the application's that opted in (`sqlite::open_connection`,
    /// `sqlite::make_default_vfs`).
    ///
    /// Use the `_in` form with that transaction (`queue.enqueue_in(tx, ..)`,
    /// `complete_in`): it joins it. Other transactions of the application's
    /// own (a `postgres` or `mysql` transaction, or a `rusqlite` connection
    /// that did not opt in to the shim) are not tracked: a queue's
    /// write inside one can wait for it up to the write deadline, then
    /// [`Error::Busy`].
    InsideTransaction,
    /// A pragma read back a different value than was set (for example a
    /// filesystem that cannot hold a WAL).
    Pragma {
        /// The pragma.
        name: &'static str,
        /// The value that was set.
        expected: String,
        /// The value read back.
        actual: String,
    },
    /// The database or its filesystem is full. Nothing of the failed operation
    /// was written; the queue works again once space is freed.
    StorageFull,
    /// Applying the schema migrations failed.
    Migration(String),
    /// Typed job arguments or a handler's output could not be encoded or
    /// decoded as JSON.
    Serialization(serde_json::Error),
    /// [`Queue::wait`](crate::Queue::wait) gave up: the job had not finished
    /// when its timeout passed. It may still finish later.
    Timeout {
        /// The job waited for.
        job_id: i64,
    },
    /// A database URL names a backend this build of backlog does not
    /// include: rebuild with the feature named here (`postgres`, `mysql`).
    FeatureDisabled {
        /// The cargo feature to enable.
        feature: &'static str,
    },
    /// The database server cannot run backlog, for example a MySQL older than
    /// 8.0.1 or a MariaDB older than 10.6 (no `SKIP LOCKED`). Checked when
    /// connecting.
    UnsupportedServer(String),
    /// One of a [`Worker`](crate::Worker)'s own threads failed: it could not
    /// be spawned (at [`WorkerBuilder::start`](crate::WorkerBuilder::start)),
    /// or it panicked (reported by
    /// [`Worker::shutdown`](crate::Worker::shutdown)). A handler's panic is
    /// not this: it is recorded as a failed attempt of its job. Also an
    /// `AsyncQueue`'s pool thread that could not be spawned, or a call of it
    /// that panicked.
    Worker(String),
    /// Any other database error.
    Database(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// True for [`Error::Busy`]: the write deadline passed under contention.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy)
    }

    /// True for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// True when a SQLite file is damaged or is not a database at all
    /// (SQLite's `SQLITE_CORRUPT`, `SQLITE_NOTADB`): retrying cannot help,
    /// and the file should not be written to. An encrypted file opened
    /// without its key or with a wrong one
    /// ([`QueueOptions::sqlite_key`](crate::QueueOptions::sqlite_key)) is
    /// refused so, with a message that names the key.
    pub fn is_corrupt(&self) -> bool {
        let Error::Database(e) = self else {
            return false;
        };
        matches!(
            e.downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code),
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
        )
    }

    /// True for errors caused by the caller's input; retrying the same call
    /// cannot succeed.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidPayload(_)
                | Error::PayloadTooLarge { .. }
                | Error::ProgressTooLarge { .. }
                | Error::InvalidName { .. }
                | Error::InvalidSchedule(_)
                | Error::InvalidArgument(_)
                | Error::InvalidPeriodic { .. }
                | Error::InvalidLimit(_)
        )
    }

    pub(crate) fn invalid_name(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidName {
            what,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LeaseLost { job_id } => write!(f, "lease lost on job {job_id}"),
            Error::Busy => f.write_str("database busy past the write deadline"),
            Error::InvalidPayload(why) => write!(f, "invalid payload: {why}"),
            Error::PayloadTooLarge { size, limit } => {
                write!(f, "payload of {size} bytes exceeds the {limit}-byte limit")
            }
            Error::ProgressTooLarge { size, limit } => {
                write!(f, "progress of {size} bytes exceeds the {limit}-byte limit")
            }
            Error::InvalidName { what, reason } => write!(f, "invalid {what}: {reason}"),
            Error::InvalidSchedule(why) => write!(f, "invalid schedule: {why}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Error::InvalidPeriodic {
                schedule,
                expression,
                reason,
            } => write!(f, "invalid schedule {schedule:?} ({expression}): {reason}"),
            Error::InvalidLimit(why) => write!(f, "invalid limit: {why}"),
            Error::NotFound { job_id } => write!(f, "job {job_id} not found"),
            Error::UnknownDependency { job_id } => {
                write!(f, "dependency {job_id}: no job has this id")
            }
            Error::InvalidWorkflow { workflow, reason } => {
                write!(f, "invalid workflow {workflow:?}: {reason}")
            }
            Error::InvalidState { job_id, reason } => write!(f, "job {job_id}: {reason}"),
            Error::NotInTransaction => f.write_str("connection is not inside a transaction"),
            Error::InsideTransaction => f.write_str(
                "called inside a write transaction this thread holds on the database (the \
                 queue's own or another connection's), which this call would wait for: use \
                 the `_in` form with that transaction",
            ),
            Error::Pragma {
                name,
                expected,
                actual,
            } => write!(
                f,
                "pragma {name} reads back {actual:?}, expected {expected:?}"
            ),
            Error::StorageFull => f.write_str("database or disk is full"),
            Error::Migration(why) => write!(f, "migration failed: {why}"),
            Error::Serialization(e) => write!(f, "JSON encoding failed: {e}"),
            Error::Timeout { job_id } => {
                write!(f, "job {job_id} had not finished when the wait timed out")
            }
            Error::FeatureDisabled { feature } => write!(
                f,
                "this database URL needs backlog built with the `{feature}` cargo feature"
            ),
            Error::UnsupportedServer(why) => write!(f, "unsupported database server: {why}"),
            Error::Worker(why) => write!(f, "worker thread failed: {why}"),
            Error::Database(e) => {
                f.write_str("database error: ")?;
                database_cause(e.as_ref(), f)
            }
        }
    }
}

/// A database error with its cause: the driver's own text and, where its
/// `Display` keeps the cause in the source chain (rust-postgres prints only
/// `db error`), the server's severity, code, message, detail and hint, or
/// the I/O error beneath.
fn database_cause(
    e: &(dyn std::error::Error + 'static),
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    #[cfg(feature = "postgres")]
    if let Some(db) = e
        .downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::as_db_error)
    {
        write!(
            f,
            "{} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        )?;
        if let Some(detail) = db.detail() {
            write!(f, " (detail: {detail})")?;
        }
        if let Some(hint) = db.hint() {
            write!(f, " (hint: {hint})")?;
        }
        return Ok(());
    }
    let mut last = e.to_string();
    f.write_str(&last)?;
    let mut cause = e.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        // Drivers that print their cause already (rusqlite, mysql) add
        // nothing here.
        if !text.is_empty() && !last.contains(&text) && !text.contains(&last) {
            write!(f, ": {text}")?;
        }
        last = text;
        cause = inner.source();
    }
    Ok(())
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Serialization(e) => Some(e),
            Error::Database(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::Busy,
            Some(ErrorCode::DiskFull) => Error::StorageFull,
            _ => Error::Database(Box::new(e)),
        }
    }
}

impl From<r2d2::Error> for Error {
    /// A pool that had no free connection by its timeout (the write
    /// deadline) is [`Error::Busy`], as a lock held past it is. One that
    /// could not open a connection carries the reason: it stays a database
    /// error (the server is down or refuses the login).
    fn from(e: r2d2::Error) -> Self {
        // r2d2 keeps the reason private; its message is only its own text
        // when there is none.
        if e.to_string() == R2D2_TIMED_OUT {
            return Error::Busy;
        }
        Error::Database(Box::new(e))
    }
}

/// r2d2's message for a wait for a free connection that timed out.
const R2D2_TIMED_OUT: &str = "timed out waiting for connection";

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Serialization(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A pool whose every connection is taken past its timeout answers
    /// `Busy` (the server pools waited until the deadline and returned an
    /// untyped error before).
    #[test]
    fn a_pool_without_a_free_connection_by_its_timeout_is_busy() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .connection_timeout(Duration::from_millis(50))
            .build(r2d2_sqlite::SqliteConnectionManager::file(
                dir.path().join("p.db"),
            ))?;
        let _taken = pool.get()?;
        let error = Error::from(pool.get().expect_err("the only connection is taken"));
        assert!(error.is_busy(), "{error:?}");
        Ok(())
    }
}
