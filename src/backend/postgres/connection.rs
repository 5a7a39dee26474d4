//! The connections of a PostgreSQL queue: the queue's pool (over
//! `pool.rs`'s connections, each with its statement cache), the retry loop
//! every operation goes through, and how the server's errors map to
//! backlog's.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, Statement};

use super::pool::{is_refused, ConnPool, Manager, PgConnection, Pooled, Statements};
use super::target::Target;
use crate::backend::inside::{self, Inside};
use crate::backend::room;
use crate::error::{Error, Result};
use crate::options::QueueOptions;

/// One client (the queue's transaction, a pooled connection, or the
/// application's transaction) and, on the queue's own connections, its
/// statement cache.
pub(crate) struct Tx<'a, C> {
    client: &'a mut C,
    statements: Option<&'a mut Statements>,
}

/// How long a pooled connection may sit idle and still be used by
/// [`Pool::autocommit_once`] without a check. Enqueues in a loop take their
/// connection back within microseconds and stay at one round trip each; an
/// enqueue after a pause pays one more, the check, which replaces a
/// connection the server closed meanwhile (the driver sees a close only
/// through a round trip). A connection closed less than this after its last
/// answer makes that enqueue fail with the outcome unknown, never sent
/// twice. (`pgx`'s pool, River's, checks a connection idle over a second.)
const TRUSTED_IDLE: Duration = Duration::from_millis(1);

/// Parameters as the driver takes them.
pub(crate) type Params<'p> = [&'p (dyn ToSql + Sync)];

impl<'a, C: GenericClient> Tx<'a, C> {
    /// A client of the queue's, with its connection's statement cache.
    pub(crate) fn cached(client: &'a mut C, statements: &'a mut Statements) -> Self {
        Tx {
            client,
            statements: Some(statements),
        }
    }

    /// A client without a statement cache (the application's transaction).
    pub(crate) fn uncached(client: &'a mut C) -> Self {
        Tx {
            client,
            statements: None,
        }
    }

    fn statement(&mut self, sql: &str) -> Result<Statement> {
        if let Some(cache) = self.statements.as_deref_mut() {
            if let Some(stmt) = cache.get(sql) {
                return Ok(stmt.clone());
            }
            let stmt = self.client.prepare(sql)?;
            cache.insert(sql.to_owned(), stmt.clone());
            return Ok(stmt);
        }
        Ok(self.client.prepare(sql)?)
    }

    pub(crate) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>> {
        let stmt = self.statement(sql)?;
        Ok(self.client.query(&stmt, params)?)
    }

    pub(crate) fn query_opt(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>> {
        let stmt = self.statement(sql)?;
        Ok(self.client.query_opt(&stmt, params)?)
    }

    pub(crate) fn execute(&mut self, sql: &str, params: &Params<'_>) -> Result<u64> {
        let stmt = self.statement(sql)?;
        Ok(self.client.execute(&stmt, params)?)
    }

    /// Runs SQL text as is (EXPLAIN), bypassing the statement cache.
    pub(crate) fn query_text(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>> {
        Ok(self.client.query(sql, params)?)
    }
}

/// The pool of one queue, its retry loop and its counters.
pub(crate) struct Pool {
    pub target: Target,
    pool: ConnPool,
    /// How long taking a connection waits for a free one, per try.
    checkout_timeout: Duration,
    deadline: Duration,
    busy_retries: AtomicU64,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of up to `options.pool_size` connections. Opens none: the
    /// caller checks the server on a connection of its own first, and
    /// hands it over ([`Pool::adopt`]).
    pub(crate) fn new(target: Target, options: &QueueOptions) -> Result<Pool> {
        let pool = ConnPool::new(
            Manager {
                target: target.clone(),
                lock_timeout: options.write_deadline,
            },
            options.pool_size,
        );
        Ok(Pool {
            target,
            pool,
            checkout_timeout: options.connect_timeout.max(Duration::from_millis(100)),
            deadline: options.write_deadline,
            busy_retries: AtomicU64::new(0),
        })
    }

    /// Keeps `client`, the connection the server was checked on at
    /// connect, as the pool's first: a node that starts on a full server
    /// waits for room once, not once more for its migrations and again for
    /// its first call.
    pub(crate) fn adopt(&self, client: Client) -> Result<()> {
        self.pool.adopt(client)
    }

    /// Runs `f` (the migrations) once, on a pooled connection's client. Its
    /// DDL may change what the connection's prepared statements return:
    /// they are dropped after, and the connection too when `f` failed (it
    /// may still hold the migration lock).
    pub(crate) fn migrating<T>(&self, f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        inside::refuse(self.id())?;
        let mut conn = self.retrying(|| self.pool.get(self.checkout_timeout))?;
        let result = f(&mut conn.client);
        conn.statements.clear();
        if result.is_err() {
            conn.broken = true;
        }
        result
    }

    pub(crate) fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    /// Names this pool's database for [`inside`]: the pool lives boxed in
    /// the queue's `Db`, at one address for the queue's life.
    fn id(&self) -> usize {
        inside::id_of(self)
    }

    /// Runs `f` in a transaction on a pooled connection and commits. Retried
    /// whole, with jittered backoff until the write deadline, on a deadlock
    /// or serialization failure, and on a connection found dead before the
    /// commit (the server rolled that transaction back). A connection lost
    /// during the commit is not retried: whether it committed is unknown.
    ///
    /// [`Error::InsideTransaction`] at once on a thread inside this queue's
    /// transaction ([`Pool::transaction`]): the write could wait for a row
    /// lock that transaction holds until `lock_timeout`.
    pub(crate) fn write<T>(
        &self,
        mut f: impl FnMut(&mut Tx<'_, postgres::Transaction<'_>>) -> Result<T>,
    ) -> Result<T> {
        self.write_deciding(|tx| Ok((f(tx)?, true)))
            .map(|(value, _)| value)
    }

    /// [`Pool::write`] whose `f` also says whether to commit: its
    /// transaction is rolled back on `false` (and its value returned all the
    /// same, for the caller to drop).
    pub(crate) fn write_deciding<T>(
        &self,
        mut f: impl FnMut(&mut Tx<'_, postgres::Transaction<'_>>) -> Result<(T, bool)>,
    ) -> Result<(T, bool)> {
        inside::refuse(self.id())?;
        self.retrying(|| {
            let mut conn = self.pool.get(self.checkout_timeout)?;
            let result = (|| {
                let PgConnection {
                    client, statements, ..
                } = &mut *conn;
                let mut tx = client.transaction()?;
                let (value, commit) = f(&mut Tx {
                    client: &mut tx,
                    statements: Some(statements),
                })?;
                if commit {
                    tx.commit().map_err(commit_error)?;
                } else {
                    tx.rollback()?;
                }
                Ok((value, commit))
            })();
            if result.as_ref().is_err_and(is_connection_lost) {
                conn.broken = true;
            }
            result
        })
    }

    /// Runs `f` on a pooled connection outside a transaction: one statement
    /// that writes and commits by itself (a lease, a heartbeat). Retried as
    /// [`Pool::write`]; a connection lost while the statement ran is
    /// retried too, so `f` must be one statement whose repetition is
    /// harmless (a lease the server rolled back with the session). Refused
    /// inside this queue's transaction, as [`Pool::write`].
    pub(crate) fn autocommit<T>(
        &self,
        f: impl FnMut(&mut Tx<'_, Client>) -> Result<T>,
    ) -> Result<T> {
        inside::refuse(self.id())?;
        self.statement(f)
    }

    /// Runs `f`, one statement that writes and commits by itself and must
    /// not run twice (the insert of plain jobs), on a pooled connection outside
    /// a transaction: one round trip, where `BEGIN`, the statement and
    /// `COMMIT` take three. Refused inside this queue's transaction, as
    /// [`Pool::write`].
    ///
    /// It is sent once. What is retried is what surely did not commit: an
    /// error the server answered (the statement failed), and a connection
    /// found dead before anything was sent. A connection idle in the pool
    /// for longer than [`TRUSTED_IDLE`] is checked first with an empty
    /// query (one round trip): a connection the server closed meanwhile (a
    /// restart, `idle_session_timeout`) fails that check and is replaced.
    /// One used more recently is trusted: the driver cannot see a close
    /// without a round trip. A connection lost after the statement was
    /// sent leaves its outcome unknown: the caller gets
    /// [`CommitUnknown`]'s error, and the job is there once or not at all,
    /// as after a raw insert or a transaction's lost `COMMIT`. An `Ok` is
    /// the server's answer after the commit (the driver reads up to
    /// `ReadyForQuery`, which follows the implicit commit).
    pub(crate) fn autocommit_once<T>(
        &self,
        mut f: impl FnMut(&mut Tx<'_, Client>) -> Result<T>,
    ) -> Result<T> {
        inside::refuse(self.id())?;
        self.retrying(|| {
            let mut conn = self.pool.get(self.checkout_timeout)?;
            if conn.idle_for() > TRUSTED_IDLE {
                if let Err(e) = conn.client.simple_query("") {
                    conn.broken = true;
                    return Err(Error::from(e));
                }
            }
            run_outside(&mut conn, &mut f).map_err(|e| {
                if is_connection_lost(&e) {
                    let unknown = CommitUnknown::new("an autocommit statement", e);
                    Error::Database(Box::new(unknown))
                } else {
                    e
                }
            })
        })
    }

    /// Runs `f`, which only reads, on a pooled connection outside a
    /// transaction. Retried as [`Pool::autocommit`]. Plain reads wait on no
    /// row lock (MVCC), so they run inside this queue's transaction too,
    /// on another connection (see [`Pool::checkout`]).
    pub(crate) fn read<T>(&self, f: impl FnMut(&mut Tx<'_, Client>) -> Result<T>) -> Result<T> {
        self.statement(f)
    }

    /// Runs `f`, which only reads, in one `REPEATABLE READ READ ONLY`
    /// transaction on a pooled connection: its statements see one snapshot
    /// (under `READ COMMITTED` each would take its own), and such a
    /// transaction never waits on a lock nor fails to serialize. Retried and
    /// allowed inside this queue's transaction, as [`Pool::read`].
    pub(crate) fn read_snapshot<T>(
        &self,
        mut f: impl FnMut(&mut Tx<'_, postgres::Transaction<'_>>) -> Result<T>,
    ) -> Result<T> {
        self.retrying(|| {
            let mut conn = self.checkout()?;
            let result = (|| {
                let PgConnection {
                    client, statements, ..
                } = &mut *conn;
                let mut tx = client
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()?;
                let value = f(&mut Tx {
                    client: &mut tx,
                    statements: Some(statements),
                })?;
                tx.commit()?;
                Ok(value)
            })();
            if result.as_ref().is_err_and(is_connection_lost) {
                conn.broken = true;
            }
            result
        })
    }

    /// One statement outside a transaction, for [`Pool::autocommit`] and
    /// [`Pool::read`].
    fn statement<T>(&self, mut f: impl FnMut(&mut Tx<'_, Client>) -> Result<T>) -> Result<T> {
        self.retrying(|| run_outside(&mut self.checkout()?, &mut f))
    }

    /// Hands a pooled connection to `f` in a transaction it owns (the
    /// application's closure), with the connection's statement cache for
    /// backlog's own statements in it. Only checking out a live connection is
    /// retried; `f` runs once. Commits on `Ok`, rolls back on `Err`.
    ///
    /// While `f` runs the thread is inside this queue's transaction: the
    /// queue's writes (and a second transaction) answer
    /// [`Error::InsideTransaction`] at once there, reads run on other
    /// connections ([`Pool::checkout`]).
    pub(crate) fn transaction<T, E>(
        &self,
        f: impl FnOnce(&mut postgres::Transaction<'_>, &mut Statements) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        let _inside = Inside::enter(self.id())?;
        // The closure runs once, so the connection is checked first: one
        // the server closed while it sat in the pool is replaced, not handed
        // to `f` to fail on.
        let mut conn = self.retrying(|| {
            let mut conn = self.pool.get(self.checkout_timeout)?;
            if let Err(e) = conn.client.simple_query("") {
                conn.broken = true;
                return Err(Error::from(e));
            }
            Ok(conn)
        })?;
        let result = (|| {
            let PgConnection {
                client, statements, ..
            } = &mut *conn;
            let mut tx = client.transaction().map_err(Error::from)?;
            let value = f(&mut tx, statements)?;
            tx.commit().map_err(commit_error)?;
            Ok(value)
        })();
        if conn.client.is_closed() {
            conn.broken = true;
        }
        result
    }

    /// A pooled connection, waiting for one up to the connect timeout (and
    /// retried up to the write deadline). A thread inside this queue's
    /// transaction holds one connection already, and the others may be
    /// held by calls waiting for that transaction's locks: it takes an idle
    /// connection or opens one while the pool has room, and otherwise gets
    /// [`Error::InsideTransaction`] at once instead of waiting (always with
    /// `pool_size(1)`).
    fn checkout(&self) -> Result<Pooled> {
        if !inside::is_inside(self.id()) {
            return self.pool.get(self.checkout_timeout);
        }
        if let Some(conn) = self.pool.try_get() {
            return Ok(conn);
        }
        if self.pool.connections() < self.pool.max_size() {
            return self.pool.get(self.checkout_timeout);
        }
        Err(Error::InsideTransaction)
    }

    /// Retries `f` on transient failures until the deadline.
    fn retrying<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        loop {
            match f() {
                Err(e) if retriable(&e) && start.elapsed() < self.deadline => {
                    if e.is_busy() {
                        self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    } else if is_refused(&e) {
                        // No connection at all, and no room for one: wait
                        // for a session elsewhere to end, without knocking
                        // at the server more than a few times a second.
                        room::warn_refused("a pooled connection", &self.target.redacted, &e);
                        backoff = backoff.max(Duration::from_millis(250));
                    } else {
                        // A dead connection or an unreachable server: wait
                        // longer than for a lock (a restart takes seconds).
                        backoff = backoff.max(Duration::from_millis(50));
                    }
                    let longest = if is_refused(&e) {
                        Duration::from_secs(1)
                    } else {
                        Duration::from_millis(250)
                    };
                    let jittered = room::jittered(backoff);
                    thread::sleep(jittered.min(self.deadline.saturating_sub(start.elapsed())));
                    backoff = (backoff * 2).min(longest);
                }
                other => return other,
            }
        }
    }
}

/// Runs `f` on `conn` outside a transaction, with the connection's
/// statement cache; a connection `f` found dead is marked so that the pool
/// drops it.
fn run_outside<T>(
    conn: &mut Pooled,
    f: &mut impl FnMut(&mut Tx<'_, Client>) -> Result<T>,
) -> Result<T> {
    let PgConnection {
        client,
        statements,
        broken,
    } = &mut **conn;
    let result = f(&mut Tx {
        client,
        statements: Some(statements),
    });
    if result.as_ref().is_err_and(is_connection_lost) {
        *broken = true;
    }
    result
}

/// Opens one connection to `target`, waiting for room on a full server up
/// to `bound` ([`is_refused`]); any other failure is returned at once.
pub(crate) fn connect_waiting(target: &Target, bound: Duration) -> Result<Client> {
    room::wait_for_room("a connection", &target.redacted, bound, is_refused, || {
        target.connect()
    })
}

/// Whether an operation may simply run again.
fn retriable(e: &Error) -> bool {
    e.is_busy() || is_connection_lost(e) || is_refused(e)
}

/// True when the server could not be reached: the connection was lost
/// (also during a COMMIT, whose outcome is then unknown), or no connection
/// could be opened (the server is down, restarting, or refuses one for lack
/// of room). The worker's completer keeps its outcomes for when the server
/// answers again; a repeated settle is fenced on its lease tokens.
pub(crate) fn is_unreachable(e: &Error) -> bool {
    is_connection_lost(e)
        || is_refused(e)
        || matches!(e, Error::Database(inner) if inner.is::<CommitUnknown>())
}

/// True for an error that says the connection is gone: closed, reset, or
/// terminated by the server (`pg_terminate_backend`, a shutdown).
pub(crate) fn is_connection_lost(e: &Error) -> bool {
    let Error::Database(inner) = e else {
        return false;
    };
    let Some(pg) = inner.downcast_ref::<postgres::Error>() else {
        return false;
    };
    if pg.is_closed() {
        return true;
    }
    if let Some(code) = pg.code() {
        let code = code.code();
        // 08: connection exception; 57P01-03: admin shutdown, crash
        // shutdown, cannot connect now.
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    }
    // An I/O error with no SQLSTATE: the socket failed.
    std::error::Error::source(pg).is_some_and(|s| s.is::<std::io::Error>())
}

/// The error of a failed `COMMIT`. When the connection died during it, the
/// transaction may or may not have committed: say so, and do not let the
/// retry loop run it again.
fn commit_error(e: postgres::Error) -> Error {
    let e = Error::from(e);
    if is_connection_lost(&e) {
        Error::Database(Box::new(CommitUnknown::new("COMMIT", e)))
    } else {
        e
    }
}

/// The connection was lost while committing: during a transaction's
/// `COMMIT`, or an autocommit statement ([`Pool::autocommit_once`]).
/// Never retried.
#[derive(Debug)]
pub(crate) struct CommitUnknown {
    during: &'static str,
    cause: String,
}

impl CommitUnknown {
    fn new(during: &'static str, cause: Error) -> Self {
        CommitUnknown {
            during,
            cause: cause.to_string(),
        }
    }
}

impl fmt::Display for CommitUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the connection was lost during {}; it may or may not have committed: {}",
            self.during, self.cause
        )
    }
}

impl std::error::Error for CommitUnknown {}

/// Maps PostgreSQL errors: deadlocks, serialization failures and lock
/// timeouts are transient ([`Error::Busy`] once retries run out), a full disk
/// is [`Error::StorageFull`], JSON that JSONB cannot store (`\u0000`) is
/// [`Error::InvalidPayload`], anything else is [`Error::Database`]. The
/// driver's messages never include the password.
impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Self {
        match e.code().map(|c| c.code()) {
            // serialization_failure, deadlock_detected, lock_not_available
            Some("40001" | "40P01" | "55P03") => Error::Busy,
            // disk_full
            Some("53100") => Error::StorageFull,
            // untranslatable_character: JSONB cannot hold `\u0000`, which
            // JSON text can; the whole statement was refused.
            Some("22P05") => Error::InvalidPayload(format!(
                "PostgreSQL cannot store this JSON: {}",
                e.as_db_error().map_or("", |d| d.message())
            )),
            _ => Error::Database(Box::new(e)),
        }
    }
}
