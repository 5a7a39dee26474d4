//! Sequences on PostgreSQL, in the order of `sqlite/sequences.rs`.
//!
//! Differs from SQLite in that several nodes enqueue at once: the swap's
//! `ON CONFLICT DO UPDATE` locks the sequence's row until the enqueue
//! commits, and a second enqueue of the key waits for it, then updates the
//! row as that one left it (READ COMMITTED re-reads the newest version). So
//! each enqueue gets the tail the one before it set, never the same as
//! another's. Two enqueues of a new key both insert: the second waits on
//! the primary key for the first to commit, then takes the update path.
//! Whether a job has finished is read with share locks ([`state_of`], which
//! `flows.rs` reads a dependency by too), so it cannot finish before the
//! edge written on it commits.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::{OwnFlows, Queries};
use crate::backend::statements::FlowStatements;
use crate::error::{Error, Result};

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

/// Where job `id` is, its row share-locked: `pending`, `live`, a history
/// status, or `None`: a sequence's tail, or a dependency (`flows.rs`).
pub(crate) fn state_of<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    f: &FlowStatements<OwnFlows>,
    id: i64,
) -> Result<Option<String>> {
    if tx.query_opt(&f.pending_for_share, &[&id])?.is_some() {
        return Ok(Some("pending".into()));
    }
    if tx.query_opt(&f.live_for_share, &[&id])?.is_some() {
        return Ok(Some("live".into()));
    }
    Ok(match tx.query_opt(&f.history_status, &[&id])? {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// [`crate::sequence::Chain`] in the enqueue's or the end's transaction.
pub(crate) struct Sequences<'a, 't, C: GenericClient>(pub &'a mut Tx<'t, C>, pub &'a Queries);

impl<C: GenericClient> crate::sequence::Chain for Sequences<'_, '_, C> {
    fn state_of(&mut self, id: i64) -> Result<Option<String>> {
        state_of(self.0, &self.1.flows, id)
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
