//! The queue's handle on one MySQL/MariaDB database ([`Db`]), the engine's
//! `now` as its statements bind it ([`Now`]), a row's columns ([`take`]),
//! and the driver's errors as the crate's. Below the concerns beside it,
//! which all name these; `mod.rs` implements the seam on [`Db`] by
//! dispatching to them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::FromValue;
use mysql::{Opts, Pool, Row};

use super::poller;
use super::queries::Sql;
use super::version::Server;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::limits::LimitedQueues;

/// A queue's connections to one MySQL/MariaDB database.
pub(crate) struct Db {
    pub(super) pool: Pool,
    /// For connections of their own (the poller's).
    pub(super) opts: Opts,
    pub(crate) sql: Arc<Sql>,
    pub(super) prefix: String,
    pub(super) server: Server,
    /// The URL without its password, for messages and `Debug`.
    pub(super) url: String,
    pub(super) write_deadline: Duration,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) busy_retries: AtomicU64,
    /// Rung by this process's commits that make a job runnable at some
    /// time (a reschedule, a rescue, a retry, a resumed queue): its workers'
    /// pollers see them without asking the server.
    pub(crate) bells: Arc<poller::Bells>,
    /// Which queues had limits at the last look.
    pub(super) limited: LimitedQueues,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mysql::Db")
            .field("url", &self.url)
            .field("server", &self.server)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The engine's `now`, and whether it overrides the server's clock (a
/// manual clock) — see the time rule in `backend/mod.rs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub(super) engine: i64,
    manual: bool,
}

impl Now {
    /// Offsets are kept within ±2^62 µs (146,000 years), so the server's now
    /// plus an offset never overflows a BIGINT; `i64::MAX` ("never") stays
    /// far in the future.
    const MAX_OFFSET: i64 = 1 << 62;

    pub(crate) fn new(engine: i64, manual: bool) -> Now {
        Now { engine, manual }
    }

    /// The `:now` parameter: the engine's now for a manual clock, NULL (the
    /// server's clock) otherwise.
    pub(crate) fn param(self) -> Option<i64> {
        self.manual.then_some(self.engine)
    }

    /// The engine's absolute time `t` as an offset from its now.
    pub(crate) fn offset(self, t: i64) -> i64 {
        t.saturating_sub(self.engine)
            .clamp(-Self::MAX_OFFSET, Self::MAX_OFFSET)
    }
}

impl Db {
    /// `now` of the engine, with this queue's clock kind.
    pub(crate) fn now(&self, engine: i64) -> Now {
        Now::new(engine, self.clock.is_manual())
    }
}

/// Column `i` of a row, converted; a missing or unconvertible value is an
/// error, never a panic.
pub(crate) fn take<T: FromValue>(row: &mut Row, i: usize) -> Result<T> {
    match row.take_opt::<T, usize>(i) {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(Error::Database(format!("column {i}: {e}").into())),
        None => Err(Error::Database(format!("column {i} missing").into())),
    }
}

/// MySQL errors: deadlocks and lock wait timeouts are transient
/// ([`Error::Busy`], retried until the write deadline), a full disk or table
/// is [`Error::StorageFull`], a pool with no free connection past the write
/// deadline is `Busy`, and everything else is [`Error::Database`]. The
/// driver's messages carry no password.
impl From<mysql::Error> for Error {
    fn from(e: mysql::Error) -> Self {
        match &e {
            mysql::Error::MySqlError(m) => match m.code {
                // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
                1213 | 1205 => Error::Busy,
                // ER_DISK_FULL, ER_RECORD_FILE_FULL (the table is full)
                1021 | 1114 => Error::StorageFull,
                // EE_WRITE, ER_GET_ERRNO with the OS's ENOSPC (28): "Error
                // writing file (Errcode: 28 ..)", "Got error 28 from storage
                // engine".
                3 | 1030 if m.message.contains("28") => Error::StorageFull,
                _ => Error::Database(Box::new(e)),
            },
            mysql::Error::DriverError(mysql::DriverError::Timeout) => Error::Busy,
            _ => Error::Database(Box::new(e)),
        }
    }
}
