//! The cancel cascade of jobs that did not complete, on PostgreSQL, a
//! level of the graph at a time: each level's edges read in one statement,
//! its pending dependents cancelled in one.

use postgres::GenericClient;

use super::super::connection::Tx;
use super::super::queries::Queries;
use super::super::sequences::Sequences;
use crate::backend::cascade::{self, Cancel, Level};
use crate::error::Result;
use crate::outcome::FinalStatus;
use crate::sequence::Chain;

/// [`crate::backend::cascade::cascade`] in the ends' transaction: a
/// level's edges read in one statement (`DEPENDENTS_MANY`), its pending
/// dependents on cancelling edges cancelled and their edges marked in one
/// (`CANCEL_PENDING_MANY`). Returns how many jobs were released.
pub(super) fn cascade<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    level: Vec<(i64, FinalStatus)>,
    now: i64,
) -> Result<usize> {
    let now_override = q.now_override(now);
    cascade::cascade(
        &mut Ends {
            tx,
            q,
            now_override,
        },
        level,
        now,
    )
}

/// [`Level`] on a transaction.
struct Ends<'a, 't, C: GenericClient> {
    tx: &'a mut Tx<'t, C>,
    q: &'a Queries,
    now_override: Option<i64>,
}

impl<C: GenericClient> Level for Ends<'_, '_, C> {
    fn dependents(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64, bool)>> {
        self.tx
            .query(&self.q.flows.dependents_many, &[&ids])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect()
    }

    fn cancel_pending(&mut self, cancels: &[Cancel]) -> Result<Vec<i64>> {
        let (mut dependencies, mut dependents, mut errors) = (Vec::new(), Vec::new(), Vec::new());
        for (dependency, dependent, error) in cancels {
            dependencies.push(*dependency);
            dependents.push(*dependent);
            errors.push(error.as_str());
        }
        self.tx
            .query(
                &self.q.flows.own.cancel_pending_many,
                &[&self.now_override, &dependencies, &dependents, &errors],
            )?
            .iter()
            .map(|r| Ok(r.try_get(0)?))
            .collect()
    }

    fn count_down(&mut self, dependent: i64) -> Result<Option<i64>> {
        Ok(
            match self.tx.query_opt(&self.q.flows.count_down, &[&dependent])? {
                Some(row) => Some(row.try_get::<_, i32>(0)?.into()),
                None => None,
            },
        )
    }

    fn release(&mut self, dependent: i64) -> Result<()> {
        self.tx
            .execute(&self.q.flows.release, &[&self.now_override, &dependent])?;
        Ok(())
    }

    fn sequences(&mut self) -> impl Chain + '_ {
        Sequences(self.tx, self.q)
    }
}
