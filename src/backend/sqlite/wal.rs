//! Keeping the write-ahead log small.
//!
//! SQLite checkpoints on its own once the WAL passes 1000 pages, but only from
//! a committing writer; a worker also checkpoints when it is idle, so a quiet
//! queue's WAL is copied back and, through `journal_size_limit`, truncated
//! when the next writer restarts it.

use rusqlite::Connection;

use super::queries;
use crate::error::Result;

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

/// Runs a passive checkpoint on `conn` (outside any transaction): it never
/// waits on other connections, so it is safe with several processes.
pub(crate) fn checkpoint(conn: &Connection) -> Result<Checkpoint> {
    Ok(conn.query_row(queries::WAL_CHECKPOINT, [], |r| {
        Ok(Checkpoint {
            busy: r.get::<_, i64>(0)? != 0,
            log_frames: r.get(1)?,
            checkpointed_frames: r.get(2)?,
        })
    })?)
}
