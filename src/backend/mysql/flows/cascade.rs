//! The cancel cascade of jobs that did not complete, on MySQL/MariaDB, a
//! level of the graph at a time (as `postgres/flows/cascade.rs`): in a
//! module of its own, `flows.rs` being long enough.

use std::collections::HashSet;

use mysql::params;
use mysql::prelude::Queryable;

use super::super::db::Now;
use super::super::queries::Sql;
use super::super::sequences::Sequences;
use crate::backend::cascade::{self, Cancel, Level};
use crate::error::Result;
use crate::outcome::FinalStatus;
use crate::sequence::Chain;

/// [`crate::backend::cascade::cascade`] in the ends' transaction: a
/// level's edges read in one statement (`DEPENDENTS_MANY`), its pending
/// dependents on cancelling edges cancelled in four (`LOCK_PENDING_MANY`,
/// `PENDING_TO_HISTORY_MANY`, `DELETE_PENDING_MANY`,
/// `MARK_CANCELLED_MANY`). Returns how many jobs were released.
pub(super) fn cascade(
    sql: &Sql,
    q: &mut impl Queryable,
    level: Vec<(i64, FinalStatus)>,
    now: Now,
) -> Result<usize> {
    cascade::cascade(&mut Ends { sql, q, now }, level, now.engine)
}

/// [`Level`] on a transaction.
struct Ends<'a, Q: Queryable> {
    sql: &'a Sql,
    q: &'a mut Q,
    now: Now,
}

impl<Q: Queryable> Level for Ends<'_, Q> {
    fn dependents(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64, bool)>> {
        Ok(self.q.exec(
            &self.sql.flows.dependents_many,
            params! { "ids" => serde_json::to_string(ids)? },
        )?)
    }

    fn cancel_pending(&mut self, cancels: &[Cancel]) -> Result<Vec<i64>> {
        let (f, q) = (&self.sql.flows, &mut *self.q);
        let pending: Vec<i64> = q.exec(
            &f.own.lock_pending_many,
            params! { "cancels" => serde_json::to_string(cancels)? },
        )?;
        if pending.is_empty() {
            return Ok(pending);
        }
        let still: HashSet<i64> = pending.iter().copied().collect();
        let moved: Vec<&Cancel> = cancels.iter().filter(|c| still.contains(&c.1)).collect();
        let moved = serde_json::to_string(&moved)?;
        q.exec_drop(
            &f.own.pending_to_history_many,
            params! { "cancels" => &moved, "now" => self.now.param() },
        )?;
        q.exec_drop(
            &f.own.delete_pending_many,
            params! { "ids" => serde_json::to_string(&pending)? },
        )?;
        q.exec_drop(&f.own.mark_cancelled_many, params! { "cancels" => &moved })?;
        Ok(pending)
    }

    fn count_down(&mut self, dependent: i64) -> Result<Option<i64>> {
        let f = &self.sql.flows;
        let counted = self
            .q
            .exec_iter(&f.count_down, params! { "id" => dependent })?
            .affected_rows();
        if counted == 0 {
            return Ok(None);
        }
        Ok(self
            .q
            .exec_first(&f.own.remaining, params! { "id" => dependent })?)
    }

    fn release(&mut self, dependent: i64) -> Result<()> {
        let f = &self.sql.flows;
        self.q.exec_drop(
            &f.release,
            params! { "id" => dependent, "now" => self.now.param() },
        )?;
        self.q
            .exec_drop(&f.delete_pending, params! { "id" => dependent })?;
        Ok(())
    }

    fn sequences(&mut self) -> impl Chain + '_ {
        Sequences(self.sql, self.q)
    }
}
