//! Enqueueing inside a `sqlx::Transaction<'_, MySql>` (feature
//! `sqlx-mysql`) with [`QueueExt`], on MySQL 8 or MariaDB 10.6+ (tested on
//! MariaDB 10.11 only). See [the module above](super) for what is and is not offered.
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
use ::sqlx::{AssertSqlSafe, MySql, Row};

pub use super::QueueExt;
use super::{refuse_own_path_only, Call};
use crate::adapter_flow::{Conflict, EnqueueFlow, Next, Step};
use crate::app_transaction::mysql_db_or;
use crate::backend::mysql::queries::Sql;
use crate::backend::mysql::{Db, Now};
use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::queue::Queue;

impl super::Driver for MySql {
    fn enqueue_all(
        call: Call<'_, Self>,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send + '_ {
        let now = Now::new(call.now, call.queue.options().clock.is_manual());
        async move {
            let sql = &database(call.queue)?.sql;
            refuse_own_path_only(call.jobs)?;
            let mut ids = Vec::with_capacity(call.jobs.len());
            for p in call.jobs {
                ids.push(enqueue(&mut *call.conn, sql, p, now).await?);
            }
            Ok(ids)
        }
    }
}

/// A finished job holding the key (per its scope), else the insert, else
/// the live job holding the key: the adapters' one flow
/// ([`crate::adapter_flow`]), each step one of the backend's statements.
async fn enqueue(
    conn: &mut MySqlConnection,
    sql: &Sql,
    p: &EnqueueParams<'_>,
    now: Now,
) -> Result<Enqueued> {
    let (mut flow, mut step) = EnqueueFlow::start(p, Conflict::Locked);
    loop {
        let id = match step {
            Step::FindInHistory { locking } => {
                let lock = if locking { " LOCK IN SHARE MODE" } else { "" };
                let found = Positional::parse(&format!("{}{lock}", sql.find_history_unique))?
                    .bind(|name| match name {
                        "queue" => Ok(Value::Str(Some(p.queue))),
                        "unique_key" => Ok(Value::Str(p.unique_key)),
                        "since_in" => Ok(Value::I64(
                            p.unique_history_since.map(|since| now.offset(since)),
                        )),
                        "now" => Ok(Value::I64(now.param())),
                        "statuses" => Ok(Value::Str(p.unique_statuses)),
                        other => Err(other),
                    })?;
                fetch_id(conn, found).await?
            }
            Step::Insert => {
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
                    Some(id)
                } else {
                    None
                }
            }
            Step::DeleteLive(id) => {
                let delete = Positional::parse(&sql.delete_live)?.bind(|name| match name {
                    "id" => Ok(Value::I64(Some(id))),
                    other => Err(other),
                })?;
                fetch_id(conn, delete).await?
            }
            Step::FindLive => {
                let live = Positional::parse(&sql.find_live_unique)?.bind(|name| match name {
                    "queue" => Ok(Value::Str(Some(p.queue))),
                    "unique_key" => Ok(Value::Str(p.unique_key)),
                    other => Err(other),
                })?;
                fetch_id(conn, live).await?
            }
        };
        match flow.answer(id)? {
            Next::Run(next) => step = next,
            Next::Done(enqueued) => return Ok(enqueued),
        }
    }
}

/// The one id column of the row `query` answers, if any.
async fn fetch_id(
    conn: &mut MySqlConnection,
    query: Query<'_, MySql, MySqlArguments>,
) -> Result<Option<i64>> {
    let row = query.fetch_optional(conn).await.map_err(from_sqlx)?;
    row.map(|r| r.try_get::<i64, _>(0).map_err(from_sqlx))
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
    mysql_db_or(
        queue,
        "this queue is not on MySQL: backlog::sqlx::mysql needs a queue opened with a mysql:// URL",
    )
}
