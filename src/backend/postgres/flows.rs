//! Job dependencies on PostgreSQL, in the order of `sqlite/flows.rs`; its
//! statements are in `queries/flows.rs`, workflows in `workflows.rs`.
//!
//! Differs from SQLite in that several nodes write at once, so each step
//! that reads a row before acting on it locks it first:
//!
//! - an enqueue looks its dependencies up `FOR SHARE`, pending table first,
//!   then live, then history (the order of a job's life). A transaction
//!   moving that job on holds its row locked until it commits, so the look
//!   waits and then finds it where it went; and once the look holds the
//!   share lock, the job cannot move on before the enqueue (and its edge)
//!   commits, so the finishing transaction sees the edge (READ COMMITTED:
//!   each statement reads what was committed before it began).
//! - a release decrements the dependent's `remaining` with an `UPDATE`, whose
//!   row lock makes two finishing transactions count one after the other:
//!   exactly one of them sees 0.
//!
//! And in that an `enqueue_many` and a `complete_many` do this per batch
//! (`backend/waits.rs` plans the enqueue): a constant number of statements
//! on arrays, not a round trip per edge; so does the cancel cascade of a job
//! that did not complete, a level of the graph per statement. Sequenced jobs
//! in an enqueue, and the run-anyway edges of a job that did not complete
//! (a sequence's hand-over among them), still go one at a time.
//!
//! A release notifies the queue's channel, as an enqueue does.

use postgres::GenericClient;

use super::connection::Tx;
use super::queries::Queries;
use super::sequences::Sequences;
use crate::backend::flows;
use crate::backend::params::EnqueueParams;
use crate::backend::waits::{self, Place};
use crate::error::{Error, Result};
use crate::job::Enqueued;
use crate::outcome::{AttemptError, FinalStatus};
use crate::sequence;

mod cascade;

/// [`waits::wait_all`] in the enqueue's transaction. `cancel` finishes a
/// live job a dependency's end cancelled (`id`, its error, `now`):
/// `jobs.rs`' finish, whose own end recurses through here.
pub(crate) fn wait_all<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    jobs: &[EnqueueParams<'_>],
    ids: Vec<Enqueued>,
    cancel: impl FnMut(&mut Tx<'_, C>, i64, &AttemptError, i64) -> Result<()>,
) -> Result<Vec<Enqueued>> {
    waits::wait_all(&mut Batch { tx, q, cancel }, jobs, ids)
}

/// [`waits::Batch`] in the enqueue's transaction.
struct Batch<'a, 't, C: GenericClient, F> {
    tx: &'a mut Tx<'t, C>,
    q: &'a Queries,
    cancel: F,
}

impl<'t, C, F> waits::Batch for Batch<'_, 't, C, F>
where
    C: GenericClient,
    F: FnMut(&mut Tx<'t, C>, i64, &AttemptError, i64) -> Result<()>,
{
    fn steps(&mut self, now: i64) -> impl flows::Steps + '_ {
        Flow {
            tx: self.tx,
            q: self.q,
            now,
        }
    }

    fn states_in(&mut self, place: Place, ids: &[i64]) -> Result<Vec<(i64, String)>> {
        let f = &self.q.flows;
        let statement = match place {
            Place::Pending => &f.pending_many_for_share,
            Place::Live => &f.live_many_for_share,
            Place::History => &f.history_many_status,
        };
        self.tx
            .query(statement, &[&ids])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    fn cancel(&mut self, id: i64, error: &AttemptError, now: i64) -> Result<()> {
        (self.cancel)(self.tx, id, error, now)
    }

    fn insert_edges(&mut self, edges: &[waits::EdgeRow]) -> Result<()> {
        let (mut dependencies, mut dependents, mut run_anyway, mut cancelled) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(dependency, dependent, anyway, cancels) in edges {
            dependencies.push(dependency);
            dependents.push(dependent);
            run_anyway.push(anyway);
            cancelled.push(cancels);
        }
        self.tx.execute(
            &self.q.flows.insert_edges,
            &[&dependencies, &dependents, &run_anyway, &cancelled],
        )?;
        Ok(())
    }

    fn live_to_pending(&mut self, pending: &[(i64, i32)]) -> Result<()> {
        let (waiting, remaining): (Vec<i64>, Vec<i32>) = pending.iter().copied().unzip();
        self.tx
            .execute(&self.q.flows.live_to_pending_many, &[&waiting, &remaining])?;
        Ok(())
    }
}

/// As SQLite's `finished`, for jobs just moved to history (`ended`: id and
/// status); notifies the queue's channel when a job was released. The
/// completed jobs release their dependents together (`COUNT_DOWN_MANY`,
/// `RELEASE_MANY`). The others cancel what waits on them level by level
/// ([`cascade::cascade`], in `flows/cascade.rs`).
pub(crate) fn finished<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    ended: Vec<(i64, FinalStatus)>,
    now: i64,
) -> Result<usize> {
    let f = &q.flows;
    let now_override = q.now_override(now);
    let (completed, ended): (Vec<_>, Vec<_>) = ended
        .into_iter()
        .partition(|&(_, status)| status == FinalStatus::Completed);
    let mut released = 0;
    if !completed.is_empty() {
        let completed: Vec<i64> = completed.into_iter().map(|(id, _)| id).collect();
        let mut free = Vec::new();
        for row in tx.query(&f.count_down_many, &[&completed])? {
            if row.try_get::<_, i32>(1)? == 0 {
                free.push(row.try_get::<_, i64>(0)?);
            }
        }
        if !free.is_empty() {
            released += tx.execute(&f.release_many, &[&now_override, &free])? as usize;
        }
    }
    released += cascade::cascade(tx, q, ended, now)?;
    if released > 0 {
        tx.query(&q.notify, &[&q.channel])?;
    }
    Ok(released)
}

/// As SQLite's.
pub(crate) fn is_pending<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
) -> Result<bool> {
    Ok(tx.query_opt(&q.flows.is_pending, &[&id])?.is_some())
}

/// As SQLite's.
pub(crate) fn end_by_operator<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
    now: i64,
) -> Result<bool> {
    flows::end_by_operator(&mut Flow { tx, q, now }, id, status, error)
}

/// As SQLite's.
pub(crate) fn deleting<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<bool> {
    flows::deleting(&mut Flow { tx, q, now }, id)
}

/// As SQLite's.
pub(crate) fn retried<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    id: i64,
    now: i64,
) -> Result<()> {
    flows::retried(&mut Flow { tx, q, now }, id)
}

/// [`flows::Steps`] in a transaction, at `now`.
struct Flow<'a, 't, C: GenericClient> {
    tx: &'a mut Tx<'t, C>,
    q: &'a Queries,
    now: i64,
}

impl<C: GenericClient> flows::Steps for Flow<'_, '_, C> {
    fn sequences(&mut self) -> impl sequence::Chain + '_ {
        Sequences(self.tx, self.q)
    }

    fn insert_edge(&mut self, edge: flows::Edge) -> Result<()> {
        let (dependency, dependent, run_anyway, cancelled) = edge;
        self.tx.execute(
            &self.q.flows.insert_edge,
            &[&dependency, &dependent, &run_anyway, &cancelled],
        )?;
        Ok(())
    }

    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()> {
        let remaining = i32::try_from(remaining)
            .map_err(|_| Error::InvalidArgument("too many dependencies".into()))?;
        self.tx
            .execute(&self.q.flows.live_to_pending, &[&id, &remaining])?;
        Ok(())
    }

    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool> {
        let moved = self.tx.execute(
            &self.q.flows.pending_to_history,
            &[
                &self.q.now_override(self.now),
                &id,
                &status.as_str(),
                &errors,
            ],
        )?;
        Ok(moved > 0)
    }

    fn delete_pending(&mut self, id: i64) -> Result<()> {
        self.tx.execute(&self.q.flows.delete_pending, &[&id])?;
        Ok(())
    }

    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize> {
        finished(self.tx, self.q, vec![(id, status)], self.now)
    }

    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>> {
        self.tx
            .query(&self.q.flows.cancelled_dependents, &[&id])?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }

    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.tx
            .execute(&self.q.flows.unmark_cancelled, &[&dependency, &dependent])?;
        Ok(())
    }

    fn history_to_pending(&mut self, id: i64) -> Result<bool> {
        Ok(self.tx.execute(&self.q.flows.history_to_pending, &[&id])? == 1)
    }
}
