//! What only PostgreSQL has: its transaction type for enqueueing and
//! completing inside your own transactions.
//!
//! Bring the extension traits into scope and the queue and the job context
//! gain the transactional calls on `postgres` types, exactly as
//! [`crate::sqlite`] gives them on `rusqlite` types:
//!
//! ```no_run
//! use backlog::postgres::{postgres, QueueExt};
//! use backlog::{NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "postgres://app@db.example/app?sslmode=verify-full";
//! let queue = Queue::connect(url)?;
//! // Your client, with the same TLS as the queue's (see "Connecting").
//! let mut client = backlog::postgres::connect(url)?;
//!
//! let mut tx = client.transaction()?;
//! tx.execute("INSERT INTO orders (id) VALUES (7)", &[])?;
//! queue.enqueue_in(&mut tx, NewJob::new("charge", json!({"order": 7})))?;
//! tx.commit()?; // the order and its job, or neither
//! # Ok(())
//! # }
//! ```
//!
//! And in a handler, effects and completion in one commit:
//!
//! ```no_run
//! use backlog::postgres::JobContextExt;
//! use backlog::{JobContext, JobError};
//!
//! fn charge(order: i32, ctx: &JobContext) -> Result<(), JobError> {
//!     ctx.transaction(|tx| {
//!         tx.execute("UPDATE orders SET paid = TRUE WHERE id = $1", &[&order])?;
//!         Ok(())
//!     })
//! }
//! ```
//!
//! ## Connecting
//!
//! [`Queue::connect`](crate::Queue::connect) takes a `postgres://` URL as libpq does. TLS follows
//! `sslmode`: `disable`; `prefer` (the default: TLS when the server offers
//! it, certificate not checked); `require` (always TLS, certificate not
//! checked, as libpq); `verify-ca` (the certificate must be signed by
//! `sslrootcert=PATH`, a PEM file, or else by a root the system trusts);
//! `verify-full` (as `verify-ca`, and it must name the host). The URL's
//! password never appears in an error or in `Debug` output.
//!
//! Connect your own client with [`connect`] (or, for a pool of your own,
//! [`client_config`]): the same URL then means the same TLS for your
//! transactions as for the queue's. `postgres::Client::connect(url,
//! postgres::NoTls)` fails on `sslmode=require` (no TLS to offer), and
//! rust-postgres alone knows neither `verify-ca`, `verify-full` nor
//! `sslrootcert`. With sqlx, pass the URL to sqlx itself: it reads libpq's
//! `sslmode` and `sslrootcert` (see `backlog::sqlx`, built with a TLS
//! feature of sqlx's).
//!
//! [`QueueOptions::schema`](crate::QueueOptions::schema) and
//! [`QueueOptions::table_prefix`](crate::QueueOptions::table_prefix) place
//! the tables, so several applications can share one database; every
//! statement names them fully, so `enqueue_in` works whatever the
//! `search_path` of your connection.
//!
//! ## Connections
//!
//! [`QueueOptions::pool_size`](crate::QueueOptions::pool_size) is the whole
//! pool: a worker's fetcher, completer, heartbeater and maintenance take a
//! connection for each statement, and every handler inside
//! [`JobContextExt::transaction`] holds one until it commits. For
//! transactional handlers, size the pool to the worker's concurrency plus
//! three. A connection the server closed (a restart, `pg_terminate_backend`)
//! is replaced: the operation that found it dead runs again on a new one,
//! unless it died during `COMMIT`, when whether it committed is unknown and
//! the error says so. Deadlocks and serialization failures are retried with
//! jittered backoff until the write deadline, then reported as
//! [`Error::Busy`]. PostgreSQL 12 or newer is required (tested on 15).
//!
//! A connection is opened when a call needs one and none is idle, and the
//! ones beyond the first are closed after 10 s unused. When the server
//! refuses one for lack of room (`too_many_connections`), a call waits for
//! one of the pool's own, or for room, up to the write deadline; opening
//! the queue waits up to
//! [`QueueOptions::connect_deadline`](crate::QueueOptions::connect_deadline).
//! A worker adds one connection, its listener's (`LISTEN`), which a full
//! server may leave out for a while: it retries every few seconds, and the
//! idle poll finds the jobs meanwhile. See the README's "Connection budget".
//!
//! ## From async code
//!
//! The `postgres` driver blocks on a runtime of its own, and panics when a
//! call of the queue's (opening it, `Worker::start`, `enqueue`, `wait`,
//! `Worker::shutdown`...) runs on a thread that drives a tokio runtime:
//! make them through `tokio::task::spawn_blocking`. Dropping the queue's
//! last handle there is safe: its idle connections close on a thread of
//! their own. To enqueue inside an async service's sqlx transaction, see
//! `backlog::sqlx` (features `sqlx-postgres`, `sqlx-mysql`).
//!
//! ## Time
//!
//! Lease expiries and schedules are computed by the database server's clock,
//! so nodes whose clocks disagree still agree on when a lease expires; the
//! queue's [`Clock`](crate::Clock) only measures delays. A
//! [`ManualClock`](crate::ManualClock) overrides the server's (for tests).

use crate::app_transaction::{postgres_db as database, transactional_calls};
use crate::backend::postgres::connection::Tx;
use crate::backend::postgres::jobs;
use crate::backend::postgres::target::Target;
use crate::error::{Error, Result};
use crate::outcome::Outcome;
use crate::queue::run_then_complete;

/// The `postgres` crate backlog is built with. Use it for the transactions
/// you pass to [`QueueExt::enqueue_in`] and friends, so the types match.
pub use ::postgres;

/// The TLS glue between `postgres` and `native-tls` backlog is built with:
/// the connector type [`client_config`] returns.
pub use ::postgres_native_tls;

/// Connects a `postgres` client to `url` as backlog connects its own: TLS
/// as `sslmode` and `sslrootcert` say (see "Connecting" above), TCP
/// keepalives and a 10 s `TCP_USER_TIMEOUT` unless the URL sets them, and a
/// 10 s connect timeout unless it sets `connect_timeout`. Use it for the
/// client whose transactions you pass to [`QueueExt::enqueue_in`].
///
/// A bad URL, an unknown `sslmode` or an unreadable `sslrootcert` is
/// [`Error::InvalidArgument`]; a server that refuses is
/// [`Error::Database`]. The password never appears in either.
pub fn connect(url: &str) -> Result<postgres::Client> {
    let target = Target::parse_for_client(url, &crate::QueueOptions::new())?;
    target.connect()
}

/// The driver settings and the TLS connector backlog would connect to `url`
/// with (see [`connect`]), for a pool of your own:
///
/// ```no_run
/// # fn main() -> backlog::Result<()> {
/// let (config, tls) = backlog::postgres::client_config("postgres://app@db/app?sslmode=require")?;
/// let mut client = config.connect(tls).map_err(backlog::Error::from)?;
/// # Ok(())
/// # }
/// ```
pub fn client_config(
    url: &str,
) -> Result<(postgres::Config, postgres_native_tls::MakeTlsConnector)> {
    let target = Target::parse_for_client(url, &crate::QueueOptions::new())?;
    Ok((target.config, target.tls))
}

/// A transaction of the `postgres` crate: the application's, or the one
/// [`QueueExt::transaction`] and [`JobContextExt::transaction`] hand to a
/// closure.
pub type Transaction<'a> = postgres::Transaction<'a>;

transactional_calls! {
    /// Transactional calls of a [`Queue`](crate::Queue) on PostgreSQL.
    ///
    /// Each `*_in` call runs inside the caller's transaction, which must be
    /// open on the queue's database. Nothing is committed by these calls and
    /// no events are sent: the caller owns the commit. A job enqueued this
    /// way wakes listening workers when, and only if, the transaction
    /// commits.
    trait QueueExt;

    /// Completes a leased job inside the caller's transaction: the
    /// completion commits if and only if the caller's transaction does,
    /// together with the caller's effects.
    ///
    /// On `Err(LeaseLost)` nothing was changed and **the caller's transaction
    /// must not commit** its effects: another worker owns the job now. Using
    /// `?` does this for you, since a `postgres::Transaction` dropped without
    /// `commit()` rolls back; [`QueueExt::transaction`] also rolls back on any
    /// `Err`. Call it first in the transaction (fence first): the job's row
    /// then stays locked until the commit, so no rescuer can take it.
    fn complete_in;

    /// Runs `f` in a transaction on one of the queue's pooled connections,
    /// committing on `Ok` and rolling back on `Err`. Pair it with
    /// [`QueueExt::complete_in`] to commit a job's effects and its completion
    /// together:
    ///
    /// ```no_run
    /// # use backlog::postgres::QueueExt;
    /// # fn demo(queue: &backlog::Queue, job: &backlog::Job) -> backlog::Result<()> {
    /// queue.transaction(|tx| {
    ///     queue.complete_in(tx, job, None)?; // fence first: LeaseLost rolls back
    ///     tx.execute("UPDATE orders SET paid = TRUE WHERE id = $1", &[&7])
    ///         .map_err(backlog::Error::from)?;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// The connection is held for the closure's run. Only checking it out
    /// and `BEGIN` are retried, up to the queue's write deadline. Inside the
    /// closure the queue's other writes and a nested `transaction` return
    /// [`Error::InsideTransaction`] at once (they could wait for the row
    /// locks of this transaction); reads work on another pooled connection,
    /// or answer `InsideTransaction` at once when none is free (see
    /// [`Queue`](crate::Queue)); the `_in` forms join it.
    fn transaction = |queue, f| database(queue)?.pool().transaction(|tx, _| f(tx));

    /// Transactional completion for handlers on PostgreSQL.
    trait JobContextExt;

    /// Runs `f` in a transaction on one of the queue's pooled connections and
    /// completes the job in the same transaction: the effects `f` writes and
    /// the completion commit together, or not at all.
    ///
    /// The lease is checked first and the job's row locked (fence first:
    /// no rescuer or other node can take the job while `f` runs), then `f`
    /// runs, then the job is completed with `f`'s value as its result (a
    /// value that serializes to JSON `null`, such as `()`, stores none) and
    /// the transaction commits. When the lease was lost, nothing commits and
    /// the error says so ([`JobError::is_lease_lost`](crate::JobError::is_lease_lost)); the effects are never
    /// applied twice. On any error from `f` the transaction rolls back.
    ///
    /// A job completed this way is not completed again by the worker,
    /// whatever the handler returns afterwards. Enqueue follow-up jobs with
    /// [`QueueExt::enqueue_in`]`(tx, ..)`, so they exist only if this
    /// transaction commits: [`Queue::enqueue`](crate::Queue::enqueue), every other write of the
    /// queue and [`JobContext::heartbeat`](crate::JobContext::heartbeat) return
    /// [`Error::InsideTransaction`] at once inside `f` (the job's row is
    /// locked by this transaction); reads work (see [`Queue`](crate::Queue)).
    fn transaction = |ctx, f| {
        let queue = ctx.source();
        ctx.complete_transactionally(|| {
            let db = database(queue)?;
            db.pool().transaction(|tx, statements| {
                // backlog's statements run prepared once per connection:
                // this is the hot path of a transactional worker.
                let lease = ctx.job().lease();
                jobs::check_lease(&mut Tx::cached(tx, statements), db.queries(), lease)?;
                run_then_complete(ctx, tx, f, |tx, result| {
                    let now = queue.now_micros();
                    let params = queue.settle_params(ctx.job(), Outcome::Complete(result), now)?;
                    let mut tx = Tx::cached(tx, statements);
                    let mut settled = jobs::settle_all(&mut tx, db.queries(), &[&params], false)?;
                    settled
                        .pop()
                        .unwrap_or_else(|| Err(Error::Database("settle returned no result".into())))?;
                    queue.note_settled_in(lease);
                    Ok(())
                })
            })
        })
    };
}
