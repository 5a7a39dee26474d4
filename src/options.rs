//! How a queue is opened: durability, timeouts, pool size, limits, policy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::validate;

/// How hard SQLite works to keep a commit on power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// WAL with `synchronous=FULL`: every acknowledged enqueue and completion
    /// survives power loss. The default.
    #[default]
    Full,
    /// WAL with `synchronous=NORMAL`: survives a process crash, but a power
    /// loss may roll back the last commits. Faster; an explicit opt-in.
    Fast,
}

impl Durability {
    /// The `synchronous` pragma value this durability sets (2 = FULL, 1 = NORMAL).
    pub fn synchronous(self) -> i64 {
        match self {
            Durability::Full => 2,
            Durability::Fast => 1,
        }
    }
}

/// Options for [`Queue::open_with`].
///
/// ```no_run
/// use std::time::Duration;
/// use backlog::{Durability, QueueOptions};
///
/// let queue = QueueOptions::new()
///     .durability(Durability::Fast)
///     .busy_timeout(Duration::from_secs(2))
///     .open("app.db")?;
/// # Ok::<(), backlog::Error>(())
/// ```
///
/// [`Queue::open_with`]: crate::Queue::open_with
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) durability: Durability,
    pub(crate) busy_timeout: Duration,
    pub(crate) write_deadline: Duration,
    pub(crate) pool_size: u32,
    pub(crate) max_payload_bytes: usize,
    pub(crate) migrate: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retry_policy: RetryPolicy,
    pub(crate) retry_policies: HashMap<String, RetryPolicy>,
    pub(crate) table_prefix: String,
    pub(crate) schema: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) connect_deadline: Duration,
    pub(crate) event_capacity: usize,
    pub(crate) sqlite_key: Option<SqliteKey>,
}

/// The key of an encrypted SQLite file ([`QueueOptions::sqlite_key`]): a
/// secret, shown as `***` by `Debug`.
#[derive(Clone)]
pub(crate) struct SqliteKey(Arc<str>);

impl SqliteKey {
    /// The key as given, for `PRAGMA key` and nothing else.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SqliteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// How many unread events a [`Queue::subscribe`] subscription holds by
/// default.
///
/// [`Queue::subscribe`]: crate::Queue::subscribe
pub const DEFAULT_EVENT_CAPACITY: usize = 4096;

/// The prefix of backlog's table names by default: `backlog_jobs`,
/// `backlog_history`, `backlog_queues`, `backlog_schema_history`.
pub const DEFAULT_TABLE_PREFIX: &str = "backlog_";

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            write_deadline: Duration::from_secs(30),
            pool_size: 4,
            max_payload_bytes: 1024 * 1024,
            migrate: true,
            clock: Arc::new(SystemClock),
            retry_policy: RetryPolicy::default(),
            retry_policies: HashMap::new(),
            table_prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            schema: None,
            connect_timeout: Duration::from_secs(10),
            connect_deadline: Duration::from_secs(60),
            event_capacity: DEFAULT_EVENT_CAPACITY,
            sqlite_key: None,
        }
    }
}

impl QueueOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Durability of commits (SQLite). Defaults to [`Durability::Full`]. The
    /// server backends commit as their server is configured to.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long one SQLite call waits for a lock held by another connection
    /// before returning BUSY (`PRAGMA busy_timeout`). Defaults to 5 seconds.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// The bound on every call that writes: how long it may wait in all
    /// before returning [`Error::Busy`]. Defaults to 30 seconds.
    ///
    /// On SQLite the wait covers the other threads of this process (the
    /// write gate), the other processes on the file (their turns at the
    /// write lock, served roughly in the order they asked), and retries of
    /// BUSY/LOCKED from connections that do not take turns (an
    /// application's own); a single try's `busy_timeout` is cut to what is
    /// left. On a server it bounds the retries of deadlocks and
    /// serialization failures, each statement's wait for a lock another
    /// session holds (PostgreSQL `lock_timeout`, MySQL
    /// `innodb_lock_wait_timeout`, whole seconds from 1 to 50), and the wait
    /// for a connection when the server refuses new ones for lack of room
    /// (see [`connect_deadline`](QueueOptions::connect_deadline)).
    pub fn write_deadline(mut self, deadline: Duration) -> Self {
        self.write_deadline = deadline;
        self
    }

    /// Connections in the pool, at least 1: read connections on SQLite (which
    /// writes through one connection per process), all connections on a
    /// server. Defaults to 4. On a server, a thread inside the queue's own
    /// transaction holds one of them: its reads need another, and answer
    /// [`Error::InsideTransaction`] at once
    /// when none is free (always at 1).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The largest encoded payload accepted, in bytes. Defaults to 1 MiB.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Whether opening applies pending schema migrations. Defaults to `true`;
    /// with `false`, call [`Queue::migrate`] yourself.
    ///
    /// [`Queue::migrate`]: crate::Queue::migrate
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The clock every stored time comes from. Defaults to the system clock;
    /// tests pass a [`ManualClock`](crate::ManualClock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The retry policy for kinds without their own. Defaults to
    /// [`RetryPolicy::default`] (1 s doubling, ±20 %, capped at 6 h).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = policy;
        self
    }

    /// The retry policy for one kind. Defaults to the queue's policy.
    pub fn retry_policy_for(mut self, kind: impl Into<String>, policy: RetryPolicy) -> Self {
        self.retry_policies.insert(kind.into(), policy);
        self
    }

    /// The prefix of backlog's table names on a server backend, so several
    /// applications or environments can share one database: `app1_` makes
    /// `app1_jobs`, `app1_history`, `app1_queues` and
    /// `app1_schema_history`. ASCII letters, digits and `_`, at most 32
    /// bytes. Defaults to [`DEFAULT_TABLE_PREFIX`] (`backlog_`); SQLite
    /// supports only the default.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }

    /// The PostgreSQL schema backlog's tables live in (created if missing).
    /// Defaults to none: the connection's `search_path` (usually `public`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// How long connecting to a database server may take, per connection.
    /// Defaults to 10 seconds.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The bound on [`Queue::connect`]'s wait for room on a full server:
    /// while the server refuses connections for lack of room (PostgreSQL
    /// `too_many_connections` or `cannot_connect_now` while it starts,
    /// MySQL/MariaDB errors 1040, 1203 and 1226), opening the queue waits for one
    /// to free up and tries again, with jittered backoff of up to a second,
    /// and returns the server's refusal once this bound has passed. Defaults
    /// to 60 seconds: long enough for the old nodes of a rolling deploy to
    /// let go of theirs.
    ///
    /// Every other connection error (a wrong password, an unknown database,
    /// an unreachable server) is returned at once. Once the queue is open,
    /// its calls wait for room within their own bound, the
    /// [`write_deadline`](QueueOptions::write_deadline), and a worker keeps
    /// running and tries again; see the README's "Connection budget" for how
    /// many connections a node opens.
    ///
    /// [`Queue::connect`]: crate::Queue::connect
    pub fn connect_deadline(mut self, deadline: Duration) -> Self {
        self.connect_deadline = deadline;
        self
    }

    /// The most unread events one [`Queue::subscribe`] subscription holds.
    /// Events that find it full are not kept, so that the queue never waits
    /// for a subscriber; the subscriber learns how many it missed from an
    /// [`Event::Lagged`](crate::Event::Lagged). Defaults to
    /// [`DEFAULT_EVENT_CAPACITY`] (4096); at least 1
    /// ([`Error::InvalidArgument`] at open otherwise).
    ///
    /// [`Queue::subscribe`]: crate::Queue::subscribe
    pub fn event_capacity(mut self, events: usize) -> Self {
        self.event_capacity = events;
        self
    }

    /// The key of an encrypted SQLite file, for a build with the `sqlcipher`
    /// feature (SQLCipher compiled in SQLite's place). Backlog runs
    /// `PRAGMA key` with it as the first statement of every connection it
    /// opens to the file, and reads the schema back: a file that does not
    /// open with it (a wrong key, or a file that is not encrypted) is
    /// refused at open with an error whose
    /// [`is_corrupt`](crate::Error::is_corrupt) is true, and nothing is
    /// written. A new file is created encrypted. The key is a SQLCipher
    /// passphrase (SQLCipher derives the key from it); `Debug` shows `***`.
    ///
    /// Where the SQLite linked in is not SQLCipher (a build without the
    /// feature), opening with a key is [`Error::InvalidArgument`] before
    /// the file is created or touched, since the file would be written in
    /// plaintext; so is an empty key. The application's own connections to
    /// the file need the same key (their own `PRAGMA key`). Defaults to
    /// none: a plaintext file. The server backends refuse it.
    pub fn sqlite_key(mut self, key: impl Into<String>) -> Self {
        self.sqlite_key = Some(SqliteKey(Arc::from(key.into())));
        self
    }

    /// Checks the options every backend shares, and the ones that only a
    /// server backend takes; a server backend's open calls it.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn check_common(&self) -> Result<()> {
        self.check_shared()?;
        if self.sqlite_key.is_some() {
            return Err(Error::InvalidArgument(
                "sqlite_key applies to an encrypted SQLite file, not to a server backend".into(),
            ));
        }
        Ok(())
    }

    /// Checks the options every backend shares.
    fn check_shared(&self) -> Result<()> {
        if self.pool_size == 0 {
            return Err(Error::InvalidArgument(
                "pool_size must be at least 1".into(),
            ));
        }
        if self.event_capacity == 0 {
            return Err(Error::InvalidArgument(
                "event_capacity must be at least 1".into(),
            ));
        }
        validate::identifier("table prefix", &self.table_prefix)?;
        if let Some(schema) = &self.schema {
            validate::identifier("schema", schema)?;
        }
        Ok(())
    }

    /// Refuses options that SQLite cannot honour.
    pub(crate) fn check_sqlite(&self) -> Result<()> {
        self.check_shared()?;
        if self.table_prefix != DEFAULT_TABLE_PREFIX || self.schema.is_some() {
            return Err(Error::InvalidArgument(
                "table_prefix and schema apply to the server backends; SQLite uses the default \
                 `backlog_` tables"
                    .into(),
            ));
        }
        // SQLCipher takes an empty key as no key: the file would be plaintext.
        if self.sqlite_key.as_ref().is_some_and(|k| k.0.is_empty()) {
            return Err(Error::InvalidArgument(
                "sqlite_key must not be empty".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn policy_for(&self, kind: &str) -> &RetryPolicy {
        self.retry_policies.get(kind).unwrap_or(&self.retry_policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key is for a SQLite file: a server backend refuses it rather than
    /// leave the application believing its data encrypted by backlog.
    #[test]
    fn a_server_backend_refuses_a_sqlite_key() {
        let options = QueueOptions::new().sqlite_key("s3cret");
        let error = options.check_common().expect_err("a server takes no key");
        assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
        assert!(!error.to_string().contains("s3cret"), "{error}");
        assert!(options.check_sqlite().is_ok());
    }
}
