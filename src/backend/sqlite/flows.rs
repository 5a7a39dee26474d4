//! Job dependencies on SQLite (`migrations/sqlite/V8`): a job enqueued with
//! dependencies that have not all finished waits in `backlog_pending`,
//! outside every lease index; the transaction that finishes its last
//! dependency moves it into `backlog_jobs`. Each function runs inside a
//! transaction its caller opened; the single writer makes every step
//! atomic. The same statements, in the same order, are in
//! `postgres/flows.rs` and `mysql/flows.rs`; what an enqueue and an
//! operator's action run of them is `crate::backend::flows`'s. `jobs.rs`
//! calls in here from its enqueue and its finish, and finishes what
//! [`wait`] says a dependency cancelled; workflows are `workflows.rs`'.
//!
//! Cost: an edge is one row written at enqueue, and one write at release
//! (the dependent's `remaining`, decremented); every lookup is a primary key
//! or index seek.

use rusqlite::{params, Connection, OptionalExtension};

use super::sequences::Sequences;
use crate::backend::flows;
use crate::backend::params::EnqueueParams;
use crate::error::Result;
use crate::job::Enqueued;
use crate::outcome::{AttemptError, FinalStatus};
use crate::sequence;

// ---- enqueue ---------------------------------------------------------------

// Where a dependency is: `sequences.rs`' `DEPENDENCY_STATE`, which a
// sequence's tail is looked up by too.

/// Records an edge: `?1` dependency, `?2` dependent, `?3` run anyway, `?4`
/// whether it cancelled its dependent.
pub const INSERT_EDGE: &str = "
INSERT INTO backlog_dependencies (dependency, dependent, run_anyway, cancelled)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT DO NOTHING";

/// Moves a job just inserted live (`?1`) to pending, waiting for `?2`
/// dependencies; `queries::DELETE_LIVE` then removes the live row.
pub const LIVE_TO_PENDING: &str = "
INSERT INTO backlog_pending
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT id, queue, kind, priority, payload, max_attempts, available_at, ?2, created_at
FROM backlog_jobs WHERE id = ?1";

// ---- release ---------------------------------------------------------------

/// What waits on a finished job (`?1`): the primary key's prefix.
pub const DEPENDENTS: &str =
    "SELECT dependent, run_anyway FROM backlog_dependencies WHERE dependency = ?1";

/// Counts one dependency of a pending job (`?1`) as finished; returns how
/// many are left, or no row when the job is not pending (cancelled already,
/// or deleted).
pub const COUNT_DOWN: &str = "
UPDATE backlog_pending SET remaining = remaining - 1 WHERE id = ?1 RETURNING remaining";

/// Moves a pending job (`?1`) whose dependencies all finished into the live
/// table, due at its own time or now (`?2`), whichever is later (`due` as
/// the enqueue sets it: a delayed job waits in the scheduled index); keeps
/// its id. [`DELETE_PENDING`] then removes the pending row.
pub const RELEASE: &str = "
INSERT INTO backlog_jobs
    (id, queue, kind, priority, payload, max_attempts, available_at, due, created_at, updated_at)
SELECT id, queue, kind, priority, payload, max_attempts, max(available_at, ?2),
       available_at <= ?2, created_at, ?2
FROM backlog_pending WHERE id = ?1";

/// Removes a pending row after [`RELEASE`] or [`PENDING_TO_HISTORY`].
pub const DELETE_PENDING: &str = "DELETE FROM backlog_pending WHERE id = ?1";

/// Finishes a pending job (`?1`) with status `?3` at `?2`, never attempted,
/// `?4` its errors (a JSON array of one entry).
pub const PENDING_TO_HISTORY: &str = "
INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, NULL, payload, 0, max_attempts, available_at, ?4, 0,
       created_at, ?2, NULL, ?3, NULL, NULL, ?2, NULL
FROM backlog_pending WHERE id = ?1";

/// Marks the edge `?1` → `?2` as the one that cancelled its dependent.
pub const MARK_CANCELLED: &str = "
UPDATE backlog_dependencies SET cancelled = 1 WHERE dependency = ?1 AND dependent = ?2";

// ---- retry -----------------------------------------------------------------

/// The dependents a job (`?1`) cancelled, now back to live by a retry.
pub const CANCELLED_DEPENDENTS: &str = "
SELECT dependent FROM backlog_dependencies WHERE dependency = ?1 AND cancelled = 1";

/// Clears the mark of [`MARK_CANCELLED`].
pub const UNMARK_CANCELLED: &str = "
UPDATE backlog_dependencies SET cancelled = 0 WHERE dependency = ?1 AND dependent = ?2";

/// Moves a cancelled job (`?1`) back from history to pending, counting the
/// dependencies that have not counted for it yet: those not finished, and
/// those that finished other than completed on a cancelling edge.
pub const HISTORY_TO_PENDING: &str = "
INSERT INTO backlog_pending
    (id, queue, kind, priority, payload, max_attempts, available_at, remaining, created_at)
SELECT h.id, h.queue, h.kind, h.priority, h.payload, h.max_attempts, h.available_at,
       (SELECT count(*) FROM backlog_dependencies AS e
        LEFT JOIN backlog_history AS d ON d.id = e.dependency
        WHERE e.dependent = h.id
          AND (d.id IS NULL OR (d.status <> 'completed' AND e.run_anyway = 0))),
       h.created_at
FROM backlog_history AS h WHERE h.id = ?1 AND h.status = 'cancelled'";

/// Removes a history row after [`HISTORY_TO_PENDING`].
pub const DELETE_HISTORY: &str = "DELETE FROM backlog_history WHERE id = ?1";

// ---- inspection ------------------------------------------------------------

/// A pending job as a record, in the column order of `LIVE_COLUMNS`.
pub const PENDING_COLUMNS: &str = "id, queue, kind, priority, NULL AS unique_key, payload, \
     0 AS attempts, max_attempts, available_at, '[]' AS errors, NULL AS locked_by, \
     NULL AS lease_until, NULL AS first_leased_at, 0 AS cancel_requested, NULL AS result, \
     NULL AS finished_at, created_at, created_at AS updated_at, 'pending' AS state, \
     NULL AS progress, NULL AS group_key, NULL AS aggregated_into";

/// Whether `?1` is pending.
pub const IS_PENDING: &str = "SELECT 1 FROM backlog_pending WHERE id = ?1";

/// Pending jobs per queue.
pub const COUNT_PENDING: &str =
    "SELECT queue, 'pending', count(*) FROM backlog_pending GROUP BY queue";

/// [`crate::backend::flows::wait`] on `conn`: the job `e` just enqueued
/// waits for its dependencies. The error to finish it with, as cancelled,
/// when a dependency's end cancels it.
pub(crate) fn wait(
    conn: &Connection,
    p: &EnqueueParams<'_>,
    e: Enqueued,
    earlier: &[Enqueued],
) -> Result<Option<AttemptError>> {
    flows::wait(&mut Flow { conn, now: p.now }, p, e, earlier)
}

/// Applies a job's end (`id` moved to history as `status`, or deleted:
/// `Cancelled`) to what waits on it, in its transaction: counts it down,
/// releasing a job whose last dependency it was, or cancels it (and what
/// waits on that, and so on) when the edge says so. Returns how many jobs
/// were released.
pub(crate) fn finished(conn: &Connection, id: i64, status: FinalStatus, now: i64) -> Result<usize> {
    let mut released = 0;
    let mut ended = vec![(id, status)];
    while let Some((id, status)) = ended.pop() {
        let dependents: Vec<(i64, bool)> = conn
            .prepare_cached(DEPENDENTS)?
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (dependent, run_anyway) in dependents {
            if status == FinalStatus::Completed || run_anyway {
                if status != FinalStatus::Completed
                    && sequence::handoff(&mut Sequences(conn), id, dependent)?
                {
                    continue;
                }
                let left: Option<i64> = conn
                    .prepare_cached(COUNT_DOWN)?
                    .query_row([dependent], |r| r.get(0))
                    .optional()?;
                if left == Some(0) {
                    conn.prepare_cached(RELEASE)?
                        .execute(params![dependent, now])?;
                    conn.prepare_cached(DELETE_PENDING)?.execute([dependent])?;
                    released += 1;
                }
            } else {
                let error = crate::flow::cancelled_error(id, status.as_str(), now);
                let errors = serde_json::to_string(&[error])?;
                if end_pending(conn, dependent, FinalStatus::Cancelled, &errors, now)? {
                    conn.prepare_cached(MARK_CANCELLED)?
                        .execute([id, dependent])?;
                    ended.push((dependent, FinalStatus::Cancelled));
                }
            }
        }
    }
    Ok(released)
}

/// Moves a pending job to history as `status` with `errors` (JSON text);
/// whether it was pending. What waits on it is the caller's to apply.
fn end_pending(
    conn: &Connection,
    id: i64,
    status: FinalStatus,
    errors: &str,
    now: i64,
) -> Result<bool> {
    let moved = conn.prepare_cached(PENDING_TO_HISTORY)?.execute(params![
        id,
        now,
        status.as_str(),
        errors
    ])?;
    if moved == 0 {
        return Ok(false);
    }
    conn.prepare_cached(DELETE_PENDING)?.execute([id])?;
    Ok(true)
}

/// Whether job `id` is pending.
pub(crate) fn is_pending(conn: &Connection, id: i64) -> Result<bool> {
    Ok(conn
        .prepare_cached(IS_PENDING)?
        .query_row([id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// [`crate::backend::flows::end_by_operator`] on `conn`.
pub(crate) fn end_by_operator(
    conn: &Connection,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
    now: i64,
) -> Result<bool> {
    flows::end_by_operator(&mut Flow { conn, now }, id, status, error)
}

/// [`crate::backend::flows::deleting`] on `conn`.
pub(crate) fn deleting(conn: &Connection, id: i64, now: i64) -> Result<bool> {
    flows::deleting(&mut Flow { conn, now }, id)
}

/// [`crate::backend::flows::retried`] on `conn`.
pub(crate) fn retried(conn: &Connection, id: i64, now: i64) -> Result<()> {
    flows::retried(&mut Flow { conn, now }, id)
}

/// [`flows::Steps`] on the caller's transaction, at `now`.
struct Flow<'c> {
    conn: &'c Connection,
    now: i64,
}

impl flows::Steps for Flow<'_> {
    fn sequences(&mut self) -> impl sequence::Chain + '_ {
        Sequences(self.conn)
    }

    fn insert_edge(&mut self, edge: flows::Edge) -> Result<()> {
        let (dependency, dependent, run_anyway, cancelled) = edge;
        self.conn
            .prepare_cached(INSERT_EDGE)?
            .execute(params![dependency, dependent, run_anyway, cancelled])?;
        Ok(())
    }

    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()> {
        self.conn
            .prepare_cached(LIVE_TO_PENDING)?
            .execute(params![id, remaining])?;
        self.conn
            .prepare_cached(super::queries::DELETE_LIVE)?
            .execute([id])?;
        Ok(())
    }

    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool> {
        end_pending(self.conn, id, status, errors, self.now)
    }

    fn delete_pending(&mut self, id: i64) -> Result<()> {
        self.conn.prepare_cached(DELETE_PENDING)?.execute([id])?;
        Ok(())
    }

    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize> {
        finished(self.conn, id, status, self.now)
    }

    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>> {
        Ok(self
            .conn
            .prepare_cached(CANCELLED_DEPENDENTS)?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.conn
            .prepare_cached(UNMARK_CANCELLED)?
            .execute([dependency, dependent])?;
        Ok(())
    }

    fn history_to_pending(&mut self, id: i64) -> Result<bool> {
        if self
            .conn
            .prepare_cached(HISTORY_TO_PENDING)?
            .execute([id])?
            != 1
        {
            return Ok(false);
        }
        self.conn.prepare_cached(DELETE_HISTORY)?.execute([id])?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::QueueOptions;

    /// Every statement a release, an enqueue or a retry runs seeks by a key
    /// or an index: none scans a table, so an edge costs the same however
    /// many jobs wait.
    #[test]
    fn every_statement_seeks_by_a_key_or_an_index() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let db = super::super::Connections::open(&dir.path().join("q.db"), &QueueOptions::new())?;
        super::super::migrate::migrate(&mut *db.writer()?, std::time::Duration::from_secs(5))?;
        let conn = db.writer()?;
        let plan = |sql: &str, n: usize| -> Result<String> {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let args = vec![1_i64; n];
            let rows =
                stmt.query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
        };
        use super::super::sequences::DEPENDENCY_STATE;
        use super::super::workflows::{DEPENDENCIES, JOB_BATCH, JOB_WORKFLOW, STEPS, WORKFLOW};
        for (sql, n) in [
            (DEPENDENCY_STATE, 1),
            (LIVE_TO_PENDING, 2),
            (DEPENDENTS, 1),
            (COUNT_DOWN, 1),
            (RELEASE, 2),
            (DELETE_PENDING, 1),
            (PENDING_TO_HISTORY, 4),
            (MARK_CANCELLED, 2),
            (CANCELLED_DEPENDENTS, 1),
            (UNMARK_CANCELLED, 2),
            (HISTORY_TO_PENDING, 1),
            (WORKFLOW, 2),
            (STEPS, 1),
            (DEPENDENCIES, 1),
            (JOB_WORKFLOW, 1),
            (JOB_BATCH, 1),
            (IS_PENDING, 1),
        ] {
            let plan = plan(sql, n)?;
            assert!(!plan.contains("SCAN"), "{sql}\n{plan}");
        }
        Ok(())
    }
}
