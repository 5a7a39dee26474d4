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

use super::queries::{OwnFlows, Sql};
use crate::backend::statements::FlowStatements;
use crate::error::Result;

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

/// Where job `id` is, its row share-locked: `pending`, `live`, a history
/// status, or `None`: a sequence's tail, or a dependency (`flows.rs`).
pub(crate) fn state_of(
    f: &FlowStatements<OwnFlows>,
    q: &mut impl Queryable,
    id: i64,
) -> Result<Option<String>> {
    if q.exec_first::<i64, _, _>(&f.pending_for_share, params! { "id" => id })?
        .is_some()
    {
        return Ok(Some("pending".into()));
    }
    if q.exec_first::<i64, _, _>(&f.live_for_share, params! { "id" => id })?
        .is_some()
    {
        return Ok(Some("live".into()));
    }
    Ok(q.exec_first(&f.history_status, params! { "id" => id })?)
}

/// [`crate::sequence::Chain`] in the enqueue's or the end's transaction.
pub(crate) struct Sequences<'a, Q: Queryable>(pub &'a Sql, pub &'a mut Q);

impl<Q: Queryable> crate::sequence::Chain for Sequences<'_, Q> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        state_of(&self.0.flows, self.1, id)
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
        let prev: Option<Option<i64>> = q.exec_first(
            &self.0.own_sequences.prev,
            params! { "queue" => queue, "key" => key },
        )?;
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
