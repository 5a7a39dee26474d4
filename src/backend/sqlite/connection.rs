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

use super::checkpointer::Checkpointer;
use super::turnstile::{Turn, Turnstile};
use super::vfs::{self, WriterFile};
use super::wal;
use crate::error::{Error, Result};
use crate::options::{Durability, QueueOptions};

/// The WAL is truncated back to this size after checkpoints.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Commits between two nudges of the checkpointer (each a passive checkpoint
/// on its thread).
const CHECKPOINT_NUDGE_EVERY: u64 = 32;

/// Commits between two looks at the WAL's size (a `stat`).
const WAL_CHECK_EVERY: u64 = 64;

/// How long a commit that found the WAL over its limit keeps trying to empty
/// it (holding this process's write gate and turn) before leaving it to a
/// later one.
const WAL_TRUNCATE_PATIENCE: Duration = Duration::from_secs(1);

/// After a try to empty the WAL failed, how long until the next.
const WAL_TRUNCATE_BACKOFF: Duration = Duration::from_secs(30);

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
    commits: AtomicU64,
    wal_truncate_not_before: Mutex<Option<Instant>>,
    /// The longest the engine's maintenance (a slice of WAL truncation, a
    /// checkpoint holding the gate, a rescue or prune transaction) held the
    /// write gate at once, in µs.
    pub(crate) longest_maintenance_hold_us: Arc<AtomicU64>,
    checkpointer: Checkpointer,
    /// How the checkpoints of this queue's connections ended.
    pub(crate) checkpoint_stats: Arc<wal::CheckpointStats>,
    /// Past this size the WAL is checkpointed and emptied (see
    /// [`wal::truncate_if_over`]).
    wal_limit: u64,
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
        // Before any connection opens: the queue's and, from now on, the
        // application's go through it (see `vfs`).
        vfs::register();
        let pragmas = Pragmas {
            durability: options.durability,
            busy_timeout: options.busy_timeout,
        };
        let flags = OPEN_FLAGS;
        let writer = Connection::open_with_flags(path, flags)?;
        // Setting WAL needs a lock another process may hold: retry like a write.
        retry_busy(options.write_deadline, &AtomicU64::new(0), || {
            pragmas.apply(&writer)
        })?;
        let checkpoints = Connection::open_with_flags(path, flags)?;
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
        let checkpointer = Checkpointer::start(
            checkpoints,
            writer.clone(),
            checkpoint_stats.clone(),
            longest_maintenance_hold_us.clone(),
        )?;

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
            commits: AtomicU64::new(0),
            wal_truncate_not_before: Mutex::new(None),
            longest_maintenance_hold_us,
            checkpointer,
            checkpoint_stats,
            wal_limit: JOURNAL_SIZE_LIMIT as u64,
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
        self.committed(&conn);
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
        self.committed(&conn);
        Ok(value)
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

    /// After a commit on the write connection (still holding the gate and
    /// the turn): now and then, empties a WAL that readers kept from being
    /// restarted, trying for up to [`WAL_TRUNCATE_PATIENCE`]
    /// ([`wal::truncate`]). After tries that a reader outlasted, the next
    /// round waits [`WAL_TRUNCATE_BACKOFF`], so a long-lived reader (a backup)
    /// stalls writes rarely.
    ///
    /// Not sliced across commits: with other processes writing between two
    /// slices, a reader's fresh snapshot was old again by the next slice, and
    /// in the 8-process storm (a reader pinning 200 ms snapshots back to
    /// back) the WAL grew to 731 MiB. So a round holds the write lock for up
    /// to a second, only when the log is over its bound.
    fn committed(&self, conn: &Connection) {
        let n = self.commits.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(CHECKPOINT_NUDGE_EVERY) {
            self.checkpointer.nudge();
        }
        if !n.is_multiple_of(WAL_CHECK_EVERY) {
            return;
        }
        let mut not_before = self
            .wal_truncate_not_before
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if not_before.is_some_and(|t| now < t) {
            return;
        }
        let Some(bytes) = wal::over_limit(&wal_path(&self.path), self.wal_limit) else {
            return;
        };
        // Something kept the checkpointer from restarting the log: readers
        // holding snapshots back to back, most often.
        tracing::warn!(
            wal = %wal_path(&self.path).display(),
            bytes,
            limit = self.wal_limit,
            "the WAL is over its bound; checkpointing it whole and truncating it"
        );
        let done = wal::truncate(conn, WAL_TRUNCATE_PATIENCE);
        self.note_maintenance_hold(now.elapsed());
        *not_before = match &done {
            Ok(c) if !c.busy => {
                tracing::debug!("the WAL was checkpointed and truncated");
                None
            }
            Ok(c) => {
                tracing::warn!(
                    log_frames = c.log_frames,
                    checkpointed_frames = c.checkpointed_frames,
                    patience = ?WAL_TRUNCATE_PATIENCE,
                    "the WAL could not be truncated: a reader kept an old snapshot; \
                     trying again later"
                );
                Some(Instant::now() + WAL_TRUNCATE_BACKOFF)
            }
            Err(error) => {
                tracing::warn!(%error, "checkpointing the WAL over its bound failed");
                Some(Instant::now() + WAL_TRUNCATE_BACKOFF)
            }
        };
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
        let id = self as *const Gate as usize;
        if GATES_HELD.with(|held| held.borrow().contains(&id)) {
            return Err(Error::InsideTransaction);
        }
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
        GATES_HELD.with(|held| held.borrow_mut().push(id));
        Ok(WriteGate {
            conn,
            gate: self,
            id,
        })
    }

    /// Whether this thread holds the file's write lock through another
    /// connection (an application's own transaction, another queue's):
    /// this queue's writer would wait for it until the deadline.
    fn locked_elsewhere_by_this_thread(&self) -> bool {
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

thread_local! {
    /// The write gates this thread holds (by address): a second take on the
    /// same thread would wait for itself.
    static GATES_HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The write connection, taken by one thread (see [`Connections::writer`]).
pub(crate) struct WriteGate<'a> {
    conn: MutexGuard<'a, Connection>,
    gate: &'a Gate,
    id: usize,
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
        GATES_HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|g| *g == self.id) {
                held.remove(at);
            }
        });
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

    /// A queue whose WAL bound is 64 KiB, with a row written and a reader
    /// holding a snapshot of it: the log cannot be restarted while it lives.
    fn wal_pinned_by_a_reader() -> Result<(tempfile::TempDir, Connections, Connection)> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let path = dir.path().join("q.db");
        let mut db = Connections::open(&path, &QueueOptions::default())?;
        db.wal_limit = 64 * 1024;
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
        let mut db = Connections::open(&path, &QueueOptions::default())?;
        db.wal_limit = 256 * 1024;
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

    /// A reader that outlasts the truncating checkpoint's patience (a backup)
    /// costs one wait, not one at every check.
    #[test]
    fn a_reader_outlasting_the_wal_truncation_stalls_writes_once() -> Result<()> {
        let (_dir, db, reader) = wal_pinned_by_a_reader()?;

        let start = Instant::now();
        for _ in 0..(5 * WAL_CHECK_EVERY) {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
        }
        let elapsed = start.elapsed();
        reader.execute_batch("COMMIT")?;
        // One try of WAL_TRUNCATE_PATIENCE; without the backoff, four or five.
        assert!(
            elapsed < WAL_TRUNCATE_PATIENCE * 2 + Duration::from_millis(500),
            "{elapsed:?}"
        );
        Ok(())
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
        for _ in 0..WAL_CHECK_EVERY {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
        }
        reader.execute_batch("COMMIT")?;

        let logged = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
        assert!(
            logged.contains("WARN") && logged.contains("the WAL is over its bound"),
            "{logged}"
        );
        assert!(logged.contains("limit=65536"), "{logged}");
        // The reader kept it from being truncated: busy (its snapshot), or a
        // checkpoint that failed outright (the queue's checkpointer thread
        // checkpointing at the same moment, under load).
        assert!(
            logged.contains("the WAL could not be truncated: a reader kept an old snapshot")
                || logged.contains("checkpointing the WAL over its bound failed"),
            "{logged}"
        );
        Ok(())
    }
}
