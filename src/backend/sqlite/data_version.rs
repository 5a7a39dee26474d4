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

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rusqlite::Connection;

use super::connection::OPEN_FLAGS;
use super::queries;
use crate::error::Result;

/// A dedicated connection that reports whether the database changed since it
/// last looked, and a signal telling when to look.
pub(crate) struct DataVersion {
    conn: Connection,
    last: i64,
    /// Keeps the file notifications alive while the watcher lives.
    #[cfg(feature = "file-events")]
    _files: Option<notify::RecommendedWatcher>,
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
    /// Opens a watcher on the (existing) database at `path` that polls every
    /// `interval`.
    pub(crate) fn polling(path: &Path, interval: Duration) -> Result<Self> {
        let (conn, last) = open(path)?;
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
    pub(crate) fn open(path: &Path, interval: Duration) -> Result<Self> {
        #[cfg(feature = "file-events")]
        if let Some((files, signal)) = notifications(path) {
            let (conn, last) = open(path)?;
            return Ok(DataVersion {
                conn,
                last,
                _files: Some(files),
                signal,
                notified: true,
            });
        }
        Self::polling(path, interval)
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

fn open(path: &Path) -> Result<(Connection, i64)> {
    let conn = Connection::open_with_flags(path, OPEN_FLAGS)?;
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

/// Watches the directory of `path` (the `-wal` file comes and goes with the
/// last connection) and signals, coalesced, when its `-wal` or main file is
/// written. `None` when the platform or filesystem cannot.
#[cfg(feature = "file-events")]
fn notifications(path: &Path) -> Option<(notify::RecommendedWatcher, Receiver<Instant>)> {
    use notify::{EventKind, RecursiveMode, Watcher};

    let path = path.canonicalize().ok()?;
    let dir = path.parent()?.to_path_buf();
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let wal = std::path::PathBuf::from(wal);
    let (tx, rx) = crossbeam_channel::bounded(1);
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
            // Full means a wake-up is pending already.
            let _ = tx.try_send(Instant::now());
        }
    })
    .ok()?;
    watcher.watch(&dir, RecursiveMode::NonRecursive).ok()?;
    Some((watcher, rx))
}
