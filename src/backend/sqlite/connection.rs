//! Opening SQLite: the file, pragmas (set and read back), the write gate, the
//! read pool, and the BUSY retry loop every write goes through.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::{Error, Result};
use crate::options::{Durability, QueueOptions};

/// The WAL is truncated back to this size after checkpoints.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Pragmas every connection gets, read back after they are set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pragmas {
    durability: Durability,
    busy_timeout: Duration,
}

impl Pragmas {
    fn apply(&self, conn: &Connection) -> Result<()> {
        let busy_ms = i64::try_from(self.busy_timeout.as_millis()).unwrap_or(i64::MAX);
        conn.busy_timeout(self.busy_timeout)?;
        // journal_mode answers with the mode now in force: "wal" unless the
        // filesystem (or an in-memory database) cannot hold one.
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        expect("journal_mode", "wal".to_owned(), mode.to_ascii_lowercase())?;
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}; PRAGMA foreign_keys = ON; PRAGMA journal_size_limit = {};",
            self.durability.synchronous(),
            JOURNAL_SIZE_LIMIT
        ))?;
        expect(
            "synchronous",
            self.durability.synchronous(),
            read_pragma::<i64>(conn, "synchronous")?,
        )?;
        expect("foreign_keys", 1, read_pragma::<i64>(conn, "foreign_keys")?)?;
        expect(
            "busy_timeout",
            busy_ms,
            read_pragma::<i64>(conn, "busy_timeout")?,
        )?;
        expect(
            "journal_size_limit",
            JOURNAL_SIZE_LIMIT,
            read_pragma::<i64>(conn, "journal_size_limit")?,
        )?;
        Ok(())
    }
}

/// A pool-init failure that is not itself a SQLite error (a pragma mismatch).
fn mismatch(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISMATCH),
        Some(message),
    )
}

fn read_pragma<T: rusqlite::types::FromSql>(conn: &Connection, name: &str) -> Result<T> {
    Ok(conn.pragma_query_value(None, name, |r| r.get(0))?)
}

fn expect<T: PartialEq + ToString>(name: &'static str, expected: T, actual: T) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::Pragma {
            name,
            expected: expected.to_string(),
            actual: actual.to_string(),
        })
    }
}

/// The connections of one queue: a single write connection behind a mutex
/// (the write gate: threads of this process queue here instead of spinning in
/// SQLite's busy handler against each other) and a pool of readers.
pub(crate) struct Connections {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: r2d2::Pool<SqliteConnectionManager>,
    write_deadline: Duration,
    busy_retries: AtomicU64,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Connections {
    /// Opens `path`, creating it (mode 0600) if missing, and sets the pragmas.
    /// Migrations are the caller's next step.
    pub(crate) fn open(path: &Path, options: &QueueOptions) -> Result<Self> {
        reject_memory_path(path)?;
        // Options are checked before the file is created: a refused open writes nothing.
        if options.pool_size == 0 {
            return Err(Error::InvalidArgument(
                "pool_size must be at least 1".into(),
            ));
        }
        create_private_file(path)?;
        let pragmas = Pragmas {
            durability: options.durability,
            busy_timeout: options.busy_timeout,
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let writer = Connection::open_with_flags(path, flags)?;
        // Setting WAL needs a lock another process may hold: retry like a write.
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            pragmas.apply(&writer)
        })?;

        let manager = SqliteConnectionManager::file(path)
            .with_flags(flags)
            .with_init(move |conn| {
                pragmas.apply(conn).map_err(|e| match e {
                    Error::Database(inner) => match inner.downcast::<rusqlite::Error>() {
                        Ok(sqlite) => *sqlite,
                        Err(other) => mismatch(other.to_string()),
                    },
                    other => mismatch(other.to_string()),
                })
            });
        let readers = r2d2::Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(0))
            .connection_timeout(options.write_deadline.max(Duration::from_secs(1)))
            .build(manager)?;

        Ok(Connections {
            path: path.to_path_buf(),
            writer: Mutex::new(writer),
            readers,
            write_deadline: options.write_deadline,
            busy_retries: AtomicU64::new(0),
        })
    }

    /// The `synchronous` pragma in force on the write connection.
    pub(crate) fn synchronous(&self) -> Result<i64> {
        read_pragma(&self.writer(), "synchronous")
    }

    /// How many times a write was retried after BUSY/LOCKED.
    pub(crate) fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    /// The write connection, held for the guard's life. A panic while it was
    /// held leaves no open transaction (rusqlite rolls back on drop), so a
    /// poisoned gate is safe to take over.
    pub(crate) fn writer(&self) -> MutexGuard<'_, Connection> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the write connection and
    /// commits. The whole transaction is retried on BUSY/LOCKED with jittered
    /// backoff until the write deadline; `f` must therefore be repeatable.
    pub(crate) fn write<T>(&self, mut f: impl FnMut(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let mut conn = self.writer();
        retry_busy(self.write_deadline, &self.busy_retries, || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = f(&tx)?;
            tx.commit()?;
            Ok(value)
        })
    }

    /// Runs a caller's closure in a `BEGIN IMMEDIATE` transaction on the write
    /// connection; commits on `Ok`, rolls back on `Err`. Only taking the lock
    /// is retried: the closure runs once.
    pub(crate) fn transaction<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        let conn = self.writer();
        // Only BEGIN is retried, before `f` runs. A shared borrow lets the
        // retry loop hand the transaction out.
        let tx = retry_busy(self.write_deadline, &self.busy_retries, || {
            Ok(Transaction::new_unchecked(
                &conn,
                TransactionBehavior::Immediate,
            )?)
        })?;
        let value = f(&tx)?;
        tx.commit().map_err(Error::from)?;
        Ok(value)
    }

    /// Runs `f` on a pooled read connection.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.get()?;
        f(&conn)
    }
}

/// Retries `f` while it fails with [`Error::Busy`], sleeping a jittered,
/// doubling backoff (1 ms up to 100 ms), until `deadline` has passed.
pub(crate) fn retry_busy<T>(
    deadline: Duration,
    retries: &AtomicU64,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(1);
    loop {
        match f() {
            Err(Error::Busy) if start.elapsed() < deadline => {
                retries.fetch_add(1, Ordering::Relaxed);
                let jittered = backoff.mul_f64(rand::random_range(0.5..=1.5));
                thread::sleep(jittered.min(deadline.saturating_sub(start.elapsed())));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn reject_memory_path(path: &Path) -> Result<()> {
    let text = path.to_string_lossy();
    if text.is_empty() || text.contains(":memory:") || text.contains("mode=memory") {
        return Err(Error::InvalidArgument(
            "backlog needs a database file: each pooled connection to an in-memory \
             database would be a different database"
                .into(),
        ));
    }
    // SQLite would open a `file:` URI as some other file than the one
    // `create_private_file` creates (with mode 0600) under the literal name.
    if text.starts_with("file:") {
        return Err(Error::InvalidArgument(format!(
            "backlog takes a database file path, not a URI: {text:?}"
        )));
    }
    Ok(())
}

/// Creates the database file with mode 0600 if it does not exist, so SQLite
/// (which copies the main file's mode to `-wal` and `-shm`) never creates a
/// world-readable queue.
fn create_private_file(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.raw_os_error() == Some(28) => Err(Error::StorageFull),
        Err(e) => Err(Error::Database(Box::new(e))),
    }
}
