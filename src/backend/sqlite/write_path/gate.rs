//! The write gate: the queue's one write connection, taken by the threads of
//! this process one at a time, first come first served, each with a
//! deadline; and the refusal of a thread that would wait for itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::vfs::WriterFile;
use crate::backend::inside::{self, Inside};
use crate::error::{Error, Result};
use crate::sync;

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
    pub(super) fn new(conn: Connection) -> Gate {
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
        let mut line = sync::lock(&self.line);
        let ticket = line.next;
        line.next += 1;
        while line.serving != ticket {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                line.abandoned.insert(ticket);
                return Err(Error::Busy);
            }
            line = sync::wait_timeout(&self.freed, line, left);
        }
        drop(line);
        let conn = sync::lock(&self.conn);
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
        sync::lock(&self.line).advance();
        self.freed.notify_all();
    }
}

thread_local! {
    /// How long this thread's last `WritePath::write_until` held the write
    /// lock, from `BEGIN IMMEDIATE` to its commit.
    static LAST_HOLD: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// How long this thread's last engine write held the write lock.
pub(crate) fn last_write_hold() -> Duration {
    LAST_HOLD.get()
}

/// Notes how long this thread's engine write just held the write lock.
pub(super) fn note_last_hold(held: Duration) {
    LAST_HOLD.set(held);
}

/// The write connection, taken by one thread (see `WritePath::writer`).
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
