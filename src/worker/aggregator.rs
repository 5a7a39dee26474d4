//! The aggregator, on a worker with a group handler: combines the groups
//! that are ready (see [`crate::group`]), each into one job, on time.
//!
//! It wakes for the same reasons as the fetcher: an enqueue in this process
//! (the doorbell: a group that just filled up), a commit by another
//! connection (another process's enqueue), the next group's deadline (a
//! grace period or max delay passing commits nothing, so it asks the
//! database when that is and sleeps until then), and the idle poll. Any
//! number of processes may run one: each combination is one transaction
//! that moves every member it takes out of its group (SQLite's single
//! writer; on a server, the group's row locked, `SKIP LOCKED` by the
//! others), so a member goes into exactly one job.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use crate::backend::ChangeWatcher;
use crate::worker::Shared;

/// Groups combined per transaction.
const BATCH: usize = 100;

/// Transactions per pass at most, so a flood of ready groups cannot hold
/// the write lock for long; the next pass goes on at once.
const BATCHES_PER_PASS: usize = 10;

pub(crate) struct Aggregator {
    pub shared: Arc<Shared>,
    pub stop: Receiver<()>,
    pub doorbell: Receiver<()>,
    pub watcher: ChangeWatcher,
}

impl Aggregator {
    pub(crate) fn run(mut self) {
        let watch = self.watcher.signal();
        let poll = self.shared.config.poll_interval;
        loop {
            let wait = match self.pass() {
                Ok(more) if more => Duration::ZERO,
                Ok(_) => self.next_ready().map_or(poll, |d| d.min(poll)),
                Err(()) => poll,
            };
            let deadline = Instant::now() + wait;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                select! {
                    recv(self.stop) -> _ => return,
                    recv(self.doorbell) -> _ => break,
                    recv(watch) -> _ => {
                        if self.watcher.changed().unwrap_or(true) {
                            break;
                        }
                    }
                    default(left) => break,
                }
            }
        }
    }

    /// Combines ready groups; `Ok(true)` when more may be ready.
    fn pass(&self) -> Result<bool, ()> {
        for _ in 0..BATCHES_PER_PASS {
            match self.shared.queue.aggregate(BATCH) {
                Ok(report) if report.jobs.len() == BATCH => continue,
                Ok(_) => return Ok(false),
                Err(error) => {
                    tracing::warn!(
                        %error,
                        busy = error.is_busy(),
                        "combining ready groups failed; trying again after the idle poll"
                    );
                    return Err(());
                }
            }
        }
        Ok(true)
    }

    /// How long until the next group is ready.
    fn next_ready(&self) -> Option<Duration> {
        match self.shared.queue.next_group_ready_in() {
            Ok(due) => due,
            Err(error) => {
                tracing::warn!(
                    %error,
                    "could not read when the next group is ready; polling instead"
                );
                None
            }
        }
    }
}
