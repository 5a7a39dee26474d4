//! Opening SQLite: the file, pragmas (set and read back), the read pool, and
//! the write path ([`super::write_path`]) every write goes through.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction};

use super::wal;
use super::write_path::last_write_hold;
use super::write_path::{retry_busy, vfs, WriteGate, WritePath};
use crate::error::{Error, Result};
use crate::options::{Durability, QueueOptions, SqliteKey};

/// The WAL is truncated back to this size after checkpoints.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// How every connection of a queue opens the file (which must exist).
pub(crate) const OPEN_FLAGS: OpenFlags = OpenFlags::SQLITE_OPEN_READ_WRITE
    .union(OpenFlags::SQLITE_OPEN_NO_MUTEX)
    .union(OpenFlags::SQLITE_OPEN_URI);

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
        // Plans must not depend on bound values. Otherwise SQLite (3.53) plans
        // a bound `LIMIT ?` with its value and re-prepares the statement each
        // time it is bound again: every lease re-parsed its SQL, ~40 % of the
        // worker's fetcher CPU (BENCHMARKS.md).
        let qpsg = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        expect("enable_qpsg", true, qpsg)?;
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
        // Checkpoints run on the checkpointer's thread, not inside commits.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        expect(
            "wal_autocheckpoint",
            0,
            read_pragma::<i64>(conn, "wal_autocheckpoint")?,
        )?;
        Ok(())
    }
}

/// Opens `path` as every connection of a queue to it does: with its key, when
/// the file has one, as the first statement, and the schema read back, so
/// that a file that does not open says so here and not at some later read.
pub(crate) fn open_keyed(
    path: &Path,
    flags: OpenFlags,
    key: Option<&SqliteKey>,
) -> Result<Connection> {
    let conn = Connection::open_with_flags(path, flags)?;
    unlock(&conn, key)?;
    Ok(conn)
}

/// [`apply_key`], then [`check_opens`].
fn unlock(conn: &Connection, key: Option<&SqliteKey>) -> Result<()> {
    apply_key(conn, key)?;
    check_opens(conn, key.is_some())
}

/// `PRAGMA key` (SQLCipher), which must come before anything reads the file.
fn apply_key(conn: &Connection, key: Option<&SqliteKey>) -> Result<()> {
    if let Some(key) = key {
        conn.pragma_update(None, "key", key.expose())?;
    }
    Ok(())
}

/// Reads the schema: the file's first read, where a wrong or missing key
/// shows, as `SQLITE_NOTADB` with a message that says what to check.
fn check_opens(conn: &Connection, keyed: bool) -> Result<()> {
    match conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    }) {
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) => {
            let why = if keyed {
                "the file does not open with the key given (QueueOptions::sqlite_key): the key \
                 is wrong, or the file is not encrypted or not a database"
            } else {
                "the file is not a database: it is encrypted (give its key with \
                 QueueOptions::sqlite_key), damaged, or not SQLite"
            };
            Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOTADB),
                Some(why.to_owned()),
            )
            .into())
        }
        other => other.map(drop).map_err(Error::from),
    }
}

/// Refuses a key where the SQLite linked in is not SQLCipher: plain SQLite
/// ignores `PRAGMA key`, and the "encrypted" file would be plaintext.
fn require_sqlcipher() -> Result<()> {
    let conn = Connection::open_in_memory()?;
    let version: Option<String> = conn
        .query_row("PRAGMA cipher_version", [], |r| r.get(0))
        .optional()?;
    match version {
        Some(_) => Ok(()),
        None => Err(Error::InvalidArgument(
            "sqlite_key needs SQLCipher, and this build links plain SQLite, which would write \
             the file unencrypted: build backlog with its `sqlcipher` feature"
                .into(),
        )),
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

/// The connections of one queue: the write path (a single write connection
/// behind its gate, see [`super::write_path`]) and a pool of readers.
pub(crate) struct Connections {
    path: PathBuf,
    key: Option<SqliteKey>,
    write: WritePath,
    readers: r2d2::Pool<SqliteConnectionManager>,
    /// How the checkpoints of this queue's connections ended.
    pub(crate) checkpoint_stats: Arc<wal::CheckpointStats>,
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
        let key = options.sqlite_key.clone();
        if key.is_some() {
            require_sqlcipher()?;
        }
        create_private_file(path)?;
        let pragmas = Pragmas {
            durability: options.durability,
            busy_timeout: options.busy_timeout,
        };
        let flags = OPEN_FLAGS;
        // Through the shim, by name: the write gate tells this writer's lock
        // from one this thread holds through another connection (see `vfs`).
        let writer = vfs::open(path, flags)?;
        apply_key(&writer, key.as_ref())?;
        // Setting WAL needs a lock another process may hold: retry like a write.
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            check_opens(&writer, key.is_some())?;
            pragmas.apply(&writer)
        })?;
        let checkpoints = vfs::open(path, flags)?;
        apply_key(&checkpoints, key.as_ref())?;
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            check_opens(&checkpoints, key.is_some())?;
            pragmas.apply(&checkpoints)
        })?;
        let write = WritePath::start(
            path,
            writer,
            checkpoints,
            JOURNAL_SIZE_LIMIT as u64,
            options,
        )?;

        let reader_key = key.clone();
        let manager = SqliteConnectionManager::file(path)
            .with_flags(flags)
            .with_init(move |conn| {
                unlock(conn, reader_key.as_ref())
                    .and_then(|()| pragmas.apply(conn))
                    .map_err(|e| match e {
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
            key,
            checkpoint_stats: write.checkpoint_stats.clone(),
            write,
            readers,
        })
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's key, for every other connection the queue opens to it.
    pub(crate) fn key(&self) -> Option<&SqliteKey> {
        self.key.as_ref()
    }

    /// The `synchronous` pragma in force on the write connection.
    pub(crate) fn synchronous(&self) -> Result<i64> {
        read_pragma(&*self.writer()?, "synchronous")
    }

    /// How many times a write was retried after BUSY/LOCKED.
    pub(crate) fn busy_retries(&self) -> u64 {
        self.write.busy_retries()
    }

    /// The write connection, held for the guard's life
    /// ([`WritePath::writer`]).
    pub(crate) fn writer(&self) -> Result<WriteGate<'_>> {
        self.write.writer()
    }

    /// The longest maintenance hold of the write gate so far.
    pub(crate) fn longest_maintenance_hold(&self) -> Duration {
        self.write.longest_maintenance_hold()
    }

    /// Counts this thread's last write (a worker's rescue or prune) as a
    /// maintenance hold of the write gate.
    pub(crate) fn note_maintenance_write(&self) {
        self.write.note_maintenance_hold(last_write_hold());
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction and commits, retried
    /// whole on BUSY, given up by the write deadline ([`WritePath::write`]).
    pub(crate) fn write<T>(&self, f: impl FnMut(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.write.write(f)
    }

    /// [`Connections::write`], finished or given up by `until`
    /// ([`WritePath::write_until`]).
    pub(crate) fn write_until<T>(
        &self,
        until: Instant,
        f: impl FnMut(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.write.write_until(until, f)
    }

    /// Runs a caller's closure once in a `BEGIN IMMEDIATE` transaction
    /// ([`WritePath::transaction`]).
    pub(crate) fn transaction<T, E>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        self.write.transaction(f)
    }

    /// Runs `f` on a pooled read connection.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.get()?;
        f(&conn)
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use std::sync::atomic::Ordering;
    use std::thread;

    use super::*;
    use crate::backend::sqlite::write_path::checkpointer::TRUNCATE_PATIENCE;
    use crate::backend::sqlite::write_path::wal_path;

    /// A queue whose WAL bound is 64 KiB, with a row written and a reader
    /// holding a snapshot of it: the log cannot be restarted while it lives.
    fn wal_pinned_by_a_reader() -> Result<(tempfile::TempDir, Connections, Connection)> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let path = dir.path().join("q.db");
        let db = Connections::open(&path, &QueueOptions::default())?;
        db.write.wal_limit.store(64 * 1024, Ordering::Relaxed);
        db.write(|tx| Ok(tx.execute_batch("CREATE TABLE blobs (b BLOB NOT NULL)")?))?;
        db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
        let reader = Connection::open(&path)?;
        reader.execute_batch("BEGIN")?;
        reader.query_row("SELECT count(*) FROM blobs", [], |r| r.get::<_, i64>(0))?;
        Ok((dir, db, reader))
    }

    /// A reader holding snapshots back to back starves passive checkpoints;
    /// the write gate must still keep the WAL near its limit.
    #[test]
    fn the_wal_stays_bounded_while_readers_pin_snapshots_back_to_back() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let path = dir.path().join("q.db");
        let db = Connections::open(&path, &QueueOptions::default())?;
        db.write.wal_limit.store(256 * 1024, Ordering::Relaxed);
        db.write(|tx| Ok(tx.execute_batch("CREATE TABLE blobs (b BLOB NOT NULL)")?))?;

        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (stop, path) = (stop.clone(), path.clone());
            thread::spawn(move || -> rusqlite::Result<()> {
                let conn = Connection::open(&path)?;
                while !stop.load(Ordering::Relaxed) {
                    conn.execute_batch("BEGIN")?;
                    conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get::<_, i64>(0))?;
                    thread::sleep(Duration::from_millis(5));
                    conn.execute_batch("COMMIT")?;
                }
                Ok(())
            })
        };
        let wal = path.with_extension("db-wal");
        let mut wal_max = 0;
        for _ in 0..600 {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
            wal_max = wal_max.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("reader thread")?;
        // Unchecked, 600 commits of two pages each make a WAL of about 5 MiB.
        assert!(wal_max < 2 * 1024 * 1024, "the WAL grew to {wal_max} bytes");
        Ok(())
    }

    /// A reader that outlasts every try to empty a log over its bound (a
    /// backup) stalls the writers once, for the long try, and then costs
    /// them only short holds; once it leaves, the log is emptied.
    #[test]
    fn a_reader_outlasting_the_wal_truncation_stalls_writes_once() -> Result<()> {
        let (dir, db, reader) = wal_pinned_by_a_reader()?;
        let wal = wal_path(&dir.path().join("q.db"));
        let start = Instant::now();
        let mut stalls = 0;
        // Past the bound (64 KiB) for 2.5 s: one long try, then short ones
        // at pauses of 1, 2, 4 ... s.
        while start.elapsed() < Duration::from_millis(2500) {
            let began = Instant::now();
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
            if began.elapsed() > TRUNCATE_PATIENCE / 2 {
                stalls += 1;
            }
        }
        let pinned = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert!(
            pinned > 64 * 1024,
            "the reader pinned the log: {pinned} bytes"
        );
        assert!(stalls <= 1, "{stalls} stalls");
        assert!(db.checkpoint_stats.partial.load(Ordering::Relaxed) > 0);

        reader.execute_batch("COMMIT")?;
        let deadline = Instant::now() + TRUNCATE_PATIENCE * 10;
        loop {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
            let len = std::fs::metadata(&wal).map_or(0, |m| m.len());
            if len < pinned / 2 {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "the log stayed at {len} bytes");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// A log over its bound is a warning, and so is a truncation a reader
    /// kept from finishing: both say something holds snapshots too long.
    #[test]
    fn a_wal_over_its_bound_is_a_warning() -> Result<()> {
        #[derive(Clone, Default)]
        struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();

        let (_dir, db, reader) = wal_pinned_by_a_reader()?;
        // The process's global subscriber, not one for this thread: a
        // callsite another test thread reached first without any subscriber
        // would be cached as uninteresting and skipped here too.
        tracing::subscriber::set_global_default(subscriber)
            .map_err(|e| Error::Database(Box::new(e)))?;
        // Past the bound, while the checkpointer's tries fail.
        let deadline = Instant::now() + Duration::from_secs(10);
        let logged = loop {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
            let logged = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
            if logged.contains("the WAL is over its bound") || Instant::now() > deadline {
                break logged;
            }
        };
        reader.execute_batch("COMMIT")?;
        assert!(
            logged.contains("WARN")
                && logged.contains("a reader kept an old snapshot through every try"),
            "{logged}"
        );
        assert!(logged.contains("limit=65536"), "{logged}");
        Ok(())
    }
}
