//! An operator's actions on one job, decided once for every database.
//!
//! Retry, run_now, cancel, discard and update each move a job from some
//! states only. The rule of which, and the error a refusal is, live here; a
//! backend reads where the job stands and applies the action in one
//! transaction, asking [`Action::applies_to`] whether to, and reports what
//! it found and did ([`Acted`]). [`Action::verdict`] turns that report into
//! the caller's answer.

use crate::backend::params::{Acted, Found};
use crate::error::{Error, Result};
use crate::inspect::CancelOutcome;
use crate::outcome::FinalStatus;
// What an operator's cancel records is an outcome (`unclaim` records it too);
// the backends name it from here, beside the actions.
pub(crate) use crate::outcome::{operator_error, CANCELLED};

/// An operator's action on one job, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// A finished job runs again (dead, discarded or cancelled only).
    Retry,
    /// A waiting job is due now.
    RunNow,
    /// A waiting job finishes as cancelled; a running one is asked to stop.
    Cancel,
    /// A waiting job finishes as discarded.
    Discard,
    /// A waiting job's priority, due time or queue changes.
    Update,
}

impl Action {
    /// Whether this action changes a job found so.
    pub(crate) fn applies_to(self, found: Found) -> bool {
        match (self, found) {
            (Action::Retry, Found::Finished(status)) => status != FinalStatus::Completed,
            (Action::Cancel, Found::Running) => true,
            (_, Found::Waiting) => self != Action::Retry,
            _ => false,
        }
    }

    /// Runs `apply` when this action applies to a job found so; `apply`
    /// says whether it changed the job (false: a unique key refused it).
    /// A backend calls this in the transaction that found the job.
    pub(crate) fn act(self, found: Found, apply: impl FnOnce() -> Result<bool>) -> Result<Acted> {
        let applied = self.applies_to(found) && apply()?;
        Ok(Acted { found, applied })
    }

    /// `Ok` when the action was applied; otherwise the error that says why
    /// not. `queue` is an update's target queue, for its message.
    pub(crate) fn verdict(self, id: i64, acted: Acted, queue: Option<&str>) -> Result<()> {
        if acted.applied {
            return Ok(());
        }
        let reason = match acted.found {
            Found::Nothing => return Err(Error::NotFound { job_id: id }),
            // Allowed, yet nothing changed: only a unique key can refuse it.
            found if self.applies_to(found) => match self {
                Action::Update => format!(
                    "a live job in queue {:?} already holds its unique key",
                    queue.unwrap_or_default()
                ),
                _ => "a live job already holds its unique key".into(),
            },
            Found::Running => match self {
                Action::Discard => "job is running; cancel asks its handler to stop".into(),
                Action::Update => "job is running; only a waiting job can be updated".into(),
                _ => "job is running".into(),
            },
            Found::Waiting => "job is waiting to run; run_now makes it due at once".into(),
            Found::Finished(FinalStatus::Completed) if self == Action::Retry => {
                "job completed; only dead, discarded or cancelled jobs can be retried".into()
            }
            Found::Finished(status) if self == Action::RunNow => format!(
                "job already finished ({}); retry brings a finished job back",
                status.as_str()
            ),
            Found::Finished(status) => format!("job already finished ({})", status.as_str()),
        };
        Err(Error::InvalidState { job_id: id, reason })
    }

    /// A cancel's answer: at once for a job that was waiting, by request for
    /// a running one.
    pub(crate) fn cancel_verdict(id: i64, acted: Acted) -> Result<CancelOutcome> {
        Action::Cancel.verdict(id, acted, None)?;
        Ok(match acted.found {
            Found::Running => CancelOutcome::Requested,
            _ => CancelOutcome::Cancelled,
        })
    }
}

/// A delete's answer: [`Error::NotFound`] when there was no job to delete.
pub(crate) fn delete_verdict(id: i64, deleted: bool) -> Result<()> {
    if deleted {
        Ok(())
    } else {
        Err(Error::NotFound { job_id: id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(action: Action, found: Found) -> String {
        let refused = Acted {
            found,
            applied: false,
        };
        match action.verdict(7, refused, Some("mail")) {
            Err(Error::InvalidState { reason, .. }) => reason,
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn each_action_applies_only_to_the_states_it_moves() {
        let dead = Found::Finished(FinalStatus::Dead);
        let completed = Found::Finished(FinalStatus::Completed);
        assert!(Action::Retry.applies_to(dead));
        assert!(!Action::Retry.applies_to(completed));
        assert!(!Action::Retry.applies_to(Found::Waiting));
        for action in [Action::RunNow, Action::Discard, Action::Update] {
            assert!(action.applies_to(Found::Waiting));
            assert!(!action.applies_to(Found::Running));
            assert!(!action.applies_to(dead));
        }
        assert!(Action::Cancel.applies_to(Found::Running));
        assert!(Action::Cancel.applies_to(Found::Waiting));
        assert!(!Action::Cancel.applies_to(Found::Nothing));
    }

    #[test]
    fn a_refusal_names_the_state_and_the_way_out() {
        assert_eq!(
            message(Action::RunNow, Found::Finished(FinalStatus::Dead)),
            "job already finished (dead); retry brings a finished job back"
        );
        assert_eq!(
            message(Action::Retry, Found::Waiting),
            "job is waiting to run; run_now makes it due at once"
        );
        assert_eq!(
            message(Action::Update, Found::Waiting),
            "a live job in queue \"mail\" already holds its unique key"
        );
        assert_eq!(
            message(Action::Retry, Found::Finished(FinalStatus::Cancelled)),
            "a live job already holds its unique key"
        );
        assert!(matches!(
            Action::Cancel.verdict(
                7,
                Acted {
                    found: Found::Nothing,
                    applied: false
                },
                None
            ),
            Err(Error::NotFound { job_id: 7 })
        ));
    }
}
