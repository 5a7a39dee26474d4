//! The completer: applies handlers' outcomes in batches, one transaction per
//! batch (group commit), flushed when the batch is full or a short delay after
//! its first outcome.
//!
//! A batch whose transaction fails is retried a few times; if it still fails
//! its jobs are forgotten here and their leases expire, so the rescuer makes
//! them available again: at-least-once holds without the completer.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::events::Event;
use crate::lease::Job;
use crate::outcome::Outcome;
use crate::worker::Shared;

/// A message to the completer.
pub(crate) enum Settle {
    /// Apply this outcome to this leased job.
    Apply(Arc<Job>, Outcome),
    /// Flush what came before and stop.
    Stop,
}

/// How often a failed batch is tried again before it is left to the rescuer.
const ATTEMPTS: u32 = 3;

pub(crate) struct Completer {
    pub shared: Arc<Shared>,
    pub outcomes: Receiver<Settle>,
}

impl Completer {
    pub(crate) fn run(self) {
        let size = self.shared.config.completer_batch;
        let delay = self.shared.config.completer_delay;
        let mut batch: Vec<(Arc<Job>, Outcome)> = Vec::with_capacity(size);
        loop {
            let mut stop = match self.outcomes.recv() {
                Ok(Settle::Apply(job, outcome)) => {
                    batch.push((job, outcome));
                    false
                }
                Ok(Settle::Stop) | Err(_) => true,
            };
            let flush_at = Instant::now() + delay;
            while !stop && batch.len() < size {
                match self.outcomes.recv_deadline(flush_at) {
                    Ok(Settle::Apply(job, outcome)) => batch.push((job, outcome)),
                    Ok(Settle::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
                    Err(RecvTimeoutError::Timeout) => break,
                }
            }
            if !batch.is_empty() {
                self.flush(&mut batch);
            }
            if stop {
                return;
            }
        }
    }

    fn flush(&self, batch: &mut Vec<(Arc<Job>, Outcome)>) {
        let queue = &self.shared.queue;
        let mut wait = Duration::from_millis(50);
        for attempt in 1..=ATTEMPTS {
            let items = batch.iter().map(|(job, o)| (job.as_ref(), o.clone()));
            match queue.settle_many(items) {
                Ok(results) => {
                    failpoint!("completer-after-commit");
                    let lost: Vec<_> = batch
                        .iter()
                        .zip(&results)
                        .filter(|(_, r)| matches!(r, Err(e) if e.is_lease_lost()))
                        .map(|((job, _), _)| job.lease())
                        .collect();
                    let news = self.shared.inflight.lose(&lost);
                    queue.emit(news.into_iter().map(|job_id| Event::LeaseLost { job_id }));
                    break;
                }
                Err(_) if attempt < ATTEMPTS => {
                    thread::sleep(wait);
                    wait *= 2;
                }
                Err(_) => {} // left to lease expiry and the rescuer
            }
        }
        self.shared
            .inflight
            .remove(batch.drain(..).map(|(job, _)| job.id));
    }
}
