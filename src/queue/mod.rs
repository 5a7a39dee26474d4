//! [`Queue`]: the handle applications enqueue with, and workers lease from.
//!
//! The other `impl Queue` blocks live one concern per file beside this one:
//! [`enqueue`], [`flows`] (workflows), [`lease`], [`settle`], [`signals`],
//! [`inspect`] and [`operate`].

mod enqueue;
mod flows;
mod inspect;
mod lease;
mod operate;
mod settle;
mod signals;

pub(crate) use enqueue::{params, Prepared};
pub use inspect::WAIT_MAX_POLL;
pub use operate::FIND_UNIQUE_HISTORY;
pub(crate) use settle::run_then_complete;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::backend::sqlite::Connections;
use crate::backend::{Backend, Store};
use crate::clock::ClockMicros;
use crate::error::{Error, Result};
use crate::events::Bus;
use crate::lease::Lease;
use crate::options::QueueOptions;

/// A durable job queue: in a SQLite file ([`Queue::open`]), or on a
/// PostgreSQL or MySQL server ([`Queue::connect`], behind the `postgres` and
/// `mysql` features).
///
/// Cheap to clone; clones share connections. All methods are blocking and
/// safe to call from many threads. Every method that writes waits at most
/// the queue's [`write_deadline`](crate::QueueOptions::write_deadline)
/// (default 30 s) for locks held by other threads or processes, then
/// returns [`Error::Busy`]. Reads wait at most that long for a pooled
/// connection. What only one database can do (its transaction type for
/// `enqueue_in` and `complete_in`) lives in that database's module:
/// `backlog::sqlite`, `backlog::postgres`, `backlog::mysql`.
///
/// # Inside the queue's own transaction
///
/// A thread inside one of this queue's transactions (`ctx.transaction` in a
/// handler, or `QueueExt::transaction` of `backlog::sqlite`,
/// `backlog::postgres` or `backlog::mysql`) never waits for itself, on any
/// backend: every method that writes (and a nested `transaction`) returns
/// [`Error::InsideTransaction`] at once and writes nothing; the `_in` forms
/// (`enqueue_in(tx, ..)`, `complete_in(tx, ..)`) join the transaction; reads
/// work, and see what was committed rather than the transaction's own
/// changes (on PostgreSQL and MySQL they need a second pooled connection,
/// and answer `InsideTransaction` at once when none is free: always with
/// `pool_size(1)`). Tested for every public method on every backend by the
/// conformance scenarios in `tests/conformance/inside_transaction.rs`.
///
/// # Inside the application's own transaction (SQLite)
///
/// On SQLite (unix) a thread that holds the file's write lock through a
/// `rusqlite` connection of the application's (after `BEGIN IMMEDIATE`, or
/// a write in a deferred transaction) gets the same answer: every method that
/// writes returns [`Error::InsideTransaction`] at once, writes nothing, and
/// `enqueue_in(&tx, ..)` joins that transaction. This holds for connections
/// the application opened through backlog's shim VFS, which notes who holds
/// the lock (`sqlite::open_connection`, or any connection opened after
/// `sqlite::make_default_vfs`); another
/// connection is waited for like another process's, up to the write
/// deadline (`tests/sqlite_foreign_transactions.rs`).
#[derive(Debug, Clone)]
pub struct Queue {
    inner: Arc<Inner>,
}

/// The extension traits extend a `Queue` (see `sealed.rs`).
impl crate::sealed::Sealed for Queue {}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    options: QueueOptions,
    /// SQLite: the path as given and its canonical form, to check that a
    /// caller's connection (`enqueue_in`, `complete_in`) is to this database.
    path: Option<PathBuf>,
    canonical_path: Option<PathBuf>,
    bus: Bus,
    /// Leases settled by `settle_in` / `complete_in` inside a caller's
    /// transaction in this process: the worker checks here before settling a
    /// job its handler may already have finished (that transaction may also
    /// have rolled back).
    settled_in: std::sync::Mutex<std::collections::HashSet<Lease>>,
    /// Held while a job's progress is read and written (heartbeater,
    /// completer, a handler's manual heartbeat), so an older value read by
    /// one never lands after a newer one written by another.
    progress_gate: std::sync::Mutex<()>,
}

// The options' own ways to open a queue: here, with the `Queue` they build
// (`QueueOptions` is plain data the backends read too).
impl QueueOptions {
    /// Opens (creating if needed) the queue at `path` with these options.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Queue> {
        Queue::open_with(path, self)
    }

    /// Connects to the queue at a database URL with these options: see
    /// [`Queue::connect`].
    pub fn connect(self, url: &str) -> Result<Queue> {
        Queue::connect_with(url, self)
    }
}

impl Queue {
    /// Opens (creating if needed) the queue in the SQLite file at `path`, with
    /// the default options: WAL, `synchronous=FULL`, migrated.
    pub fn open(path: impl AsRef<Path>) -> Result<Queue> {
        Self::open_with(path, QueueOptions::default())
    }

    /// Opens the queue at `path` with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: QueueOptions) -> Result<Queue> {
        let path = path.as_ref();
        options.check_sqlite()?;
        let connections = Connections::open(path, &options)?;
        Self::start(
            Backend::Sqlite(connections),
            options,
            Some(path.to_path_buf()),
        )
    }

    /// Connects to the queue at `url` with the default options, migrating it:
    ///
    /// - `postgres://user@host/db` (or `postgresql://`): PostgreSQL, with the
    ///   `postgres` feature. `sslmode=require` or `verify-full` in the URL
    ///   turns on TLS.
    /// - `mysql://user@host/db`: MySQL ≥ 8.0.1 or MariaDB ≥ 10.6, with the
    ///   `mysql` feature.
    /// - `sqlite:PATH` or `sqlite://PATH`: the SQLite file at `PATH`, as
    ///   [`Queue::open`].
    ///
    /// A URL for a backend this build does not include is
    /// [`Error::FeatureDisabled`]; its password never appears in an error.
    pub fn connect(url: &str) -> Result<Queue> {
        Self::connect_with(url, QueueOptions::default())
    }

    /// Connects to the queue at `url` with `options`. See [`Queue::connect`].
    pub fn connect_with(url: &str, options: QueueOptions) -> Result<Queue> {
        match Target::parse(url)? {
            Target::Sqlite(path) => Self::open_with(path, options),
            #[cfg(feature = "postgres")]
            Target::Postgres => {
                let db = crate::backend::postgres::Db::connect(url, &options)?;
                Self::start(Backend::Postgres(db), options, None)
            }
            #[cfg(feature = "mysql")]
            Target::Mysql => {
                let db = crate::backend::mysql::Db::connect(url, &options)?;
                Self::start(Backend::Mysql(db), options, None)
            }
        }
    }

    fn start(backend: Backend, options: QueueOptions, path: Option<PathBuf>) -> Result<Queue> {
        if options.migrate {
            backend.store().migrate(options.write_deadline)?;
        }
        let bus = Bus::new(options.event_capacity);
        Ok(Queue {
            inner: Arc::new(Inner {
                backend,
                canonical_path: path.as_ref().and_then(|p| p.canonicalize().ok()),
                path,
                options,
                bus,
                settled_in: Default::default(),
                progress_gate: Default::default(),
            }),
        })
    }

    /// Applies pending schema migrations (for queues opened with
    /// [`QueueOptions::migrate`]`(false)`).
    pub fn migrate(&self) -> Result<()> {
        self.store().migrate(self.inner.options.write_deadline)
    }

    /// The schema migrations this version of backlog has that the database
    /// has not applied yet, oldest first (`V2__due`); empty when the schema
    /// is current. Reads only: tools that open with
    /// [`QueueOptions::migrate`]`(false)` check here before using a database
    /// an older backlog created.
    pub fn pending_migrations(&self) -> Result<Vec<String>> {
        self.store().pending_migrations()
    }

    /// The database file, for a queue on SQLite.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The backend, for the per-database modules: typed access to what
    /// only one database has.
    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The database, as the engine uses every one of them.
    pub(crate) fn store(&self) -> &dyn Store {
        self.inner.backend.store()
    }

    /// The options the queue was opened with.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn options(&self) -> &QueueOptions {
        &self.inner.options
    }

    /// Whether `other` is a handle on the same database.
    pub(crate) fn same_database(&self, other: &Queue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.canonical_path.is_some()
                && self.inner.canonical_path == other.inner.canonical_path)
    }

    /// SQLite: the path as given and its canonical form.
    pub(crate) fn paths(&self) -> (Option<&Path>, Option<&Path>) {
        (
            self.inner.path.as_deref(),
            self.inner.canonical_path.as_deref(),
        )
    }

    /// The current time of the queue's clock.
    pub fn now(&self) -> SystemTime {
        self.inner.options.clock.now()
    }

    /// The current time of the queue's clock as the databases store it,
    /// unix µs.
    pub(crate) fn now_micros(&self) -> i64 {
        self.inner.options.clock.now_micros()
    }

    /// How many transactions were retried after a transient failure: SQLite's
    /// BUSY/LOCKED, or a server's deadlock or serialization failure.
    pub fn busy_retries(&self) -> u64 {
        self.store().busy_retries()
    }
}

/// Where [`Queue::connect`] goes.
enum Target {
    Sqlite(PathBuf),
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    Mysql,
}

impl Target {
    fn parse(url: &str) -> Result<Target> {
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("sqlite") => {
                let rest = &url["sqlite:".len()..];
                let path = rest.strip_prefix("//").unwrap_or(rest);
                Ok(Target::Sqlite(PathBuf::from(path)))
            }
            #[cfg(feature = "postgres")]
            Some("postgres" | "postgresql") => Ok(Target::Postgres),
            #[cfg(not(feature = "postgres"))]
            Some("postgres" | "postgresql") => Err(Error::FeatureDisabled {
                feature: "postgres",
            }),
            #[cfg(feature = "mysql")]
            Some("mysql" | "mariadb") => Ok(Target::Mysql),
            #[cfg(not(feature = "mysql"))]
            Some("mysql" | "mariadb") => Err(Error::FeatureDisabled { feature: "mysql" }),
            _ => Err(Error::InvalidArgument(format!(
                "not a database URL (postgres://, mysql:// or sqlite:PATH): {:?}",
                crate::validate::redact_url(url)
            ))),
        }
    }
}
