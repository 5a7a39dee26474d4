//! Wake-ups across nodes: `LISTEN` on the queue's channel, which every
//! enqueue notifies in its own transaction (so a rolled-back enqueue wakes
//! nobody).
//!
//! The listening connection lives on a thread of its own that blocks on its
//! socket, so a notification from any node wakes the fetcher within a
//! millisecond. The sync driver's non-blocking `notifications().iter()`
//! never reads the socket (it only hands over what a blocking call already
//! read), which is why the read must block here rather than be polled.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use super::pool::is_refused;
use super::target::Target;
use crate::backend::room;
use crate::backend::watcher::{Notifier, Watcher};
use crate::error::Result;

/// How long one blocking read waits before the thread looks at its stop
/// flag: the longest a dropped listener makes its owner wait while the
/// connection is up.
const READ_SLICE: Duration = Duration::from_millis(50);

/// How often an idle listener checks that its connection is alive: a
/// server that went away without a word (a crash, a cut network) leaves no
/// error to read, only silence.
const PING_EVERY: Duration = Duration::from_secs(2);

/// How long a ping may take before the connection counts as dead.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// After a failed reconnect, how long until the next try (meanwhile the
/// fetcher's idle poll still runs).
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// After the server refused the listener's connection for lack of room,
/// how long until the next try (jittered).
const REFUSED_RETRY: Duration = Duration::from_secs(5);

/// The longest a reconnect may take; with [`PING_TIMEOUT`] and
/// [`READ_SLICE`], it bounds how long dropping a listener waits for its
/// thread (while the server is unreachable).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A dedicated connection listening on the queue's channel, read by a
/// thread of its own (`backlog-listen`), joined when the listener is
/// dropped (`backend/watcher.rs`).
pub(crate) struct Listener {
    watcher: Watcher,
    connected: Arc<AtomicBool>,
    target: String,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("target", &self.target)
            .field("connected", &self.connected.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Connects, starts listening, and starts the thread that reads the
    /// connection. `listen` is the rendered `LISTEN`. Fails when the first
    /// connection fails (later losses are reconnected by the thread).
    pub(crate) fn open(mut target: Target, listen: String) -> Result<Listener> {
        // A full server: the thread listens once there is room (meanwhile
        // the fetcher's idle poll finds the jobs).
        let client = match subscribe(&target, &listen) {
            Ok(client) => Some(client),
            Err(e) if is_refused(&e) => None,
            Err(e) => return Err(e),
        };
        // A reconnect holds up a dropping owner: keep it short.
        let timeout = target
            .config
            .get_connect_timeout()
            .map_or(RECONNECT_TIMEOUT, |t| (*t).min(RECONNECT_TIMEOUT));
        target.config.connect_timeout(timeout);
        let connected = Arc::new(AtomicBool::new(client.is_some()));
        let redacted = target.redacted.clone();
        let seen = connected.clone();
        // Dropping the listener stops the thread within [`READ_SLICE`]
        // while connected; at worst [`RECONNECT_TIMEOUT`] or
        // [`PING_TIMEOUT`] when the server does not answer.
        let watcher = Watcher::spawn("backlog-listen", move |notifier| {
            Reader {
                notifier,
                connected: seen,
                target,
                listen,
                client,
                last_heard: Instant::now(),
                next_connect: Instant::now(),
            }
            .run();
        })?;
        Ok(Listener {
            watcher,
            connected,
            target: redacted,
        })
    }

    /// True when an enqueue (or a retry, a resume) was committed since the
    /// last call, by any node, this one included, or when the connection
    /// was lost and made again (notifications may have been missed). Never
    /// blocks.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        Ok(self.watcher.changed())
    }

    /// Fires (coalesced) when [`Listener::changed`] has news.
    pub(crate) fn signal(&self) -> Receiver<Instant> {
        self.watcher.signal()
    }
}

/// The thread's side.
struct Reader {
    notifier: Notifier,
    /// Whether the listening connection is up, for the listener's `Debug`.
    connected: Arc<AtomicBool>,
    target: Target,
    listen: String,
    client: Option<Client>,
    /// When the server last said anything (a notification or a ping).
    last_heard: Instant,
    /// No reconnect before this.
    next_connect: Instant,
}

impl Reader {
    fn run(mut self) {
        while !self.notifier.stopping() {
            match self.client.take() {
                Some(client) => self.client = self.read(client),
                None => self.reconnect(),
            }
        }
    }

    /// Blocks up to [`READ_SLICE`] for notifications, and pings after
    /// [`PING_EVERY`] of silence. Returns the client, or `None` when the
    /// connection is lost.
    fn read(&mut self, mut client: Client) -> Option<Client> {
        let mut heard = false;
        let alive = {
            let mut notifications = client.notifications();
            let mut iter = notifications.timeout_iter(READ_SLICE);
            loop {
                match iter.next() {
                    Ok(Some(_)) => {
                        heard = true;
                        // Wake at once; more may be queued behind it, and
                        // the next call returns them without waiting.
                        self.notifier.notify();
                        if self.notifier.stopping() {
                            break true;
                        }
                    }
                    Ok(None) => break true, // the slice ended (or the socket closed)
                    Err(_) => break false,
                }
            }
        };
        if heard {
            self.last_heard = Instant::now();
        }
        let alive = alive
            && !client.is_closed()
            && (self.last_heard.elapsed() < PING_EVERY || {
                self.last_heard = Instant::now();
                client.is_valid(PING_TIMEOUT).is_ok()
            });
        if alive {
            Some(client)
        } else {
            self.connected.store(false, Ordering::SeqCst);
            self.next_connect = Instant::now(); // try at once
            None
        }
    }

    /// Listens again, at most every [`RECONNECT_EVERY`]; on success reports
    /// a change, since notifications sent meanwhile were missed.
    fn reconnect(&mut self) {
        let wait = self.next_connect.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            // Sleeps, but wakes at once when the listener is dropped.
            let _ = self.notifier.stopped().recv_timeout(wait);
            return;
        }
        self.next_connect = Instant::now() + RECONNECT_EVERY;
        self.last_heard = Instant::now();
        match subscribe(&self.target, &self.listen) {
            Ok(client) => {
                self.client = Some(client);
                self.connected.store(true, Ordering::SeqCst);
                self.notifier.notify();
            }
            Err(error) if is_refused(&error) => {
                // The pool's connections matter more: leave them the room.
                self.next_connect = Instant::now() + room::jittered(REFUSED_RETRY);
                room::warn_refused("the listener's connection", &self.target.redacted, &error);
            }
            Err(error) => {
                tracing::debug!(%error, url = %self.target.redacted, "listener reconnect failed");
            }
        }
    }
}

fn subscribe(target: &Target, listen: &str) -> Result<Client> {
    let mut client = target.connect()?;
    client.batch_execute(listen)?;
    Ok(client)
}
