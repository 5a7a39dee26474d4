//! Inspection and operator actions on SQLite: get, list, counts, retry,
//! cancel, delete, pause, prune.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{flows, jobs, queries, sequences};
use crate::action::{self, Action};
use crate::backend::live_state;
use crate::backend::params::{
    bigint, Acted, FinishedInMinute, Found, RecentCompletions, UpdateParams,
};
use crate::backend::record::{self, Columns};
use crate::clock;
use crate::error::Result;
use crate::inspect::{JobFilter, JobRecord, JobState, Page, StateCount};
use crate::outcome::FinalStatus;

/// A live job as a record, its state derived at `?1`.
const LIVE_COLUMNS: &str = record::live_columns!("?1");

/// Runs `f`, which reads several tables, in one read transaction, so it
/// reads them at one moment. Read a statement at a time, a job moving
/// between two tables (a dependent released from `backlog_pending` into
/// `backlog_jobs` after the live table was read) was found in neither, and
/// `wait` reported it `NotFound`. Inside a caller's transaction already
/// (the `testing::*_in` helpers), that transaction is the moment.
fn at_one_moment<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    if !conn.is_autocommit() {
        return f(conn);
    }
    let snapshot = conn.unchecked_transaction()?; // rolled back on drop: it only reads
    f(&snapshot)
}

/// A job by id, live, finished, grouped or pending, with its sequence key.
pub(crate) fn get(conn: &Connection, id: i64, now: i64) -> Result<Option<JobRecord>> {
    at_one_moment(conn, |conn| {
        let found = find(conn, id, now)?;
        crate::inspect::with_sequence_key(found, |ids| sequences::keys_of(conn, ids))
    })
}

/// A job by id, wherever it is, without its sequence key.
fn find(conn: &Connection, id: i64, now: i64) -> Result<Option<JobRecord>> {
    let live = format!("SELECT {} FROM backlog_jobs WHERE id = ?2", LIVE_COLUMNS);
    if let Some(record) = first(conn, &live, params![now, id])? {
        return Ok(Some(record));
    }
    let finished = format!(
        "SELECT {} FROM backlog_history WHERE id = ?1",
        record::HISTORY_COLUMNS
    );
    if let Some(record) = first(conn, &finished, params![id])? {
        return Ok(Some(record));
    }
    let grouped = format!(
        "SELECT {} FROM backlog_group_members WHERE id = ?1",
        record::GROUPED_COLUMNS
    );
    if let Some(record) = first(conn, &grouped, params![id])? {
        return Ok(Some(record));
    }
    let pending = format!(
        "SELECT {} FROM backlog_pending WHERE id = ?1",
        flows::PENDING_COLUMNS
    );
    first(conn, &pending, params![id])
}

/// The record `sql` finds first, if any.
fn first(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Option<JobRecord>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query_and_then(params, record)?;
    rows.next().transpose()
}

/// One page of jobs in a state, by ascending id.
pub(crate) fn list(conn: &Connection, filter: &JobFilter, now: i64) -> Result<Page> {
    let sql = match filter.state {
        JobState::Finished(_) => format!(
            "SELECT {} FROM backlog_history WHERE status = ?1 AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR kind = ?3) AND id > ?4 ORDER BY id LIMIT ?5",
            record::HISTORY_COLUMNS
        ),
        // `?1` (now) plays no part: they wait for their dependencies.
        JobState::Pending => format!(
            "SELECT {} FROM backlog_pending WHERE ?1 IS NOT NULL
             AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) AND id > ?4
             ORDER BY id LIMIT ?5",
            flows::PENDING_COLUMNS
        ),
        // `?1` (now) plays no part: the members wait for their group.
        JobState::Grouped => format!(
            "SELECT {} FROM backlog_group_members WHERE ?1 IS NOT NULL
             AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) AND id > ?4
             ORDER BY id LIMIT ?5",
            record::GROUPED_COLUMNS
        ),
        live => format!(
            "SELECT {} FROM backlog_jobs WHERE {} AND (?2 IS NULL OR queue = ?2)
             AND (?3 IS NULL OR kind = ?3) AND id > ?4 ORDER BY id LIMIT ?5",
            LIVE_COLUMNS,
            live_state::condition(live.as_str(), "?1")
        ),
    };
    let first: rusqlite::types::Value = match filter.state {
        JobState::Finished(status) => status.as_str().to_owned().into(),
        _ => now.into(),
    };
    let limit = bigint(filter.limit);
    // The page and its sequence keys at one moment.
    at_one_moment(conn, |conn| page(conn, &sql, first, filter, limit))
}

/// One page of [`list`], with its jobs' sequence keys.
fn page(
    conn: &Connection,
    sql: &str,
    first: rusqlite::types::Value,
    filter: &JobFilter,
    limit: i64,
) -> Result<Page> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut jobs = stmt
        .query_and_then(
            params![
                first,
                filter.queue,
                filter.kind,
                filter.after_id.unwrap_or(i64::MIN),
                limit
            ],
            record,
        )?
        .collect::<Result<Vec<_>>>()?;
    crate::inspect::with_sequence_keys(&mut jobs, |ids| sequences::keys_of(conn, ids))?;
    Ok(Page::of(jobs, filter.limit))
}

/// Reads a row in [`LIVE_COLUMNS`] order.
fn record(mut r: &Row<'_>) -> Result<JobRecord> {
    record::read(&mut r)
}

impl Columns for &Row<'_> {
    fn int(&mut self, i: usize) -> Result<Option<i64>> {
        Ok(self.get(i)?)
    }

    fn text(&mut self, i: usize) -> Result<Option<String>> {
        Ok(self.get(i)?)
    }

    fn flag(&mut self, i: usize) -> Result<bool> {
        Ok(self.get(i)?)
    }
}

/// Jobs per queue and state (states with no jobs are left out), every
/// table read at one moment: a job moving between two of them counts once.
pub(crate) fn counts(conn: &Connection, now: i64) -> Result<Vec<StateCount>> {
    let count_live = live_state::count("backlog_jobs", "?1");
    at_one_moment(conn, |conn| {
        count_by_state(
            conn,
            &[
                (count_live.as_str(), vec![now]),
                (queries::COUNT_GROUPED, vec![]),
                (flows::COUNT_PENDING, vec![]),
                (queries::COUNT_HISTORY, vec![]),
            ],
        )
    })
}

/// Live jobs per queue and state, and dead jobs per queue, read from
/// indexes (see [`queries::COUNT_WAITING_DUE`]).
pub(crate) fn depth(conn: &Connection, now: i64) -> Result<Vec<StateCount>> {
    at_one_moment(conn, |conn| depth_at(conn, now)) // one moment, as `counts`
}

fn depth_at(conn: &Connection, now: i64) -> Result<Vec<StateCount>> {
    let mut out = count_by_state(
        conn,
        &[
            (queries::COUNT_RUNNING, vec![]),
            (queries::COUNT_GROUPED, vec![]),
            (flows::COUNT_PENDING, vec![]),
            (queries::COUNT_DEAD, vec![]),
        ],
    )?;
    // Per queue: due now, retrying, all unleased.
    let mut waiting = std::collections::BTreeMap::<String, [i64; 3]>::new();
    for sql in [queries::COUNT_WAITING_DUE, queries::COUNT_WAITING_LATER] {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map([now], |r| {
            Ok((
                r.get::<_, String>(0)?,
                [
                    r.get::<_, Option<i64>>(1)?.unwrap_or(0),
                    r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                    r.get::<_, i64>(3)?,
                ],
            ))
        })?;
        for row in rows {
            let (queue, counts) = row?;
            let sums = waiting.entry(queue).or_default();
            for (sum, n) in sums.iter_mut().zip(counts) {
                *sum += n;
            }
        }
    }
    for (queue, [due, retrying, all]) in waiting {
        let scheduled = all - due - retrying;
        for (state, count) in [
            (JobState::Available, due),
            (JobState::Scheduled, scheduled),
            (JobState::Retrying, retrying),
        ] {
            if count > 0 {
                out.push(StateCount {
                    queue: queue.clone(),
                    state,
                    count: count as u64,
                });
            }
        }
    }
    StateCount::sort(&mut out);
    Ok(out)
}

/// Runs queries that return `(queue, state, count)` rows, sorted by queue
/// then state.
fn count_by_state(conn: &Connection, queries: &[(&str, Vec<i64>)]) -> Result<Vec<StateCount>> {
    let mut out = Vec::new();
    for (sql, args) in queries {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (queue, state, count) = row?;
            out.extend(StateCount::from_row(queue, &state, count));
        }
    }
    StateCount::sort(&mut out);
    Ok(out)
}

/// Where job `id` stands: live (leased or not), finished, or nowhere.
fn look(conn: &Connection, id: i64) -> Result<Found> {
    let live: Option<Option<i64>> = conn
        .prepare_cached(queries::LIVE_LEASE)?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(match live {
        Some(Some(_)) => Found::Running,
        Some(None) => Found::Waiting,
        None => {
            let status: Option<String> = conn
                .prepare_cached(queries::HISTORY_STATUS)?
                .query_row([id], |r| r.get(0))
                .optional()?;
            match status.as_deref().and_then(FinalStatus::parse) {
                Some(status) => Found::Finished(status),
                None => Found::Nothing,
            }
        }
    })
}

/// [`look`], finding a pending job (see `flows`) as waiting: what a cancel
/// or a discard applies to.
fn look_pending(conn: &Connection, id: i64) -> Result<Found> {
    Ok(match look(conn, id)? {
        Found::Nothing if flows::is_pending(conn, id)? => Found::Waiting,
        found => found,
    })
}

/// Makes a dead, discarded or cancelled job live again with attempts reset.
pub(crate) fn retry(conn: &Connection, id: i64, now: i64) -> Result<Acted> {
    Action::Retry.act(look(conn, id)?, || {
        let moved = conn
            .prepare_cached(queries::RETRY_FROM_HISTORY)?
            .execute(params![id, now])?;
        if moved > 0 {
            conn.prepare_cached(queries::DELETE_HISTORY)?
                .execute([id])?;
            flows::retried(conn, id, now)?;
        }
        Ok(moved > 0)
    })
}

/// Makes a scheduled or retrying job (one not running) due now, keeping its
/// attempts.
pub(crate) fn run_now(conn: &Connection, id: i64, now: i64) -> Result<Acted> {
    Action::RunNow.act(look(conn, id)?, || {
        conn.prepare_cached(queries::RUN_NOW)?
            .execute(params![id, now])?;
        Ok(true)
    })
}

/// Cancels a job: at once when it is not running, by request when it is.
pub(crate) fn cancel(conn: &Connection, id: i64, now: i64) -> Result<Acted> {
    let found = look_pending(conn, id)?;
    Action::Cancel.act(found, || {
        if found == Found::Running {
            conn.prepare_cached(queries::REQUEST_CANCEL)?
                .execute(params![id, now])?;
        } else {
            finish_waiting(conn, id, FinalStatus::Cancelled, action::CANCELLED, now)?;
        }
        Ok(true)
    })
}

/// Cancels a workflow's steps `ids` in the caller's one transaction: looks
/// at every one, then cancels those not finished
/// (`crate::flow::cancel_unfinished`).
pub(crate) fn cancel_steps(conn: &Connection, ids: &[i64], now: i64) -> Result<Vec<Option<Acted>>> {
    let mut tx = conn;
    let look = |conn: &mut &Connection, id| look_pending(conn, id);
    crate::flow::cancel_unfinished(&mut tx, ids, look, |conn, id| cancel(conn, id, now))
}

/// Moves a job that is not running to history as `discarded`, with
/// `reason` as its last error.
pub(crate) fn discard(conn: &Connection, id: i64, reason: &str, now: i64) -> Result<Acted> {
    Action::Discard.act(look_pending(conn, id)?, || {
        finish_waiting(conn, id, FinalStatus::Discarded, reason, now)?;
        Ok(true)
    })
}

/// Moves a job that is not leased to history as `status`, with the
/// operator's `message`.
fn finish_waiting(
    conn: &Connection,
    id: i64,
    status: FinalStatus,
    message: &str,
    now: i64,
) -> Result<()> {
    let error = action::operator_error(message, now);
    if flows::end_by_operator(conn, id, status, &error, now)? {
        return Ok(());
    }
    jobs::finish(conn, id, None, status, None, Some(&error), now)
}

/// Deletes a job, live or finished; whether there was one. A worker running
/// it gets `LeaseLost`.
pub(crate) fn delete(conn: &Connection, id: i64, now: i64) -> Result<bool> {
    let pending = flows::deleting(conn, id, now)?;
    let live = conn.prepare_cached(queries::DELETE_LIVE)?.execute([id])?;
    if live > 0 {
        super::batches::deleted(conn, id, now, super::jobs::enqueue_all)?;
    }
    let finished = conn
        .prepare_cached(queries::DELETE_HISTORY)?
        .execute([id])?;
    sequences::forget(conn, &[id])?;
    Ok(pending || live + finished > 0)
}

/// Inserts jobs copied from another database (see `backlog::copy()`), keeping
/// their ids; returns how many were written (the others were already there).
pub(crate) fn import(conn: &Connection, records: &[JobRecord]) -> Result<usize> {
    let mut written = 0;
    let mut highest = 0;
    for r in records {
        let errors = serde_json::to_string(&r.errors)?;
        let common = params![
            r.id,
            r.queue,
            r.kind,
            r.priority,
            r.unique_key,
            r.payload,
            r.attempts,
            r.max_attempts,
            clock::micros(r.available_at),
            r.started_at.map(clock::micros),
            errors,
            r.cancel_requested,
            clock::micros(r.created_at),
            clock::micros(r.updated_at),
        ];
        written += match r.state {
            JobState::Grouped => {
                let key = r.group_key.as_deref().unwrap_or_default();
                let inserted = conn
                    .prepare_cached(queries::IMPORT_GROUPED)?
                    .execute(params![
                        r.id,
                        r.queue,
                        r.kind,
                        key,
                        r.priority,
                        r.payload,
                        r.max_attempts,
                        clock::micros(r.created_at)
                    ])?;
                if inserted == 1 {
                    // The group takes the default policy until the next
                    // enqueue into it gives one.
                    let (max_size, grace_us, max_delay_us) = crate::Group::new(key).check()?;
                    let now = clock::micros(r.updated_at.max(r.created_at));
                    conn.prepare_cached(queries::JOIN_GROUP)?.execute(params![
                        r.queue,
                        r.kind,
                        key,
                        max_size,
                        grace_us,
                        max_delay_us,
                        now
                    ])?;
                }
                inserted
            }
            JobState::Finished(status) => {
                let mut values = common.to_vec();
                let finished_at = clock::micros(r.finished_at.unwrap_or(r.updated_at));
                let status = status.as_str();
                values.extend(params![
                    r.result,
                    status,
                    r.worker,
                    finished_at,
                    r.progress,
                    r.group_key,
                    r.aggregated_into
                ]);
                let inserted = conn
                    .prepare_cached(queries::IMPORT_HISTORY)?
                    .execute(values.as_slice())?;
                if inserted > 0 {
                    super::counts::count_moved(conn, &[r.id])?;
                }
                inserted
            }
            _ => {
                let mut values = common.to_vec();
                values.push(&r.progress);
                conn.prepare_cached(queries::IMPORT_LIVE)?
                    .execute(values.as_slice())?
            }
        };
        highest = highest.max(r.id);
    }
    conn.execute(queries::ENSURE_NEXT_ID, [highest])?;
    conn.execute(queries::RAISE_NEXT_ID, [highest])?;
    Ok(written)
}

/// Completed jobs per queue since `hour_since`, and since `minute_since`.
pub(crate) fn recent_completions(
    conn: &Connection,
    hour_since: i64,
    minute_since: i64,
) -> Result<Vec<RecentCompletions>> {
    let mut stmt = conn.prepare_cached(queries::COUNT_RECENT_COMPLETIONS)?;
    let rows = stmt.query_map(params![hour_since, minute_since], |r| {
        Ok(RecentCompletions {
            queue: r.get(0)?,
            hour: r.get::<_, i64>(1)?.max(0) as u64,
            minute: r.get::<_, Option<i64>>(2)?.unwrap_or(0).max(0) as u64,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn finished_per_minute(
    conn: &Connection,
    since: i64,
    now: i64,
) -> Result<Vec<FinishedInMinute>> {
    let mut stmt = conn.prepare_cached(queries::COUNT_FINISHED_PER_MINUTE)?;
    let rows = stmt.query_map(params![since, now], |r| {
        Ok(FinishedInMinute {
            queue: r.get(0)?,
            status: r.get(1)?,
            minutes_ago: r.get(2)?,
            count: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Changes priority, due time or queue of a job that is not running.
pub(crate) fn update(conn: &Connection, p: &UpdateParams<'_>) -> Result<Acted> {
    Action::Update.act(look(conn, p.id)?, || {
        let changed = conn
            .prepare_cached(queries::UPDATE_WAITING)?
            .execute(params![p.id, p.priority, p.available_at, p.queue, p.now])?;
        // The job is unleased and this transaction holds the write lock:
        // only the unique index can have ignored the row.
        Ok(changed > 0)
    })
}

/// Backlog's tables (of 3) and all tables in the SQLite file at `path`,
/// read on a read-only connection of its own: nothing is created or changed.
/// With `key`, the file is read through SQLCipher's `PRAGMA key`; `None`
/// when it does not open with it (a wrong key, or not encrypted with one).
pub(crate) fn probe_tables(
    path: &std::path::Path,
    key: Option<&str>,
) -> Result<Option<(i64, i64)>> {
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    if let Some(key) = key {
        conn.pragma_update(None, "key", key)?;
    }
    match conn.query_row(queries::PROBE_TABLES, [], |r| Ok((r.get(0)?, r.get(1)?))) {
        Err(e)
            if key.is_some()
                && e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) =>
        {
            Ok(None)
        }
        other => Ok(Some(other?)),
    }
}

/// Pauses (`true`) or resumes (`false`) a queue.
pub(crate) fn set_paused(conn: &Connection, queue: &str, paused: bool, now: i64) -> Result<()> {
    conn.prepare_cached(queries::SET_PAUSED)?
        .execute(params![queue, paused, now])?;
    Ok(())
}

/// The paused queues.
pub(crate) fn find_unique(
    conn: &Connection,
    queue: &str,
    key: &str,
    history: i64,
) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(queries::FIND_UNIQUE)?;
    let ids = stmt.query_map(params![queue, key, history], |r| r.get(0))?;
    Ok(ids.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn paused_queues(conn: &Connection) -> Result<Vec<String>> {
    jobs::paused_queues(conn)
}

/// Deletes up to `limit` finished jobs of `status` that finished before
/// `cutoff`, with their dependency edges and workflow steps, and each
/// workflow whose last step they were.
pub(crate) fn prune(
    conn: &Connection,
    status: FinalStatus,
    cutoff: i64,
    limit: usize,
) -> Result<usize> {
    let limit = bigint(limit);
    let ids = conn
        .prepare_cached(queries::PRUNE_HISTORY)?
        .query_map(params![status.as_str(), cutoff, limit], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<i64>>>()?;
    sequences::forget(conn, &ids)?;
    let mut edges = conn.prepare_cached(queries::PRUNE_EDGES)?;
    let mut step = conn.prepare_cached(queries::PRUNE_STEP)?;
    let mut workflow = conn.prepare_cached(queries::PRUNE_WORKFLOW)?;
    for id in &ids {
        edges.execute([id])?;
        let of: Option<i64> = step.query_row([id], |r| r.get(0)).optional()?;
        if let Some(of) = of {
            workflow.execute([of])?;
        }
    }
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::QueueOptions;

    /// A scrape must not read every payload or the whole history: each count
    /// walks an index.
    #[test]
    fn depth_and_recent_completions_read_indexes_only() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let db = super::super::Connections::open(&dir.path().join("q.db"), &QueueOptions::new())?;
        super::super::migrate::migrate(&mut *db.writer()?, std::time::Duration::from_secs(5))?;
        let plan = |sql: &str, args: &[i64]| -> Result<String> {
            let conn = db.writer()?;
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let rows =
                stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
        };
        for (sql, args, index) in [
            (queries::COUNT_WAITING_DUE, &[0][..], "backlog_jobs_lease"),
            (queries::COUNT_WAITING_LATER, &[0], "backlog_jobs_scheduled"),
            (queries::COUNT_RUNNING, &[], "backlog_jobs_running"),
            (queries::COUNT_DEAD, &[], "backlog_history_finished"),
            (
                queries::COUNT_RECENT_COMPLETIONS,
                &[0, 0],
                "backlog_history_finished",
            ),
        ] {
            let plan = plan(sql, args)?;
            assert!(plan.contains(index), "{sql}\n{plan}");
        }
        Ok(())
    }
}
