//! Sequences on SQLite (`migrations/sqlite/V11`): an enqueue swaps its job
//! in as its sequence's tail and hands the old tail to `flows.rs`' `wait`,
//! which makes the job wait on it (`crate::sequence`), and `LINK` marks
//! that edge as the sequence's. When a job ends without running while the
//! job before it has not finished, `crate::sequence::handoff` makes the
//! next one wait on that one instead (`HAND_OVER`). Each runs inside its
//! caller's transaction; the single writer makes the swap atomic, so two
//! enqueues of one key, from any process, chain one after the other. The
//! same statements, in the same order, are in `postgres/sequences.rs` and
//! `mysql/sequences.rs`; what to run, and when, is `crate::sequence`'s,
//! through [`Sequences`].

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::Result;

/// Where a job is: `?1` id. `pending`, `live`, a history status, or no
/// row. Looked up in the order of a job's life (pending, live, history),
/// which on the servers keeps a job moving on meanwhile from being missed.
/// A sequence's tail is looked up by it, and a dependency (`flows.rs`).
pub const DEPENDENCY_STATE: &str = "
SELECT 'pending' FROM backlog_pending WHERE id = ?1
UNION ALL SELECT 'live' FROM backlog_jobs WHERE id = ?1
UNION ALL SELECT status FROM backlog_history WHERE id = ?1
LIMIT 1";

/// Makes `?3` the tail of sequence `?2` in queue `?1`, returning the tail
/// it replaced (`prev`), NULL for a new sequence. In `DO UPDATE` a bare
/// column is the row as it was, so `prev` takes the old tail.
pub const SWAP_TAIL: &str = "
INSERT INTO backlog_sequences (queue, key, tail) VALUES (?1, ?2, ?3)
ON CONFLICT (queue, key) DO UPDATE SET prev = tail, tail = excluded.tail
RETURNING prev";

/// Records that job `?1` is of sequence `?2` (its queue is the job's), for
/// its record.
pub const RECORD_KEY: &str =
    "INSERT INTO backlog_sequence_jobs (job_id, sequence_key) VALUES (?1, ?2)";

/// The sequence keys of the jobs whose ids are the JSON array `?1` (those
/// of a sequence only): one seek of the primary key each.
pub const KEYS_OF: &str = "
SELECT job_id, sequence_key FROM backlog_sequence_jobs
WHERE job_id IN (SELECT value FROM json_each(?1))";

/// Deletes the keys of the jobs whose ids are the JSON array `?1` (deleted
/// or pruned).
pub const FORGET_KEYS: &str =
    "DELETE FROM backlog_sequence_jobs WHERE job_id IN (SELECT value FROM json_each(?1))";

/// Puts back the tail `?4` of sequence `?2` in queue `?1` where the job
/// `?3` had replaced it: a job cancelled at enqueue leaves the sequence to
/// the job before it.
pub const RESTORE_TAIL: &str = "
UPDATE backlog_sequences SET tail = ?4 WHERE queue = ?1 AND key = ?2 AND tail = ?3";

/// Records the sequence's edge from `?1` to the next job `?2`, or marks a
/// dependency edge between them as the sequence's.
pub const LINK: &str = "
INSERT INTO backlog_dependencies (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (?1, ?2, 1, 0, 1)
ON CONFLICT (dependency, dependent) DO UPDATE SET in_sequence = 1";

/// The jobs before `?1` in its sequence that it waits (or waited) on: the
/// one enqueued before it, and those handed over to it since.
pub const PREDECESSORS: &str = "
SELECT dependency FROM backlog_dependencies WHERE dependent = ?1 AND in_sequence = 1";

/// Whether `?2` waits on `?1` as the next of its sequence.
pub const IS_NEXT: &str = "
SELECT 1 FROM backlog_dependencies WHERE dependency = ?1 AND dependent = ?2 AND in_sequence = 1";

/// The sequence's edge from `?1` to `?2` handed over; nothing when an edge
/// between them is there already.
pub const HAND_OVER: &str = "
INSERT INTO backlog_dependencies (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (?1, ?2, 1, 0, 1)
ON CONFLICT DO NOTHING";

/// The sequence keys of jobs `ids` that have one, by job id.
pub(crate) fn keys_of(conn: &Connection, ids: &[i64]) -> Result<Vec<(i64, String)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached(KEYS_OF)?;
    let rows = stmt.query_map([serde_json::to_string(ids)?], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Deletes the sequence keys of jobs `ids`, in the transaction that deletes
/// them.
pub(crate) fn forget(conn: &Connection, ids: &[i64]) -> Result<()> {
    if !ids.is_empty() {
        conn.prepare_cached(FORGET_KEYS)?
            .execute([serde_json::to_string(ids)?])?;
    }
    Ok(())
}

/// [`crate::sequence::Chain`] on the enqueue's or the end's connection.
pub(crate) struct Sequences<'c>(pub &'c Connection);

impl crate::sequence::Chain for Sequences<'_> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        Ok(self
            .0
            .prepare_cached(DEPENDENCY_STATE)?
            .query_row([id], |r| r.get(0))
            .optional()?)
    }

    fn predecessors(&mut self, id: i64) -> Result<Vec<i64>> {
        Ok(self
            .0
            .prepare_cached(PREDECESSORS)?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?)
    }

    fn swap_tail(&mut self, queue: &str, key: &str, id: i64) -> Result<Option<i64>> {
        let tail = self
            .0
            .prepare_cached(SWAP_TAIL)?
            .query_row(params![queue, key, id], |r| r.get(0))?;
        self.0
            .prepare_cached(RECORD_KEY)?
            .execute(params![id, key])?;
        Ok(tail)
    }

    fn restore_tail(&mut self, queue: &str, key: &str, job: i64, tail: i64) -> Result<()> {
        self.0
            .prepare_cached(RESTORE_TAIL)?
            .execute(params![queue, key, job, tail])?;
        Ok(())
    }

    fn link(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.0
            .prepare_cached(LINK)?
            .execute([dependency, dependent])?;
        Ok(())
    }

    fn is_next(&mut self, ended: i64, next: i64) -> Result<bool> {
        Ok(self
            .0
            .prepare_cached(IS_NEXT)?
            .query_row([ended, next], |_| Ok(()))
            .optional()?
            .is_some())
    }

    fn hand_over(&mut self, before: i64, next: i64) -> Result<bool> {
        Ok(self.0.prepare_cached(HAND_OVER)?.execute([before, next])? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::QueueOptions;

    /// The swap and the hand-over seek keys: they cost the same however
    /// many sequences and edges there are.
    #[test]
    fn the_swap_seeks_the_primary_key() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let db = super::super::Connections::open(&dir.path().join("q.db"), &QueueOptions::new())?;
        super::super::migrate::migrate(&mut *db.writer()?, std::time::Duration::from_secs(5))?;
        let conn = db.writer()?;
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN SELECT tail FROM backlog_sequences WHERE queue = ?1 AND key = ?2")?
            .query_map(["q", "k"], |r| r.get::<_, String>(3))?
            .collect::<rusqlite::Result<_>>()?;
        assert!(plan.join(";").contains("PRIMARY KEY"), "{plan:?}");
        for (sql, n) in [(PREDECESSORS, 1), (IS_NEXT, 2), (RESTORE_TAIL, 4)] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?
                .query_map(rusqlite::params_from_iter(vec![1_i64; n]), |r| {
                    r.get::<_, String>(3)
                })?
                .collect::<rusqlite::Result<_>>()?;
            assert!(!plan.join(";").contains("SCAN"), "{sql}\n{plan:?}");
        }
        Ok(())
    }
}
