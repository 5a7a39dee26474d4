//! Job lifecycle events, and the in-process doorbell that wakes fetchers.
//!
//! Events are for tests, logs and metrics: a test waits on
//! `Event::Completed` with a timeout instead of sleeping. They describe what
//! this process did (another process's enqueues are not seen here), and are
//! sent only after the change committed. Operations inside a caller's
//! transaction (`enqueue_in`, `complete_in`) send none: the caller owns the commit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use crossbeam_channel::{Receiver, Sender, TrySendError};

/// Something that happened to a job.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A job was inserted (not sent for a duplicate unique key).
    Enqueued {
        /// The job.
        job_id: i64,
        /// Its queue.
        queue: String,
        /// Its kind.
        kind: String,
    },
    /// A job was claimed by a lease.
    Leased {
        /// The job.
        job_id: i64,
        /// The claim, 1-based.
        attempt: u32,
        /// Its queue.
        queue: String,
        /// Its kind.
        kind: String,
        /// When it was due (the metrics' enqueue→start latency counts from
        /// here).
        available_at: SystemTime,
    },
    /// A worker started running a job's handler.
    Started {
        /// The job.
        job_id: i64,
        /// The claim, 1-based.
        attempt: u32,
    },
    /// A job completed.
    Completed {
        /// The job.
        job_id: i64,
    },
    /// An attempt failed and the job was scheduled to retry.
    Retried {
        /// The job.
        job_id: i64,
        /// The attempt that failed.
        attempt: u32,
        /// When it runs again.
        available_at: SystemTime,
    },
    /// A job was snoozed: rescheduled without using an attempt.
    Snoozed {
        /// The job.
        job_id: i64,
        /// When it runs again.
        available_at: SystemTime,
    },
    /// A leased job was given back, available at once, without using an
    /// attempt: [`Queue::release`](crate::Queue::release), or a worker's
    /// shutdown releasing the jobs it could not finish.
    Released {
        /// The job.
        job_id: i64,
    },
    /// A job's last attempt failed (or expired): it is in the dead-letter history.
    Dead {
        /// The job.
        job_id: i64,
    },
    /// A job was discarded.
    Discarded {
        /// The job.
        job_id: i64,
    },
    /// A job was cancelled.
    Cancelled {
        /// The job.
        job_id: i64,
    },
    /// A job whose lease expired was made available again by the rescuer.
    Rescued {
        /// The job.
        job_id: i64,
    },
    /// A worker found it no longer held a job's lease.
    LeaseLost {
        /// The job.
        job_id: i64,
    },
}

impl Event {
    /// True when this event moved job `id` to history (completed, dead,
    /// discarded or cancelled).
    pub fn finishes(&self, id: i64) -> bool {
        match self {
            Event::Completed { job_id }
            | Event::Dead { job_id }
            | Event::Discarded { job_id }
            | Event::Cancelled { job_id } => *job_id == id,
            _ => false,
        }
    }
}

/// Fan-out of events to subscribers, and of wake-ups to fetchers. Costs one
/// atomic load per operation while nobody listens.
#[derive(Debug, Default)]
pub(crate) struct Bus {
    listeners: AtomicUsize,
    subscribers: Mutex<Vec<Sender<Event>>>,
    doorbells: Mutex<Vec<Sender<()>>>,
}

impl Bus {
    /// A new subscription to every event from now on (unbounded: a subscriber
    /// that never reads grows memory; drop the receiver to unsubscribe).
    pub(crate) fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = crossbeam_channel::unbounded();
        lock(&self.subscribers).push(tx);
        self.listeners.fetch_add(1, Ordering::SeqCst);
        rx
    }

    /// A doorbell: receives `()` (coalesced) whenever a job is enqueued
    /// through this process's queue handles.
    pub(crate) fn doorbell(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        lock(&self.doorbells).push(tx);
        self.listeners.fetch_add(1, Ordering::SeqCst);
        rx
    }

    /// True when someone may be listening.
    pub(crate) fn has_listeners(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    /// Sends events to every subscriber, dropping closed subscriptions.
    pub(crate) fn emit(&self, events: impl IntoIterator<Item = Event>) {
        if !self.has_listeners() {
            return;
        }
        let mut subscribers = lock(&self.subscribers);
        if subscribers.is_empty() {
            return;
        }
        for event in events {
            let before = subscribers.len();
            subscribers.retain(|s| s.send(event.clone()).is_ok());
            self.listeners
                .fetch_sub(before - subscribers.len(), Ordering::SeqCst);
        }
    }

    /// Rings every doorbell.
    pub(crate) fn ring(&self) {
        if !self.has_listeners() {
            return;
        }
        let mut doorbells = lock(&self.doorbells);
        let before = doorbells.len();
        doorbells.retain(|d| !matches!(d.try_send(()), Err(TrySendError::Disconnected(_))));
        self.listeners
            .fetch_sub(before - doorbells.len(), Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
