//! Job dependencies on MySQL/MariaDB, in the order of `sqlite/flows.rs`; its
//! statements are in `queries/flows.rs`, workflows in `workflows.rs`.
//!
//! Differs from SQLite in the locks that keep several nodes apart, as on
//! PostgreSQL (see `postgres/flows.rs`): an enqueue reads its dependencies
//! `LOCK IN SHARE MODE`, pending table first, then live, then history; a
//! release counts down with an `UPDATE`, whose row lock orders two finishing
//! transactions. Under READ COMMITTED each plain read sees what was
//! committed before it. As there, an `enqueue_many` and a `complete_many`
//! do it per batch, each set statement on a `JSON_TABLE` of ids (one
//! parameter: the driver's named parameters cost quadratic time in their
//! number), joined `STRAIGHT_JOIN` on primary keys as the finishing
//! statements are (see `CLAIM`).
//! So does the cancel cascade of a job that did not complete, a level of
//! the graph at a time (`flows/cascade.rs`).
//!
//! And in how a release wakes other nodes: MySQL has no LISTEN/NOTIFY, and
//! its poller watches the newest job id, which a released job (keeping the
//! id it got at enqueue) does not move. So a transaction that releases jobs
//! also bumps the one-row counter `{releases}`, which the poller reads with
//! the id (`LATEST_JOB`).

use mysql::params;
use mysql::prelude::Queryable;

use super::db::Now;
use super::queries::Sql;
use super::sequences::Sequences;
use crate::backend::flows;
use crate::backend::params::EnqueueParams;
use crate::backend::waits::{self, Place};
use crate::error::Result;
use crate::job::Enqueued;
use crate::outcome::{AttemptError, FinalStatus};
use crate::sequence;

mod cascade;

/// [`waits::wait_all`] in the enqueue's transaction: the whole batch in a
/// constant number of statements, or (a batch with a sequenced job) each
/// job in order. `cancel` finishes a live job a dependency's end cancelled
/// (`id`, its error): `jobs.rs`' finish, whose own end recurses through
/// here.
pub(crate) fn wait_all<Q: Queryable>(
    sql: &Sql,
    q: &mut Q,
    jobs: &[EnqueueParams<'_>],
    ids: Vec<Enqueued>,
    now: Now,
    cancel: impl FnMut(&mut Q, i64, &AttemptError) -> Result<()>,
) -> Result<Vec<Enqueued>> {
    waits::wait_all(
        &mut Batch {
            sql,
            q,
            now,
            cancel,
        },
        jobs,
        ids,
    )
}

/// [`waits::Batch`] in the enqueue's transaction. Its jobs run at the
/// batch's `now`, the one the caller's finish is stamped with too.
struct Batch<'a, Q, F> {
    sql: &'a Sql,
    q: &'a mut Q,
    now: Now,
    cancel: F,
}

impl<Q, F> waits::Batch for Batch<'_, Q, F>
where
    Q: Queryable,
    F: FnMut(&mut Q, i64, &AttemptError) -> Result<()>,
{
    fn steps(&mut self, _now: i64) -> impl flows::Steps + '_ {
        Flow {
            sql: self.sql,
            q: self.q,
            now: self.now,
        }
    }

    fn states_in(&mut self, place: Place, ids: &[i64]) -> Result<Vec<(i64, String)>> {
        let f = &self.sql.flows;
        let statement = match place {
            Place::Pending => &f.pending_many_for_share,
            Place::Live => &f.live_many_for_share,
            Place::History => &f.history_many_status,
        };
        let ids = serde_json::to_string(ids)?;
        Ok(self.q.exec(statement, params! { "ids" => ids })?)
    }

    fn cancel(&mut self, id: i64, error: &AttemptError, _now: i64) -> Result<()> {
        (self.cancel)(self.q, id, error)
    }

    fn insert_edges(&mut self, edges: &[waits::EdgeRow]) -> Result<()> {
        let edges: Vec<[i64; 4]> = edges
            .iter()
            .map(|&(dependency, dependent, run_anyway, cancels)| {
                [dependency, dependent, run_anyway.into(), cancels.into()]
            })
            .collect();
        self.q.exec_drop(
            &self.sql.flows.insert_edges,
            params! { "edges" => serde_json::to_string(&edges)? },
        )?;
        Ok(())
    }

    fn live_to_pending(&mut self, pending: &[(i64, i32)]) -> Result<()> {
        let waits: Vec<[i64; 2]> = pending
            .iter()
            .map(|&(id, remaining)| [id, remaining.into()])
            .collect();
        let waits = serde_json::to_string(&waits)?;
        let f = &self.sql.flows;
        self.q
            .exec_drop(&f.live_to_pending_many, params! { "waits" => &waits })?;
        self.q
            .exec_drop(&f.own.delete_live_many, params! { "waits" => &waits })?;
        Ok(())
    }
}

/// As SQLite's `finished`, for jobs just moved to history; bumps
/// `{releases}` when a job was released. As on PostgreSQL, the completed
/// jobs release their dependents together (`COUNT_DOWN_MANY`,
/// `RELEASE_MANY`); the others cancel what waits on them level by level
/// ([`cascade::cascade`], in `flows/cascade.rs`).
pub(crate) fn finished(
    sql: &Sql,
    q: &mut impl Queryable,
    ended: Vec<(i64, FinalStatus)>,
    now: Now,
) -> Result<usize> {
    let f = &sql.flows;
    let (completed, ended): (Vec<_>, Vec<_>) = ended
        .into_iter()
        .partition(|&(_, status)| status == FinalStatus::Completed);
    let mut released = 0;
    if !completed.is_empty() {
        let mut completed: Vec<i64> = completed.into_iter().map(|(id, _)| id).collect();
        completed.sort_unstable();
        let completed = serde_json::to_string(&completed)?;
        let counted = q
            .exec_iter(&f.count_down_many, params! { "ids" => &completed })?
            .affected_rows();
        if counted > 0 {
            let mut free: Vec<i64> = q.exec(&f.own.freed, params! { "ids" => &completed })?;
            free.sort_unstable();
            if !free.is_empty() {
                let free_json = serde_json::to_string(&free)?;
                q.exec_drop(
                    &f.release_many,
                    params! { "ids" => &free_json, "now" => now.param() },
                )?;
                q.exec_drop(&f.own.delete_pending_many, params! { "ids" => &free_json })?;
                released += free.len();
            }
        }
    }
    released += cascade::cascade(sql, q, ended, now)?;
    if released > 0 {
        q.exec_drop(&f.own.bump_releases, ())?;
        super::connection::note_runnable();
    }
    Ok(released)
}

/// As SQLite's.
pub(crate) fn is_pending(sql: &Sql, q: &mut impl Queryable, id: i64) -> Result<bool> {
    Ok(
        q.exec_first::<i64, _, _>(&sql.flows.is_pending, params! { "id" => id })?
            .is_some(),
    )
}

/// As SQLite's.
pub(crate) fn end_by_operator(
    sql: &Sql,
    q: &mut impl Queryable,
    id: i64,
    status: FinalStatus,
    error: &AttemptError,
    now: Now,
) -> Result<bool> {
    flows::end_by_operator(&mut Flow { sql, q, now }, id, status, error)
}

/// As SQLite's.
pub(crate) fn deleting(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<bool> {
    flows::deleting(&mut Flow { sql, q, now }, id)
}

/// As SQLite's.
pub(crate) fn retried(sql: &Sql, q: &mut impl Queryable, id: i64, now: Now) -> Result<()> {
    flows::retried(&mut Flow { sql, q, now }, id)
}

/// [`flows::Steps`] in a transaction, at `now`.
struct Flow<'a, Q: Queryable> {
    sql: &'a Sql,
    q: &'a mut Q,
    now: Now,
}

impl<Q: Queryable> flows::Steps for Flow<'_, Q> {
    fn sequences(&mut self) -> impl sequence::Chain + '_ {
        Sequences(self.sql, self.q)
    }

    fn insert_edge(&mut self, edge: flows::Edge) -> Result<()> {
        let (dependency, dependent, run_anyway, cancelled) = edge;
        self.q.exec_drop(
            &self.sql.flows.insert_edge,
            params! {
                "dependency" => dependency, "dependent" => dependent,
                "run_anyway" => run_anyway, "cancelled" => cancelled,
            },
        )?;
        Ok(())
    }

    fn live_to_pending(&mut self, id: i64, remaining: i64) -> Result<()> {
        self.q.exec_drop(
            &self.sql.flows.live_to_pending,
            params! { "id" => id, "remaining" => remaining },
        )?;
        self.q
            .exec_drop(&self.sql.delete_live, params! { "id" => id })?;
        Ok(())
    }

    fn end_pending(&mut self, id: i64, status: FinalStatus, errors: &str) -> Result<bool> {
        let f = &self.sql.flows;
        let moved = self
            .q
            .exec_iter(
                &f.pending_to_history,
                params! {
                    "id" => id, "status" => status.as_str(), "errors" => errors,
                    "now" => self.now.param(),
                },
            )?
            .affected_rows();
        if moved == 0 {
            return Ok(false);
        }
        self.q
            .exec_drop(&f.delete_pending, params! { "id" => id })?;
        Ok(true)
    }

    fn delete_pending(&mut self, id: i64) -> Result<()> {
        self.q
            .exec_drop(&self.sql.flows.delete_pending, params! { "id" => id })?;
        Ok(())
    }

    fn finished(&mut self, id: i64, status: FinalStatus) -> Result<usize> {
        finished(self.sql, self.q, vec![(id, status)], self.now)
    }

    fn cancelled_dependents(&mut self, id: i64) -> Result<Vec<i64>> {
        Ok(self
            .q
            .exec(&self.sql.flows.cancelled_dependents, params! { "id" => id })?)
    }

    fn unmark_cancelled(&mut self, dependency: i64, dependent: i64) -> Result<()> {
        self.q.exec_drop(
            &self.sql.flows.unmark_cancelled,
            params! { "dependency" => dependency, "dependent" => dependent },
        )?;
        Ok(())
    }

    fn history_to_pending(&mut self, id: i64) -> Result<bool> {
        let f = &self.sql.flows;
        let moved = self
            .q
            .exec_iter(&f.history_to_pending, params! { "id" => id })?
            .affected_rows();
        if moved != 1 {
            return Ok(false);
        }
        self.q
            .exec_drop(&f.own.delete_history, params! { "id" => id })?;
        Ok(true)
    }
}
