//! The job operations of `backlog::diesel::mysql` on an application's diesel
//! `MysqlConnection`: the statements of [`super::queries`], the very texts
//! the queue's own connections run, sent with `diesel::sql_query`.
//!
//! Those texts name their parameters (`:queue`, `:now`, ..., some used
//! twice), which the `mysql` crate matches to the server's positional `?`
//! on the client. diesel binds only positionally, in order, so
//! [`positional`] does that translation, in this one place: each `:name`
//! becomes `?` and its name is listed, and [`Binds`] binds by name in that
//! order. A statement is translated at each call (a scan of a few hundred
//! bytes; the server parses it anyway: diesel's `sql_query` is not a
//! cached prepared statement).
//!
//! The enqueue is the adapters' one flow ([`crate::adapter_flow`]), the
//! same as sqlx's, one job at a time (no multi-row insert); `check_lease`
//! and `finish` mirror [`super::jobs`], naming the function they follow, so
//! a change there is made here too. Differs from them in that the id of an
//! inserted job is read with `SELECT LAST_INSERT_ID()` (diesel's `execute`
//! returns only the affected rows: one round trip more than the `mysql`
//! crate), and grouped jobs are refused by the caller before anything runs.

use ::diesel::mysql::{Mysql, MysqlConnection};
use ::diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use ::diesel::sql_types::{BigInt, Integer, Nullable, Text, Unsigned};
use ::diesel::{sql_query, QueryableByName, RunQueryDsl};

use super::db::Now;
use super::queries::Sql;
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

/// `LAST_INSERT_ID()`, which MySQL types unsigned.
#[derive(QueryableByName)]
struct InsertId {
    #[diesel(sql_type = Unsigned<BigInt>)]
    id: u64,
}

/// The one column of [`Sql::lease_held`] (`SELECT 1 ..`).
#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = BigInt)]
    #[diesel(column_name = "1")]
    _one: i64,
}

/// `sql` with each named parameter (`:name`) replaced by `?`, and the
/// names in the order they occur (a name used twice is listed twice).
/// Quoted text (`'..'`, `".."`, `` `..` ``) is copied as it is, so a colon
/// inside a literal or a JSON path is not a parameter.
pub(crate) fn positional(sql: &str) -> (String, Vec<&str>) {
    let bytes = sql.as_bytes();
    let mut text = String::with_capacity(sql.len());
    let mut names = Vec::new();
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += 1;
                }
                i += 1;
            }
            b':' if bytes
                .get(i + 1)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_') =>
            {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
                {
                    end += 1;
                }
                text.push_str(&sql[copied..i]);
                text.push('?');
                names.push(&sql[start..end]);
                copied = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    text.push_str(&sql[copied.min(sql.len())..]);
    (text, names)
}

/// One parameter's value, typed for diesel.
#[derive(Clone, Copy)]
enum Value<'a> {
    Text(Option<&'a str>),
    BigInt(Option<i64>),
    Int(i32),
}

/// The values of a statement's named parameters.
struct Binds<'a>(Vec<(&'static str, Value<'a>)>);

impl<'a> Binds<'a> {
    /// `sql` translated by [`positional`], each `?` bound to its name's
    /// value; a name without a value is an error (a statement changed and
    /// this file not), before anything is sent.
    fn query(&self, sql: &str) -> Result<BoxedSqlQuery<'a, Mysql, SqlQuery>> {
        let (text, names) = positional(sql);
        let mut query = sql_query(text).into_boxed::<Mysql>();
        for name in names {
            let value = self
                .0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    Error::Database(format!("no value for the statement's :{name}").into())
                })?;
            query = match value {
                Value::Text(v) => query.bind::<Nullable<Text>, _>(v),
                Value::BigInt(v) => query.bind::<Nullable<BigInt>, _>(v),
                Value::Int(v) => query.bind::<Integer, _>(v),
            };
        }
        Ok(query)
    }
}

/// One job inserted, or the job already holding its unique key (in recent
/// history or live): the adapters' one flow ([`crate::adapter_flow`]),
/// each step one of the queue's statements.
pub(crate) fn enqueue(
    conn: &mut MysqlConnection,
    sql: &Sql,
    p: &EnqueueParams<'_>,
    now: Now,
) -> Result<Enqueued> {
    let max_attempts = i32::try_from(p.max_attempts)
        .map_err(|_| Error::InvalidArgument("max_attempts is out of range".into()))?;
    drive(p, Conflict::Locked, |step| {
        let found: Option<Id> = match step {
            Step::FindInHistory { locking } => {
                let lock = if locking { " LOCK IN SHARE MODE" } else { "" };
                Binds(vec![
                    ("queue", Value::Text(Some(p.queue))),
                    ("unique_key", Value::Text(p.unique_key)),
                    (
                        "since_in",
                        Value::BigInt(p.unique_history_since.map(|s| now.offset(s))),
                    ),
                    ("now", Value::BigInt(now.param())),
                    ("statuses", Value::Text(p.unique_statuses)),
                ])
                .query(&format!("{}{lock}", sql.find_history_unique))?
                .get_result(conn)
                .map(Some)
                .or_else(not_found_is_none)?
            }
            Step::Insert => {
                let inserted = Binds(vec![
                    ("queue", Value::Text(Some(p.queue))),
                    ("kind", Value::Text(Some(p.kind))),
                    ("priority", Value::Int(p.priority)),
                    ("unique_key", Value::Text(p.unique_key)),
                    ("payload", Value::Text(Some(p.payload))),
                    ("max_attempts", Value::Int(max_attempts)),
                    (
                        "available_in",
                        Value::BigInt(Some(now.offset(p.available_at))),
                    ),
                    ("now", Value::BigInt(now.param())),
                ])
                .query(&sql.enqueue)?
                .execute(conn)?;
                if inserted != 1 {
                    return Ok(None);
                }
                // diesel's `execute` answers only the count: the id is read
                // back, one round trip more than the `mysql` crate.
                let row: InsertId = sql_query("SELECT LAST_INSERT_ID() AS id").get_result(conn)?;
                let id = i64::try_from(row.id)
                    .map_err(|_| Error::Database("insert returned no id".into()))?;
                return Ok(Some(id));
            }
            Step::DeleteLive(id) => {
                Binds(vec![("id", Value::BigInt(Some(id)))])
                    .query(&sql.delete_live)?
                    .execute(conn)?;
                None
            }
            Step::FindLive => Binds(vec![
                ("queue", Value::Text(Some(p.queue))),
                ("unique_key", Value::Text(p.unique_key)),
            ])
            .query(&sql.find_live_unique)?
            .get_result(conn)
            .map(Some)
            .or_else(not_found_is_none)?,
        };
        Ok(found.map(|row| row.id))
    })
}

/// Whether job `job_id` is a batch member or other jobs depend on it
/// (`backlog::diesel` then refuses to finish it).
pub(crate) fn followed(conn: &mut MysqlConnection, sql: &Sql, job_id: i64) -> Result<bool> {
    let t = &sql.tables;
    let followed: Vec<Id> = Binds(vec![("id", Value::BigInt(Some(job_id)))])
        .query(&format!(
            "SELECT job_id AS id FROM {} WHERE job_id = :id
             UNION ALL
             SELECT dependency AS id FROM {} WHERE dependency = :id
             LIMIT 1",
            t.batch_jobs, t.dependencies
        ))?
        .load(conn)?;
    Ok(!followed.is_empty())
}

/// Whether `lease` is held, its row locked until the caller's transaction
/// ends (fence first). Follows `jobs::check_lease`.
pub(crate) fn lease_held(conn: &mut MysqlConnection, sql: &Sql, lease: Lease) -> Result<bool> {
    let held: Vec<Held> = Binds(vec![
        ("id", Value::BigInt(Some(lease.job_id))),
        ("token", Value::BigInt(Some(lease.token))),
    ])
    .query(&sql.lease_held)?
    .load(conn)?;
    Ok(!held.is_empty())
}

/// Moves a leased job to history as the engine decided, fenced on its
/// lease. Follows `jobs::finish`; only finishing outcomes reach it.
pub(crate) fn finish(
    conn: &mut MysqlConnection,
    sql: &Sql,
    f: &Finishing<'_>,
    now: Now,
) -> Result<()> {
    let copied = Binds(vec![
        ("id", Value::BigInt(Some(f.lease.job_id))),
        ("token", Value::BigInt(Some(f.lease.token))),
        ("result", Value::Text(f.result)),
        ("status", Value::Text(Some(f.status))),
        ("error", Value::Text(f.error.as_deref())),
        ("now", Value::BigInt(now.param())),
    ])
    .query(&sql.finish_to_history)?
    .execute(conn)?;
    if copied == 0 {
        return Err(Error::LeaseLost {
            job_id: f.lease.job_id,
        });
    }
    Binds(vec![("id", Value::BigInt(Some(f.lease.job_id)))])
        .query(&sql.delete_live)?
        .execute(conn)?;
    // As `jobs::finish`: the finished counts, in the same transaction.
    let ids = serde_json::to_string(&[f.lease.job_id])?;
    Binds(vec![("ids", Value::Text(Some(&ids)))])
        .query(&sql.count_moved)?
        .execute(conn)?;
    Ok(())
}

/// `get_result` answers `NotFound` for no row: here that is an answer.
fn not_found_is_none<T>(e: ::diesel::result::Error) -> Result<Option<T>> {
    match e {
        ::diesel::result::Error::NotFound => Ok(None),
        e => Err(Error::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::positional;

    #[test]
    fn named_parameters_become_positional_in_order_quotes_kept() {
        let (text, names) =
            positional("SELECT :a, ':no', JSON_SET(:e, '$.at', x) FROM t WHERE b = :b_1 OR c = :a");
        assert_eq!(
            text,
            "SELECT ?, ':no', JSON_SET(?, '$.at', x) FROM t WHERE b = ? OR c = ?"
        );
        assert_eq!(names, ["a", "e", "b_1", "a"]);
    }

    #[test]
    fn the_queue_statements_translate_with_no_colon_left_outside_quotes() {
        let sql = super::Sql::new(super::super::queries::Tables::new("db", "t_"), true);
        for s in [
            &sql.enqueue,
            &sql.find_live_unique,
            &sql.find_history_unique,
            &sql.lease_held,
            &sql.finish_to_history,
            &sql.delete_live,
        ] {
            let (text, names) = positional(s);
            assert!(!names.is_empty(), "{s}");
            assert_eq!(text.matches('?').count(), names.len(), "{text}");
        }
    }
}
