//! Sequences on PostgreSQL, in the order of `sqlite/sequences.rs`.
//!
//! Differs from SQLite in that several nodes enqueue at once: the swap's
//! `ON CONFLICT DO UPDATE` locks the sequence's row until the enqueue
//! commits, and a second enqueue of the key waits for it, then updates the
//! row as that one left it (READ COMMITTED re-reads the newest version). So
//! each enqueue gets the tail the one before it set, never the same as
//! another's. Two enqueues of a new key both insert: the second waits on
//! the primary key for the first to commit, then takes the update path.
//! Whether a job has finished is read with `flows.rs`' share locks, so it
//! cannot finish before the edge written on it commits.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::{Queries, Tables};
use crate::error::{Error, Result};

/// As SQLite's, `$1` queue, `$2` key, `$3` the new tail. Every `SET`
/// expression reads the row as it was, so `prev` takes the old tail.
pub const SWAP_TAIL: &str = "
INSERT INTO {sequences} AS s (queue, key, tail) VALUES ($1, $2, $3)
ON CONFLICT (queue, key) DO UPDATE SET prev = s.tail, tail = EXCLUDED.tail
RETURNING prev";

/// As SQLite's.
pub const RECORD_KEY: &str = "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES ($1, $2)";

/// As SQLite's, `$1` an array of ids.
pub const KEYS_OF: &str = "SELECT job_id, sequence_key FROM {sequence_jobs} WHERE job_id = ANY($1)";

/// As SQLite's, `$1` an array of ids.
pub const FORGET_KEYS: &str = "DELETE FROM {sequence_jobs} WHERE job_id = ANY($1)";

/// As SQLite's.
pub const RESTORE_TAIL: &str =
    "UPDATE {sequences} SET tail = $4 WHERE queue = $1 AND key = $2 AND tail = $3";

/// As SQLite's.
pub const LINK: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT (dependency, dependent) DO UPDATE SET in_sequence = TRUE";

/// As SQLite's.
pub const PREDECESSORS: &str =
    "SELECT dependency FROM {dependencies} WHERE dependent = $1 AND in_sequence";

/// As SQLite's.
pub const IS_NEXT: &str =
    "SELECT 1 FROM {dependencies} WHERE dependency = $1 AND dependent = $2 AND in_sequence";

/// As SQLite's.
pub const HAND_OVER: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT DO NOTHING";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub(crate) struct SequenceQueries {
    swap_tail: String,
    record_key: String,
    keys_of: String,
    forget_keys: String,
    restore_tail: String,
    link: String,
    predecessors: String,
    is_next: String,
    hand_over: String,
}

impl SequenceQueries {
    pub(crate) fn render(tables: &Tables) -> SequenceQueries {
        let r = |t: &str| tables.render(t);
        SequenceQueries {
            swap_tail: r(SWAP_TAIL),
            record_key: r(RECORD_KEY),
            keys_of: r(KEYS_OF),
            forget_keys: r(FORGET_KEYS),
            restore_tail: r(RESTORE_TAIL),
            link: r(LINK),
            predecessors: r(PREDECESSORS),
            is_next: r(IS_NEXT),
            hand_over: r(HAND_OVER),
        }
    }
}

/// As SQLite's `keys_of`.
pub(crate) fn keys_of<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    ids: &[i64],
) -> Result<Vec<(i64, String)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    tx.query(&q.sequences.keys_of, &[&ids])?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// As SQLite's `forget`.
pub(crate) fn forget<C: GenericClient>(tx: &mut Tx<'_, C>, q: &Queries, ids: &[i64]) -> Result<()> {
    if !ids.is_empty() {
        tx.execute(&q.sequences.forget_keys, &[&ids])?;
    }
    Ok(())
}

/// [`crate::sequence::Chain`] in the enqueue's or the end's transaction.
pub(crate) struct Sequences<'a, 't, C: GenericClient>(pub &'a mut Tx<'t, C>, pub &'a Queries);

impl<C: GenericClient> crate::sequence::Chain for Sequences<'_, '_, C> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        super::flows::state_of(self.0, &self.1.flows, id)
    }

    fn predecessors(&mut self, id: i64) -> Result<Vec<i64>> {
        let rows = self.0.query(&self.1.sequences.predecessors, &[&id])?;
        Ok(rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?)
    }

    fn swap_tail(&mut self, queue: &str, key: &str, id: i64) -> Result<Option<i64>> {
        let s = &self.1.sequences;
        let row = self
            .0
            .query_opt(&s.swap_tail, &[&queue, &key, &id])?
            .ok_or_else(|| Error::Database("the sequence's upsert returned no row".into()))?;
        self.0.execute(&s.record_key, &[&id, &key])?;
        Ok(row.try_get(0)?)
    }

    fn restore_tail(&mut self, queue: &str, key: &str, job: i64, tail: i64) -> Result<()> {
        let s = &self.1.sequences;
        self.0
            .execute(&s.restore_tail, &[&queue, &key, &job, &tail])?;
        Ok(())
    }

    fn link(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.0
            .execute(&self.1.sequences.link, &[&dependency, &dependent])?;
        Ok(())
    }

    fn is_next(&mut self, ended: i64, next: i64) -> Result<bool> {
        let is_next = self
            .0
            .query_opt(&self.1.sequences.is_next, &[&ended, &next])?;
        Ok(is_next.is_some())
    }

    fn hand_over(&mut self, before: i64, next: i64) -> Result<bool> {
        let s = &self.1.sequences;
        Ok(self.0.execute(&s.hand_over, &[&before, &next])? == 1)
    }
}
