//! The turnstile: processes writing to one SQLite file take turns at its
//! write lock, roughly in the order they asked.
//!
//! SQLite's own busy handler is not fair: a connection that finds the lock
//! taken sleeps (1, 2, 5 … 100 ms) and tries again, so a process that commits
//! in a loop takes the lock again the instant it lets go, and a process
//! writing once now and then waits seconds (BENCHMARKS.md, fairness). So
//! before `BEGIN IMMEDIATE`, every queue on the file takes a turn here.
//!
//! The turn is a lock on a byte of a file next to the database
//! (`<db>-turnstile`), taken with the kernel's blocking record locks
//! (`fcntl(F_OFD_SETLKW)`): the kernel drops them when the process dies, so a
//! holder or a waiter killed with SIGKILL blocks nobody. Two bytes:
//!
//! - the *door*: at most one process waits for the turn, holding the door;
//!   the rest wait at the door;
//! - the *turn*: held for the write transaction.
//!
//! Taking a turn is: lock the door, lock the turn, unlock the door. A process
//! that lets go of the turn and wants it back must pass the door again, which
//! the waiter holds until it has the turn: a writer in a loop therefore
//! yields to the one that was waiting, whether or not the kernel schedules
//! that waiter first, and then queues at the door behind the others.
//!
//! Measured on Linux 6 (2 cores): five processes blocked one after another
//! on a record lock got it in the order they blocked in 19 of 20 trials (the
//! twentieth swapped two neighbours); a waiter that loses the race blocks
//! again. So the door is roughly first come, first served.
//!
//! Every wait is bounded: blocking `fcntl` has no timeout, so blocking waits
//! run on a helper thread (`backlog-turnstile`) and the caller waits for it
//! with a deadline. A caller that gives up leaves the helper waiting; the
//! turn it later gets goes to the next caller of this process, or is let go
//! at once.
//!
//! # States
//!
//! One caller at a time (it holds the queue's write gate) and one helper
//! share a `State` (Linux):
//!
//! ```text
//!        caller: door and turn free
//!        (takes both, lets the door go)
//!            +------+
//!            |      v
//!          +----------+   caller: door or turn taken   +--------------------------+
//!  open -->|   Idle   |------------------------------->| Helping { door_held,     |
//!          +----------+                                |           wanted: true } |
//!           ^   ^    ^                                 +--------------------------+
//!           |   |    |  helper got the turn, nobody      |  |  ^   |
//!           |   |    |  wants it: lets it go             |  |  |   | caller gave up
//!           |   |    +-----------------------------------+  |  |   v (deadline)
//!           |   |                                           |  | wanted: false
//!           |   |                                           |  +--- a later caller
//!           |   |  caller takes the turn                    |       wants it
//!           |   +---------------- Granted <-----------------+ helper got the turn
//!           |  caller writes without a turn                 |
//!           +-------------------- Failed  <-----------------+ helper's lock failed
//!
//!  any state --(the queue closes)--> Closed: the helper lets go what it gets
//!  and ends; the close joins it, or leaves it after CLOSE_PATIENCE.
//! ```
//!
//! The helper blocks in the kernel only in `Helping`, and no caller takes a
//! lock on the file meanwhile: locks of one open file description never
//! conflict with each other, so the caller and the helper could both
//! believe they hold the turn.
//!
//! Closing joins the helper, waiting for it [`CLOSE_PATIENCE`] at most: it
//! ends at once unless it is blocked in the kernel for another process's
//! turn (a caller gave up on it), which no thread can interrupt. Past the
//! bound it is left to end by itself once it gets that turn, which it lets
//! go at once.
//!
//! The turnstile file sits beside the database's real file: a path through
//! a symbolic link is resolved first, as SQLite resolves it for `-wal` and
//! `-shm`, so that every queue on the file, whichever path opened it, takes
//! turns at the same file.
//!
//! Connections that do not use the turnstile (an application's own rusqlite
//! connection) are not slowed by it: they meet backlog's writers in SQLite's
//! busy handler, as before, and are only not served in turn.
//!
//! Off Linux the turnstile is a no-op (no open-file-description locks), and
//! writers meet in SQLite's busy handler.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sync;

/// How long closing a queue waits for its turnstile's helper thread.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) const CLOSE_PATIENCE: Duration = Duration::from_millis(250);

/// The turnstile file of the database at `db`, beside the file a symbolic
/// link points to (the path as given if it cannot be resolved).
pub(crate) fn path_of(db: &Path) -> PathBuf {
    let mut path = db
        .canonicalize()
        .unwrap_or_else(|_| db.to_path_buf())
        .into_os_string();
    path.push("-turnstile");
    PathBuf::from(path)
}

#[cfg(target_os = "linux")]
pub(crate) use linux::Turnstile;

#[cfg(not(target_os = "linux"))]
pub(crate) use fallback::Turnstile;

/// A turn: while it lives, this queue may write. Dropping it lets go.
pub(crate) struct Turn<'a> {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    turnstile: Option<&'a Turnstile>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some(turnstile) = self.turnstile {
            turnstile.release();
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::sync::{Arc, Condvar, Mutex, MutexGuard};
    use std::thread::{self, JoinHandle};

    use super::*;

    /// Byte offsets in the turnstile file.
    const TURN: i64 = 0;
    const DOOR: i64 = 1;

    /// The turnstile of one queue: its own open file description (so its
    /// locks conflict with every other queue's, in this process too) and the
    /// helper thread that makes blocking waits.
    pub(crate) struct Turnstile {
        /// `None`: no turnstile (its file could not be opened).
        inner: Option<Arc<Inner>>,
        helper: Option<JoinHandle<()>>,
    }

    struct Inner {
        file: File,
        state: Mutex<State>,
        changed: Condvar,
    }

    /// Where the caller and the helper are (the module's state diagram).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum State {
        /// Nothing of this queue's waits in the kernel: a caller tries the
        /// locks itself, without blocking.
        Idle,
        /// The helper is asked to block, or blocks, in the kernel for the
        /// turn. `door_held`: the caller already held the door when it asked
        /// (the helper takes the turn only). `wanted`: a caller waits for
        /// the turn; false once it gave up, and what the helper gets then is
        /// let go, unless a later caller wants it first.
        Helping { door_held: bool, wanted: bool },
        /// The helper holds the turn for the waiting caller.
        Granted,
        /// The helper's lock failed: the waiting caller writes without a
        /// turn (correct, only not in turn).
        Failed,
        /// The queue closed: the helper lets go what it gets and ends.
        Closed,
    }

    impl Turnstile {
        /// Opens the turnstile file of the database at `db`, creating it with
        /// the database's mode (as SQLite creates `-wal` and `-shm`: a file
        /// shared with a group is shared whole), and starts its helper
        /// thread.
        pub(crate) fn open(db: &Path) -> Result<Turnstile> {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let mode = std::fs::metadata(db).map_or(0o600, |m| m.permissions().mode() & 0o777);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(mode)
                .open(path_of(db))
                .map_err(|e| Error::Database(Box::new(e)))?;
            let inner = Arc::new(Inner {
                file,
                state: Mutex::new(State::Idle),
                changed: Condvar::new(),
            });
            let helper = inner.clone();
            let helper = thread::Builder::new()
                .name("backlog-turnstile".into())
                .spawn(move || helper.help())
                .map_err(|e| Error::Database(Box::new(e)))?;
            Ok(Turnstile {
                inner: Some(inner),
                helper: Some(helper),
            })
        }

        /// No turnstile: writers meet in SQLite's busy handler.
        pub(crate) fn none() -> Turnstile {
            Turnstile {
                inner: None,
                helper: None,
            }
        }

        /// Waits for this queue's turn until `until`; [`Error::Busy`] past it.
        /// The caller holds the queue's write gate, so there is one caller at
        /// a time.
        pub(crate) fn enter(&self, until: Instant) -> Result<Turn<'_>> {
            let Some(inner) = self.inner.as_deref() else {
                return Ok(Turn { turnstile: None });
            };
            let mut state = inner.lock_state();
            match *state {
                State::Idle => {
                    // No one waits in the kernel for us: try without blocking.
                    if !inner.try_lock(DOOR)? {
                        *state = State::Helping {
                            door_held: false,
                            wanted: true,
                        };
                    } else if inner.try_lock(TURN).inspect_err(|_| inner.unlock(DOOR))? {
                        inner.unlock(DOOR);
                        return Ok(Turn {
                            turnstile: Some(self),
                        });
                    } else {
                        *state = State::Helping {
                            door_held: true,
                            wanted: true,
                        };
                    }
                }
                // An earlier caller gave up; what the helper gets is ours.
                State::Helping { door_held, .. } => {
                    *state = State::Helping {
                        door_held,
                        wanted: true,
                    }
                }
                // Not while a caller can be here (see the state diagram).
                State::Granted | State::Failed | State::Closed => {}
            }
            inner.changed.notify_all();
            loop {
                match *state {
                    State::Granted => {
                        *state = State::Idle;
                        return Ok(Turn {
                            turnstile: Some(self),
                        });
                    }
                    State::Failed => {
                        *state = State::Idle;
                        return Ok(Turn { turnstile: None });
                    }
                    State::Closed => return Ok(Turn { turnstile: None }),
                    State::Idle | State::Helping { .. } => {}
                }
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    if let State::Helping { door_held, .. } = *state {
                        // The helper goes on waiting; what it gets goes to
                        // the next caller, or is let go.
                        *state = State::Helping {
                            door_held,
                            wanted: false,
                        };
                    }
                    return Err(Error::Busy);
                }
                state = sync::wait_timeout(&inner.changed, state, left);
            }
        }

        pub(super) fn release(&self) {
            if let Some(inner) = &self.inner {
                inner.unlock(TURN);
            }
        }

        /// The state, for tests.
        #[cfg(test)]
        pub(super) fn state(&self) -> Option<State> {
            self.inner.as_deref().map(|inner| *inner.lock_state())
        }
    }

    impl Drop for Turnstile {
        fn drop(&mut self) {
            let (Some(inner), Some(helper)) = (&self.inner, self.helper.take()) else {
                return;
            };
            *inner.lock_state() = State::Closed;
            inner.changed.notify_all();
            // Bounded: the helper may be blocked on another process's turn,
            // which nothing can interrupt (see the module docs).
            let deadline = Instant::now() + CLOSE_PATIENCE;
            while !helper.is_finished() {
                if Instant::now() >= deadline {
                    tracing::debug!(
                        "the turnstile's helper waits for another process's turn: \
                         left to end once it has it"
                    );
                    return;
                }
                thread::sleep(Duration::from_millis(1));
            }
            let _ = helper.join();
        }
    }

    impl Inner {
        fn lock_state(&self) -> MutexGuard<'_, State> {
            sync::lock(&self.state)
        }

        /// The helper thread: blocks in the kernel for a turn when a caller
        /// asks, and hands it over.
        fn help(&self) {
            let mut state = self.lock_state();
            loop {
                let door_held = match *state {
                    State::Closed => return,
                    State::Helping { door_held, wanted } => {
                        // The door is the helper's to let go from here on.
                        *state = State::Helping {
                            door_held: false,
                            wanted,
                        };
                        door_held
                    }
                    State::Idle | State::Granted | State::Failed => {
                        state = sync::wait(&self.changed, state);
                        continue;
                    }
                };
                drop(state);
                let got = (door_held || self.lock(DOOR)) && self.lock(TURN);
                self.unlock(DOOR);
                state = self.lock_state();
                *state = match (*state, got) {
                    (State::Helping { wanted: true, .. }, true) => State::Granted,
                    (State::Helping { wanted: true, .. }, false) => State::Failed,
                    (closed_or_unwanted, got) => {
                        if got {
                            self.unlock(TURN);
                        }
                        if closed_or_unwanted == State::Closed {
                            State::Closed
                        } else {
                            State::Idle
                        }
                    }
                };
                self.changed.notify_all();
            }
        }

        /// Takes `byte` if no other open file description holds it.
        fn try_lock(&self, byte: i64) -> Result<bool> {
            match self.fcntl(libc::F_OFD_SETLK, libc::F_WRLCK, byte) {
                Ok(()) => Ok(true),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                    Ok(false)
                }
                Err(e) => Err(Error::Database(Box::new(e))),
            }
        }

        /// Takes `byte`, waiting as long as it takes. False on an error.
        fn lock(&self, byte: i64) -> bool {
            loop {
                match self.fcntl(libc::F_OFD_SETLKW, libc::F_WRLCK, byte) {
                    Ok(()) => return true,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "the turnstile's lock failed");
                        return false;
                    }
                }
            }
        }

        fn unlock(&self, byte: i64) {
            let _ = self.fcntl(libc::F_OFD_SETLK, libc::F_UNLCK, byte);
        }

        fn fcntl(&self, command: libc::c_int, kind: libc::c_int, byte: i64) -> std::io::Result<()> {
            // SAFETY: a zeroed flock is valid (l_pid must be 0 for OFD locks);
            // the fd is open for as long as `self.file` lives.
            let mut lock: libc::flock = unsafe { std::mem::zeroed() };
            lock.l_type = kind as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            lock.l_start = byte as libc::off_t;
            lock.l_len = 1;
            let done = unsafe { libc::fcntl(self.file.as_raw_fd(), command, &mut lock) };
            if done == -1 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A queue's turnstile, and a second one on the same file standing
        /// for another process (its own open file description).
        fn two() -> (tempfile::TempDir, Turnstile, Turnstile) {
            let dir = tempfile::tempdir().expect("tempdir");
            let db = dir.path().join("q.db");
            std::fs::write(&db, b"").expect("db file");
            let ours = Turnstile::open(&db).expect("ours");
            let theirs = Turnstile::open(&db).expect("theirs");
            (dir, ours, theirs)
        }

        fn soon() -> Instant {
            Instant::now() + Duration::from_secs(5)
        }

        /// Dropping the turnstile joins its helper thread.
        #[test]
        fn closing_joins_the_idle_helper() {
            let (_dir, ours, _theirs) = two();
            drop(ours.enter(soon()).expect("a free turn"));
            let inner = Arc::downgrade(ours.inner.as_ref().expect("a turnstile"));
            drop(ours);
            // The helper held the other reference: it has ended.
            assert!(inner.upgrade().is_none());
        }

        /// A helper blocked on another process's turn keeps the close
        /// waiting CLOSE_PATIENCE at most; it ends once it gets the turn,
        /// and lets it go.
        #[test]
        fn closing_leaves_a_helper_blocked_on_another_turn_after_its_patience() {
            let (_dir, ours, theirs) = two();
            let held = theirs.enter(soon()).expect("their turn");
            let gave_up = ours
                .enter(Instant::now() + Duration::from_millis(50))
                .map(|_| ());
            assert!(matches!(gave_up, Err(Error::Busy)));
            assert!(
                matches!(ours.state(), Some(State::Helping { wanted: false, .. })),
                "{:?}",
                ours.state()
            );
            let inner = Arc::downgrade(ours.inner.as_ref().expect("a turnstile"));
            let start = Instant::now();
            drop(ours);
            let took = start.elapsed();
            assert!(took >= CLOSE_PATIENCE, "{took:?}");
            assert!(took < CLOSE_PATIENCE + Duration::from_secs(2), "{took:?}");
            assert!(inner.upgrade().is_some(), "the helper is still blocked");
            drop(held);
            let deadline = soon();
            while inner.upgrade().is_some() {
                assert!(Instant::now() < deadline, "the helper never ended");
                thread::sleep(Duration::from_millis(5));
            }
            // It let the turn go: the other one takes it at once.
            drop(
                theirs
                    .enter(Instant::now() + Duration::from_millis(500))
                    .expect("free"),
            );
        }

        /// A caller that gave up leaves the helper waiting; the next caller
        /// gets what the helper gets.
        #[test]
        fn the_next_caller_gets_the_turn_a_caller_gave_up_on() {
            let (_dir, ours, theirs) = two();
            thread::scope(|s| {
                let held = theirs.enter(soon()).expect("their turn");
                assert!(matches!(
                    ours.enter(Instant::now() + Duration::from_millis(20)),
                    Err(Error::Busy)
                ));
                s.spawn(move || {
                    thread::sleep(Duration::from_millis(50));
                    drop(held);
                });
                let turn = ours.enter(soon()).expect("the turn the helper got");
                assert!(turn.turnstile.is_some());
                assert_eq!(ours.state(), Some(State::Idle));
                // We hold the turn: the other one cannot have it.
                assert!(matches!(
                    theirs.enter(Instant::now() + Duration::from_millis(50)),
                    Err(Error::Busy)
                ));
                drop(turn);
            });
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod fallback {
    use super::*;

    /// No turnstile: writers meet in SQLite's busy handler.
    pub(crate) struct Turnstile;

    impl Turnstile {
        pub(crate) fn open(_db: &Path) -> Result<Turnstile> {
            Ok(Turnstile)
        }

        pub(crate) fn none() -> Turnstile {
            Turnstile
        }

        pub(crate) fn enter(&self, _until: Instant) -> Result<Turn<'_>> {
            Ok(Turn { turnstile: None })
        }

        pub(super) fn release(&self) {}
    }
}
