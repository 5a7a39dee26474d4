//! The SQLite write path: how one write of a queue reaches the file's single
//! write lock, and how long it may wait on the way.
//!
//! SQLite lets one connection write at a time, and its own busy handler is
//! neither fair nor aware of who waits for whom. Five mechanisms stand in
//! front of it, each kept because a measurement asked for it
//! (BENCHMARKS.md, RELIABILITY.md):
//!
//! - [`gate`]: the queue's one write connection, taken by the threads of
//!   this process one at a time, first come first served. A thread that
//!   already holds it, or that holds the file's write lock through another
//!   connection, is refused at once ([`Error::InsideTransaction`]).
//! - [`vfs`]: the shim VFS that tells the gate which thread holds the file's
//!   write lock through another connection (the foreign-transaction check).
//! - [`checkpointer`]: copies the WAL back and starts it again on a thread
//!   of its own; writers far ahead of it wait for its next pass (pacing).
//! - [`turnstile`]: the processes writing to the file take turns at its
//!   write lock, roughly in the order they asked.
//! - [`retry`]: BUSY from a connection that takes no turns (another
//!   program's) is retried with jittered backoff.
//!
//! # One write
//!
//! ```text
//!   write_until(until, f)
//!     |
//!     v
//!   pace ---------- waits for the checkpointer's next pass when this
//!     |             process ran far ahead (<= 100 ms, holding nothing;
//!     |             skipped inside a transaction: it may wait for us)
//!     v
//!   gate ---------- InsideTransaction at once: this thread holds the gate,
//!     |             or the file's write lock through another connection
//!     |             (vfs); else waits its ticket ------------> Busy at until
//!     v
//!   turn ---------- waits for this queue's turn at the file --> Busy at until
//!     |             (turnstile; Idle -> Helping -> Granted, see there)
//!     v
//!   BEGIN IMMEDIATE; f; COMMIT
//!     |             BUSY/LOCKED: the whole transaction again, after a
//!     |             jittered backoff, each try's busy timeout cut to what
//!     |             is left (retry) ------------------------> Busy at until
//!     v
//!   committed ----- every 32nd commit nudges the checkpointer
//!     |
//!   drop: turn let go, gate passed to the next ticket
//! ```
//!
//! Every wait ends by the caller's deadline (the queue's `write_deadline`,
//! or a worker's shutdown). The checkpointer takes the same gate and turn,
//! with a short patience of its own, so its restarts queue with the writes.
//! Closing the queue joins the checkpointer's thread, then the turnstile's
//! (bounded, see [`turnstile::CLOSE_PATIENCE`]).

pub(crate) mod checkpointer;
pub(crate) mod gate;
pub(crate) mod retry;
pub(crate) mod turnstile;
pub(crate) mod vfs;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use self::checkpointer::{Checkpointer, Parts};
pub(crate) use self::gate::last_write_hold;
pub(crate) use self::gate::WriteGate;
use self::gate::{note_hold, note_last_hold, Gate};
pub(crate) use self::retry::retry_busy;
use self::turnstile::{Turn, Turnstile};
use super::wal;
use crate::backend::inside;
use crate::error::{Error, Result};
use crate::options::QueueOptions;

/// Commits between two nudges of the checkpointer (each a passive checkpoint
/// on its thread).
const CHECKPOINT_NUDGE_EVERY: u64 = 32;

/// The write path of one queue: its gate, its turnstile, its checkpointer,
/// and what they count.
pub(crate) struct WritePath {
    writer: Arc<Gate>,
    /// Turns at the file's write lock, shared fairly with other processes.
    turnstile: Arc<Turnstile>,
    write_deadline: Duration,
    busy_timeout: Duration,
    busy_retries: AtomicU64,
    commits: Arc<AtomicU64>,
    /// The longest the engine's maintenance (the checkpointer's restart of
    /// the log, a rescue or prune transaction) held the write gate at once,
    /// in µs.
    longest_maintenance_hold_us: Arc<AtomicU64>,
    /// Declared after the gate and the turnstile's handle, so dropped after
    /// them: its thread holds the last references and ends first.
    checkpointer: Checkpointer,
    /// How the checkpoints of this queue's connections ended.
    pub(crate) checkpoint_stats: Arc<wal::CheckpointStats>,
    /// Past this size (bytes) the checkpointer empties the WAL's file
    /// instead of only starting the log again. Shared with the checkpointer
    /// so that tests can lower it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) wal_limit: Arc<AtomicU64>,
}

impl WritePath {
    /// The write path of the database at `path` over its write connection
    /// and the checkpointer's (both with the queue's pragmas), whose WAL is
    /// emptied past `wal_limit` bytes. Starts the checkpointer's thread and
    /// the turnstile's.
    pub(crate) fn start(
        path: &Path,
        writer: Connection,
        checkpoints: Connection,
        wal_limit: u64,
        options: &QueueOptions,
    ) -> Result<WritePath> {
        let writer = Arc::new(Gate::new(writer));
        let turnstile = Arc::new(Turnstile::open(path).unwrap_or_else(|error| {
            // Writes stay correct and bounded without it, only not in turn.
            tracing::warn!(
                %error,
                file = %turnstile::path_of(path).display(),
                "the turnstile file cannot be opened: this queue's writes will not \
                 take turns with other processes"
            );
            Turnstile::none()
        }));
        let checkpoint_stats = Arc::new(wal::CheckpointStats::default());
        let longest_maintenance_hold_us = Arc::new(AtomicU64::new(0));
        let wal_limit = Arc::new(AtomicU64::new(wal_limit));
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
        Ok(WritePath {
            writer,
            turnstile,
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
    /// write deadline (see [`WritePath::write_until`]).
    pub(crate) fn write<T>(&self, f: impl FnMut(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.write_until(Instant::now() + self.write_deadline, f)
    }

    /// [`WritePath::write`], finished or given up by `until`: each try's
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
            note_last_hold(began.elapsed());
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
    /// thread ([`checkpointer`]).
    fn committed(&self) {
        let n = self.commits.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(CHECKPOINT_NUDGE_EVERY) {
            self.checkpointer.nudge();
        }
    }
}

/// The WAL file of the database at `path`.
pub(crate) fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.to_path_buf().into_os_string();
    wal.push("-wal");
    PathBuf::from(wal)
}
