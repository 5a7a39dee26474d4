//! Noticing other connections' commits: `PRAGMA data_version`, woken by the
//! operating system's file notifications where it has them.
//!
//! The pragma reads a counter from the WAL index in shared memory: no table is
//! touched, so checking it costs next to nothing. It changes when any *other*
//! connection commits, including the write connection of this process, so the
//! watcher keeps a connection of its own.
//!
//! When to check: with the `file-events` feature (on by default), a commit
//! appends to the `-wal` file, the operating system reports the write
//! (inotify on Linux, kqueue on the BSDs, FSEvents on macOS,
//! ReadDirectoryChangesW on Windows) and the watcher checks then: an idle
//! worker wakes only for writes. Where notifications cannot be set up (the
//! feature off, a filesystem without them, an exhausted inotify limit) it
//! checks every watch interval instead.
//!
//! A commit's write to the `-wal` file is reported before the commit is
//! visible (it becomes visible after the fsync, in the shared-memory index,
//! which reports nothing): the watcher that looks at once may see nothing
//! new. So after the last write it is told to look again a few times, at
//! growing delays ([`RECHECKS`]), lest the last commit of a burst wait for
//! the idle poll.

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rusqlite::Connection;

use super::connection::{open_keyed, OPEN_FLAGS};
use super::queries;
use crate::error::Result;
use crate::options::SqliteKey;

/// A dedicated connection that reports whether the database changed since it
/// last looked, and a signal telling when to look.
pub(crate) struct DataVersion {
    conn: Connection,
    last: i64,
    /// Keeps the file notifications alive while the watcher lives.
    #[cfg(feature = "file-events")]
    _files: Option<Files>,
    signal: Receiver<Instant>,
    notified: bool,
}

impl std::fmt::Debug for DataVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataVersion")
            .field("last", &self.last)
            .field("notified", &self.notified)
            .finish_non_exhaustive()
    }
}

impl DataVersion {
    /// Opens a watcher on the (existing) database at `path`, with its `key`,
    /// that polls every `interval`.
    pub(crate) fn polling(
        path: &Path,
        key: Option<&SqliteKey>,
        interval: Duration,
    ) -> Result<Self> {
        let (conn, last) = open(path, key)?;
        Ok(DataVersion {
            conn,
            last,
            #[cfg(feature = "file-events")]
            _files: None,
            signal: crossbeam_channel::tick(interval),
            notified: false,
        })
    }

    /// Opens a watcher woken by file notifications, or polling every
    /// `interval` where they are not available.
    pub(crate) fn open(path: &Path, key: Option<&SqliteKey>, interval: Duration) -> Result<Self> {
        #[cfg(feature = "file-events")]
        if let Some((files, signal)) = notifications(path) {
            let (conn, last) = open(path, key)?;
            return Ok(DataVersion {
                conn,
                last,
                _files: Some(files),
                signal,
                notified: true,
            });
        }
        Self::polling(path, key, interval)
    }

    /// Fires when it is time to call [`DataVersion::changed`].
    pub(crate) fn signal(&self) -> Receiver<Instant> {
        self.signal.clone()
    }

    /// True when woken by file notifications rather than a timer.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_notified(&self) -> bool {
        self.notified
    }

    /// True when another connection committed since the last call.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        let now = read(&self.conn)?;
        let changed = now != self.last;
        self.last = now;
        Ok(changed)
    }
}

fn open(path: &Path, key: Option<&SqliteKey>) -> Result<(Connection, i64)> {
    let conn = open_keyed(path, OPEN_FLAGS, key)?;
    // A read only waits while another connection recovers the WAL.
    conn.busy_timeout(Duration::from_millis(100))?;
    let last = read(&conn)?;
    Ok((conn, last))
}

fn read(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached(queries::DATA_VERSION)?
        .query_row([], |r| r.get(0))?)
}

/// After the last write reported, the watcher is told to look again after
/// each of these delays (from that write): a commit is visible only once its
/// fsync is done. Each look is one read of a shared-memory counter.
#[cfg(feature = "file-events")]
const RECHECKS: [Duration; 4] = [
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(25),
    Duration::from_millis(125),
];

/// The file notifications and the thread (`backlog-files`) that turns them
/// into signals with their follow-ups; the thread is joined on drop.
#[cfg(feature = "file-events")]
struct Files {
    _watcher: notify::RecommendedWatcher,
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "file-events")]
impl Drop for Files {
    /// Returns within a moment: the thread waits on nothing but channels.
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Forwards each write to `signal` at once, then again after each of
/// [`RECHECKS`] unless another write comes first; returns when `stop` is
/// dropped.
#[cfg(feature = "file-events")]
fn forward(writes: Receiver<()>, stop: Receiver<()>, signal: &crossbeam_channel::Sender<Instant>) {
    let mut last_write: Option<Instant> = None;
    let mut next = 0;
    loop {
        let recheck = last_write.and_then(|at| RECHECKS.get(next).map(|d| at + *d));
        let timeout = match recheck {
            Some(at) => crossbeam_channel::at(at),
            None => crossbeam_channel::never(),
        };
        crossbeam_channel::select! {
            recv(stop) -> _ => return,
            recv(writes) -> write => {
                if write.is_err() {
                    return;
                }
                last_write = Some(Instant::now());
                next = 0;
            }
            recv(timeout) -> _ => next += 1,
        }
        // Full means a wake-up is pending already.
        let _ = signal.try_send(Instant::now());
    }
}

/// Watches the directory of `path` (the `-wal` file comes and goes with the
/// last connection) and signals, coalesced, when its `-wal` or main file is
/// written, and again shortly after (see [`RECHECKS`]). `None` when the
/// platform or filesystem cannot.
#[cfg(feature = "file-events")]
fn notifications(path: &Path) -> Option<(Files, Receiver<Instant>)> {
    use notify::{EventKind, RecursiveMode, Watcher};

    let path = path.canonicalize().ok()?;
    let dir = path.parent()?.to_path_buf();
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let wal = std::path::PathBuf::from(wal);
    let (tx, writes) = crossbeam_channel::bounded(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let wanted = match &event {
            Ok(e) => {
                matches!(e.kind, EventKind::Modify(_) | EventKind::Create(_))
                    && e.paths.iter().any(|p| *p == wal || *p == path)
            }
            // A lost event (an overflowing queue): look, to be safe.
            Err(_) => true,
        };
        if wanted {
            // Full means the forwarder has one to read already.
            let _ = tx.try_send(());
        }
    })
    .ok()?;
    watcher.watch(&dir, RecursiveMode::NonRecursive).ok()?;
    let (signal, rx) = crossbeam_channel::bounded(1);
    let (stop, stopped) = crossbeam_channel::bounded(0);
    let thread = std::thread::Builder::new()
        .name("backlog-files".into())
        .spawn(move || forward(writes, stopped, &signal))
        .ok()?;
    let files = Files {
        _watcher: watcher,
        stop: Some(stop),
        thread: Some(thread),
    };
    Some((files, rx))
}
