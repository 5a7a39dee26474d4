//! Inspection and operator actions on PostgreSQL: get, list, counts, depth,
//! retry, cancel, discard, delete, update, pause, prune. The engine decides
//! which state an action applies to (`crate::action`); the rows an action
//! changes are locked first (`FOR UPDATE`), since here a
//! lease on another node may run at the same moment.

use postgres::types::{ToSql, Type};
use postgres::{GenericClient, Row};

use super::connection::Tx;
use super::jobs::{self, canonical_json};
use super::queries::{self, Queries};
use super::{flows, sequences};
use crate::action::{self, Action};
use crate::backend::live_state;
use crate::backend::params::{
    bigint, Acted, FinishedInMinute, Found, RecentCompletions, UpdateParams,
};
use crate::backend::record::{self, Columns};
use crate::clock;
use crate::error::{Error, Result};
use crate::inspect::{JobFilter, JobRecord, JobState, Page, StateCount};
use crate::outcome::FinalStatus;

/// A job by id, live, finished, grouped or pending, with its sequence key.
pub(crate) fn get<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<Option<JobRecord>> {
    let found = find(tx, q, id, now)?;
    crate::inspect::with_sequence_key(found, |ids| sequences::keys_of(tx, q, ids))
}

/// A job by id, wherever it is, without its sequence key.
fn find<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<Option<JobRecord>> {
    let live = q.tables.render(&format!(
        "SELECT {} FROM {{jobs}} WHERE id = $2",
        queries::LIVE_COLUMNS
    ));
    if let Some(row) = tx.query_opt(&live, &[&q.now_override(now), &id])? {
        return record(&row).map(Some);
    }
    let finished = q.tables.render(&format!(
        "SELECT {} FROM {{history}} WHERE id = $1",
        queries::HISTORY_COLUMNS
    ));
    if let Some(row) = tx.query_opt(&finished, &[&id])? {
        return record(&row).map(Some);
    }
    let grouped = q.tables.render(&format!(
        "SELECT {} FROM {{group_members}} WHERE id = $1",
        queries::GROUPED_COLUMNS
    ));
    if let Some(row) = tx.query_opt(&grouped, &[&id])? {
        return record(&row).map(Some);
    }
    tx.query_opt(&q.flows.own.get_pending, &[&id])?
        .map(|row| record(&row))
        .transpose()
}

/// One page of jobs in a state, by ascending id.
pub(crate) fn list<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    filter: &JobFilter,
    now: i64,
) -> Result<Page> {
    let limit = bigint(filter.limit);
    let after = filter.after_id.unwrap_or(i64::MIN);
    let rows = match filter.state {
        JobState::Finished(status) => {
            let sql = q.tables.render(&format!(
                "SELECT {} FROM {{history}} WHERE status = $1 AND ($2::text IS NULL OR queue = $2)
                 AND ($3::text IS NULL OR kind = $3) AND id > $4 ORDER BY id LIMIT $5",
                queries::HISTORY_COLUMNS
            ));
            tx.query(
                &sql,
                &[
                    &status.as_str(),
                    &filter.queue,
                    &filter.kind,
                    &after,
                    &limit,
                ],
            )?
        }
        JobState::Pending => tx.query(
            &q.flows.own.list_pending,
            &[&filter.queue, &filter.kind, &after, &limit],
        )?,
        JobState::Grouped => {
            let sql = q.tables.render(&format!(
                "SELECT {} FROM {{group_members}} WHERE ($1::text IS NULL OR queue = $1)
                 AND ($2::text IS NULL OR kind = $2) AND id > $3 ORDER BY id LIMIT $4",
                queries::GROUPED_COLUMNS
            ));
            tx.query(&sql, &[&filter.queue, &filter.kind, &after, &limit])?
        }
        live => {
            let sql = q.tables.render(&format!(
                "SELECT {} FROM {{jobs}} WHERE {} AND ($2::text IS NULL OR queue = $2)
                 AND ($3::text IS NULL OR kind = $3) AND id > $4 ORDER BY id LIMIT $5",
                queries::LIVE_COLUMNS,
                live_state::condition(live.as_str(), "{now}")
            ));
            tx.query(
                &sql,
                &[
                    &q.now_override(now),
                    &filter.queue,
                    &filter.kind,
                    &after,
                    &limit,
                ],
            )?
        }
    };
    let mut jobs = rows.iter().map(record).collect::<Result<Vec<_>>>()?;
    crate::inspect::with_sequence_keys(&mut jobs, |ids| sequences::keys_of(tx, q, ids))?;
    Ok(Page::of(jobs, filter.limit))
}

/// Reads a row in [`queries::LIVE_COLUMNS`] order.
fn record(mut r: &Row) -> Result<JobRecord> {
    record::read(&mut r)
}

impl Columns for &Row {
    /// `INTEGER` and `BIGINT` columns alike.
    fn int(&mut self, i: usize) -> Result<Option<i64>> {
        Ok(match self.columns().get(i).map(|c| c.type_()) {
            Some(&Type::INT2) => self.try_get::<_, Option<i16>>(i)?.map(i64::from),
            Some(&Type::INT4) => self.try_get::<_, Option<i32>>(i)?.map(i64::from),
            _ => self.try_get(i)?,
        })
    }

    fn text(&mut self, i: usize) -> Result<Option<String>> {
        Ok(self.try_get(i)?)
    }

    fn flag(&mut self, i: usize) -> Result<bool> {
        Ok(self.try_get(i)?)
    }

    /// JSONB comes back reformatted (`{"a": 1}`): put back in the
    /// engine's compact form.
    fn json(&mut self, i: usize) -> Result<Option<String>> {
        Ok(self.try_get::<_, Option<String>>(i)?.map(canonical_json))
    }
}

/// Jobs per queue and state (states with no jobs are left out).
pub(crate) fn counts<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
) -> Result<Vec<StateCount>> {
    let mut rows = tx.query(&q.inspect.count_live, &[&q.now_override(now)])?;
    rows.extend(tx.query(&q.count_grouped, &[])?);
    rows.extend(tx.query(&q.flows.count_pending, &[])?);
    rows.extend(tx.query(&q.inspect.count_history, &[])?);
    let mut out = Vec::new();
    for row in rows {
        let queue: String = row.try_get(0)?;
        let state: String = row.try_get(1)?;
        let count: i64 = row.try_get(2)?;
        out.extend(StateCount::from_row(queue, &state, count));
    }
    StateCount::sort(&mut out);
    Ok(out)
}

/// Live jobs per queue and state, and dead jobs per queue, read from
/// indexes in one statement (see [`queries::COUNT_WAITING_DUE`]).
pub(crate) fn depth<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    now: i64,
) -> Result<Vec<StateCount>> {
    let mut out = Vec::new();
    for row in tx.query(&q.depth, &[&q.now_override(now)])? {
        let queue: String = row.try_get(0)?;
        let state: String = row.try_get(1)?;
        let count: i64 = row.try_get(2)?;
        out.extend(StateCount::from_row(queue, &state, count));
    }
    StateCount::sort(&mut out);
    Ok(out)
}

/// Where job `id` stands: live (leased or not), finished, or nowhere. Locks
/// the live row.
fn look<C: GenericClient>(tx: &mut Tx<'_, C>, q: &Queries, id: i64) -> Result<Found> {
    if let Some(row) = tx.query_opt(&q.inspect.live_lease, &[&id])? {
        let token: Option<i64> = row.try_get(0)?;
        return Ok(match token {
            Some(_) => Found::Running,
            None => Found::Waiting,
        });
    }
    Ok(match tx.query_opt(&q.inspect.history_status, &[&id])? {
        Some(row) => match FinalStatus::parse(&row.try_get::<_, String>(0)?) {
            Some(status) => Found::Finished(status),
            None => Found::Nothing,
        },
        None => Found::Nothing,
    })
}

/// [`look`], finding a pending job (see `flows`) as waiting: what a cancel
/// or a discard applies to.
fn look_pending<C: GenericClient>(tx: &mut Tx<'_, C>, q: &Queries, id: i64) -> Result<Found> {
    Ok(match look(tx, q, id)? {
        Found::Nothing if flows::is_pending(tx, q, id)? => Found::Waiting,
        found => found,
    })
}

/// Makes a dead, discarded or cancelled job live again with attempts reset.
pub(crate) fn retry<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<Acted> {
    let found = look(tx, q, id)?;
    Action::Retry.act(found, || {
        let moved = tx.execute(&q.inspect.retry_from_history, &[&q.now_override(now), &id])?;
        if moved > 0 {
            tx.execute(&q.inspect.delete_history, &[&id])?;
            tx.query(&q.notify, &[&q.channel])?;
            flows::retried(tx, q, id, now)?;
        }
        Ok(moved > 0)
    })
}

/// Makes a scheduled or retrying job (one not running) due now, keeping its
/// attempts.
pub(crate) fn run_now<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<Acted> {
    let found = look(tx, q, id)?;
    Action::RunNow.act(found, || {
        tx.execute(&q.inspect.run_now, &[&q.now_override(now), &id])?;
        tx.query(&q.notify, &[&q.channel])?;
        Ok(true)
    })
}

/// Cancels a job: at once when it is not running, by request when it is.
pub(crate) fn cancel<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<Acted> {
    let found = look_pending(tx, q, id)?;
    Action::Cancel.act(found, || {
        if found == Found::Running {
            tx.execute(&q.inspect.request_cancel, &[&q.now_override(now), &id])?;
        } else {
            let error = action::operator_error(action::CANCELLED, now);
            if flows::end_by_operator(tx, q, id, FinalStatus::Cancelled, &error, now)? {
                return Ok(true);
            }
            jobs::finish_one(tx, q, id, FinalStatus::Cancelled, Some(&error), now)?;
        }
        Ok(true)
    })
}

/// As SQLite's `cancel_steps`. The look locks every step's row (`FOR
/// UPDATE`) before any is cancelled: a worker finishing one waits for this
/// transaction, or finished it before and it is left alone.
pub(crate) fn cancel_steps<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    ids: &[i64],
    now: i64,
) -> Result<Vec<Option<Acted>>> {
    let look = |tx: &mut _, id| look_pending(tx, q, id);
    crate::flow::cancel_unfinished(tx, ids, look, |tx, id| cancel(tx, q, id, now))
}

/// Moves a job that is not running to history as `discarded`, with
/// `reason` as its last error.
pub(crate) fn discard<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    reason: &str,
    now: i64,
) -> Result<Acted> {
    let found = look_pending(tx, q, id)?;
    Action::Discard.act(found, || {
        // The row is locked and not leased: it moves.
        let error = action::operator_error(reason, now);
        if flows::end_by_operator(tx, q, id, FinalStatus::Discarded, &error, now)? {
            return Ok(true);
        }
        jobs::finish_one(tx, q, id, FinalStatus::Discarded, Some(&error), now)?;
        Ok(true)
    })
}

/// Deletes a job, live or finished; whether there was one. A worker running
/// it gets `LeaseLost`.
pub(crate) fn delete<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<bool> {
    let pending = flows::deleting(tx, q, id, now)?;
    let live = tx.execute(&q.delete_live, &[&id])?;
    if live > 0 {
        super::batches::deleted(tx, q, id, now, jobs::enqueue_all)?;
    }
    let finished = tx.execute(&q.inspect.delete_history, &[&id])?;
    sequences::forget(tx, q, &[id])?;
    Ok(pending || live + finished > 0)
}

/// Inserts jobs copied from another database (see `backlog::copy`), keeping
/// their ids; returns how many were written (the others were already there).
pub(crate) fn import<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    records: &[JobRecord],
) -> Result<usize> {
    let mut written = 0;
    let mut highest = 0;
    for r in records {
        let errors = serde_json::to_string(&r.errors)?;
        let attempts = i32::try_from(r.attempts).unwrap_or(i32::MAX);
        let max_attempts = i32::try_from(r.max_attempts).unwrap_or(i32::MAX);
        let (available_at, started_at) = (
            clock::micros(r.available_at),
            r.started_at.map(clock::micros),
        );
        let (created_at, updated_at) = (clock::micros(r.created_at), clock::micros(r.updated_at));
        let common: [&(dyn ToSql + Sync); 14] = [
            &r.id,
            &r.queue,
            &r.kind,
            &r.priority,
            &r.unique_key,
            &r.payload,
            &attempts,
            &max_attempts,
            &available_at,
            &started_at,
            &errors,
            &r.cancel_requested,
            &created_at,
            &updated_at,
        ];
        written += match r.state {
            JobState::Grouped => {
                let key = r.group_key.as_deref().unwrap_or_default();
                let inserted = tx.execute(
                    &q.import_grouped,
                    &[
                        &r.id,
                        &r.queue,
                        &r.kind,
                        &key,
                        &r.priority,
                        &r.payload,
                        &max_attempts,
                        &created_at,
                    ],
                )?;
                if inserted == 1 {
                    // The group takes the default policy until the next
                    // enqueue into it gives one.
                    let (max_size, grace_us, max_delay_us) = crate::Group::new(key).check()?;
                    let max_size = i32::try_from(max_size).unwrap_or(i32::MAX);
                    let now = Some(clock::micros(r.updated_at.max(r.created_at)));
                    tx.execute(
                        &q.join_group,
                        &[
                            &now,
                            &r.queue,
                            &r.kind,
                            &key,
                            &max_size,
                            &grace_us,
                            &max_delay_us,
                        ],
                    )?;
                }
                inserted
            }
            JobState::Finished(status) => {
                let finished_at = clock::micros(r.finished_at.unwrap_or(r.updated_at));
                let status = status.as_str();
                let mut values = common.to_vec();
                values.extend_from_slice(&[
                    &r.result,
                    &status,
                    &r.worker,
                    &finished_at,
                    &r.progress,
                    &r.group_key,
                    &r.aggregated_into,
                ]);
                let inserted = tx.execute(&q.import_history, &values)?;
                if inserted > 0 {
                    super::counts::count_moved(tx, q, [r.id])?;
                }
                inserted
            }
            _ => {
                let mut values = common.to_vec();
                values.push(&r.progress);
                tx.execute(&q.import_live, &values)?
            }
        };
        highest = highest.max(r.id);
    }
    if highest > 0 {
        tx.query(&q.raise_next_id, &[&highest])?;
    }
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

/// Completed jobs per queue since `hour_since`, and since `minute_since`:
/// absolute times of the engine's clock, turned into offsets from its `now`
/// and applied to the server's, as [`prune`]'s cutoff.
pub(crate) fn recent_completions<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    hour_since: i64,
    minute_since: i64,
    now: i64,
) -> Result<Vec<RecentCompletions>> {
    let hour_back = hour_since.saturating_sub(now);
    let minute_back = minute_since.saturating_sub(now);
    tx.query(
        &q.inspect.count_recent_completions,
        &[&q.now_override(now), &hour_back, &minute_back],
    )?
    .iter()
    .map(|r| {
        Ok(RecentCompletions {
            queue: r.try_get(0)?,
            hour: r.try_get::<_, i64>(1)?.max(0) as u64,
            minute: r.try_get::<_, i64>(2)?.max(0) as u64,
        })
    })
    .collect()
}

pub(crate) fn finished_per_minute<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    since: i64,
    now: i64,
) -> Result<Vec<FinishedInMinute>> {
    let back = since.saturating_sub(now);
    tx.query(
        &q.inspect.count_finished_per_minute,
        &[&q.now_override(now), &back],
    )?
    .iter()
    .map(|r| {
        Ok(FinishedInMinute {
            queue: r.try_get(0)?,
            status: r.try_get(1)?,
            minutes_ago: r.try_get(2)?,
            count: r.try_get(3)?,
        })
    })
    .collect()
}

/// Changes priority, due time or queue of a job that is not running. A
/// change of time or queue wakes the listeners: the job may be claimable
/// sooner, or by another worker.
pub(crate) fn update<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    p: &UpdateParams<'_>,
) -> Result<Acted> {
    let found = look(tx, q, p.id)?;
    Action::Update.act(found, || {
        let delay = p.available_at.map(|at| at.saturating_sub(p.now));
        let changed = match tx.execute(
            &q.inspect.update_waiting,
            &[&q.now_override(p.now), &p.id, &p.priority, &delay, &p.queue],
        ) {
            Ok(changed) => changed,
            // The statement aborted the transaction; its commit rolls back.
            Err(e) if is_unique_violation(&e) => 0,
            Err(e) => return Err(e),
        };
        // The row is locked by this transaction and not leased: only the
        // unique key check can have left it out.
        if changed > 0 && (p.available_at.is_some() || p.queue.is_some()) {
            tx.query(&q.notify, &[&q.channel])?;
        }
        Ok(changed > 0)
    })
}

/// A `unique_violation` (23505): the only unique index an update can hit is
/// the live jobs' unique key. The transaction is aborted, and its COMMIT
/// rolls it back (PostgreSQL answers the commit of an aborted transaction
/// with a rollback, not an error): nothing is written.
fn is_unique_violation(e: &Error) -> bool {
    matches!(e, Error::Database(inner)
        if inner.downcast_ref::<postgres::Error>()
            .and_then(postgres::Error::code)
            .is_some_and(|c| *c == postgres::error::SqlState::UNIQUE_VIOLATION))
}

/// Pauses (`true`) or resumes (`false`) a queue. A resume wakes the
/// listeners: the queue's jobs may be claimed again.
pub(crate) fn set_paused<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    queue: &str,
    paused: bool,
    now: i64,
) -> Result<()> {
    tx.execute(
        &q.inspect.set_paused,
        &[&q.now_override(now), &queue, &paused],
    )?;
    if !paused {
        tx.query(&q.notify, &[&q.channel])?;
    }
    Ok(())
}

/// The paused queues.
pub(crate) fn find_unique<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    queue: &str,
    key: &str,
    history: i64,
) -> Result<Vec<i64>> {
    tx.query(&q.inspect.find_unique, &[&queue, &key, &history])?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

pub(crate) fn paused_queues<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
) -> Result<Vec<String>> {
    tx.query(&q.inspect.paused_queues, &[])?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

/// Deletes up to `limit` finished jobs of `status` that finished before
/// `cutoff` (`now` is the engine's clock then, to turn it into an offset),
/// with their edges and workflow steps (`PRUNE_HISTORY`).
pub(crate) fn prune<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    status: FinalStatus,
    cutoff: i64,
    limit: usize,
    now: i64,
) -> Result<usize> {
    let limit = bigint(limit);
    let back = cutoff.saturating_sub(now);
    let deleted: i64 = tx
        .query_opt(
            &q.prune_history,
            &[&q.now_override(now), &status.as_str(), &back, &limit],
        )?
        .map_or(Ok(0), |r| r.try_get(0))?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}
