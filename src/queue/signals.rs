//! What the queue tells its workers and subscribers: lifecycle events,
//! wake-ups (the doorbell, other processes' commits, the next due job),
//! idle checkpoints, and which leases were settled inside a caller's
//! transaction.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::Result;
use crate::events::Event;
use crate::lease::Lease;
use crate::sync;

use super::Queue;

impl Queue {
    /// Subscribes to the lifecycle events of jobs handled through this queue
    /// (and its clones) in this process, from now on. Drop the receiver to
    /// unsubscribe. A subscription holds at most
    /// [`QueueOptions::event_capacity`](crate::QueueOptions::event_capacity)
    /// unread events (4096 by default): the queue never waits for it, and a
    /// subscriber that fell behind receives
    /// [`Event::Lagged`] with the number of events it missed.
    pub fn subscribe(&self) -> crossbeam_channel::Receiver<Event> {
        self.inner.bus.subscribe()
    }

    /// How long until the next job of `queues` that is not due yet comes due
    /// (delayed, retrying or snoozed, written by any process), or the next
    /// rate window of a rate-limited one of them opens, whichever is first;
    /// `None` when neither. The fetcher sleeps until then.
    pub(crate) fn next_due_in(&self, queues: &[String]) -> Result<Option<Duration>> {
        let now = self.now_micros();
        let due = self.store().next_due(queues, now)?;
        let window = crate::limits::next_window_in(
            self.all_limits()?
                .iter()
                .filter(|(q, _)| queues.contains(q))
                .map(|(_, limits)| limits),
            now,
        );
        let first = match (due, window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(first.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// A coalescing wake-up that fires when this process enqueues a job.
    pub(crate) fn doorbell(&self) -> crossbeam_channel::Receiver<()> {
        self.inner.bus.doorbell()
    }

    /// A watcher that notices commits by other connections to this database
    /// (the worker's cross-process wake-up), woken by file notifications
    /// where it can be, else checked every `interval`.
    pub(crate) fn watch_changes(
        &self,
        interval: Duration,
    ) -> Result<crate::backend::ChangeWatcher> {
        self.store().watch_changes(interval, true)
    }

    /// Checkpoints the write-ahead log without waiting on other connections
    /// (the worker's maintenance, when idle). True when the whole log was
    /// copied back.
    pub(crate) fn checkpoint(&self) -> Result<bool> {
        self.store().checkpoint()
    }

    /// Records that `lease` was settled inside a caller's transaction (which
    /// may still roll back). Every backend's `settle_in` calls it.
    pub(crate) fn note_settled_in(&self, lease: Lease) {
        sync::lock(&self.inner.settled_in).insert(lease);
    }

    /// Whether `lease` was settled inside a caller's transaction, forgetting
    /// it.
    pub(crate) fn take_settled_in(&self, lease: Lease) -> bool {
        sync::lock(&self.inner.settled_in).remove(&lease)
    }

    /// Sends events (the worker's `Started` and `LeaseLost`).
    pub(crate) fn emit(&self, events: impl IntoIterator<Item = Event>) {
        self.inner.bus.emit(events);
    }

    /// Counts the last write of this thread (a worker's rescue or prune) as
    /// a maintenance hold of the write gate; nothing on a server.
    pub(crate) fn note_maintenance_write(&self) {
        #[allow(irrefutable_let_patterns)]
        if let Backend::Sqlite(db) = &self.inner.backend {
            db.note_maintenance_write();
        }
    }
}
