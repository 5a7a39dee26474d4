//! The checkpointer: copies the WAL back into the database from a thread of
//! its own, so that no commit pays for it.
//!
//! SQLite's automatic checkpoint runs inside whichever commit pushes the WAL
//! past 1000 pages: that commit waits for the copy and an fsync of the
//! database file. On the open-loop benchmark those inline checkpoints were the
//! p99 of enqueue→handler start (a raw loop: 1.9–2.3 ms with them, 0.45 ms
//! without; BENCHMARKS.md). So a queue's connections turn them off
//! (`wal_autocheckpoint = 0`, set and read back with the other pragmas) and
//! this thread, on a connection of its own, checkpoints when the write gate
//! nudges it (every few commits).
//!
//! Each nudge runs a passive checkpoint, which copies what it can while this
//! process's writers go on. Once the log holds the threshold's worth of
//! frames, a second passive checkpoint runs holding the write gate: it copies
//! only what was appended meanwhile, and a log copied back whole is restarted
//! by the next writer. A passive checkpoint alone never catches up with a
//! steady stream of commits, and the log would grow without bound. Passive
//! checkpoints never wait on other connections, so other processes on the
//! file are safe.
//!
//! The gate is first come, first served, so the wait for it is one commit
//! and little is appended meanwhile. (Running more passive checkpoints
//! first, to leave less for the gated one, was tried: in the 8-process storm
//! the checkpoint lock was then never free for another process's truncating
//! checkpoint, and the WAL grew to 351 MiB.)

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use rusqlite::Connection;

use super::connection::{note_hold, Gate};
use super::wal;
use crate::error::{Error, Result};

/// SQLite's own auto-checkpoint threshold: 1000 frames in the log.
const CHECKPOINT_FRAMES: i64 = 1000;

/// How long the thread waits for the write gate before leaving the catch-up
/// to the next nudge.
const GATE_PATIENCE: Duration = Duration::from_millis(100);

/// The checkpoint thread of one queue. Dropping it stops the thread.
pub(crate) struct Checkpointer {
    nudge: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread on `conn`, a connection with the queue's pragmas;
    /// `gate` is the queue's write gate; the longest hold of it is noted in
    /// `longest_hold` (µs).
    pub(crate) fn start(
        conn: Connection,
        gate: Arc<Gate>,
        stats: Arc<wal::CheckpointStats>,
        longest_hold: Arc<AtomicU64>,
    ) -> Result<Self> {
        let (nudge, nudges) = bounded::<()>(1);
        let thread = thread::Builder::new()
            .name("backlog-checkpoint".into())
            .spawn(move || {
                // Best effort: a checkpoint that fails, or that another
                // connection kept from finishing, is tried again at the next nudge.
                for () in nudges.iter() {
                    let Ok(done) = stats.record(wal::checkpoint(&conn)) else {
                        continue;
                    };
                    if done.log_frames < CHECKPOINT_FRAMES {
                        continue;
                    }
                    let Ok(_gate) = gate.enter(Instant::now() + GATE_PATIENCE) else {
                        continue;
                    };
                    let began = Instant::now();
                    let _ = stats.record(wal::checkpoint(&conn));
                    note_hold(&longest_hold, began.elapsed());
                }
            })
            .map_err(|e| Error::Database(Box::new(e)))?;
        Ok(Checkpointer {
            nudge: Some(nudge),
            thread: Some(thread),
        })
    }

    /// Asks the thread to look at the WAL's size; never blocks.
    pub(crate) fn nudge(&self) {
        if let Some(nudge) = &self.nudge {
            let _ = nudge.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.nudge.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sqlite::Connections;
    use crate::options::QueueOptions;

    /// With SQLite's inline checkpoints off, the checkpointer alone must keep
    /// a busy writer's WAL near the threshold.
    #[test]
    fn the_wal_is_checkpointed_off_the_commit_path() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let path = dir.path().join("q.db");
        let db = Connections::open(&path, &QueueOptions::default())?;
        let autocheckpoint: i64 =
            db.read(|c| Ok(c.pragma_query_value(None, "wal_autocheckpoint", |r| r.get(0))?))?;
        assert_eq!(autocheckpoint, 0, "inline checkpoints are off");
        db.write(|tx| Ok(tx.execute_batch("CREATE TABLE blobs (b BLOB NOT NULL)")?))?;

        let wal = path.with_extension("db-wal");
        let mut wal_max = 0;
        // 3000 commits of two pages each: about 24 MiB of WAL unchecked.
        for _ in 0..3000 {
            db.write(|tx| Ok(tx.execute("INSERT INTO blobs VALUES (zeroblob(4096))", [])?))?;
            wal_max = wal_max.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        let threshold = CHECKPOINT_FRAMES as u64 * 4096;
        assert!(wal_max < 3 * threshold, "the WAL grew to {wal_max} bytes");
        Ok(())
    }
}
