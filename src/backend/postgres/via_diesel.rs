//! The job operations of `backlog::diesel::postgres` on an application's
//! diesel `PgConnection`: the statements of [`super::queries`], the very
//! texts the queue's own connections run, sent as [`Prepared`] statements
//! with typed binds in their `$n` order.
//!
//! diesel's `sql_query` is never cached: each call would parse and plan the
//! statement again (the enqueue's CTE with its `ON CONFLICT` and
//! `pg_notify` costs more to plan than a plain insert costs to run), and
//! libpq sends a prepare and an execute, two round trips. [`Prepared`] lets
//! diesel's statement cache, keyed by the text, prepare each statement once
//! per connection, as backlog's own connections and sqlx do.
//!
//! The enqueue is the adapters' one flow ([`crate::adapter_flow`]), the
//! same as sqlx's; `finish` mirrors [`super::jobs`] for the one reason that
//! its `Tx` speaks the `postgres` crate's rows and binds, and diesel's
//! connection is libpq's: it names the function it follows, so a change
//! there is made here too. Differs from them in that a batch goes one
//! statement per job (no arrays bound through diesel), and grouped jobs are
//! refused by the caller before anything runs.

use ::diesel::pg::{Pg, PgConnection};
use ::diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use ::diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Untyped};
use ::diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::queries::Queries;
use crate::adapter_flow::{drive, Conflict, Step};
use crate::backend::params::{EnqueueParams, Finishing};
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::lease::Lease;

/// A statement's one `id` column.
#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// One job inserted (notifying the queue's channel, delivered at commit), or
/// the job already holding its unique key: the adapters' one flow
/// ([`crate::adapter_flow`]), each step one of the queue's statements.
pub(crate) fn enqueue(
    conn: &mut PgConnection,
    q: &Queries,
    p: &EnqueueParams<'_>,
) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    let max_attempts = i32::try_from(p.max_attempts)
        .map_err(|_| Error::InvalidArgument("max_attempts is out of range".into()))?;
    let delay = p.available_at.saturating_sub(p.now);
    drive(p, Conflict::Retry, |step| {
        let statement = match step {
            Step::FindInHistory { .. } => Prepared::new(
                &q.find_history_unique,
                vec![
                    Bind::BigInt(now),
                    Bind::Text(Some(p.queue)),
                    Bind::Text(p.unique_key),
                    Bind::BigInt(p.unique_history_since.map(|s| s.saturating_sub(p.now))),
                    Bind::Text(p.unique_statuses),
                ],
            ),
            Step::Insert => Prepared::new(
                &q.enqueue_notify,
                vec![
                    Bind::BigInt(now),
                    Bind::Text(Some(p.queue)),
                    Bind::Text(Some(p.kind)),
                    Bind::Int(p.priority),
                    Bind::Text(p.unique_key),
                    Bind::Text(Some(p.payload)),
                    Bind::Int(max_attempts),
                    Bind::BigInt(Some(delay)),
                    Bind::Text(Some(&q.channel)),
                ],
            ),
            Step::DeleteLive(id) => {
                Prepared::new(&q.delete_live, vec![Bind::BigInt(Some(id))]).execute(conn)?;
                return Ok(None);
            }
            Step::FindLive => Prepared::new(
                &q.find_live_unique,
                vec![Bind::Text(Some(p.queue)), Bind::Text(p.unique_key)],
            ),
        };
        statement
            .get_result::<Id>(conn)
            .map(|row| Some(row.id))
            .or_else(not_found_is_none)
    })
}

/// Whether job `job_id` is a batch member or other jobs depend on it
/// (`backlog::diesel` then refuses to finish it).
pub(crate) fn followed(conn: &mut PgConnection, q: &Queries, job_id: i64) -> Result<bool> {
    let (schema, prefix) = (&q.tables.schema, &q.tables.prefix);
    let sql = format!(
        "SELECT job_id AS id FROM {schema}{prefix}batch_jobs WHERE job_id = $1
         UNION ALL
         SELECT dependency AS id FROM {schema}{prefix}dependencies WHERE dependency = $1
         LIMIT 1"
    );
    let followed: Vec<Id> = Prepared::new(&sql, vec![Bind::BigInt(Some(job_id))])
        .load(conn)
        .map_err(db_error)?;
    Ok(!followed.is_empty())
}

/// Whether `lease` is held, its row locked (fence first). Follows
/// `jobs::check_lease`.
pub(crate) fn lease_held(conn: &mut PgConnection, q: &Queries, lease: Lease) -> Result<bool> {
    // A SELECT's count is its rows (libpq's `PQcmdTuples`).
    let held = Prepared::new(
        &q.lease_held,
        vec![
            Bind::BigInt(Some(lease.job_id)),
            Bind::BigInt(Some(lease.token)),
        ],
    )
    .execute(conn)
    .map_err(db_error)?;
    Ok(held == 1)
}

/// Moves a leased job to history as the engine decided, fenced on its
/// lease: `LeaseLost` when another worker holds it now. Follows
/// `jobs::finish` for one job; only finishing outcomes reach it.
pub(crate) fn finish(conn: &mut PgConnection, q: &Queries, f: &Finishing<'_>) -> Result<()> {
    let moved: Vec<Id> = Prepared::new(
        &q.finish_to_history,
        vec![
            Bind::BigInt(q.now_override(f.now)),
            Bind::BigInts(vec![Some(f.lease.job_id)]),
            Bind::BigInts(vec![Some(f.lease.token)]),
            Bind::Texts(vec![Some(f.status)]),
            Bind::Texts(vec![f.result]),
            Bind::Texts(vec![f.error.as_deref()]),
        ],
    )
    .load(conn)
    .map_err(db_error)?;
    if moved.iter().any(|row| row.id == f.lease.job_id) {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            job_id: f.lease.job_id,
        })
    }
}

/// One parameter's value, typed for diesel: a scalar is bound nullable
/// (the same type on the wire), arrays of nullable elements likewise.
enum Bind<'a> {
    BigInt(Option<i64>),
    Int(i32),
    Text(Option<&'a str>),
    BigInts(Vec<Option<i64>>),
    Texts(Vec<Option<&'a str>>),
}

/// One of the queue's statements with its values, which diesel's statement
/// cache prepares once per connection (keyed by the text and the bind
/// types). The text keeps its `$n` references; each occurrence is bound in
/// turn (diesel numbers its placeholders itself), so a parameter used twice
/// is sent twice.
struct Prepared<'a> {
    sql: &'a str,
    binds: Vec<Bind<'a>>,
}

impl<'a> Prepared<'a> {
    fn new(sql: &'a str, binds: Vec<Bind<'a>>) -> Self {
        Prepared { sql, binds }
    }
}

impl QueryFragment<Pg> for Prepared<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let bytes = self.sql.as_bytes();
        let (mut copied, mut i) = (0, 0);
        while i < bytes.len() {
            match bytes[i] {
                // A quoted literal or name is copied as it is.
                quote @ (b'\'' | b'"') => {
                    i += 1;
                    while i < bytes.len() && bytes[i] != quote {
                        i += 1;
                    }
                    i += 1;
                }
                b'$' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                    let end = (i + 1..bytes.len())
                        .find(|&j| !bytes[j].is_ascii_digit())
                        .unwrap_or(bytes.len());
                    out.push_sql(&self.sql[copied..i]);
                    let n: usize = self.sql[i + 1..end].parse().unwrap_or(0);
                    let bind = n
                        .checked_sub(1)
                        .and_then(|n| self.binds.get(n))
                        .ok_or_else(|| {
                            ::diesel::result::Error::QueryBuilderError(
                                format!("no value for the statement's ${n}").into(),
                            )
                        })?;
                    match bind {
                        Bind::BigInt(v) => out.push_bind_param::<Nullable<BigInt>, _>(v)?,
                        Bind::Int(v) => out.push_bind_param::<Integer, _>(v)?,
                        Bind::Text(v) => out.push_bind_param::<Nullable<Text>, _>(v)?,
                        Bind::BigInts(v) => out.push_bind_param::<Array<Nullable<BigInt>>, _>(v)?,
                        Bind::Texts(v) => out.push_bind_param::<Array<Nullable<Text>>, _>(v)?,
                    }
                    copied = end;
                    i = end;
                }
                _ => i += 1,
            }
        }
        out.push_sql(&self.sql[copied.min(self.sql.len())..]);
        Ok(())
    }
}

impl QueryId for Prepared<'_> {
    type QueryId = ();
    // Not a static id: the cache keys it by its text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Prepared<'_> {
    type SqlType = Untyped;
}

impl RunQueryDsl<PgConnection> for Prepared<'_> {}

/// `get_result` answers `NotFound` for no row: here that is an answer.
fn not_found_is_none<T>(e: ::diesel::result::Error) -> Result<Option<T>> {
    match e {
        ::diesel::result::Error::NotFound => Ok(None),
        e => Err(db_error(e)),
    }
}

/// A diesel error as backlog's: the caller's transaction is now aborted on
/// the server, and rolls back.
pub(crate) fn db_error(e: ::diesel::result::Error) -> Error {
    Error::from(e)
}
