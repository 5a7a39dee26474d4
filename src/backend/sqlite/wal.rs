//! Keeping the write-ahead log small.
//!
//! The checkpointer thread (`write_path/checkpointer.rs`) copies the WAL back as
//! commits grow it, and starts it again from its beginning ([`restart`]);
//! a worker also checkpoints when it is idle, so a quiet queue's WAL is
//! copied back whole and, through `journal_size_limit`, truncated when the
//! next writer starts it again.
//!
//! Passive checkpoints copy back only frames no reader still needs, and
//! never wait. Starting the log again needs every frame copied back and no
//! reader left on an older snapshot: [`restart`] waits for that, briefly.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::queries;
use crate::error::Result;

/// How long one try of a restarting checkpoint waits on other connections.
const RESTART_TRY: Duration = Duration::from_millis(20);

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

/// Copies the log back whole and has the next writer start it from its
/// beginning (`truncate`: empties its file too), in tries each waiting at
/// most [`RESTART_TRY`] for another connection's write to end and for
/// readers to leave old snapshots (new writers wait meanwhile), for up to
/// `patience` in all. `busy` when they were not done by then.
pub(crate) fn restart(conn: &Connection, patience: Duration, truncate: bool) -> Result<Checkpoint> {
    // Short tries, not one long wait: a checkpoint keeps waiting for the
    // reader of a snapshot mark it first saw as old, even after that reader
    // moved the mark to the latest frame; a fresh try sees the move.
    let sql = if truncate {
        queries::WAL_CHECKPOINT_TRUNCATE
    } else {
        queries::WAL_CHECKPOINT_RESTART
    };
    let busy_ms: u32 = conn.pragma_query_value(None, "busy_timeout", |r| r.get(0))?;
    // SQLite's own busy handler sleeps up to 100 ms at a time: a reader's
    // end would be seen late, and the write lock held that much longer.
    conn.busy_handler(Some(poll_briefly))?;
    let until = Instant::now() + patience;
    let done = loop {
        let left = until.saturating_duration_since(Instant::now());
        TRY_UNTIL.set(Some(Instant::now() + left.min(RESTART_TRY)));
        match run(conn, sql) {
            Ok(c) if c.busy && !left.is_zero() => continue,
            done => break done,
        }
    };
    TRY_UNTIL.set(None);
    conn.busy_timeout(Duration::from_millis(busy_ms.into()))?;
    done
}

thread_local! {
    /// When the current try of [`restart`] on this thread gives up.
    static TRY_UNTIL: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// A busy handler that looks again every millisecond until the try's end.
fn poll_briefly(_count: i32) -> bool {
    match TRY_UNTIL.get() {
        Some(until) if Instant::now() < until => {
            std::thread::sleep(Duration::from_millis(1));
            true
        }
        _ => false,
    }
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
