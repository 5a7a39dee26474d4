//! Maintenance, on every worker: rescue expired leases, prune history by
//! retention, compact the finished counts, delete the registry rows of
//! workers gone without a shutdown, and checkpoint the WAL when idle.
//!
//! Each step is one short, bounded transaction fenced like every other write,
//! so any number of worker processes on one file can run it at once: two
//! rescuers never both rescue a job (the second finds its lease already
//! replaced), and pruning deletes by status and age only.

use std::sync::Arc;

use crossbeam_channel::{select, tick, Receiver};

use crate::worker::Shared;

/// Expired leases handled per transaction: a batch of 500 held the write
/// lock up to 45 ms (fairness bench, rescue); 250 keeps each hold near 20 ms,
/// under the 50 ms other processes may wait for maintenance at once.
const RESCUE_BATCH: usize = 250;

/// Rescue transactions per pass at most, so a huge backlog of expired leases
/// cannot keep the write lock busy for long; between two, other writers get
/// their turns; the next pass goes on.
const RESCUE_BATCHES_PER_PASS: usize = 40;

/// Finished jobs pruned per status per pass.
const PRUNE_BATCH: usize = 500;

pub(crate) struct Maintenance {
    pub shared: Arc<Shared>,
    pub stop: Receiver<()>,
}

impl Maintenance {
    pub(crate) fn run(self) {
        let ticks = tick(self.shared.config.rescue_interval);
        loop {
            self.pass();
            select! {
                recv(self.stop) -> _ => return,
                recv(ticks) -> _ => {}
            }
        }
    }

    /// One pass. Errors are left for the next pass: each step is idempotent.
    fn pass(&self) {
        let queue = &self.shared.queue;
        for _ in 0..RESCUE_BATCHES_PER_PASS {
            let rescued = queue.rescue(RESCUE_BATCH);
            if rescued.is_ok() {
                queue.note_maintenance_write();
            }
            match rescued {
                Ok(r) if r.rescued + r.dead + r.cancelled == RESCUE_BATCH => continue,
                Ok(_) => break,
                Err(error) => {
                    warn_failed("rescuing expired leases", &error);
                    break;
                }
            }
        }
        match queue.prune_history(&self.shared.config.retention, PRUNE_BATCH) {
            Ok(_) => queue.note_maintenance_write(),
            Err(error) => warn_failed("pruning history", &error),
        }
        match queue.compact_finished_counts() {
            Ok(0) => {}
            Ok(_) => queue.note_maintenance_write(),
            Err(error) => warn_failed("compacting finished counts", &error),
        }
        match queue.prune_workers() {
            Ok(0) => {}
            Ok(_) => queue.note_maintenance_write(),
            Err(error) => warn_failed("pruning expired workers", &error),
        }
        if self.shared.inflight.is_empty() {
            if let Err(error) = queue.checkpoint() {
                warn_failed("checkpointing the WAL", &error);
            }
        }
    }
}

fn warn_failed(step: &str, error: &crate::Error) {
    tracing::warn!(
        %error,
        busy = error.is_busy(),
        "maintenance: {step} failed; the next pass tries again"
    );
}

#[cfg(test)]
mod tests {
    use crate::{NewJob, Queue};
    use serde_json::json;

    #[test]
    fn an_idle_checkpoint_copies_the_whole_wal_back() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::Error::Database(Box::new(e)))?;
        let queue = Queue::open(dir.path().join("q.db"))?;
        queue.enqueue_many((0..50).map(|n| NewJob::new("k", json!(n))))?;
        // The queue's checkpointer thread may be checkpointing at this very
        // moment (a second checkpoint then reports busy): allow it to finish.
        let mut whole = false;
        for _ in 0..100 {
            whole = queue.checkpoint()?;
            if whole {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(whole, "the idle checkpoint never copied the WAL back whole");
        Ok(())
    }

    #[test]
    fn the_change_watcher_sees_other_connections_commits_only() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::Error::Database(Box::new(e)))?;
        let queue = Queue::open(dir.path().join("q.db"))?;
        let mut watcher = queue.watch_changes(std::time::Duration::from_millis(10))?;
        assert!(!watcher.changed()?, "nothing committed yet");
        // Another process would open its own queue; a second handle has its
        // own connections just the same.
        let other = Queue::open(queue.path().expect("a SQLite queue"))?;
        other.enqueue(NewJob::new("k", json!(1)))?;
        assert!(watcher.changed()?);
        assert!(!watcher.changed()?, "reported once");
        queue.enqueue(NewJob::new("k", json!(2)))?;
        assert!(
            watcher.changed()?,
            "this process's writer is another connection too"
        );
        Ok(())
    }

    /// On Linux (inotify), macOS and Windows the watcher is woken by the
    /// operating system when another connection writes, not by a timer: an
    /// idle worker sleeps until then.
    #[cfg(all(
        feature = "file-events",
        any(target_os = "linux", target_os = "macos", windows)
    ))]
    #[test]
    fn the_change_watcher_is_woken_by_file_notifications() -> crate::Result<()> {
        use std::time::Duration;
        let dir = tempfile::tempdir().map_err(|e| crate::Error::Database(Box::new(e)))?;
        let queue = Queue::open(dir.path().join("q.db"))?;
        let mut watcher = queue.watch_changes(Duration::from_secs(3600))?;
        assert!(
            watcher.is_notified(),
            "file notifications could not be set up"
        );
        let signal = watcher.signal();
        // The writes of opening the file (migrations, then the checkpointer
        // copying them back) die down, and then nothing wakes the watcher.
        let mut quiet = false;
        for _ in 0..20 {
            if signal.recv_timeout(Duration::from_millis(300)).is_err() {
                quiet = true;
                break;
            }
        }
        assert!(quiet, "woken again and again with nothing written");
        let other = Queue::open(queue.path().expect("a SQLite queue"))?;
        while signal.try_recv().is_ok() {}
        other.enqueue(NewJob::new("k", json!(1)))?;
        // The timer would fire in an hour: this is the notification.
        assert!(signal.recv_timeout(Duration::from_secs(5)).is_ok());
        assert!(watcher.changed()?);
        Ok(())
    }
}
