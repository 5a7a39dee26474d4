//! Job lifecycle events, and the in-process doorbell that wakes fetchers.
//!
//! Events are for tests, logs and metrics: a test waits on
//! `Event::Completed` with a timeout instead of sleeping. They describe what
//! this process did (another process's enqueues are not seen here), and are
//! sent only after the change committed. Operations inside a caller's
//! transaction (`enqueue_in`, `complete_in`) send none: the caller owns the commit.
//!
//! A subscription holds at most [`QueueOptions::event_capacity`] unread
//! events: the queue never waits for a subscriber. Events that find it full
//! are not kept; the subscriber learns how many it missed from the
//! [`Event::Lagged`] that comes before the next event it receives.
//!
//! [`QueueOptions::event_capacity`]: crate::QueueOptions::event_capacity

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::sync;

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
    /// This subscription was full (it holds at most
    /// [`QueueOptions::event_capacity`](crate::QueueOptions::event_capacity)
    /// unread events) and `missed` events were not kept for it. Comes before
    /// the next event it receives; whatever waited for one of the missed
    /// events should look at the jobs themselves ([`Queue::get`](crate::Queue::get)).
    Lagged {
        /// How many events were not kept, since the last event received.
        missed: u64,
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
#[derive(Debug)]
pub(crate) struct Bus {
    listeners: AtomicUsize,
    /// The most unread events a subscription holds.
    capacity: usize,
    subscribers: Mutex<Vec<Subscriber>>,
    doorbells: Mutex<Vec<Sender<()>>>,
}

/// One subscription, and what it missed while it was full.
#[derive(Debug)]
struct Subscriber {
    events: Sender<Event>,
    /// Events not kept since the last one that was: told in an
    /// [`Event::Lagged`] before the next one.
    missed: u64,
}

impl Subscriber {
    /// Offers `event` without waiting; false once the receiver is gone.
    fn offer(&mut self, event: &Event) -> bool {
        if self.missed > 0 {
            let lagged = Event::Lagged {
                missed: self.missed,
            };
            match self.events.try_send(lagged) {
                Ok(()) => self.missed = 0,
                Err(TrySendError::Full(_)) => {
                    self.missed += 1;
                    return true;
                }
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        match self.events.try_send(event.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.missed += 1;
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

impl Bus {
    /// A bus whose subscriptions hold at most `capacity` unread events each
    /// (at least 1).
    pub(crate) fn new(capacity: usize) -> Bus {
        Bus {
            listeners: AtomicUsize::new(0),
            capacity: capacity.max(1),
            subscribers: Mutex::default(),
            doorbells: Mutex::default(),
        }
    }

    /// A new subscription to every event from now on, holding at most the
    /// bus's capacity of unread events (see [`Event::Lagged`]). Drop the
    /// receiver to unsubscribe.
    pub(crate) fn subscribe(&self) -> Receiver<Event> {
        let (events, rx) = crossbeam_channel::bounded(self.capacity);
        sync::lock(&self.subscribers).push(Subscriber { events, missed: 0 });
        self.listeners.fetch_add(1, Ordering::SeqCst);
        rx
    }

    /// A doorbell: receives `()` (coalesced) whenever a job is enqueued
    /// through this process's queue handles.
    pub(crate) fn doorbell(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        sync::lock(&self.doorbells).push(tx);
        self.listeners.fetch_add(1, Ordering::SeqCst);
        rx
    }

    /// True when someone may be listening.
    pub(crate) fn has_listeners(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    /// Sends events to every subscriber without waiting (a full one misses
    /// them), dropping closed subscriptions.
    pub(crate) fn emit(&self, events: impl IntoIterator<Item = Event>) {
        if !self.has_listeners() {
            return;
        }
        let mut subscribers = sync::lock(&self.subscribers);
        if subscribers.is_empty() {
            return;
        }
        for event in events {
            let before = subscribers.len();
            subscribers.retain_mut(|s| s.offer(&event));
            self.listeners
                .fetch_sub(before - subscribers.len(), Ordering::SeqCst);
        }
    }

    /// Rings every doorbell.
    pub(crate) fn ring(&self) {
        if !self.has_listeners() {
            return;
        }
        let mut doorbells = sync::lock(&self.doorbells);
        let before = doorbells.len();
        doorbells.retain(|d| !matches!(d.try_send(()), Err(TrySendError::Disconnected(_))));
        self.listeners
            .fetch_sub(before - doorbells.len(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enqueued(job_id: i64) -> Event {
        Event::Enqueued {
            job_id,
            queue: "default".into(),
            kind: "k".into(),
        }
    }

    /// A full subscription misses events, never blocks the sender, and is
    /// told how many it missed before the next event it gets.
    #[test]
    fn a_full_subscription_misses_events_and_is_told_how_many() {
        let bus = Bus::new(3);
        let slow = bus.subscribe();
        let fast = bus.subscribe();
        for id in 1..=10 {
            bus.emit([enqueued(id)]);
            // The fast one keeps up and misses nothing.
            assert_eq!(fast.try_recv().ok(), Some(enqueued(id)));
        }
        let got: Vec<Event> = slow.try_iter().collect();
        assert_eq!(got, [enqueued(1), enqueued(2), enqueued(3)]);
        bus.emit([enqueued(11)]);
        let got: Vec<Event> = slow.try_iter().collect();
        assert_eq!(got, [Event::Lagged { missed: 7 }, enqueued(11)]);
        bus.emit([enqueued(12)]);
        assert_eq!(slow.try_iter().collect::<Vec<_>>(), [enqueued(12)]);
    }

    /// When only the `Lagged` fits, it goes out and the event after it is
    /// counted as missed in the next one.
    #[test]
    fn a_lagged_that_fills_the_subscription_counts_the_event_after_it() {
        let bus = Bus::new(1);
        let slow = bus.subscribe();
        bus.emit([enqueued(1), enqueued(2)]);
        assert_eq!(slow.try_recv().ok(), Some(enqueued(1)));
        bus.emit([enqueued(3)]);
        assert_eq!(slow.try_recv().ok(), Some(Event::Lagged { missed: 1 }));
        bus.emit([enqueued(4)]);
        assert_eq!(slow.try_recv().ok(), Some(Event::Lagged { missed: 1 }));
        bus.emit([enqueued(5)]);
        assert_eq!(slow.try_recv().ok(), Some(Event::Lagged { missed: 1 }));
        assert!(slow.try_recv().is_err());
    }

    /// A dropped receiver is forgotten, full or not.
    #[test]
    fn a_dropped_subscription_is_forgotten() {
        let bus = Bus::new(1);
        let gone = bus.subscribe();
        bus.emit([enqueued(1)]);
        drop(gone);
        bus.emit([enqueued(2), enqueued(3)]);
        assert!(!bus.has_listeners());
        assert!(sync::lock(&bus.subscribers).is_empty());
    }
}
