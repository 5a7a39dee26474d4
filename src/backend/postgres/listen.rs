//! Wake-ups across nodes: `LISTEN` on the queue's channel, which every
//! enqueue notifies in its own transaction (so a rolled-back enqueue wakes
//! nobody).

use std::fmt;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use super::target::Target;
use crate::error::Result;

/// How often an idle listener checks that its connection is alive: a
/// server that went away without a word (a crash, a cut network) leaves no
/// error to read, only silence.
const PING_EVERY: Duration = Duration::from_secs(2);

/// How long a ping may take before the connection counts as dead.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// After a failed reconnect, how long until the next try (the fetcher asks
/// every few milliseconds; meanwhile its idle poll still runs).
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// The longest a reconnect may take.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A dedicated connection listening on the queue's channel. Boxed: a driver
/// config and client are large, and `ChangeWatcher` holds a listener.
pub(crate) struct Listener(Box<State>);

struct State {
    target: Target,
    listen: String,
    client: Option<Client>,
    last_ping: Instant,
    last_connect: Instant,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("target", &self.0.target)
            .field("connected", &self.0.client.is_some())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Connects and starts listening. `listen` is the rendered `LISTEN`.
    pub(crate) fn open(mut target: Target, listen: String) -> Result<Listener> {
        let client = subscribe(&target, &listen)?;
        // A reconnect holds up the fetcher that asked: keep it short.
        let timeout = target
            .config
            .get_connect_timeout()
            .map_or(RECONNECT_TIMEOUT, |t| (*t).min(RECONNECT_TIMEOUT));
        target.config.connect_timeout(timeout);
        Ok(Listener(Box::new(State {
            target,
            listen,
            client: Some(client),
            last_ping: Instant::now(),
            last_connect: Instant::now(),
        })))
    }

    /// True when an enqueue (or a retry, a resume) was committed since the
    /// last call: see [`State::changed`].
    pub(crate) fn changed(&mut self) -> Result<bool> {
        self.0.changed()
    }
}

impl State {
    /// True when an enqueue (or a retry, a resume) was committed since the
    /// last call, by any node, this one included. Never blocks on the
    /// server except for a ping every [`PING_EVERY`] and a reconnect. After a
    /// lost connection it reconnects and reports `true`, since notifications
    /// sent meanwhile were missed.
    fn changed(&mut self) -> Result<bool> {
        let Some(client) = self.client.as_mut() else {
            return Ok(self.reconnect());
        };
        let (changed, alive) = drain(client);
        let alive = if !alive || changed || self.last_ping.elapsed() < PING_EVERY {
            alive
        } else {
            self.last_ping = Instant::now();
            !client.is_closed() && client.is_valid(PING_TIMEOUT).is_ok()
        };
        if changed {
            self.last_ping = Instant::now();
        }
        if !alive {
            self.client = None;
            return Ok(self.reconnect());
        }
        Ok(changed)
    }

    /// Tries to listen again, at most every [`RECONNECT_EVERY`]. True when a
    /// try was made (the caller should look for work: notifications may
    /// have been missed), false while waiting for the next try.
    fn reconnect(&mut self) -> bool {
        if self.last_connect.elapsed() < RECONNECT_EVERY {
            return false;
        }
        self.last_connect = Instant::now();
        self.last_ping = Instant::now();
        self.client = subscribe(&self.target, &self.listen).ok();
        true
    }
}

/// Reads the notifications that arrived: (any arrived, connection alive).
fn drain(client: &mut Client) -> (bool, bool) {
    let mut notifications = client.notifications();
    let mut iter = notifications.iter();
    let mut changed = false;
    loop {
        match iter.next() {
            Ok(Some(_)) => changed = true,
            Ok(None) => return (changed, true),
            Err(_) => return (changed, false),
        }
    }
}

fn subscribe(target: &Target, listen: &str) -> Result<Client> {
    let mut client = target.connect()?;
    client.batch_execute(listen)?;
    Ok(client)
}
