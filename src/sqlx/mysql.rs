//! Enqueueing inside a `sqlx::Transaction<'_, MySql>` (feature
//! `sqlx-mysql`), on MySQL 8 or MariaDB 10.6+ (tested on MariaDB 10.11
//! only). See [the module above](super) for what is and is not offered.
//!
//! The statements are the MySQL backend's own (`ENQUEUE`, the unique
//! look-ups), rendered for the queue's tables. They are written with named
//! parameters (`:queue`), which backlog's `mysql` driver rewrites to `?` on
//! the client; sqlx has positional `?` only, so `Positional` rewrites
//! them here with that same driver's parser and binds each value by name,
//! in order. Jobs go in one insert each (backlog's multi-row insert is
//! MariaDB-only and matches rows up by `RETURNING`; one per job keeps the
//! adapter the same on both servers). Workers on other nodes notice a
//! committed job by their poll of the newest id, as for every MySQL enqueue.

use std::future::Future;

use ::mysql_common::named_params::ParsedNamedParams;
use ::sqlx::mysql::{MySqlArguments, MySqlConnection, MySqlDatabaseError};
use ::sqlx::query::Query;
use ::sqlx::{AssertSqlSafe, MySql, Row, Transaction};

use crate::backend::mysql::queries::Sql;
use crate::backend::mysql::{Db, Now};
use crate::backend::params::EnqueueParams;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::job::{Enqueued, IntoNewJob};
use crate::queue::{params, Queue};

/// Enqueueing of a [`Queue`] on MySQL/MariaDB inside the application's sqlx
/// transaction.
///
/// Nothing is committed by these calls: the caller owns the commit, and the
/// job exists when and only if the transaction commits. The transaction may
/// be on any connection to the queue's server: the statements name the
/// queue's database.
pub trait QueueExt {
    /// Enqueues a job inside `tx`. A bad job is refused with a typed error
    /// before anything is sent. With a unique key already held, the existing
    /// job's id comes back with `existed: true`; a key held by another
    /// transaction not yet committed waits for it, up to your
    /// `innodb_lock_wait_timeout` ([`Error::Busy`] then).
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, MySql>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Enqueues many jobs inside `tx`, one insert each, ids in input order.
    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, MySql>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;
}

impl QueueExt for Queue {
    fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, MySql>,
        job: impl IntoNewJob,
    ) -> impl Future<Output = Result<Enqueued>> + Send {
        let ids = self.enqueue_many_in(tx, [job]);
        async move { super::single(ids.await?) }
    }

    fn enqueue_many_in<J: IntoNewJob>(
        &self,
        tx: &mut Transaction<'_, MySql>,
        jobs: impl IntoIterator<Item = J>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send {
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now);
        let clocked = Now::new(now, self.options().clock.is_manual());
        let conn: &mut MySqlConnection = tx;
        async move {
            let prepared = prepared?;
            let db = database(self)?;
            let jobs = params(&prepared, now);
            super::refuse_own_path_only(&jobs)?;
            let mut ids = Vec::with_capacity(jobs.len());
            for p in &jobs {
                ids.push(enqueue(conn, &db.sql, p, clocked).await?);
            }
            Ok(ids)
        }
    }
}

/// As the backend's `enqueue::enqueue`: a finished job holding the key (per
/// its scope), else the insert, else the live job holding the key.
async fn enqueue(
    conn: &mut MySqlConnection,
    sql: &Sql,
    p: &EnqueueParams<'_>,
    now: Now,
) -> Result<Enqueued> {
    if let Some(id) = find_in_history(conn, sql, p, now, "").await? {
        return Ok(Enqueued { id, existed: true });
    }
    let done = Positional::parse(&sql.enqueue)?
        .bind(|name| match name {
            "queue" => Ok(Value::Str(Some(p.queue))),
            "kind" => Ok(Value::Str(Some(p.kind))),
            "priority" => Ok(Value::I64(Some(i64::from(p.priority)))),
            "unique_key" => Ok(Value::Str(p.unique_key)),
            "payload" => Ok(Value::Str(Some(p.payload))),
            "max_attempts" => Ok(Value::I64(Some(i64::from(p.max_attempts)))),
            "available_in" => Ok(Value::I64(Some(now.offset(p.available_at)))),
            "now" => Ok(Value::I64(now.param())),
            other => Err(other),
        })?
        .execute(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    if done.rows_affected() == 1 {
        let id = i64::try_from(done.last_insert_id())
            .ok()
            .filter(|&id| id > 0)
            .ok_or_else(|| Error::Database("insert returned no id".into()))?;
        // As the backend: a period-scoped key is looked at again with a
        // locking read, and the row just inserted is taken back if a
        // finished job now holds it.
        if let Some(found) = find_in_history(conn, sql, p, now, " LOCK IN SHARE MODE").await? {
            Positional::parse(&sql.delete_live)?
                .bind(|name| match name {
                    "id" => Ok(Value::I64(Some(id))),
                    other => Err(other),
                })?
                .execute(&mut *conn)
                .await
                .map_err(from_sqlx)?;
            return Ok(Enqueued {
                id: found,
                existed: true,
            });
        }
        return Ok(Enqueued { id, existed: false });
    }
    // Nothing inserted: only the unique index can refuse a row, and the
    // refused insert holds a lock on the row it collided with until commit.
    let key = p
        .unique_key
        .ok_or_else(|| Error::Database("insert ignored without a unique key conflict".into()))?;
    let live = Positional::parse(&sql.find_live_unique)?
        .bind(|name| match name {
            "queue" => Ok(Value::Str(Some(p.queue))),
            "unique_key" => Ok(Value::Str(Some(key))),
            other => Err(other),
        })?
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?
        .ok_or_else(|| Error::Database("unique key conflict with no live job".into()))?;
    Ok(Enqueued {
        id: live.try_get::<i64, _>(0).map_err(from_sqlx)?,
        existed: true,
    })
}

/// With a unique key scoped to recent history: the finished job holding it
/// (per the key's statuses), as the backend's look-up; `lock` is appended
/// to the statement (a locking read after the insert).
async fn find_in_history(
    conn: &mut MySqlConnection,
    sql: &Sql,
    p: &EnqueueParams<'_>,
    now: Now,
    lock: &str,
) -> Result<Option<i64>> {
    let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) else {
        return Ok(None);
    };
    let found = Positional::parse(&format!("{}{lock}", sql.find_history_unique))?
        .bind(|name| match name {
            "queue" => Ok(Value::Str(Some(p.queue))),
            "unique_key" => Ok(Value::Str(Some(key))),
            "since_in" => Ok(Value::I64(Some(now.offset(since)))),
            "now" => Ok(Value::I64(now.param())),
            "statuses" => Ok(Value::Str(p.unique_statuses)),
            other => Err(other),
        })?
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    found
        .map(|row| row.try_get::<i64, _>(0).map_err(from_sqlx))
        .transpose()
}

/// A value bound to one named parameter.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Str(Option<&'a str>),
    I64(Option<i64>),
}

/// One of the backend's statements with its `:name` parameters rewritten to
/// sqlx's `?`, by the parser backlog's `mysql` driver uses for the same
/// text (it skips quotes and comments), and their names in order (a name
/// may appear several times, as `:now` does).
struct Positional {
    sql: String,
    names: Vec<String>,
}

impl Positional {
    fn parse(named: &str) -> Result<Positional> {
        let parsed = ParsedNamedParams::parse(named.as_bytes())
            .map_err(|e| Error::Database(format!("statement parameters: {e:?}").into()))?;
        let sql =
            String::from_utf8(parsed.query().to_vec()).map_err(|e| Error::Database(Box::new(e)))?;
        let names = parsed
            .params()
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        Ok(Positional { sql, names })
    }

    /// The sqlx query with each parameter bound to `value(name)`; a name
    /// `value` does not know is an error of backlog's, never sent.
    fn bind<'a>(
        self,
        value: impl Fn(&str) -> std::result::Result<Value<'a>, &str>,
    ) -> Result<Query<'a, MySql, MySqlArguments>> {
        let mut query = ::sqlx::query(AssertSqlSafe(self.sql));
        for name in &self.names {
            query = match value(name) {
                Ok(Value::Str(v)) => query.bind(v),
                Ok(Value::I64(v)) => query.bind(v),
                Err(unknown) => {
                    return Err(Error::Database(
                        format!("no value for the statement parameter :{unknown}").into(),
                    ))
                }
            };
        }
        Ok(query)
    }
}

/// A sqlx error as backlog's own MySQL errors are mapped: a deadlock or lock
/// wait timeout is [`Error::Busy`], a full disk or table
/// [`Error::StorageFull`].
fn from_sqlx(e: ::sqlx::Error) -> Error {
    let number = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number);
    match number {
        // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
        Some(1213 | 1205) => Error::Busy,
        // ER_DISK_FULL, ER_RECORD_FILE_FULL
        Some(1021 | 1114) => Error::StorageFull,
        _ => Error::Database(Box::new(e)),
    }
}

/// The MySQL database of `queue`, or a typed error for a queue on another
/// backend.
fn database(queue: &Queue) -> Result<&Db> {
    match queue.backend() {
        Backend::Mysql(db) => Ok(db),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidArgument(
            "this queue is not on MySQL: backlog::sqlx::mysql needs a queue opened with a \
             mysql:// URL"
                .into(),
        )),
    }
}
