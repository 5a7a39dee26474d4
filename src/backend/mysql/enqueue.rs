//! Enqueueing on MySQL: one insert per job, or on MariaDB many jobs per
//! multi-row insert; a unique key already held returns its job's id.
//!
//! Plain jobs (no unique key, group, batch or dependency) whose enqueue is
//! a single statement (one job, or up to 1,000 on MariaDB) go in one
//! autocommit statement: one round trip, the price of a raw insert, where a
//! transaction costs three. Every other enqueue runs in a transaction.
//!
//! Why a single statement never enqueues twice, though the engine retries
//! a write whose connection failed: an autocommit insert whose answer is
//! lost may have committed, so it is never sent again. What can be retried
//! is told apart before sending or by the server itself:
//! - a pooled connection the server closed while idle (a restart, a kill,
//!   `wait_timeout`) holds the server's FIN on its socket, seen by a `poll`
//!   at checkout (no round trip), and is replaced before anything is sent;
//! - an error packet from the server (a deadlock, a lock wait timeout, a
//!   killed query) means the statement did not commit.
//!
//! A connection lost after sending (a network cut, a server crash
//! mid-statement) returns its error to the caller, as a raw insert or a
//! transaction's lost `COMMIT` does: the job is then there once or not at
//! all. An `Ok` is the server's answer to the committed statement. Where the
//! FIN cannot be seen (off Linux) every enqueue takes the transaction.

use mysql::prelude::Queryable;
use mysql::{params, Params, Value};

use super::db::Now;
use super::queries::{RowShape, Sql, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY};
use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// Rows per multi-row insert, largest first: a batch goes out in chunks of
/// these sizes, so a handful of statement texts serve every batch size (each
/// is prepared once per connection). `enqueue_many(1000)` of plain jobs is
/// one statement, committing by itself ([`is_one_statement`]), as the raw
/// ceiling's is (with 128 rows at most it took eleven, with 500 two and a
/// transaction). A 1,000-row statement has 10,000 placeholders, well under
/// the protocol's 65,535.
const ROWS_PER_INSERT: [usize; 5] = [1000, 100, 20, 5, 1];

/// Payload bytes per multi-row insert, well under the server's default
/// `max_allowed_packet` (16 MiB on MariaDB).
const BYTES_PER_INSERT: usize = 4 << 20;

/// Whether enqueueing `jobs` is one statement and nothing else, so that it
/// can commit by itself, in one round trip ([`Db::autocommit`]) where a
/// transaction takes three: plain jobs (no unique key: a refused insert is
/// followed by a look-up of the job holding the key, and a period-scoped key
/// by a locking read; nothing else to write: no group, no batch, no
/// dependencies, no sequence, see `EnqueueParams::own_path_only`), one of them, or
/// on MariaDB as many as one multi-row insert takes ([`ROWS_PER_INSERT`]).
/// A statement is atomic: all the rows or none, as in a transaction.
///
/// Why that cannot enqueue twice: the statement is sent once. Before it is
/// sent, a connection the server has closed is replaced (its FIN is on the
/// socket), and an error the server answers means the statement did not
/// commit: both are retried. A connection lost after the statement was sent
/// leaves the outcome unknown (it may have committed): it is not retried,
/// and the caller gets the error, as with a raw insert, or with a
/// transaction's `COMMIT` lost the same way. An `Ok` is the server's answer
/// to the committed statement, so no acknowledged job is lost.
///
/// [`Db::autocommit`]: super::db::Db::autocommit
pub(crate) fn is_one_statement(sql: &Sql, jobs: &[EnqueueParams<'_>]) -> bool {
    let plain = |p: &EnqueueParams<'_>| p.unique_key.is_none() && p.own_path_only().is_none();
    match jobs {
        [] => false,
        [p] => plain(p),
        _ => {
            sql.returning
                && jobs.iter().all(plain)
                && chunk_len(jobs, &(0..jobs.len()).collect::<Vec<_>>()) == jobs.len()
        }
    }
}

/// Inserts jobs in order, each one or the id of the job already holding its
/// unique key: `jobs.rs`' `enqueue_all` before members join their batches
/// and the jobs with dependencies are made to wait. On MariaDB many rows go
/// in one statement.
pub(crate) fn insert_all(
    sql: &Sql,
    q: &mut impl Queryable,
    jobs: &[EnqueueParams<'_>],
    now: Now,
) -> Result<Vec<Enqueued>> {
    if jobs.iter().any(|p| p.group.is_some()) {
        return jobs
            .iter()
            .map(|p| match &p.group {
                Some(group) => super::groups::join(sql, q, p, group, now),
                None => enqueue(sql, q, p, now),
            })
            .collect();
    }
    // A period-scoped key is looked at again after its insert (`enqueue`).
    if !sql.returning || jobs.len() == 1 || jobs.iter().any(|p| p.unique_history_since.is_some()) {
        return jobs.iter().map(|p| enqueue(sql, q, p, now)).collect();
    }
    let mut out: Vec<Option<Enqueued>> = Vec::with_capacity(jobs.len());
    for p in jobs {
        out.push(find_in_history(sql, q, p, now)?);
    }
    let pending: Vec<usize> = (0..jobs.len()).filter(|&i| out[i].is_none()).collect();
    let mut rest = pending.as_slice();
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(chunk_len(jobs, rest));
        insert_rows(sql, q, jobs, chunk, &mut out, now)?;
        rest = tail;
    }
    out.into_iter()
        .map(|e| e.ok_or_else(|| Error::Database("a job was neither inserted nor found".into())))
        .collect()
}

/// How many of the jobs at `rest` the next multi-row insert takes: the
/// largest of [`ROWS_PER_INSERT`] that they fill, fewer while their payloads
/// pass [`BYTES_PER_INSERT`].
fn chunk_len(jobs: &[EnqueueParams<'_>], rest: &[usize]) -> usize {
    let mut n = ROWS_PER_INSERT
        .into_iter()
        .find(|&n| n <= rest.len())
        .unwrap_or(1);
    while n > 1
        && rest[..n]
            .iter()
            .map(|&i| jobs[i].payload.len())
            .sum::<usize>()
            > BYTES_PER_INSERT
    {
        n = ROWS_PER_INSERT.into_iter().find(|&m| m < n).unwrap_or(1);
    }
    n
}

/// Inserts the jobs at `chunk` in one statement, filling `out` with their
/// ids, or with the ids of the live jobs holding their unique keys.
fn insert_rows(
    sql: &Sql,
    q: &mut impl Queryable,
    jobs: &[EnqueueParams<'_>],
    chunk: &[usize],
    out: &mut [Option<Enqueued>],
    now: Now,
) -> Result<()> {
    let (shape, values) = bind(chunk.iter().map(|&i| &jobs[i]), now);
    let sql_text = sql.enqueue_rows(chunk.len(), shape);
    if !shape.keyed {
        // Nothing to refuse: an id a row, in order.
        let ids: Vec<i64> = q.exec(&*sql_text, Params::Positional(values))?;
        if ids.len() != chunk.len() {
            return Err(Error::Database(
                "a job was neither inserted nor found".into(),
            ));
        }
        for (&i, id) in chunk.iter().zip(ids) {
            out[i] = Some(Enqueued { id, existed: false });
        }
        return Ok(());
    }
    let rows: Vec<(i64, String, Option<String>)> =
        q.exec(&*sql_text, Params::Positional(values))?;
    // Rows come back in input order, refused ones left out: match them up.
    let mut inserted = rows.into_iter().peekable();
    for &i in chunk {
        let p = &jobs[i];
        let matches = inserted
            .peek()
            .is_some_and(|(_, queue, key)| queue == p.queue && key.as_deref() == p.unique_key);
        out[i] = Some(match inserted.next_if(|_| matches) {
            Some((id, _, _)) => Enqueued { id, existed: false },
            None => find_live(sql, q, p)?,
        });
    }
    Ok(())
}

/// The shape of these jobs' insert, and their values, positional in
/// `enqueue_rows`'s order: only what differs from the columns' defaults.
fn bind<'a, 'p: 'a>(
    rows: impl Iterator<Item = &'a EnqueueParams<'p>> + Clone,
    now: Now,
) -> (RowShape, Vec<Value>) {
    let manual = now.param();
    let shape = RowShape {
        keyed: rows.clone().any(|p| p.unique_key.is_some()),
        manual: manual.is_some(),
        explicit: !rows.clone().all(|p| takes_defaults(p, now)),
    };
    let mut values: Vec<Value> = Vec::with_capacity(rows.size_hint().0 * 8);
    for p in rows {
        values.extend([p.queue.into(), p.kind.into(), p.payload.into()]);
        if shape.keyed {
            values.push(p.unique_key.into());
        }
        if shape.explicit {
            values.extend([p.priority.into(), p.max_attempts.into()]);
        }
        if let Some(now) = manual {
            values.push(now.into());
        }
        if shape.explicit {
            values.push(now.offset(p.available_at).into());
        }
    }
    (shape, values)
}

/// Whether a job's priority and max attempts are the columns' defaults and
/// it is due now: its row may leave all three to the schema ([`RowShape`]).
fn takes_defaults(p: &EnqueueParams<'_>, now: Now) -> bool {
    p.priority == DEFAULT_PRIORITY
        && p.max_attempts == DEFAULT_MAX_ATTEMPTS
        && now.offset(p.available_at) == 0
}

/// Inserts a job, or finds the job already holding its unique key. The
/// insert binds positionally only what differs from the columns' defaults
/// ([`RowShape`]), where [`ENQUEUE`](super::queries::ENQUEUE) binds eight
/// named values.
fn enqueue(sql: &Sql, q: &mut impl Queryable, p: &EnqueueParams<'_>, now: Now) -> Result<Enqueued> {
    if let Some(found) = find_in_history(sql, q, p, now)? {
        return Ok(found);
    }
    let (inserted, id) = {
        let (shape, values) = bind(std::iter::once(p), now);
        let result = q.exec_iter(&*sql.enqueue_row(shape), Params::Positional(values))?;
        (result.affected_rows(), result.last_insert_id())
    };
    if inserted == 1 {
        let id = id
            .and_then(|id| i64::try_from(id).ok())
            .ok_or_else(|| Error::Database("insert returned no id".into()))?;
        // The job holding the key may have finished between the look-up
        // above and the insert: looked at again with a locking read (the
        // latest commits, whatever the caller's isolation level), a
        // period-scoped key is refused then, and the row taken back.
        if let Some(found) = find_in_history_locked(sql, q, p, now)? {
            q.exec_drop(&sql.delete_live, params! { "id" => id })?;
            return Ok(found);
        }
        return Ok(Enqueued { id, existed: false });
    }
    find_live(sql, q, p)
}

/// With a unique key scoped to recent history: the finished job holding it.
fn find_in_history(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &EnqueueParams<'_>,
    now: Now,
) -> Result<Option<Enqueued>> {
    let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) else {
        return Ok(None);
    };
    let found: Option<i64> = q.exec_first(
        &sql.find_history_unique,
        params! {
            "queue" => p.queue, "unique_key" => key,
            "since_in" => now.offset(since), "now" => now.param(),
            "statuses" => p.unique_statuses,
        },
    )?;
    Ok(found.map(|id| Enqueued { id, existed: true }))
}

/// [`find_in_history`] with a locking read.
fn find_in_history_locked(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &EnqueueParams<'_>,
    now: Now,
) -> Result<Option<Enqueued>> {
    let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) else {
        return Ok(None);
    };
    let found: Option<i64> = q.exec_first(
        format!("{} LOCK IN SHARE MODE", sql.find_history_unique),
        params! {
            "queue" => p.queue, "unique_key" => key,
            "since_in" => now.offset(since), "now" => now.param(),
            "statuses" => p.unique_statuses,
        },
    )?;
    Ok(found.map(|id| Enqueued { id, existed: true }))
}

/// After an insert refused a job: the live job holding its unique key (only
/// that index can refuse a row). The refused insert holds a lock on the row
/// it collided with until commit, so it is still there to be found.
fn find_live(sql: &Sql, q: &mut impl Queryable, p: &EnqueueParams<'_>) -> Result<Enqueued> {
    let key = p
        .unique_key
        .ok_or_else(|| Error::Database("insert ignored without a unique key conflict".into()))?;
    let id: Option<i64> = q.exec_first(
        &sql.find_live_unique,
        params! { "queue" => p.queue, "unique_key" => key },
    )?;
    let id = id.ok_or_else(|| Error::Database("unique key conflict with no live job".into()))?;
    Ok(Enqueued { id, existed: true })
}
