//! Sequences on MySQL/MariaDB, in the order of `sqlite/sequences.rs`.
//!
//! Differs from SQLite in that several nodes enqueue at once: the swap's
//! `ON DUPLICATE KEY UPDATE` takes the sequence row's exclusive lock (or,
//! for a new key, the primary key's) until the enqueue commits, so a second
//! enqueue of the key waits, then updates the row as the first left it. And
//! in that the swap takes two statements: an upsert returns no row here, so
//! the old tail is read back after it, from the row this transaction has
//! just written (a transaction reads its own writes at any isolation).
//! Whether a job has finished is read with `flows.rs`' share locks, as on
//! PostgreSQL.

use mysql::params;
use mysql::prelude::Queryable;

use super::queries::{Sql, Tables};
use crate::error::Result;

/// As SQLite's, without the `RETURNING`. The assignments of `ON DUPLICATE
/// KEY UPDATE` run left to right, each seeing the ones before it: `prev`
/// takes the old tail, then `tail` the new one.
pub const SWAP_TAIL: &str = "
INSERT INTO {sequences} (queue, `key`, tail) VALUES (:queue, :key, :tail)
ON DUPLICATE KEY UPDATE prev = tail, tail = VALUES(tail)";

/// As SQLite's.
pub const RECORD_KEY: &str =
    "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES (:id, :key)";

/// As SQLite's: the ids drive the join on the primary key (as the
/// `JSON_TABLE` joins of `templates.rs`).
pub const KEYS_OF: &str = "
SELECT k.job_id, k.sequence_key
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

/// As SQLite's, joined as [`KEYS_OF`].
pub const FORGET_KEYS: &str = "
DELETE k
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

/// The tail [`SWAP_TAIL`] replaced, NULL for a new sequence.
pub const PREV: &str = "SELECT prev FROM {sequences} WHERE queue = :queue AND `key` = :key";

/// As SQLite's.
pub const RESTORE_TAIL: &str = "
UPDATE {sequences} SET tail = :prev WHERE queue = :queue AND `key` = :key AND tail = :tail";

/// As SQLite's.
pub const LINK: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)
ON DUPLICATE KEY UPDATE in_sequence = TRUE";

/// As SQLite's.
pub const PREDECESSORS: &str =
    "SELECT dependency FROM {dependencies} WHERE dependent = :id AND in_sequence";

/// As SQLite's.
pub const IS_NEXT: &str = "
SELECT 1 FROM {dependencies} WHERE dependency = :ended AND dependent = :next AND in_sequence";

/// As SQLite's.
pub const HAND_OVER: &str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub struct SequenceSql {
    swap_tail: String,
    prev: String,
    record_key: String,
    keys_of: String,
    forget_keys: String,
    restore_tail: String,
    link: String,
    predecessors: String,
    is_next: String,
    hand_over: String,
}

impl SequenceSql {
    pub fn new(tables: &Tables) -> SequenceSql {
        let r = |t: &str| tables.render(t);
        SequenceSql {
            swap_tail: r(SWAP_TAIL),
            prev: r(PREV),
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
pub(crate) fn keys_of(
    sql: &Sql,
    q: &mut impl Queryable,
    ids: &[i64],
) -> Result<Vec<(i64, String)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(q.exec(
        &sql.sequences.keys_of,
        params! { "ids" => serde_json::to_string(ids)? },
    )?)
}

/// As SQLite's `forget`.
pub(crate) fn forget(sql: &Sql, q: &mut impl Queryable, ids: &[i64]) -> Result<()> {
    if !ids.is_empty() {
        q.exec_drop(
            &sql.sequences.forget_keys,
            params! { "ids" => serde_json::to_string(ids)? },
        )?;
    }
    Ok(())
}

/// [`crate::sequence::Chain`] in the enqueue's or the end's transaction.
pub(crate) struct Sequences<'a, Q: Queryable>(pub &'a Sql, pub &'a mut Q);

impl<Q: Queryable> crate::sequence::Chain for Sequences<'_, Q> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        super::flows::state_of(&self.0.flows, self.1, id)
    }

    fn predecessors(&mut self, id: i64) -> Result<Vec<i64>> {
        Ok(self
            .1
            .exec(&self.0.sequences.predecessors, params! { "id" => id })?)
    }

    fn swap_tail(&mut self, queue: &str, key: &str, id: i64) -> Result<Option<i64>> {
        let (s, q) = (&self.0.sequences, &mut *self.1);
        q.exec_drop(
            &s.swap_tail,
            params! { "queue" => queue, "key" => key, "tail" => id },
        )?;
        let prev: Option<Option<i64>> =
            q.exec_first(&s.prev, params! { "queue" => queue, "key" => key })?;
        q.exec_drop(&s.record_key, params! { "id" => id, "key" => key })?;
        Ok(prev.flatten())
    }

    fn restore_tail(&mut self, queue: &str, key: &str, job: i64, tail: i64) -> Result<()> {
        self.1.exec_drop(
            &self.0.sequences.restore_tail,
            params! { "queue" => queue, "key" => key, "tail" => job, "prev" => tail },
        )?;
        Ok(())
    }

    fn link(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.1.exec_drop(
            &self.0.sequences.link,
            params! { "dependency" => dependency, "dependent" => dependent },
        )?;
        Ok(())
    }

    fn is_next(&mut self, ended: i64, next: i64) -> Result<bool> {
        let is_next: Option<i64> = self.1.exec_first(
            &self.0.sequences.is_next,
            params! { "ended" => ended, "next" => next },
        )?;
        Ok(is_next.is_some())
    }

    fn hand_over(&mut self, before: i64, next: i64) -> Result<bool> {
        let inserted = self
            .1
            .exec_iter(
                &self.0.sequences.hand_over,
                params! { "dependency" => before, "dependent" => next },
            )?
            .affected_rows();
        Ok(inserted == 1)
    }
}
