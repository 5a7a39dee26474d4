//! Enqueueing on PostgreSQL: one insert per job (notifying the queue's
//! listeners in the same statement), or a batch of jobs without unique keys
//! in one statement; a unique key already held returns its job's id.
//! `jobs::enqueue_all` runs it, then joins batch members to their batches
//! and makes jobs with dependencies wait.
//!
//! Plain jobs ([`is_one_statement`]) go in one autocommit statement: one
//! round trip, where a transaction costs three (see
//! [`Pool::autocommit_once`](super::connection::Pool::autocommit_once) for
//! why it never enqueues twice). Every other enqueue runs in a transaction.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::Queries;
use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// Whether enqueueing `jobs` is one statement and nothing else, so that it
/// can commit by itself in one round trip
/// ([`Pool::autocommit_once`](super::connection::Pool::autocommit_once)):
/// plain jobs, with no unique key (a refused insert is followed by a
/// look-up of the job holding the key) and nothing written but their own
/// rows (see `EnqueueParams::own_path_only`). One is `enqueue_plain`'s
/// insert; more are one `ENQUEUE_BATCH` (or its uniform form), which checks
/// the count of rows it inserted itself, before its commit.
pub(crate) fn is_one_statement(jobs: &[EnqueueParams<'_>]) -> bool {
    !jobs.is_empty()
        && jobs
            .iter()
            .all(|p| p.unique_key.is_none() && p.own_path_only().is_none())
}

/// `jobs::enqueue_all` before members join their batches and the jobs with
/// dependencies are made to wait.
pub(crate) fn insert_all<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
) -> Result<Vec<Enqueued>> {
    if jobs.iter().any(|p| p.group.is_some()) {
        let ids = jobs
            .iter()
            .map(|p| match &p.group {
                Some(group) => super::groups::join(tx, q, p, group),
                None => enqueue(tx, q, p),
            })
            .collect::<Result<Vec<_>>>()?;
        // A group member's insert does not notify by itself.
        if ids.iter().any(|e| !e.existed) {
            tx.query(&q.notify, &[&q.channel])?;
        }
        return Ok(ids);
    }
    if jobs.len() > 1 && jobs.iter().all(|p| p.unique_key.is_none()) {
        return enqueue_batch(tx, q, jobs);
    }
    jobs.iter().map(|p| enqueue(tx, q, p)).collect()
}

/// Inserts a job and notifies, or finds the job already holding its unique
/// key.
fn enqueue<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &EnqueueParams<'_>,
) -> Result<Enqueued> {
    let now = q.now_override(p.now);
    if let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) {
        let back = since.saturating_sub(p.now);
        if let Some(row) = tx.query_opt(
            &q.find_history_unique,
            &[&now, &p.queue, &key, &back, &p.unique_statuses],
        )? {
            return Ok(Enqueued {
                id: row.try_get(0)?,
                existed: true,
            });
        }
    }
    let max_attempts = to_i32("max_attempts", p.max_attempts)?;
    let delay = p.available_at.saturating_sub(p.now);
    let insert = match p.unique_key {
        Some(_) => &q.enqueue_notify,
        None => &q.enqueue_plain,
    };
    // The job holding the key may finish between the insert that conflicted
    // and the look-up: then the insert is tried again.
    for _ in 0..3 {
        let inserted = tx.query_opt(
            insert,
            &[
                &now,
                &p.queue,
                &p.kind,
                &p.priority,
                &p.unique_key,
                &p.payload,
                &max_attempts,
                &delay,
                &q.channel,
            ],
        )?;
        if let Some(row) = inserted {
            let id: i64 = row.try_get(0)?;
            // The job holding the key may have finished between the look-up
            // above and the insert: looked at again after it (a statement of
            // its own reads every commit before it), a period-scoped key is
            // refused then, and the row just inserted taken back.
            if let (Some(key), Some(since)) = (p.unique_key, p.unique_history_since) {
                let back = since.saturating_sub(p.now);
                let found = tx.query_opt(
                    &q.find_history_unique,
                    &[&now, &p.queue, &key, &back, &p.unique_statuses],
                )?;
                if let Some(found) = found {
                    tx.execute(&q.delete_live, &[&id])?;
                    return Ok(Enqueued {
                        id: found.try_get(0)?,
                        existed: true,
                    });
                }
            }
            return Ok(Enqueued { id, existed: false });
        }
        // Nothing inserted: only the unique index can refuse a row.
        let key = p.unique_key.ok_or_else(|| {
            Error::Database("insert ignored without a unique key conflict".into())
        })?;
        if let Some(row) = tx.query_opt(&q.find_live_unique, &[&p.queue, &key])? {
            return Ok(Enqueued {
                id: row.try_get(0)?,
                existed: true,
            });
        }
    }
    Err(Error::Busy)
}

/// Inserts jobs without unique keys and notifies, in one statement; ids in
/// input order. A batch whose jobs differ only in their payloads binds the
/// rest once ([`ENQUEUE_BATCH_UNIFORM`]).
///
/// [`ENQUEUE_BATCH_UNIFORM`]: super::queries::ENQUEUE_BATCH_UNIFORM
fn enqueue_batch<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
) -> Result<Vec<Enqueued>> {
    let Some(first) = jobs.first() else {
        return Ok(Vec::new());
    };
    let now = q.now_override(first.now);
    let payloads: Vec<&str> = jobs.iter().map(|p| p.payload).collect();
    let delay = |p: &EnqueueParams<'_>| p.available_at.saturating_sub(p.now);
    let uniform = jobs.iter().all(|p| {
        p.queue == first.queue
            && p.kind == first.kind
            && p.priority == first.priority
            && p.max_attempts == first.max_attempts
            && delay(p) == delay(first)
    });
    let row = if uniform {
        let max_attempts = to_i32("max_attempts", first.max_attempts)?;
        tx.query_opt(
            &q.enqueue_batch_uniform,
            &[
                &now,
                &first.queue,
                &first.kind,
                &first.priority,
                &payloads,
                &max_attempts,
                &delay(first),
                &q.channel,
            ],
        )?
    } else {
        let queues: Vec<&str> = jobs.iter().map(|p| p.queue).collect();
        let kinds: Vec<&str> = jobs.iter().map(|p| p.kind).collect();
        let priorities: Vec<i32> = jobs.iter().map(|p| p.priority).collect();
        let max_attempts = jobs
            .iter()
            .map(|p| to_i32("max_attempts", p.max_attempts))
            .collect::<Result<Vec<i32>>>()?;
        let delays: Vec<i64> = jobs.iter().map(delay).collect();
        tx.query_opt(
            &q.enqueue_batch,
            &[
                &now,
                &queues,
                &kinds,
                &priorities,
                &payloads,
                &max_attempts,
                &delays,
                &q.channel,
            ],
        )?
    };
    let ids: Vec<i64> = match row {
        Some(row) => row.try_get(0)?,
        None => Vec::new(),
    };
    batch_enqueued(ids, jobs.len())
}

/// The jobs of a batch statement (`ENQUEUE_BATCH*`) from the one array of
/// ids it returns, in input order; an error when it inserted fewer than
/// `expected`. The sqlx adapter reads its row through this too.
pub(crate) fn batch_enqueued(mut ids: Vec<i64>, expected: usize) -> Result<Vec<Enqueued>> {
    if ids.len() != expected {
        return Err(Error::Database(
            format!("inserted {} of {expected} jobs", ids.len()).into(),
        ));
    }
    // Rows were inserted in input order, so their ids increase with it.
    ids.sort_unstable();
    Ok(ids
        .into_iter()
        .map(|id| Enqueued { id, existed: false })
        .collect())
}

fn to_i32(what: &str, value: u32) -> Result<i32> {
    i32::try_from(value)
        .map_err(|_| Error::InvalidArgument(format!("{what} {value} is over {}", i32::MAX)))
}
