//! The heartbeater: extends the leases of every job this worker holds, in one
//! statement per tick, and sets the cancellation flag of jobs whose lease was
//! lost or whose cancellation was requested. It also watches job timeouts,
//! waking at the earliest deadline to set that job's flag. Each tick also
//! refreshes the worker's row in the worker registry and looks for due jobs
//! no live worker handles; on stop it deregisters the worker.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{after, select, Receiver};

use crate::events::Event;
use crate::worker::context::CancelReason;
use crate::worker::registry::Registration;
use crate::worker::Shared;

/// After a failed heartbeat, the next try comes this much sooner than a tick.
const RETRY_DIVISOR: u32 = 4;

pub(crate) struct Heartbeater {
    pub shared: Arc<Shared>,
    pub stop: Receiver<()>,
    /// Rung when a job with a deadline starts.
    pub deadline_set: Receiver<()>,
    /// The worker's row in the registry, registered before this thread
    /// started.
    pub registration: Registration,
}

impl Heartbeater {
    pub(crate) fn run(mut self) {
        let interval = self.shared.config.heartbeat_interval;
        let mut next_beat = Instant::now() + interval;
        loop {
            let now = Instant::now();
            let next_deadline = self.shared.inflight.check_deadlines(now);
            if now >= next_beat {
                next_beat = now + self.beat().map_or(interval / RETRY_DIVISOR, |()| interval);
                self.registration.beat(&self.shared.queue);
                self.registration.check_unhandled(&self.shared.queue);
            }
            let wake = next_deadline.map_or(next_beat, |d| d.min(next_beat));
            select! {
                recv(self.stop) -> _ => {
                    // Stopped after the completer flushed: nothing is held.
                    self.registration.deregister(&self.shared.queue);
                    return;
                }
                recv(self.deadline_set) -> _ => {}
                recv(after(wake.saturating_duration_since(Instant::now()))) -> _ => {}
            }
        }
    }

    /// One heartbeat for every lease held. `Err` when the database refused.
    fn beat(&self) -> Result<(), ()> {
        let shared = &self.shared;
        let leases = shared.inflight.leases();
        if leases.is_empty() {
            return Ok(());
        }
        // Progress rides along with the beat: one more short transaction,
        // only when a handler reported some since the last one.
        shared.inflight.write_progress(&shared.queue, None, false);
        let report = shared
            .queue
            .heartbeat(&leases, shared.config.lease_ttl)
            .map_err(|error| {
                tracing::warn!(
                    %error,
                    busy = error.is_busy(),
                    jobs = leases.len(),
                    retry_in = ?shared.config.heartbeat_interval / RETRY_DIVISOR,
                    "heartbeat failed; retrying sooner"
                );
            })?;
        failpoint!("heartbeat");
        let news = shared
            .inflight
            .lose_unsettled(&report.lost, |lease| shared.queue.take_settled_in(lease));
        for job_id in &news {
            tracing::warn!(
                job_id,
                "lease lost: the heartbeat found the job no longer held by this worker \
                 (its lease expired and it was rescued, or it was deleted); its handler \
                 is told to stop"
            );
        }
        shared
            .queue
            .emit(news.into_iter().map(|job_id| Event::LeaseLost { job_id }));
        shared
            .inflight
            .cancel(&report.cancel_requested, CancelReason::CancelRequested);
        Ok(())
    }
}
