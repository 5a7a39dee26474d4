//! Keeping the write-ahead log small.
//!
//! The checkpointer thread ([`super::checkpointer`]) copies the WAL back as
//! commits grow it; a worker also checkpoints when it is idle, so a quiet
//! queue's WAL is copied back whole and, through `journal_size_limit`,
//! truncated when the next writer restarts it.
//!
//! Those checkpoints are passive: they copy back only frames no reader still
//! needs, and the log restarts only once it was copied back whole. Readers
//! that hold snapshots back to back (another process reporting in a loop)
//! keep that from ever happening, and the log grows without bound. So the
//! write gate looks at the log's size now and then, and past the limit runs
//! checkpoints that wait for readers to move on ([`truncate`]).

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::queries;
use crate::error::Result;

/// How long one try of a truncating checkpoint waits on other connections.
const TRUNCATE_TRY: Duration = Duration::from_millis(20);

/// What one checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// True when another connection's lock kept it from finishing.
    pub busy: bool,
    /// Frames in the WAL.
    pub log_frames: i64,
    /// Frames copied back into the database.
    pub checkpointed_frames: i64,
}

/// How this queue's checkpoints ended, for the metrics.
#[derive(Debug, Default)]
pub(crate) struct CheckpointStats {
    /// The whole log was copied back.
    pub complete: std::sync::atomic::AtomicU64,
    /// Other connections' readers or writers kept part of it in the log.
    pub partial: std::sync::atomic::AtomicU64,
    /// The checkpoint failed (an I/O error, a full disk).
    pub failed: std::sync::atomic::AtomicU64,
}

impl CheckpointStats {
    /// Counts one checkpoint's result, and hands it back.
    pub(crate) fn record(&self, result: Result<Checkpoint>) -> Result<Checkpoint> {
        use std::sync::atomic::Ordering::Relaxed;
        match &result {
            Ok(done) if !done.busy && done.checkpointed_frames >= done.log_frames => {
                self.complete.fetch_add(1, Relaxed)
            }
            Ok(_) => self.partial.fetch_add(1, Relaxed),
            Err(_) => self.failed.fetch_add(1, Relaxed),
        };
        result
    }
}

/// Runs a passive checkpoint on `conn` (outside any transaction): it never
/// waits on other connections, so it is safe with several processes.
pub(crate) fn checkpoint(conn: &Connection) -> Result<Checkpoint> {
    run(conn, queries::WAL_CHECKPOINT)
}

/// The size of the log at `wal` when it is larger than `limit` bytes.
pub(crate) fn over_limit(wal: &Path, limit: u64) -> Option<u64> {
    match std::fs::metadata(wal) {
        Ok(meta) if meta.len() > limit => Some(meta.len()),
        _ => None,
    }
}

/// Checkpoints the log whole and truncates it, in tries each waiting at most
/// [`TRUNCATE_TRY`] for other connections' readers to leave old snapshots
/// (new writers wait meanwhile), for up to `patience`.
pub(crate) fn truncate(conn: &Connection, patience: Duration) -> Result<Checkpoint> {
    // Short tries, not one long wait: a checkpoint keeps waiting for the
    // reader of a snapshot mark it first saw as old, even after that reader
    // moved the mark to the latest frame; a fresh try sees the move.
    let busy_ms: u32 = conn.pragma_query_value(None, "busy_timeout", |r| r.get(0))?;
    conn.busy_timeout(TRUNCATE_TRY)?;
    let start = Instant::now();
    let done = loop {
        match run(conn, queries::WAL_CHECKPOINT_TRUNCATE) {
            Ok(c) if c.busy && start.elapsed() < patience => continue,
            done => break done,
        }
    };
    conn.busy_timeout(Duration::from_millis(busy_ms.into()))?;
    done
}

fn run(conn: &Connection, sql: &str) -> Result<Checkpoint> {
    Ok(conn.query_row(sql, [], |r| {
        Ok(Checkpoint {
            busy: r.get::<_, i64>(0)? != 0,
            log_frames: r.get(1)?,
            checkpointed_frames: r.get(2)?,
        })
    })?)
}
