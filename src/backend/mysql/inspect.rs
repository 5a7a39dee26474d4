//! Inspection and operator actions on MySQL: get, list, counts, retry,
//! cancel, discard, delete, update, pause, prune.

use mysql::prelude::Queryable;
use mysql::{params, Params, Row};

use super::db::{take, Now};
use super::queries::Sql;
use super::{flows, jobs, sequences};
use crate::action::{self, Action};
use crate::backend::params::{Acted, FinishedInMinute, Found, RecentCompletions, UpdateParams};
use crate::backend::record::{self, Columns};
use crate::clock;
use crate::error::Result;
use crate::inspect::{JobFilter, JobRecord, JobState, Page, StateCount};
use crate::outcome::FinalStatus;

/// A job by id, live, finished, grouped or pending, with its sequence key.
pub(crate) fn get(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    now: Now,
) -> Result<Option<JobRecord>> {
    let found = find(sql, q, id, now)?;
    crate::inspect::with_sequence_key(found, |ids| sequences::keys_of(sql, q, ids))
}

/// A job by id, wherever it is, without its sequence key.
fn find(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<Option<JobRecord>> {
    let live: Option<Row> =
        q.exec_first(&sql.get_live, params! { "id" => id, "now" => now.param() })?;
    if let Some(row) = live {
        return record(row).map(Some);
    }
    let finished: Option<Row> = q.exec_first(&sql.get_history, params! { "id" => id })?;
    if let Some(row) = finished {
        return record(row).map(Some);
    }
    let grouped: Option<Row> = q.exec_first(&sql.get_grouped, params! { "id" => id })?;
    if let Some(row) = grouped {
        return record(row).map(Some);
    }
    let pending: Option<Row> = q.exec_first(&sql.flows.own.get_pending, params! { "id" => id })?;
    pending.map(record).transpose()
}

/// One page of jobs in a state, by ascending id.
pub(crate) fn list(
    sql: &Sql,
    q: &mut impl Queryable,
    filter: &JobFilter,
    now: Now,
) -> Result<Page> {
    let (text, status) = match filter.state {
        JobState::Finished(status) => (sql.list(None), Some(status.as_str())),
        live => (sql.list(Some(live.as_str())), None),
    };
    let limit = u64::try_from(filter.limit).unwrap_or(u64::MAX);
    let rows: Vec<Row> = q.exec(
        text,
        params! {
            "status" => status, "now" => now.param(),
            "queue" => filter.queue.as_deref(), "kind" => filter.kind.as_deref(),
            "after" => filter.after_id.unwrap_or(i64::MIN), "limit" => limit,
        },
    )?;
    let mut jobs = rows.into_iter().map(record).collect::<Result<Vec<_>>>()?;
    crate::inspect::with_sequence_keys(&mut jobs, |ids| sequences::keys_of(sql, q, ids))?;
    Ok(Page::of(jobs, filter.limit))
}

/// Reads a row in `LIVE_COLUMNS` order.
fn record(mut r: Row) -> Result<JobRecord> {
    record::read(&mut r)
}

/// Each column is taken out of the row: read once, never copied.
impl Columns for Row {
    fn int(&mut self, i: usize) -> Result<Option<i64>> {
        take(self, i)
    }

    fn text(&mut self, i: usize) -> Result<Option<String>> {
        take(self, i)
    }

    fn flag(&mut self, i: usize) -> Result<bool> {
        take(self, i)
    }
}

/// Jobs per queue and state (states with no jobs are left out).
pub(crate) fn counts(sql: &Sql, q: &mut impl Queryable, now: Now) -> Result<Vec<StateCount>> {
    let mut rows: Vec<Row> = q.exec(&sql.inspect.count_live, params! { "now" => now.param() })?;
    rows.extend(q.exec::<Row, _, _>(&sql.count_grouped, ())?);
    rows.extend(q.exec::<Row, _, _>(&sql.flows.count_pending, ())?);
    rows.extend(q.exec::<Row, _, _>(&sql.inspect.count_history, ())?);
    count_by_state(rows)
}

/// Live jobs per queue and state, and dead jobs per queue, read from
/// indexes in one statement (see [`super::queries::COUNT_WAITING_DUE`]).
pub(crate) fn depth(sql: &Sql, q: &mut impl Queryable, now: Now) -> Result<Vec<StateCount>> {
    let rows: Vec<Row> = q.exec(&sql.depth, params! { "now" => now.param() })?;
    count_by_state(rows)
}

/// Reads `(queue, state, count)` rows, sorted by queue then state.
fn count_by_state(rows: Vec<Row>) -> Result<Vec<StateCount>> {
    let mut out = Vec::new();
    for mut r in rows {
        let (queue, state, count): (String, String, i64) =
            (take(&mut r, 0)?, take(&mut r, 1)?, take(&mut r, 2)?);
        out.extend(StateCount::from_row(queue, &state, count));
    }
    StateCount::sort(&mut out);
    Ok(out)
}

/// Where job `id` stands: live (leased or not), finished, or nowhere. Locks
/// the live row.
fn look(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<Found> {
    let live: Option<Row> = q.exec_first(&sql.inspect.live_lease, params! { "id" => id })?;
    if let Some(mut row) = live {
        return Ok(match take::<Option<i64>>(&mut row, 0)? {
            Some(_) => Found::Running,
            None => Found::Waiting,
        });
    }
    let status: Option<String> =
        q.exec_first(&sql.inspect.history_status, params! { "id" => id })?;
    Ok(match status.as_deref().and_then(FinalStatus::parse) {
        Some(status) => Found::Finished(status),
        None => Found::Nothing,
    })
}

/// [`look`], finding a pending job (see `flows`) as waiting: what a cancel
/// or a discard applies to.
fn look_pending(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<Found> {
    Ok(match look(sql, q, id)? {
        Found::Nothing if flows::is_pending(sql, q, id)? => Found::Waiting,
        found => found,
    })
}

/// Makes a dead, discarded or cancelled job live again with attempts reset.
pub(crate) fn retry(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<Acted> {
    let found = look(sql, q, id)?;
    Action::Retry.act(found, || {
        let moved = q
            .exec_iter(
                &sql.inspect.retry_from_history,
                params! { "id" => id, "now" => now.param() },
            )?
            .affected_rows();
        if moved > 0 {
            q.exec_drop(&sql.inspect.delete_history, params! { "id" => id })?;
            flows::retried(sql, q, id, now)?;
        }
        Ok(moved > 0)
    })
}

/// Makes a scheduled or retrying job (one not running) due now, keeping its
/// attempts.
pub(crate) fn run_now(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<Acted> {
    let found = look(sql, q, id)?;
    Action::RunNow.act(found, || {
        q.exec_drop(
            &sql.inspect.run_now,
            params! { "id" => id, "now" => now.param() },
        )?;
        Ok(true)
    })
}

/// Cancels a job: at once when it is not running, by request when it is.
pub(crate) fn cancel(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<Acted> {
    let found = look_pending(sql, q, id)?;
    Action::Cancel.act(found, || {
        if found == Found::Running {
            let cancel = params! { "id" => id, "now" => now.param() };
            q.exec_drop(&sql.inspect.request_cancel, cancel)?;
        } else {
            finish_waiting(sql, q, id, FinalStatus::Cancelled, action::CANCELLED, now)?;
        }
        Ok(true)
    })
}

/// As PostgreSQL's `cancel_steps`: the look locks every step's row first.
pub(crate) fn cancel_steps(
    sql: &Sql,
    q: &mut impl Queryable,
    ids: &[i64],
    now: Now,
) -> Result<Vec<Option<Acted>>> {
    let look = |q: &mut _, id| look_pending(sql, q, id);
    crate::flow::cancel_unfinished(q, ids, look, |q, id| cancel(sql, q, id, now))
}

/// Moves a job that is not running to history as `discarded`, with
/// `reason` as its last error.
pub(crate) fn discard(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    reason: &str,
    now: Now,
) -> Result<Acted> {
    let found = look_pending(sql, q, id)?;
    Action::Discard.act(found, || {
        finish_waiting(sql, q, id, FinalStatus::Discarded, reason, now)?;
        Ok(true)
    })
}

/// Moves a job that is not leased, its row locked, to history as `status`,
/// with the operator's `message`; its time is the server's now, set in SQL.
fn finish_waiting(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    status: FinalStatus,
    message: &str,
    now: Now,
) -> Result<()> {
    let error = action::operator_error(message, 0);
    if flows::end_by_operator(
        sql,
        q,
        id,
        status,
        &action::operator_error(message, now.engine),
        now,
    )? {
        return Ok(());
    }
    jobs::finish(sql, q, id, None, status, None, Some(&error), now)
}

/// Deletes a job, live or finished; whether there was one. A worker running
/// it gets `LeaseLost`.
pub(crate) fn delete(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<bool> {
    let pending = flows::deleting(sql, q, id, now)?;
    let live = q
        .exec_iter(&sql.delete_live, params! { "id" => id })?
        .affected_rows();
    if live > 0 {
        super::batches::deleted(sql, q, id, now, super::jobs::enqueue_all)?;
    }
    let finished = q
        .exec_iter(&sql.inspect.delete_history, params! { "id" => id })?
        .affected_rows();
    sequences::forget(sql, q, &[id])?;
    Ok(pending || live + finished > 0)
}

/// Inserts jobs copied from another database (see `backlog::copy()`), keeping
/// their ids; returns how many were written (the others were already there).
pub(crate) fn import(sql: &Sql, q: &mut impl Queryable, records: &[JobRecord]) -> Result<usize> {
    let mut written = 0;
    let mut highest = 0;
    for r in records {
        let mut values = params! {
            "id" => r.id, "queue" => &r.queue, "kind" => &r.kind, "priority" => r.priority,
            "unique_key" => r.unique_key.as_deref(), "payload" => &r.payload,
            "attempts" => r.attempts, "max_attempts" => r.max_attempts,
            "available_at" => clock::micros(r.available_at),
            "started_at" => r.started_at.map(clock::micros),
            "errors" => serde_json::to_string(&r.errors)?,
            "cancel_requested" => r.cancel_requested,
            "created_at" => clock::micros(r.created_at),
            "updated_at" => clock::micros(r.updated_at),
            "progress" => r.progress.as_deref(),
            "group_key" => r.group_key.as_deref(),
            "aggregated_into" => r.aggregated_into,
        };
        let statement = match r.state {
            JobState::Grouped => {
                let key = r.group_key.as_deref().unwrap_or_default();
                let inserted = q
                    .exec_iter(
                        &sql.import_grouped,
                        params! {
                            "id" => r.id, "queue" => &r.queue, "kind" => &r.kind,
                            "group_key" => key, "priority" => r.priority,
                            "payload" => &r.payload, "max_attempts" => r.max_attempts,
                            "created_at" => clock::micros(r.created_at),
                        },
                    )?
                    .affected_rows();
                if inserted == 1 {
                    // The group takes the default policy until the next
                    // enqueue into it gives one.
                    let (max_size, grace_us, max_delay_us) = crate::Group::new(key).check()?;
                    q.exec_drop(
                        &sql.join_group,
                        params! {
                            "queue" => &r.queue, "kind" => &r.kind, "group_key" => key,
                            "max_size" => max_size, "grace_us" => grace_us,
                            "max_delay_us" => max_delay_us,
                            "now" => clock::micros(r.updated_at.max(r.created_at)),
                        },
                    )?;
                }
                written += inserted;
                highest = highest.max(r.id);
                continue;
            }
            JobState::Finished(status) => {
                if let Params::Named(map) = &mut values {
                    map.insert(b"result".to_vec(), r.result.as_deref().into());
                    map.insert(b"status".to_vec(), status.as_str().into());
                    map.insert(b"processed_by".to_vec(), r.worker.as_deref().into());
                    map.insert(
                        b"finished_at".to_vec(),
                        clock::micros(r.finished_at.unwrap_or(r.updated_at)).into(),
                    );
                }
                &sql.import_history
            }
            _ => &sql.import_live,
        };
        let inserted = q.exec_iter(statement, values)?.affected_rows();
        if inserted > 0 && matches!(r.state, JobState::Finished(_)) {
            super::counts::count_moved(sql, q, &[r.id])?;
        }
        written += inserted;
        highest = highest.max(r.id);
    }
    if highest > 0 {
        q.exec_drop(&sql.raise_next_id, params! { "id" => highest })?;
        q.exec_drop(&sql.drop_id_placeholder, params! { "id" => highest })?;
    }
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

/// Completed jobs per queue since `hour_since`, and since `minute_since`,
/// both bound as offsets from `now` onto the server's clock.
pub(crate) fn recent_completions(
    sql: &Sql,
    q: &mut impl Queryable,
    hour_since: i64,
    minute_since: i64,
    now: Now,
) -> Result<Vec<RecentCompletions>> {
    let rows: Vec<Row> = q.exec(
        &sql.inspect.count_recent_completions,
        params! {
            "hour_in" => now.offset(hour_since), "minute_in" => now.offset(minute_since),
            "now" => now.param(),
        },
    )?;
    rows.into_iter()
        .map(|mut r| {
            Ok(RecentCompletions {
                queue: take(&mut r, 0)?,
                hour: take::<i64>(&mut r, 1)?.max(0) as u64,
                minute: take::<i64>(&mut r, 2)?.max(0) as u64,
            })
        })
        .collect()
}

pub(crate) fn finished_per_minute(
    sql: &Sql,
    q: &mut impl Queryable,
    since: i64,
    now: Now,
) -> Result<Vec<FinishedInMinute>> {
    let rows: Vec<Row> = q.exec(
        &sql.inspect.count_finished_per_minute,
        params! { "since_in" => now.offset(since), "now" => now.param() },
    )?;
    rows.into_iter()
        .map(|mut r| {
            Ok(FinishedInMinute {
                queue: take(&mut r, 0)?,
                status: take(&mut r, 1)?,
                minutes_ago: take(&mut r, 2)?,
                count: take(&mut r, 3)?,
            })
        })
        .collect()
}

/// Changes priority, due time or queue of a job that is not running.
pub(crate) fn update(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &UpdateParams<'_>,
    now: Now,
) -> Result<Acted> {
    let found = look(sql, q, p.id)?;
    Action::Update.act(found, || {
        let updated = q.exec_drop(
            &sql.inspect.update_waiting,
            params! {
                "id" => p.id, "priority" => p.priority,
                "available_in" => p.available_at.map(|t| now.offset(t)),
                "queue" => p.queue, "now" => now.param(),
            },
        );
        match updated {
            Ok(()) => Ok(true),
            // ER_DUP_ENTRY (ER_DUP_ENTRY_WITH_KEY_NAME on some paths of
            // MySQL): the row is unleased and locked by `look`, the id is
            // unchanged, so only `jobs_unique` can refuse it. The statement
            // alone was rolled back.
            Err(mysql::Error::MySqlError(e)) if matches!(e.code, 1062 | 1586) => Ok(false),
            Err(e) => Err(e.into()),
        }
    })
}

/// Pauses (`true`) or resumes (`false`) a queue.
pub(crate) fn set_paused(
    sql: &Sql,
    q: &mut impl Queryable,
    queue: &str,
    paused: bool,
    now: Now,
) -> Result<()> {
    q.exec_drop(
        &sql.inspect.set_paused,
        params! { "name" => queue, "paused" => paused, "now" => now.param() },
    )?;
    Ok(())
}

/// The paused queues.
pub(crate) fn find_unique(
    sql: &Sql,
    q: &mut impl Queryable,
    queue: &str,
    key: &str,
    history: i64,
) -> Result<Vec<i64>> {
    let rows: Vec<Row> = q.exec(
        &sql.inspect.find_unique,
        params! { "queue" => queue, "unique_key" => key, "history" => history },
    )?;
    rows.into_iter().map(|mut r| take(&mut r, 0)).collect()
}

pub(crate) fn paused_queues(sql: &Sql, q: &mut impl Queryable) -> Result<Vec<String>> {
    let rows: Vec<Row> = q.exec(&sql.inspect.paused_queues, ())?;
    rows.into_iter().map(|mut r| take(&mut r, 0)).collect()
}

/// Deletes up to `limit` finished jobs of `status` that finished before
/// `cutoff`, with their dependency edges and workflow steps, and each
/// workflow whose last step they were (`PRUNE_HISTORY` and the statements
/// after it).
pub(crate) fn prune(
    sql: &Sql,
    q: &mut impl Queryable,
    status: FinalStatus,
    cutoff: i64,
    limit: usize,
    now: Now,
) -> Result<usize> {
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let ids: Vec<i64> = q.exec(
        &sql.prune_history,
        params! {
            "status" => status.as_str(), "cutoff_in" => now.offset(cutoff),
            "limit" => limit, "now" => now.param(),
        },
    )?;
    if ids.is_empty() {
        return Ok(0);
    }
    let [jobs, edges_out, edges_in, steps_of, steps, workflows] = &sql.prune;
    let json = serde_json::to_string(&ids)?;
    let mut flows: Vec<i64> = q.exec(steps_of, params! { "ids" => &json })?;
    for statement in [jobs, edges_out, edges_in, steps] {
        q.exec_drop(statement, params! { "ids" => &json })?;
    }
    sequences::forget(sql, q, &ids)?;
    if !flows.is_empty() {
        flows.sort_unstable();
        flows.dedup();
        q.exec_drop(
            workflows,
            params! { "ids" => serde_json::to_string(&flows)? },
        )?;
    }
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mysql::Db;
    use crate::backend::Store;
    use crate::options::QueueOptions;

    /// Tables under a prefix of the test's own on `BACKLOG_TEST_MYSQL_URL`,
    /// dropped at the end; `None` when no server is configured.
    struct Tables {
        db: Db,
    }

    impl Tables {
        fn connect() -> Result<Option<Tables>> {
            let Some(url) = crate::backend::mysql::connection::tests::test_url() else {
                return Ok(None);
            };
            let prefix = format!("ut{:012x}_", rand::random::<u64>() >> 16);
            let options = QueueOptions::new().table_prefix(prefix);
            Ok(Some(Tables {
                db: Db::connect(&url, &options)?,
            }))
        }
    }

    impl Drop for Tables {
        fn drop(&mut self) {
            let t = &self.db.sql.tables;
            let drop = format!(
                "DROP TABLE IF EXISTS {}, {}, {}, {}",
                t.jobs, t.history, t.queues, t.schema_history
            );
            if let Ok(mut conn) = self.db.conn() {
                let _ = conn.query_drop(drop);
            }
        }
    }

    #[test]
    fn pending_migrations_reads_refinerys_table_under_the_prefix() -> Result<()> {
        let Some(t) = Tables::connect()? else {
            return Ok(());
        };
        let all = [
            "V1__initial",
            "V2__due",
            "V3__progress",
            "V4__groups",
            "V5__limits",
            "V6__schedules",
            "V7__workers",
            "V8__dependencies",
            "V9__batches",
            "V10__finished_counts",
            "V11__sequences",
            "V12__open_batches_sequence_keys",
            "V13__finished_batches",
            "V14__running_bound",
        ];
        assert_eq!(t.db.pending_migrations()?, all, "no history table yet");
        t.db.migrate(std::time::Duration::ZERO)?;
        assert!(t.db.pending_migrations()?.is_empty());
        t.db.conn()?.query_drop(format!(
            "DELETE FROM {} WHERE version = 2",
            t.db.sql.tables.schema_history
        ))?;
        assert_eq!(t.db.pending_migrations()?, ["V2__due"]);
        Ok(())
    }

    /// A scrape must not read every payload or the whole history: each part
    /// of `depth` and the recent completions walk an index.
    #[test]
    fn depth_and_recent_completions_read_indexes_only() -> Result<()> {
        let Some(t) = Tables::connect()? else {
            return Ok(());
        };
        t.db.migrate(std::time::Duration::ZERO)?;
        let mut conn = t.db.conn()?;
        let plan = |conn: &mut mysql::PooledConn, sql: &str, params: Params| -> Result<_> {
            let rows: Vec<Row> = conn.exec(format!("EXPLAIN {sql}"), params)?;
            Ok(rows
                .into_iter()
                .filter_map(|r| {
                    let field = |name: &str| -> Option<String> {
                        let i = r
                            .columns_ref()
                            .iter()
                            .position(|c| c.name_str().eq_ignore_ascii_case(name))?;
                        r.get_opt::<Option<String>, _>(i)?.ok().flatten()
                    };
                    let select = field("select_type").unwrap_or_default();
                    (select != "UNION RESULT").then(|| {
                        (
                            field("table").unwrap_or_default(),
                            field("type").unwrap_or_default(),
                            field("key").unwrap_or_default(),
                        )
                    })
                })
                .collect::<Vec<_>>())
        };
        let depth = plan(&mut conn, &t.db.sql.depth, params! { "now" => None::<i64> })?;
        let keys: Vec<&str> = depth.iter().map(|(_, _, key)| key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "jobs_scheduled",
                "jobs_scheduled",
                "jobs_expiry",
                "group_members_group",
                "history_finished",
                "pending_queue"
            ],
            "{depth:?}"
        );
        let recent = plan(
            &mut conn,
            &t.db.sql.inspect.count_recent_completions,
            params! { "now" => None::<i64>, "hour_in" => -3_600_000_000_i64,
            "minute_in" => -60_000_000_i64 },
        )?;
        assert_eq!(recent.len(), 1, "{recent:?}");
        assert_eq!(recent[0].2, "history_finished", "{recent:?}");
        for (table, access, _) in depth.iter().chain(&recent) {
            assert_ne!(access, "ALL", "{table} scanned: {depth:?} {recent:?}");
        }
        Ok(())
    }
}
