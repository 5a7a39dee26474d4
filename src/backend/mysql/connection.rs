//! Connecting to MySQL/MariaDB: the URL, the pool, each session's settings,
//! the version check, and the retry loop every transaction goes through.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{
    AccessMode, IsolationLevel, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts, PooledConn,
    Transaction, TxOpts,
};

use super::db::Db;
use super::queries::{self, Sql, Tables};
use super::version::Server;
use crate::backend::inside::{self, Inside};
use crate::backend::room;
use crate::error::{Error, Result};
use crate::options::QueueOptions;
use crate::validate::redact_url;

/// Prepared statements kept per connection: the fixed statements, and the
/// lease walks of a few queue and kind counts.
const STATEMENT_CACHE: usize = 128;

thread_local! {
    /// Whether the transaction running on this thread made a job runnable
    /// that no enqueue call of this process announces: a job released from
    /// waiting for its dependencies (`flows::finished`), or a batch's
    /// callback (`batches::fire_if_due`). Other nodes see them by the
    /// `{releases}` counter and the newest id their poller reads; this
    /// process's own pollers are rung once the transaction commits
    /// ([`Db::write`]), as a fresh enqueue rings them, so such a job starts
    /// without waiting for this process's next poll.
    static RUNNABLE: Cell<bool> = const { Cell::new(false) };
}

/// Notes that the transaction on this thread made a job runnable (see
/// `RUNNABLE`).
pub(crate) fn note_runnable() {
    RUNNABLE.set(true);
}

/// Parses the URL into connection options: every session reads committed
/// data, runs in strict mode, and waits for a row lock no longer than the
/// write deadline allows.
pub(crate) fn opts(url: &str, options: &QueueOptions) -> Result<(Opts, String)> {
    // The driver knows only `mysql://`; `Queue::connect` also takes `mariadb://`.
    let normalized = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => {
            format!("mysql://{rest}")
        }
        _ => url.to_owned(),
    };
    let parsed = Opts::from_url(&normalized)
        .map_err(|e| Error::InvalidArgument(format!("bad MySQL URL {}: {e}", redact_url(url))))?;
    let database = parsed
        .get_db_name()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a MySQL URL must name its database (mysql://user@host/DATABASE): {}",
                redact_url(url)
            ))
        })?
        .to_owned();
    let pool_size = usize::try_from(options.pool_size).unwrap_or(usize::MAX);
    let constraints = PoolConstraints::new(0, pool_size)
        .ok_or_else(|| Error::InvalidArgument("pool_size must be at least 1".into()))?;
    let lock_wait = options.write_deadline.as_secs().clamp(1, 50);
    let mut builder = OptsBuilder::from_opts(parsed.clone());
    // A server that vanished without closing its sockets (a host down, a
    // network cut) would leave a call waiting for its answer for ever. Three
    // bounds (the URL may set the first two: `tcp_user_timeout_ms`,
    // `tcp_keepalive_time_ms`):
    // - TCP_USER_TIMEOUT (Linux): a request or keepalive probe the peer has
    //   not acknowledged for 10 s closes the connection. The server's kernel
    //   acknowledges at once even while a statement runs for minutes, so
    //   this never cuts a legitimate statement short.
    // - keepalive probes after 10 s idle, every 5 s: a call waiting for an
    //   answer on a dead network fails within about 20 s (the probes fall
    //   under TCP_USER_TIMEOUT).
    // - read and write timeouts ([`socket_timeout`]): the backstop for a
    //   peer whose TCP stack answers but whose server never does.
    if parsed.get_tcp_keepalive_time_ms().is_none() {
        builder = builder.tcp_keepalive_time_ms(Some(10_000));
        #[cfg(any(target_os = "linux", target_os = "macos"))]
        {
            builder = builder
                .tcp_keepalive_probe_interval_secs(Some(5))
                .tcp_keepalive_probe_count(Some(3));
        }
    }
    #[cfg(target_os = "linux")]
    if parsed.get_tcp_user_timeout_ms().is_none() {
        builder = builder.tcp_user_timeout_ms(Some(10_000));
    }
    builder = builder
        .read_timeout(Some(socket_timeout(options)))
        .write_timeout(Some(socket_timeout(options)));
    let builder = builder
        .tcp_connect_timeout(Some(options.connect_timeout))
        .stmt_cache_size(STATEMENT_CACHE)
        // A broken connection is found by the next statement and discarded
        // then (see `discard_if_broken`), not by a ping before each use.
        .pool_opts(
            PoolOpts::default()
                .with_constraints(constraints)
                .with_reset_connection(false)
                .with_check_health(false),
        )
        .init(vec![
            // Claims need READ COMMITTED: under REPEATABLE READ (the
            // default) locking reads also lock the gaps between index
            // entries, and concurrent claims and enqueues deadlock. The
            // statement, not the variable, because MySQL 8 names it
            // `transaction_isolation` and MariaDB before 11.1 `tx_isolation`.
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
            // Strict: a value that does not fit is an error, never truncated.
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'".to_owned(),
            format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}"),
        ]);
    Ok((builder.into(), database))
}

/// How long a pooled connection waits for the server to answer (or to take
/// bytes) before the call fails as a lost connection: the write deadline
/// plus two minutes (150 s by default). The library's longest legitimate
/// waits are bounded by the write deadline (a row lock's
/// `innodb_lock_wait_timeout`, the migration lock's `GET_LOCK`), and its
/// statements otherwise take milliseconds; the two minutes leave room for a
/// migration's DDL on a large table, and for the application's own
/// statements in `queue.transaction(..)`, which share these connections. A
/// network cut is found sooner, by TCP_USER_TIMEOUT and keepalive (see
/// [`opts`]); this bound is for a server that accepts packets and never
/// answers.
pub(crate) fn socket_timeout(options: &QueueOptions) -> Duration {
    options
        .write_deadline
        .saturating_add(Duration::from_secs(120))
}

impl Db {
    /// Connects, checks the server's version, and renders the statements for
    /// the queue's tables. Migrations are the caller's next step.
    pub(crate) fn connect(url: &str, options: &QueueOptions) -> Result<Db> {
        options.check_common()?;
        let (opts, database) = opts(url, options)?;
        let redacted = redact_url(url);
        let pool = Pool::new(opts.clone()).map_err(|e| connect_error(&redacted, e.into()))?;
        let mut conn = room::wait_for_room(
            "a connection",
            &redacted,
            options.connect_deadline,
            is_refused,
            || Ok(pool.try_get_conn(options.connect_timeout)?),
        )
        .map_err(|e| connect_error(&redacted, e))?;
        let version: Option<String> = conn.query_first(queries::VERSION)?;
        let server = Server::parse(version.as_deref().unwrap_or_default())?.check()?;
        drop(conn);
        Ok(Db {
            pool,
            opts,
            sql: std::sync::Arc::new(Sql::new(
                Tables::new(&database, &options.table_prefix),
                server.is_mariadb(),
            )),
            prefix: options.table_prefix.clone(),
            server,
            url: redacted,
            write_deadline: options.write_deadline,
            clock: options.clock.clone(),
            busy_retries: AtomicU64::new(0),
            bells: Default::default(),
            limited: Default::default(),
        })
    }

    /// Names this database for [`inside`]: the `Db` lives in the queue's
    /// shared state, at one address for the queue's life.
    fn id(&self) -> usize {
        inside::id_of(self)
    }

    /// [`Error::InsideTransaction`] on a thread inside this queue's
    /// transaction ([`Db::transaction`]): a write would wait for the row
    /// locks that transaction holds until `innodb_lock_wait_timeout`.
    pub(crate) fn refuse_inside(&self) -> Result<()> {
        inside::refuse(self.id())
    }

    /// A pooled connection, waiting for a free one up to the write deadline
    /// ([`Error::Busy`] then), and for room on a full server (a new
    /// connection refused, [`is_refused`]) up to the write deadline too; a
    /// connection another call returns meanwhile ends that wait. A thread inside this queue's transaction
    /// holds one connection already, and the others may be held by calls
    /// waiting for that transaction's locks: it takes an idle connection or
    /// opens one while the pool has room, and otherwise gets
    /// [`Error::InsideTransaction`] at once instead of waiting (always with
    /// `pool_size(1)`).
    ///
    /// An idle connection the server has closed meanwhile (a restart, a
    /// kill, `wait_timeout`, a proxy's reset: its socket holds the server's
    /// FIN) is dropped and another taken, at no cost of a round trip
    /// ([`closed_by_peer`]); the pool makes a new one once no idle one is
    /// left.
    ///
    /// At most [`STALE_CHECKOUTS`] closed connections are passed over in one
    /// call; the next one is returned as it is, to fail on use with the
    /// driver's error, so a server that closes every connection it accepts
    /// cannot keep this call looping.
    pub(crate) fn conn(&self) -> Result<PooledConn> {
        for _ in 0..STALE_CHECKOUTS {
            let mut conn = self.checkout()?;
            if closed_by_peer(&conn) != Some(true) {
                return Ok(conn);
            }
            // Dropped by the pool on its return: the reset fails.
            conn.reset_connection(true);
        }
        self.checkout()
    }

    fn checkout(&self) -> Result<PooledConn> {
        if inside::is_inside(self.id()) {
            return self.pool.try_get_conn(Duration::ZERO).map_err(|e| match e {
                mysql::Error::DriverError(mysql::DriverError::Timeout) => Error::InsideTransaction,
                e => e.into(),
            });
        }
        let start = Instant::now();
        room::wait_for_room(
            "a pooled connection",
            &self.url,
            self.write_deadline,
            is_refused,
            || {
                let left = self.write_deadline.saturating_sub(start.elapsed());
                Ok(self.pool.try_get_conn(left.max(Duration::from_secs(1)))?)
            },
        )
    }

    /// Runs `f` in a transaction on a pooled connection and commits. The
    /// whole transaction is retried with jittered backoff up to the write
    /// deadline on a deadlock or lock wait timeout, and on a fresh connection
    /// when the one it got was broken before the commit was sent (nothing
    /// was committed then: the server rolls back a dead session's
    /// transaction). `f` must therefore be repeatable. Refused inside this
    /// queue's transaction ([`Db::refuse_inside`]).
    pub(crate) fn write<T>(
        &self,
        mut f: impl FnMut(&mut Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.refuse_inside()?;
        self.with_retries(|| {
            let mut conn = self.conn()?;
            let result = (|| {
                RUNNABLE.set(false);
                let mut tx = conn.start_transaction(TxOpts::default())?;
                let value = f(&mut tx)?;
                tx.commit().map_err(|e| Attempt::Committing(e.into()))?;
                if RUNNABLE.take() {
                    self.rescheduled();
                }
                Ok(value)
            })();
            if let Err(Attempt::Failed(e) | Attempt::Committing(e)) = &result {
                discard_if_broken(&mut conn, e);
            }
            result
        })
    }

    /// Runs `f`, a single statement that commits by itself (autocommit), on
    /// a pooled connection: one round trip where [`Db::write`] takes three
    /// (`START TRANSACTION`, the statement, `COMMIT`). `None` where an idle
    /// connection closed by the server cannot be told apart before use
    /// ([`closed_by_peer`]): the caller takes [`Db::write`] then.
    ///
    /// Retried as [`Db::write`] is, up to the moment the statement is sent:
    /// a connection the server closed while it sat in the pool is replaced
    /// before anything is sent ([`Db::conn`]), and an error the server
    /// answers (a deadlock, a lock wait timeout, a killed query) means the
    /// statement did not commit, so it runs again. A connection lost after
    /// the statement was sent and before its answer came leaves the outcome
    /// unknown, as the commit of [`Db::write`] does: the statement may have
    /// committed, so it is not run again (that could write twice) and the
    /// error is returned. A raw autocommit insert behaves the same.
    pub(crate) fn autocommit<T>(
        &self,
        mut f: impl FnMut(&mut PooledConn) -> Result<T>,
    ) -> Option<Result<T>> {
        closed_by_peer_is_known()?;
        if let Err(e) = self.refuse_inside() {
            return Some(Err(e));
        }
        Some(self.with_retries(|| {
            let mut conn = self.conn()?;
            f(&mut conn).map_err(|e| {
                discard_if_broken(&mut conn, &e);
                if is_connectivity(&e) && !is_answer(&e) {
                    Attempt::Committing(e)
                } else {
                    Attempt::Failed(e)
                }
            })
        }))
    }

    /// Runs `f`, which only reads, in one read-only `REPEATABLE READ`
    /// transaction: its statements read the moment of its first read, where
    /// under the session's READ COMMITTED each would read its own (a job
    /// moving between two tables could be missed by both reads). Its reads
    /// take no locks. Retried as [`Db::read`]; the isolation level applies
    /// to this transaction only.
    ///
    /// Not `WITH CONSISTENT SNAPSHOT`, which would take the moment at the
    /// start instead: the driver (mysql 28) panics when that statement's
    /// answer is lost (it unwraps it), and the first read gives one moment
    /// all the same.
    pub(crate) fn read_snapshot<T>(
        &self,
        mut f: impl FnMut(&mut Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.with_retries(|| {
            let mut conn = self.conn()?;
            let result = (|| {
                let opts = TxOpts::default()
                    .set_isolation_level(Some(IsolationLevel::RepeatableRead))
                    .set_access_mode(Some(AccessMode::ReadOnly));
                let mut tx = conn.start_transaction(opts)?;
                let value = f(&mut tx)?;
                tx.commit()?;
                Ok(value)
            })();
            if let Err(e) = &result {
                discard_if_broken(&mut conn, e);
            }
            result.map_err(Attempt::from)
        })
    }

    /// Runs `f` on a pooled connection, once more on a fresh one if the
    /// first was broken (reads are idempotent). Consistent reads take no
    /// row locks (the sessions read committed data), so reads run inside
    /// this queue's transaction too, on another connection ([`Db::conn`]).
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&mut PooledConn) -> Result<T>) -> Result<T> {
        self.with_retries(|| {
            let mut conn = self.conn()?;
            let result = f(&mut conn);
            if let Err(e) = &result {
                discard_if_broken(&mut conn, e);
            }
            result.map_err(Attempt::from)
        })
    }

    /// Runs a caller's closure in a transaction on a pooled connection;
    /// commits on `Ok`, rolls back on `Err`. Only getting a working
    /// connection (a ping) is retried: the closure runs once.
    ///
    /// While `f` runs the thread is inside this queue's transaction: the
    /// queue's writes (and a second transaction) answer
    /// [`Error::InsideTransaction`] at once there.
    pub(crate) fn transaction<T, E>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        self.refuse_inside()?;
        let mut conn = self.with_retries(|| {
            let mut conn = self.conn()?;
            if let Err(e) = conn.as_mut().ping() {
                let e = Error::from(e);
                discard_if_broken(&mut conn, &e);
                return Err(e.into());
            }
            Ok(conn)
        })?;
        // Whatever session state the caller's statements leave must not
        // reach the next user of the connection.
        conn.reset_connection(true);
        let _inside = Inside::enter(self.id())?;
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .map_err(Error::from)?;
        let value = f(&mut tx)?;
        tx.commit().map_err(Error::from)?;
        Ok(value)
    }

    /// The retry loop: transient lock errors until the write deadline (then
    /// [`Error::Busy`]), a broken connection before a commit twice.
    fn with_retries<T>(&self, mut f: impl FnMut() -> std::result::Result<T, Attempt>) -> Result<T> {
        const BROKEN_TRIES: u32 = 3;
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        let mut broken = 0;
        loop {
            let error = match f() {
                Ok(value) => return Ok(value),
                Err(Attempt::Committing(e)) => return Err(e),
                Err(Attempt::Failed(e)) => e,
            };
            let transient = match &error {
                Error::Busy => start.elapsed() < self.write_deadline,
                e if is_connectivity(e) => {
                    broken += 1;
                    broken < BROKEN_TRIES
                }
                _ => false,
            };
            if !transient {
                return Err(error);
            }
            if error.is_busy() {
                self.busy_retries.fetch_add(1, Ordering::Relaxed);
            }
            let jittered = backoff.mul_f64(rand::random_range(0.5..=1.5));
            thread::sleep(jittered.min(self.write_deadline.saturating_sub(start.elapsed())));
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }
}

/// How one try of a transaction ended: failed before its commit was sent
/// (safe to run again), or failed committing (the outcome is unknown).
pub(crate) enum Attempt {
    Failed(Error),
    Committing(Error),
}

impl From<Error> for Attempt {
    fn from(e: Error) -> Self {
        Attempt::Failed(e)
    }
}

impl From<mysql::Error> for Attempt {
    fn from(e: mysql::Error) -> Self {
        Attempt::Failed(e.into())
    }
}

/// After a connection error, the connection is reset when it goes back to
/// the pool, which drops it when the reset fails; a connection that still
/// works comes back clean (the reset re-runs the session settings).
fn discard_if_broken(conn: &mut PooledConn, e: &Error) {
    if is_connectivity(e) {
        conn.reset_connection(true);
    }
}

/// How many idle connections closed by the server one [`Db::conn`] passes
/// over before it returns one as it is: more than a pool holds, so a server
/// restart that closed them all is passed over in one call.
const STALE_CHECKOUTS: usize = 256;

/// Whether the server has closed this idle connection: its FIN (or a
/// reset) is waiting on the socket. Costs one `poll` on the socket, no round
/// trip. An idle connection has no answer due, so anything the server sent
/// is a goodbye (MariaDB's notice of a kill or a shutdown comes with the
/// FIN). `None` where it cannot be told (off Linux: `POLLRDHUP` is
/// Linux's). A connection that breaks without a FIN (a silent network cut)
/// is not found here, and fails on use.
#[cfg(target_os = "linux")]
fn closed_by_peer(conn: &PooledConn) -> Option<bool> {
    use std::os::unix::io::AsRawFd;
    let mut fd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; the socket stays open
    // (borrowed from `conn`) for the call.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    Some(ready < 0 || fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
}

#[cfg(not(target_os = "linux"))]
fn closed_by_peer(_: &PooledConn) -> Option<bool> {
    None
}

/// `Some` where [`closed_by_peer`] can tell.
fn closed_by_peer_is_known() -> Option<()> {
    cfg!(target_os = "linux").then_some(())
}

/// True for an error of the connection rather than of the statement: the
/// server went away, the socket broke, the session was killed.
pub(crate) fn is_connectivity(e: &Error) -> bool {
    match e {
        Error::Database(inner) => inner
            .downcast_ref::<mysql::Error>()
            .is_some_and(|e| match e {
                mysql::Error::MySqlError(e) => {
                    // ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN, ER_QUERY_INTERRUPTED
                    matches!(e.code, 1927 | 1053 | 1317)
                }
                e => e.is_connectivity_error(),
            }),
        _ => false,
    }
}

/// True for an error the server answered (an error packet), as opposed to
/// an answer that never came: the statement did not commit.
fn is_answer(e: &Error) -> bool {
    matches!(e, Error::Database(inner)
        if matches!(inner.downcast_ref::<mysql::Error>(), Some(mysql::Error::MySqlError(_))))
}

/// True when the server refused a new connection for lack of room: its
/// `max_connections` (ER_CON_COUNT_ERROR, 1040), the global
/// `max_user_connections` (ER_TOO_MANY_USER_CONNECTIONS, 1203), or the
/// account's `MAX_USER_CONNECTIONS` (ER_USER_LIMIT_REACHED, 1226, which
/// MariaDB answers for it). A session ending elsewhere makes room: worth
/// waiting for.
pub(crate) fn is_refused(e: &Error) -> bool {
    let Error::Database(inner) = e else {
        return false;
    };
    matches!(
        inner.downcast_ref::<mysql::Error>(),
        Some(mysql::Error::MySqlError(e)) if matches!(e.code, 1040 | 1203 | 1226)
    )
}

/// A failure to reach the server, naming it without its password.
fn connect_error(redacted_url: &str, e: Error) -> Error {
    match e {
        Error::Database(inner) => {
            Error::Database(format!("connecting to {redacted_url}: {inner}").into())
        }
        other => other,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `BACKLOG_TEST_MYSQL_URL`, or `None` (saying the test is skipped)
    /// when no server is configured: for this module's tests and
    /// `inspect.rs`'s.
    pub(crate) fn test_url() -> Option<String> {
        let url = std::env::var("BACKLOG_TEST_MYSQL_URL")
            .ok()
            .filter(|u| !u.is_empty());
        if url.is_none() {
            println!("SKIPPED: set BACKLOG_TEST_MYSQL_URL");
        }
        url
    }

    /// A `Db` on the test server; `None` when none is configured. Nothing
    /// is written: the transactions below only read.
    fn db() -> Result<Option<Db>> {
        test_url()
            .map(|url| Db::connect(&url, &QueueOptions::new()))
            .transpose()
    }

    /// The pollers of this process are rung after, and only after, a
    /// committed transaction that made a job runnable (a release, a batch's
    /// callback).
    #[test]
    fn a_committed_release_or_callback_rings_this_processs_pollers() -> Result<()> {
        let Some(db) = db()? else {
            return Ok(());
        };
        let bell = db.bells.add();
        db.write(|tx| Ok(tx.query_drop("SELECT 1")?))?;
        assert!(bell.try_recv().is_err(), "rung without a release");

        let failed: Result<()> = db.write(|tx| {
            tx.query_drop("SELECT 1")?;
            note_runnable();
            Err(Error::InvalidArgument("rolled back".into()))
        });
        assert!(failed.is_err());
        assert!(bell.try_recv().is_err(), "rung for a rolled back release");

        db.write(|tx| {
            tx.query_drop("SELECT 1")?;
            note_runnable();
            assert!(bell.try_recv().is_err(), "rung before the commit");
            Ok(())
        })?;
        assert!(bell.try_recv().is_ok(), "not rung after the commit");
        // The note does not outlive its transaction.
        db.write(|tx| Ok(tx.query_drop("SELECT 1")?))?;
        assert!(bell.try_recv().is_err(), "rung again without a release");
        Ok(())
    }
}
