//! The checkpointer: copies the WAL back into the database, and starts it
//! again from its beginning, from a thread of its own, so that no commit pays
//! for it and no maintenance holds the write lock for long.
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
//! Each nudge runs a passive checkpoint, which copies what it can while every
//! writer goes on. A passive checkpoint alone never catches up with a steady
//! stream of commits, and a log is only started again once it was copied
//! back whole. So once the log holds the threshold's worth of frames, or its
//! file is over its bound, the thread takes the write gate and this queue's
//! turn at the file (no backlog writer of any process appends meanwhile) and
//! runs a `RESTART` checkpoint: it copies what was appended since the passive
//! one (little: the gate is first come, first served), and makes the next
//! writer start the log from its beginning (`TRUNCATE` when the file is over
//! its bound, which also empties it).
//!
//! Readers of snapshots older than the last frame keep a log from being
//! started again. The restart waits for them for [`RESTART_PATIENCE`] at
//! most, then gives up, and the next try comes after a pause that doubles up
//! to [`RETRY_MAX`]: a reader with short snapshots back to back is outwaited
//! in a try or two, and one that defeats every try (long snapshots back to
//! back, a backup) costs one short hold per pause. Only a log past its bound
//! gets a long try ([`TRUNCATE_PATIENCE`], at most every
//! [`TRUNCATE_BACKOFF`]): the log's size comes first. Before, a commit that
//! found the log past its bound truncated it holding the write lock,
//! waiting up to a second for readers: the longest maintenance hold.
//!
//! Writers that run far ahead of the checkpointer wait for its next pass,
//! holding nothing ([`Checkpointer::pace`]), so that what a restart copies
//! under the gate stays small.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use rusqlite::Connection;

use super::gate::{note_hold, Gate};
use super::turnstile::Turnstile;
use crate::backend::sqlite::wal;
use crate::error::{Error, Result};
use crate::sync;

/// SQLite's own auto-checkpoint threshold: 1000 frames in the log.
const CHECKPOINT_FRAMES: i64 = 1000;

/// How long the thread waits for the write gate and the turn before leaving
/// the restart to the next nudge.
const GATE_PATIENCE: Duration = Duration::from_millis(100);

/// How long one restart waits for readers of old snapshots, holding the
/// write gate and the turn.
pub(crate) const RESTART_PATIENCE: Duration = Duration::from_millis(30);

/// How long a try to empty a log over its bound waits for readers of old
/// snapshots: a reader that holds snapshots back to back, each longer than
/// [`RESTART_PATIENCE`], is only outwaited by a longer hold, and past the
/// bound the log's size comes first.
pub(crate) const TRUNCATE_PATIENCE: Duration = Duration::from_secs(1);

/// After a long try failed, how long until the next.
const TRUNCATE_BACKOFF: Duration = Duration::from_secs(30);

/// The pause after a restart that readers kept from happening; it doubles
/// after each one, up to [`RETRY_MAX`]. Short tries fail only against a
/// reader whose snapshots outlast them, back to back, and would fail again:
/// in the 8-process busy storm (200 ms readers), pauses from 100 ms
/// doubling to 1 s cost a quarter of the throughput (287 → 209 enqueues/s),
/// to 5 s still 219–224/s against 259/s with a first pause of 5 s (40 s
/// runs). A log past its bound does not wait for this pause: the long try
/// keeps it bounded.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest pause between two short tries.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How many commits a writer may run ahead of what the checkpointer's last
/// pass copied back before it waits for the next pass ([`Checkpointer::pace`]).
const PACE_COMMITS: u64 = 256;

/// The longest a write waits for the checkpointer.
const PACE_MAX_WAIT: Duration = Duration::from_millis(100);

/// What the checkpointer thread works with.
pub(crate) struct Parts {
    /// A connection with the queue's pragmas, for checkpoints only.
    pub conn: Connection,
    /// The database's WAL file.
    pub wal: PathBuf,
    /// Past this size (bytes) the WAL file is emptied, not only restarted.
    pub wal_limit: Arc<AtomicU64>,
    pub gate: Arc<Gate>,
    pub turnstile: Arc<Turnstile>,
    pub stats: Arc<wal::CheckpointStats>,
    /// The longest maintenance hold (µs), where the restarts are counted.
    pub longest_hold: Arc<AtomicU64>,
    /// The queue's count of commits.
    pub commits: Arc<AtomicU64>,
}

/// The checkpoint thread of one queue. Dropping it stops the thread.
pub(crate) struct Checkpointer {
    nudge: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    passes: Arc<Passes>,
}

/// How far the checkpointer's passes got, for the writers it paces.
#[derive(Default)]
struct Passes {
    /// The queue's commit count when the last finished pass began: what
    /// was committed before it is copied back, readers allowing.
    copied_through: Mutex<u64>,
    passed: Condvar,
}

impl Checkpointer {
    /// Starts the thread.
    pub(crate) fn start(parts: Parts) -> Result<Self> {
        let (nudge, nudges) = bounded::<()>(1);
        let passes = Arc::new(Passes::default());
        let progress = passes.clone();
        let thread = thread::Builder::new()
            .name("backlog-checkpoint".into())
            .spawn(move || {
                let mut retry = Retry::default();
                // Best effort: a checkpoint that fails, or that another
                // connection kept from finishing, is tried again later.
                for () in nudges.iter() {
                    parts.on_nudge(&mut retry, &progress);
                }
            })
            .map_err(|e| Error::Database(Box::new(e)))?;
        Ok(Checkpointer {
            nudge: Some(nudge),
            thread: Some(thread),
            passes,
        })
    }

    /// Before a write that `commits` would follow: when the writers of this
    /// process ran more than [`PACE_COMMITS`] commits ahead of the
    /// checkpointer's last pass, waits for its next pass, until `until` or
    /// [`PACE_MAX_WAIT`] at most. Holds nothing meanwhile.
    ///
    /// A writer faster than the disk (flat out at `Durability::Fast`) would
    /// otherwise leave the checkpointer ever further behind, and its catch-up,
    /// made holding the write gate, ever longer: paced, the catch-up copies
    /// a few hundred commits' frames at most. A pass that readers keep from
    /// copying everything still counts: readers slow no writer here.
    pub(crate) fn pace(&self, commits: u64, until: Instant) {
        let until = until.min(Instant::now() + PACE_MAX_WAIT);
        let mut through = sync::lock(&self.passes.copied_through);
        while commits.saturating_sub(*through) > PACE_COMMITS {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.nudge();
            through = sync::wait_timeout(&self.passes.passed, through, left);
        }
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

/// When to try the next restart after some failed.
#[derive(Default)]
struct Retry {
    not_before: Option<Instant>,
    pause: Duration,
    /// A warning was logged for this run of failures.
    warned: bool,
    /// When a log over its bound may be waited for long again.
    long_not_before: Option<Instant>,
}

impl Parts {
    fn on_nudge(&self, retry: &mut Retry, passes: &Passes) {
        let began_at = self.commits.load(Ordering::Relaxed);
        let done = self.stats.record(wal::checkpoint(&self.conn));
        {
            let mut through = sync::lock(&passes.copied_through);
            *through = (*through).max(began_at);
        }
        passes.passed.notify_all();
        let Ok(done) = done else {
            return;
        };
        let limit = self.wal_limit.load(Ordering::Relaxed);
        let over = wal::over_limit(&self.wal, limit);
        if done.log_frames < CHECKPOINT_FRAMES && over.is_none() {
            return;
        }
        let now = Instant::now();
        // A log past its bound is not kept waiting by the short tries' pause.
        let long = over.is_some() && retry.long_not_before.is_none_or(|t| now >= t);
        if !long && retry.not_before.is_some_and(|t| now < t) {
            return;
        }
        let until = now + GATE_PATIENCE;
        let Ok(gate) = self.gate.enter(until) else {
            return;
        };
        let Ok(turn) = self.turnstile.enter(until) else {
            return;
        };
        let patience = if long {
            TRUNCATE_PATIENCE
        } else {
            RESTART_PATIENCE
        };
        let began = Instant::now();
        let restarted = self
            .stats
            .record(wal::restart(&self.conn, patience, over.is_some()));
        note_hold(&self.longest_hold, began.elapsed());
        drop(turn);
        drop(gate);
        match restarted {
            Ok(c) if !c.busy => {
                if retry.warned {
                    tracing::info!("the WAL was copied back and started again");
                }
                retry.warned = false;
                // A long try outwaits readers that defeat short ones: after
                // it, short tries keep their pause (each would fail again,
                // holding the lock; in the busy storm, resetting it here
                // cost 13 % of the throughput).
                if !long {
                    retry.not_before = None;
                    retry.pause = Duration::ZERO;
                }
            }
            failed => {
                if !retry.warned {
                    retry.warned = true;
                    match (&failed, over) {
                        (Err(error), _) => {
                            tracing::warn!(%error, "checkpointing the WAL failed; trying again")
                        }
                        (Ok(_), Some(bytes)) => tracing::warn!(
                            wal = %self.wal.display(),
                            bytes,
                            limit,
                            "the WAL is over its bound: a reader kept an old snapshot \
                             through every try to empty it; trying again"
                        ),
                        (Ok(_), None) => {}
                    }
                }
                if long {
                    retry.long_not_before = Some(Instant::now() + TRUNCATE_BACKOFF);
                }
                retry.pause = (retry.pause * 2).clamp(RETRY_FIRST, RETRY_MAX);
                retry.not_before = Some(Instant::now() + retry.pause);
            }
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
