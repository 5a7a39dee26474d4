//! Opening SQLite: the file, pragmas (set and read back), the write gate, the
//! read pool, and the BUSY retry loop every write goes through.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use super::checkpointer::{Checkpointer, Parts};
use super::turnstile::{Turn, Turnstile};
use super::vfs::{self, WriterFile};
use super::wal;
use crate::backend::inside::{self, Inside};
use crate::error::{Error, Result};
use crate::options::{Durability, QueueOptions};

/// The WAL is truncated back to this size after checkpoints.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Commits between two nudges of the checkpointer (each a passive checkpoint
/// on its thread).
const CHECKPOINT_NUDGE_EVERY: u64 = 32;

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
    writer: Arc<Gate>,
    /// Turns at the file's write lock, shared fairly with other processes.
    turnstile: Arc<Turnstile>,
    readers: r2d2::Pool<SqliteConnectionManager>,
    write_deadline: Duration,
    busy_timeout: Duration,
    busy_retries: AtomicU64,
    commits: Arc<AtomicU64>,
    /// The longest the engine's maintenance (the checkpointer's restart of
    /// the log, a rescue or prune transaction) held the write gate at once,
    /// in µs.
    pub(crate) longest_maintenance_hold_us: Arc<AtomicU64>,
    checkpointer: Checkpointer,
    /// How the checkpoints of this queue's connections ended.
    pub(crate) checkpoint_stats: Arc<wal::CheckpointStats>,
    /// Past this size (bytes) the checkpointer empties the WAL's file
    /// instead of only starting the log again. Shared with the checkpointer
    /// so that tests can lower it.
    #[cfg_attr(not(test), allow(dead_code))]
    wal_limit: Arc<AtomicU64>,
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
        let flags = OPEN_FLAGS;
        // Through the shim, by name: the write gate tells this writer's lock
        // from one this thread holds through another connection (see `vfs`).
        let writer = vfs::open(path, flags)?;
        // Setting WAL needs a lock another process may hold: retry like a write.
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            pragmas.apply(&writer)
        })?;
        let checkpoints = vfs::open(path, flags)?;
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            pragmas.apply(&checkpoints)
        })?;
        let writer = Arc::new(Gate::new(writer));
        let turnstile = Arc::new(Turnstile::open(path).unwrap_or_else(|error| {
            // Writes stay correct and bounded without it, only not in turn.
            tracing::warn!(
                %error,
                file = %super::turnstile::path_of(path).display(),
                "the turnstile file cannot be opened: this queue's writes will not \
                 take turns with other processes"
            );
            Turnstile::none()
        }));
        let checkpoint_stats = Arc::new(wal::CheckpointStats::default());
        let longest_maintenance_hold_us = Arc::new(AtomicU64::new(0));
        let wal_limit = Arc::new(AtomicU64::new(JOURNAL_SIZE_LIMIT as u64));
        let commits = Arc::new(AtomicU64::new(0));
        let checkpointer = Checkpointer::start(Parts {
            conn: checkpoints,
            wal: wal_path(path),
            wal_limit: wal_limit.clone(),
            gate: writer.clone(),
            turnstile: turnstile.clone(),
            stats: checkpoint_stats.clone(),
            longest_hold: longest_maintenance_hold_us.clone(),
            commits: commits.clone(),
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
            writer,
            turnstile,
            readers,
            write_deadline: options.write_deadline,
            busy_timeout: options.busy_timeout,
            busy_retries: AtomicU64::new(0),
            commits,
            longest_maintenance_hold_us,
            checkpointer,
            checkpoint_stats,
            wal_limit,
        })
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The `synchronous` pragma in force on the write connection.
    pub(crate) fn synchronous(&self) -> Result<i64> {
        read_pragma(&*self.writer()?, "synchronous")
    }

    /// How many times a write was retried after BUSY/LOCKED.
    pub(crate) fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    /// The write connection, held for the guard's life. A panic while it was
    /// held leaves no open transaction (rusqlite rolls back on drop), so a
    /// poisoned gate is safe to take over.
    ///
    /// A thread that already holds this gate (a handler inside
    /// `ctx.transaction`, a closure of `QueueExt::transaction`), or that
    /// holds the file's write lock through a connection of its own (an
    /// application's `BEGIN IMMEDIATE`), gets [`Error::InsideTransaction`] at
    /// once instead of waiting for itself. Waits for other threads of this
    /// process up to the write deadline ([`Error::Busy`] past it).
    pub(crate) fn writer(&self) -> Result<WriteGate<'_>> {
        self.writer.enter(Instant::now() + self.write_deadline)
    }

    /// The longest maintenance hold of the write gate so far.
    pub(crate) fn longest_maintenance_hold(&self) -> Duration {
        Duration::from_micros(self.longest_maintenance_hold_us.load(Ordering::Relaxed))
    }

    /// Counts a maintenance hold of the write gate.
    pub(crate) fn note_maintenance_hold(&self, held: Duration) {
        note_hold(&self.longest_maintenance_hold_us, held);
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the write connection and
    /// commits. The whole transaction is retried on BUSY/LOCKED with jittered
    /// backoff; `f` must therefore be repeatable. Everything (the gate, the
    /// turn at the file, the retries) is given up with [`Error::Busy`] at the
    /// write deadline (see [`Connections::write_until`]).
    pub(crate) fn write<T>(&self, f: impl FnMut(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.write_until(Instant::now() + self.write_deadline, f)
    }

    /// [`Connections::write`], finished or given up by `until`: each try's
    /// busy timeout is cut to what is left, so a write lock another process
    /// holds cannot keep the caller past it (a worker's shutdown). Gives up
    /// with [`Error::Busy`].
    pub(crate) fn write_until<T>(
        &self,
        until: Instant,
        mut f: impl FnMut(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.pace(until);
        let mut conn = self.writer.enter(until)?;
        let _turn = self.turn(until)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Busy);
        }
        let patience = self.busy_timeout.min(left);
        conn.busy_timeout(patience)?;
        let result = retry_busy(left, &self.busy_retries, || {
            let left = until.saturating_duration_since(Instant::now());
            conn.busy_timeout(patience.min(left).max(Duration::from_millis(1)))?;
            let began = Instant::now();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = f(&tx)?;
            tx.commit()?;
            LAST_HOLD.set(began.elapsed());
            Ok(value)
        });
        conn.busy_timeout(self.busy_timeout)?;
        let value = result?;
        self.committed();
        Ok(value)
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
        let until = Instant::now() + self.write_deadline;
        self.pace(until);
        let conn = self.writer.enter(until)?;
        let _turn = self.turn(until)?;
        let left = until.saturating_duration_since(Instant::now());
        // Only BEGIN is retried, before `f` runs, each try's busy timeout cut
        // to what is left of the deadline. A shared borrow lets the retry
        // loop hand the transaction out.
        let begun = retry_busy(left, &self.busy_retries, || {
            let left = until.saturating_duration_since(Instant::now());
            conn.busy_timeout(self.busy_timeout.min(left).max(Duration::from_millis(1)))?;
            Ok(Transaction::new_unchecked(
                &conn,
                TransactionBehavior::Immediate,
            )?)
        });
        conn.busy_timeout(self.busy_timeout).map_err(Error::from)?;
        let tx = begun?;
        let value = f(&tx)?;
        tx.commit().map_err(Error::from)?;
        self.committed();
        Ok(value)
    }

    /// Lets the checkpointer keep up with this process's writers
    /// ([`Checkpointer::pace`]); never on a thread holding a write gate, or
    /// the file's write lock through another connection, which the
    /// checkpointer may be waiting for (the gate then refuses at once).
    fn pace(&self, until: Instant) {
        if !inside::is_inside_any() && !self.writer.locked_elsewhere_by_this_thread() {
            self.checkpointer
                .pace(self.commits.load(Ordering::Relaxed), until);
        }
    }

    /// This queue's turn at the file's write lock, waited for until `until`
    /// ([`Error::Busy`] past it). The caller holds the write gate.
    fn turn(&self, until: Instant) -> Result<Turn<'_>> {
        let start = Instant::now();
        self.turnstile.enter(until).inspect_err(|_| {
            tracing::warn!(
                waited = ?start.elapsed(),
                "other processes kept the write lock past the write deadline: \
                 giving up with Error::Busy"
            )
        })
    }

    /// After a commit on the write connection: now and then, nudges the
    /// checkpointer, which copies the log back and starts it again on its own
    /// thread ([`super::checkpointer`]).
    fn committed(&self) {
        let n = self.commits.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(CHECKPOINT_NUDGE_EVERY) {
            self.checkpointer.nudge();
        }
    }

    /// Runs `f` on a pooled read connection.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.get()?;
        f(&conn)
    }
}

/// Keeps the longest of the holds noted in `longest` (µs).
pub(crate) fn note_hold(longest: &AtomicU64, held: Duration) {
    let us = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
    longest.fetch_max(us, Ordering::Relaxed);
}

/// The write connection and its gate: threads of this process queue here,
/// each with a deadline, in the order they came, instead of against each
/// other in SQLite's busy handler. First come, first served: a thread that
/// writes in a loop cannot keep the checkpointer (or a handler's
/// `ctx.transaction`) waiting while it takes the gate again and again.
pub(crate) struct Gate {
    conn: Mutex<Connection>,
    /// The write connection's file handle, to tell its write lock from one
    /// this thread holds through another connection (see `vfs`).
    file: Option<WriterFile>,
    /// Who holds the gate and who is next. The connection's own mutex is
    /// only ever taken by the holder.
    line: Mutex<Line>,
    freed: Condvar,
}

/// A ticket line: each thread takes the next ticket and enters when its
/// ticket is served.
#[derive(Default)]
struct Line {
    next: u64,
    serving: u64,
    /// Tickets whose threads gave up waiting: skipped when served.
    abandoned: std::collections::BTreeSet<u64>,
}

impl Line {
    /// Serves the next ticket still wanted.
    fn advance(&mut self) {
        self.serving += 1;
        while self.abandoned.remove(&self.serving) {
            self.serving += 1;
        }
    }
}

impl Gate {
    fn new(conn: Connection) -> Gate {
        Gate {
            file: WriterFile::of(&conn),
            conn: Mutex::new(conn),
            line: Mutex::new(Line::default()),
            freed: Condvar::new(),
        }
    }

    /// Takes the gate, waiting for other threads until `until`
    /// ([`Error::Busy`] past it). A thread that already holds it, or that
    /// holds the file's write lock through another connection, gets
    /// [`Error::InsideTransaction`] at once. A panic while it was held leaves
    /// no open transaction (rusqlite rolls back on drop), so a poisoned
    /// connection is safe to take over.
    pub(crate) fn enter(&self, until: Instant) -> Result<WriteGate<'_>> {
        let inside = Inside::enter(inside::id_of(self))?;
        if self.locked_elsewhere_by_this_thread() {
            return Err(Error::InsideTransaction);
        }
        let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = line.next;
        line.next += 1;
        while line.serving != ticket {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                line.abandoned.insert(ticket);
                return Err(Error::Busy);
            }
            line = self
                .freed
                .wait_timeout(line, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(line);
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Ok(WriteGate {
            conn,
            gate: self,
            _inside: inside,
        })
    }

    /// Whether this thread holds the file's write lock through another
    /// connection (an application's own transaction, another queue's):
    /// this queue's writer would wait for it until the deadline.
    pub(crate) fn locked_elsewhere_by_this_thread(&self) -> bool {
        self.file
            .is_some_and(|file| file.locked_elsewhere_by_this_thread())
    }

    fn leave(&self) {
        self.line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .advance();
        self.freed.notify_all();
    }
}

thread_local! {
    /// How long this thread's last [`Connections::write`] held the write
    /// lock, from `BEGIN IMMEDIATE` to its commit.
    static LAST_HOLD: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// How long this thread's last engine write held the write lock.
pub(crate) fn last_write_hold() -> Duration {
    LAST_HOLD.get()
}

/// The write connection, taken by one thread (see [`Connections::writer`]).
pub(crate) struct WriteGate<'a> {
    conn: MutexGuard<'a, Connection>,
    gate: &'a Gate,
    /// Marks the thread as holding the gate: a second take on it would wait
    /// for itself.
    _inside: Inside,
}

impl std::ops::Deref for WriteGate<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriteGate<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl Drop for WriteGate<'_> {
    fn drop(&mut self) {
        // The connection's guard is dropped right after this: a thread let
        // in now waits those few instructions for it.
        self.gate.leave();
    }
}

/// The WAL file of the database at `path`.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.to_path_buf().into_os_string();
    wal.push("-wal");
    PathBuf::from(wal)
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
    let mut tries = 0u64;
    loop {
        match f() {
            Err(Error::Busy) if start.elapsed() < deadline => {
                retries.fetch_add(1, Ordering::Relaxed);
                tries += 1;
                let jittered = backoff.mul_f64(rand::random_range(0.5..=1.5));
                thread::sleep(jittered.min(deadline.saturating_sub(start.elapsed())));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(Error::Busy) => {
                tracing::warn!(
                    waited = ?start.elapsed(),
                    ?deadline,
                    retries = tries,
                    "the database stayed locked by another connection past the write \
                     deadline: giving up with Error::Busy"
                );
                return Err(Error::Busy);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use super::*;
    use crate::backend::sqlite::checkpointer::TRUNCATE_PATIENCE;

    /// A queue whose WAL bound is 64 KiB, with a row written and a reader
    /// holding a snapshot of it: the log cannot be restarted while it lives.
    fn wal_pinned_by_a_reader() -> Result<(tempfile::TempDir, Connections, Connection)> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let path = dir.path().join("q.db");
        let db = Connections::open(&path, &QueueOptions::default())?;
        db.wal_limit.store(64 * 1024, Ordering::Relaxed);
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
        db.wal_limit.store(256 * 1024, Ordering::Relaxed);
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
