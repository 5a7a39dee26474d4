//! One job's enqueue through a driver adapter (`backlog::sqlx`,
//! `backlog::diesel`), decided once: which statement runs next, and what
//! its answer means. The four adapters (sqlx and diesel, PostgreSQL and
//! MySQL) each only run the [`Step`]s on their connection, with their
//! dialect's text and binds, and feed the row back; the sync ones through
//! [`drive`], the async ones in the same small loop with `.await`.
//!
//! It is the control flow of the backends' own enqueue (a finished job
//! holding a period-scoped key, else the insert, else the live job holding
//! the key), written as a state machine instead of driver calls because
//! sqlx is async and diesel is not.

use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// A statement for the driver to run. Each answers one job id or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The finished job holding the unique key within its period
    /// (`find_history_unique`). `locking` after the insert: a read that
    /// sees every commit before it (on MySQL, `LOCK IN SHARE MODE`;
    /// PostgreSQL's statement snapshot already does).
    FindInHistory { locking: bool },
    /// The insert: the new job's id, or none when the unique index refused
    /// it.
    Insert,
    /// Takes back the row just inserted (`delete_live`); answers none.
    DeleteLive(i64),
    /// The live job holding the unique key (`find_live_unique`).
    FindLive,
}

/// What a key conflict whose live job is gone by the look-up means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Each variant is one server's: a build with one server's adapters uses one.
#[allow(dead_code)]
pub(crate) enum Conflict {
    /// PostgreSQL's `ON CONFLICT DO NOTHING` locks nothing: the job holding
    /// the key may finish in between, so the insert is tried again (three
    /// times, then [`Error::Busy`]).
    Retry,
    /// MySQL's refused insert holds a lock on the row it collided with, so
    /// the live job is there: its absence is an error.
    Locked,
}

/// Where one job's enqueue stands.
pub(crate) struct EnqueueFlow {
    history_scoped: bool,
    keyed: bool,
    conflict: Conflict,
    at: Step,
    inserted: Option<i64>,
    found: Option<i64>,
    inserts: u8,
}

/// The driver's next move.
pub(crate) enum Next {
    Run(Step),
    Done(Enqueued),
}

impl EnqueueFlow {
    /// The flow for `p`, and its first statement.
    pub(crate) fn start(p: &EnqueueParams<'_>, conflict: Conflict) -> (EnqueueFlow, Step) {
        let keyed = p.unique_key.is_some();
        Self::keyed(keyed, keyed && p.unique_history_since.is_some(), conflict)
    }

    /// [`EnqueueFlow::start`] for a job with a unique key (`keyed`), whose
    /// scope reaches into history (`history_scoped`).
    fn keyed(keyed: bool, history_scoped: bool, conflict: Conflict) -> (EnqueueFlow, Step) {
        let first = if history_scoped {
            Step::FindInHistory { locking: false }
        } else {
            Step::Insert
        };
        let flow = EnqueueFlow {
            history_scoped,
            keyed,
            conflict,
            at: first,
            inserted: None,
            found: None,
            inserts: 0,
        };
        (flow, first)
    }

    /// The answer of the statement just run: what comes next.
    pub(crate) fn answer(&mut self, row: Option<i64>) -> Result<Next> {
        let next = match (self.at, row) {
            (Step::FindInHistory { locking: false }, Some(id)) => {
                return Ok(Next::Done(Enqueued { id, existed: true }))
            }
            (Step::FindInHistory { locking: false }, None) => Step::Insert,
            (Step::Insert, Some(id)) if self.history_scoped => {
                // A period-scoped key is looked at again after the insert,
                // and the row taken back if a finished job now holds it.
                self.inserted = Some(id);
                Step::FindInHistory { locking: true }
            }
            (Step::Insert, Some(id)) => return Ok(Next::Done(Enqueued { id, existed: false })),
            (Step::Insert, None) if !self.keyed => {
                return Err(Error::Database(
                    "insert ignored without a unique key conflict".into(),
                ))
            }
            (Step::Insert, None) => Step::FindLive,
            (Step::FindInHistory { locking: true }, Some(found)) => {
                self.found = Some(found);
                Step::DeleteLive(self.inserted.unwrap_or_default())
            }
            (Step::FindInHistory { locking: true }, None) | (Step::DeleteLive(_), _) => {
                let (id, existed) = match self.found {
                    Some(found) => (found, true),
                    None => (self.inserted.unwrap_or_default(), false),
                };
                return Ok(Next::Done(Enqueued { id, existed }));
            }
            (Step::FindLive, Some(id)) => return Ok(Next::Done(Enqueued { id, existed: true })),
            (Step::FindLive, None) => match self.conflict {
                Conflict::Retry if self.inserts < 2 => {
                    self.inserts += 1;
                    Step::Insert
                }
                Conflict::Retry => return Err(Error::Busy),
                Conflict::Locked => {
                    return Err(Error::Database(
                        "unique key conflict with no live job".into(),
                    ))
                }
            },
        };
        self.at = next;
        Ok(Next::Run(next))
    }
}

/// Runs one job's enqueue with a blocking driver: `run` executes a step on
/// the connection and answers its row.
#[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
pub(crate) fn drive(
    p: &EnqueueParams<'_>,
    conflict: Conflict,
    mut run: impl FnMut(Step) -> Result<Option<i64>>,
) -> Result<Enqueued> {
    let (mut flow, mut step) = EnqueueFlow::start(p, conflict);
    loop {
        match flow.answer(run(step)?)? {
            Next::Run(next) => step = next,
            Next::Done(enqueued) => return Ok(enqueued),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's key: (keyed, history-scoped).
    fn params(key: Option<&'static str>, since: Option<i64>) -> (bool, bool) {
        (key.is_some(), key.is_some() && since.is_some())
    }

    /// The statements a flow runs against scripted answers.
    fn script(
        p: &(bool, bool),
        conflict: Conflict,
        answers: &[Option<i64>],
    ) -> (Vec<Step>, Result<Enqueued>) {
        let mut ran = Vec::new();
        let mut answers = answers.iter();
        let (mut flow, mut step) = EnqueueFlow::keyed(p.0, p.1, conflict);
        loop {
            ran.push(step);
            match flow.answer(*answers.next().expect("an answer per step")) {
                Ok(Next::Run(next)) => step = next,
                Ok(Next::Done(e)) => return (ran, Ok(e)),
                Err(e) => return (ran, Err(e)),
            }
        }
    }

    #[test]
    fn a_plain_job_is_one_insert() {
        let (ran, got) = script(&params(None, None), Conflict::Retry, &[Some(7)]);
        assert_eq!(ran, [Step::Insert]);
        assert_eq!(
            got.unwrap(),
            Enqueued {
                id: 7,
                existed: false
            }
        );
    }

    #[test]
    fn a_finished_holder_of_a_period_key_is_returned_before_any_insert() {
        let (ran, got) = script(&params(Some("k"), Some(1)), Conflict::Locked, &[Some(3)]);
        assert_eq!(ran, [Step::FindInHistory { locking: false }]);
        assert_eq!(
            got.unwrap(),
            Enqueued {
                id: 3,
                existed: true
            }
        );
    }

    #[test]
    fn a_holder_finishing_during_the_insert_takes_the_row_back() {
        let (ran, got) = script(
            &params(Some("k"), Some(1)),
            Conflict::Retry,
            &[None, Some(9), Some(4), None],
        );
        assert_eq!(
            ran,
            [
                Step::FindInHistory { locking: false },
                Step::Insert,
                Step::FindInHistory { locking: true },
                Step::DeleteLive(9),
            ]
        );
        assert_eq!(
            got.unwrap(),
            Enqueued {
                id: 4,
                existed: true
            }
        );
    }

    #[test]
    fn a_live_holder_is_returned_and_a_vanished_one_retried_or_refused() {
        let p = params(Some("k"), None);
        let (ran, got) = script(&p, Conflict::Retry, &[None, Some(5)]);
        assert_eq!(ran, [Step::Insert, Step::FindLive]);
        assert_eq!(
            got.unwrap(),
            Enqueued {
                id: 5,
                existed: true
            }
        );
        let (ran, got) = script(&p, Conflict::Retry, &[None; 6]);
        assert_eq!(ran.len(), 6);
        assert!(matches!(got, Err(Error::Busy)));
        let (ran, got) = script(&p, Conflict::Locked, &[None, None]);
        assert_eq!(ran, [Step::Insert, Step::FindLive]);
        assert!(matches!(got, Err(Error::Database(_))));
    }

    #[test]
    fn an_ignored_insert_without_a_key_is_an_error() {
        let (_, got) = script(&params(None, None), Conflict::Retry, &[None]);
        assert!(matches!(got, Err(Error::Database(_))));
    }
}
