//! The pool of a PostgreSQL queue's connections, sized for a shared server.
//!
//! A node opens a connection only when a call needs one and none is idle,
//! on the calling thread, and closes the ones it stopped needing: the
//! connections a burst opened sit at the bottom of the idle stack (the last
//! one returned is handed out first) and are closed after [`IDLE_TIMEOUT`]
//! unused, down to one. So on a server with little room, each node holds
//! about what it uses at once, and a node that starts later finds room.
//!
//! When the server refuses a new connection for lack of room
//! ([`is_refused`]) and the pool has connections of its own, the call waits
//! for one of them instead, and the pool opens none for [`HOLD_OFF`]: no
//! thread keeps knocking at a full server in the background. With no
//! connection at all, the refusal goes back to the caller's retry loop,
//! which waits and tries again up to its deadline.
//!
//! Also what the pool holds and opens: a connection with its statement
//! cache ([`PgConnection`], opened by [`Manager`]), and the refusal above.
//! The queue's retry loop over the pool is `connection.rs`'s.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postgres::{Client, Statement};

use super::target::Target;
use crate::error::{Error, Result};
use crate::sync;

/// Prepared statements of one connection, by SQL text.
pub(crate) type Statements = HashMap<String, Statement>;

/// A pooled connection: the client and the statements prepared on it.
pub(crate) struct PgConnection {
    pub client: Client,
    pub statements: Statements,
    /// Set when an operation found the connection dead, so the pool drops it
    /// instead of handing it out again.
    pub broken: bool,
}

impl PgConnection {
    /// Whether the connection must not be used again: an operation found it
    /// dead, or the driver saw it close.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken || self.client.is_closed()
    }
}

/// Opens the pool's connections.
pub(crate) struct Manager {
    pub target: Target,
    /// `lock_timeout` of each connection: a statement waiting for a row or
    /// table lock another session holds gives up (55P03, `Error::Busy`) at
    /// the queue's write deadline instead of waiting for ever.
    pub lock_timeout: Duration,
}

impl Manager {
    /// Opens one connection for the pool.
    pub(crate) fn open(&self) -> Result<PgConnection> {
        self.prepare(self.target.connect()?)
    }

    /// Sets up `client`, open already, for the pool.
    pub(crate) fn prepare(&self, mut client: Client) -> Result<PgConnection> {
        client.batch_execute(&format!(
            "SET lock_timeout = {}",
            self.lock_timeout.as_millis().max(1)
        ))?;
        Ok(PgConnection {
            client,
            statements: Statements::new(),
            broken: false,
        })
    }
}

/// True when the server refused a new connection for lack of room: the
/// connection limit of the server, the database or the role
/// (`too_many_connections`, 53300, "sorry, too many clients already"), or
/// a server still starting (`cannot_connect_now`, 57P03). A session ending
/// elsewhere, or the start completing, makes room: worth waiting for.
pub(crate) fn is_refused(e: &Error) -> bool {
    let Error::Database(inner) = e else {
        return false;
    };
    inner
        .downcast_ref::<postgres::Error>()
        .and_then(|pg| pg.code())
        .is_some_and(|code| matches!(code.code(), "53300" | "57P03"))
}

/// How long an idle connection beyond the first is kept.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// After a refusal for lack of room, how long the pool opens no connection
/// while it has others to wait for.
const HOLD_OFF: Duration = Duration::from_secs(1);

/// Up to `max_size` connections, opened on demand.
pub(crate) struct ConnPool {
    shared: Arc<Shared>,
}

struct Shared {
    manager: Manager,
    max_size: u32,
    state: Mutex<State>,
    returned: Condvar,
}

struct State {
    /// Idle connections and when each was returned, the last returned last.
    idle: Vec<(PgConnection, Instant)>,
    /// Connections open or being opened, idle or not.
    open: u32,
    /// No connection is opened before this while others are open.
    hold_off_until: Option<Instant>,
}

/// A connection taken from the pool; returned when dropped (closed instead
/// when it is broken).
pub(crate) struct Pooled {
    conn: Option<PgConnection>,
    shared: Arc<Shared>,
    /// When it was returned to the pool; `None` for one opened for this
    /// call.
    idle_since: Option<Instant>,
}

impl ConnPool {
    pub(crate) fn new(manager: Manager, max_size: u32) -> ConnPool {
        ConnPool {
            shared: Arc::new(Shared {
                manager,
                max_size,
                state: Mutex::new(State {
                    idle: Vec::new(),
                    open: 0,
                    hold_off_until: None,
                }),
                returned: Condvar::new(),
            }),
        }
    }

    /// Takes `client`, opened by the caller, as an idle connection.
    pub(crate) fn adopt(&self, client: postgres::Client) -> Result<()> {
        let conn = self.shared.manager.prepare(client)?;
        let mut state = self.shared.lock();
        state.open += 1;
        state.idle.push((conn, Instant::now()));
        Ok(())
    }

    pub(crate) fn max_size(&self) -> u32 {
        self.shared.max_size
    }

    /// Connections open (idle or in use) or being opened.
    pub(crate) fn connections(&self) -> u32 {
        self.shared.lock().open
    }

    /// An idle connection, if there is one; never waits nor opens one.
    pub(crate) fn try_get(&self) -> Option<Pooled> {
        let (conn, since) = self.shared.lock().idle.pop()?;
        Some(self.pooled(conn, Some(since)))
    }

    /// A connection: an idle one, a new one while the pool has room (and
    /// the server too), or one another call returns within `timeout`
    /// ([`Error::Busy`] after). A failure to open one is returned at once,
    /// unless it was a refusal for lack of room and the pool has other
    /// connections to wait for.
    pub(crate) fn get(&self, timeout: Duration) -> Result<Pooled> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some((conn, since)) = state.idle.pop() {
                return Ok(self.pooled(conn, Some(since)));
            }
            let held_off = state
                .hold_off_until
                .is_some_and(|until| Instant::now() < until && state.open > 0);
            if state.open < self.shared.max_size && !held_off {
                state.open += 1;
                drop(state);
                let opened = self.shared.manager.open();
                state = self.shared.lock();
                match opened {
                    Ok(conn) => {
                        state.hold_off_until = None;
                        return Ok(self.pooled(conn, None));
                    }
                    Err(e) => {
                        state.open -= 1;
                        if !(is_refused(&e) && state.open > 0) {
                            return Err(e);
                        }
                        state.hold_off_until = Some(Instant::now() + HOLD_OFF);
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Busy);
            }
            // Woken by a returned connection, or to try opening one again.
            let wait = match state.hold_off_until {
                Some(until) if until > now => (until - now).min(deadline - now),
                _ => deadline - now,
            };
            state = sync::wait_timeout(&self.shared.returned, state, wait);
        }
    }

    fn pooled(&self, conn: PgConnection, idle_since: Option<Instant>) -> Pooled {
        Pooled {
            conn: Some(conn),
            shared: self.shared.clone(),
            idle_since,
        }
    }
}

impl Pooled {
    /// How long the connection sat idle in the pool before this call took
    /// it; zero for one opened for this call.
    pub(crate) fn idle_for(&self) -> Duration {
        self.idle_since
            .map_or(Duration::ZERO, |since| since.elapsed())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.state)
    }
}

impl Drop for Shared {
    /// Closes the idle connections on a thread of their own: the `postgres`
    /// driver closes a connection by blocking on a runtime of its own, which
    /// panics on a thread that drives an async runtime (a tokio application
    /// dropping its last handle of the queue there). Waits for them, so the
    /// connections are closed when the last handle is gone, as before.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let idle = std::mem::take(&mut state.idle);
        if idle.is_empty() {
            return;
        }
        // Should the thread not start, the closure and the connections in
        // it are dropped here instead.
        if let Ok(closer) = std::thread::Builder::new()
            .name("backlog-close".into())
            .spawn(move || drop(idle))
        {
            let _ = closer.join();
        }
    }
}

impl State {
    /// Takes out the connections idle longer than [`IDLE_TIMEOUT`], oldest
    /// first, keeping one: the caller closes them once it let go of the
    /// lock.
    fn trim(&mut self) -> Vec<(PgConnection, Instant)> {
        let stale = self
            .idle
            .iter()
            .take(self.idle.len().saturating_sub(1))
            .take_while(|(_, since)| since.elapsed() > IDLE_TIMEOUT)
            .count();
        self.open -= stale as u32;
        self.idle.drain(..stale).collect()
    }
}

impl std::ops::Deref for Pooled {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        // Taken out only by `drop`.
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let keep = !conn.is_broken();
        let mut state = self.shared.lock();
        let closed = if keep {
            state.idle.push((conn, Instant::now()));
            None
        } else {
            state.open -= 1;
            Some(conn)
        };
        let stale = state.trim();
        drop(state);
        self.shared.returned.notify_one();
        drop((closed, stale));
    }
}
