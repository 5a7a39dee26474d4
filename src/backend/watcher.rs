//! The thread behind a server's change watcher: PostgreSQL's listener
//! (`postgres/listen.rs`) and MySQL's poller (`mysql/poller.rs`) each run
//! one, on a connection of its own, and differ only in how they learn of a
//! change. How the thread tells its owner, and how it is stopped and
//! joined, is decided here once.
//!
//! The thread raises a flag and rings a one-slot channel ([`Notifier::notify`]):
//! wake-ups coalesce while the fetcher is busy, and the flag says there
//! was news when the fetcher comes to look. Dropping the [`Watcher`]
//! disconnects the thread's stop channel and joins the thread; the thread
//! looks at it between its blocking calls, so each database bounds how long
//! a drop waits by bounding those calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::error::{Error, Result};

/// The owner's side: the news flag, the wake-up signal, and the thread,
/// stopped and joined on drop.
pub(crate) struct Watcher {
    changed: Arc<AtomicBool>,
    signal: Receiver<Instant>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The thread's side.
pub(crate) struct Notifier {
    changed: Arc<AtomicBool>,
    wake: Sender<Instant>,
    /// Disconnected when the watcher is dropped.
    stopped: Receiver<()>,
}

impl Watcher {
    /// Starts `run` on a thread named `name`, with the [`Notifier`] it
    /// reports through.
    pub(crate) fn spawn(name: &str, run: impl FnOnce(Notifier) + Send + 'static) -> Result<Self> {
        let changed = Arc::new(AtomicBool::new(false));
        // One slot: wake-ups coalesce while the fetcher is busy.
        let (wake, signal) = crossbeam_channel::bounded(1);
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let notifier = Notifier {
            changed: changed.clone(),
            wake,
            stopped,
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(notifier))
            .map_err(|e| Error::Database(Box::new(e)))?;
        Ok(Watcher {
            changed,
            signal,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// True when the thread notified since the last call. Never blocks.
    pub(crate) fn changed(&self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }

    /// Fires (coalesced) when [`Watcher::changed`] has news.
    pub(crate) fn signal(&self) -> Receiver<Instant> {
        self.signal.clone()
    }
}

impl Drop for Watcher {
    /// Stops and joins the thread, as soon as it looks at its stop channel.
    fn drop(&mut self) {
        drop(self.stop.take()); // disconnects `stopped`: the thread's stop flag
        if let Some(thread) = self.thread.take() {
            // The threads catch nothing that could panic; a panic there
            // would only mean no more wake-ups, which the idle poll covers.
            let _ = thread.join();
        }
    }
}

impl Notifier {
    /// Tells the owner there is news, and wakes its fetcher.
    pub(crate) fn notify(&self) {
        self.changed.store(true, Ordering::SeqCst);
        // Full means a wake-up is pending already: the fetcher will see the
        // flag then.
        let _ = self.wake.try_send(Instant::now());
    }

    /// True once the watcher was dropped. (PostgreSQL's listener asks
    /// between its waits; MySQL's poller selects on [`Notifier::stopped`].)
    #[cfg(feature = "postgres")]
    pub(crate) fn stopping(&self) -> bool {
        matches!(
            self.stopped.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Disconnected once the watcher was dropped: for a `select!` or a
    /// `recv_timeout` that must wake at once then.
    pub(crate) fn stopped(&self) -> &Receiver<()> {
        &self.stopped
    }
}
