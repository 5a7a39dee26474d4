//! How a claimed job ends its attempt, and the engine's decision of where that
//! takes it.
//!
//! The engine owns policy: it turns an [`Outcome`] into an explicit
//! [`Transition`] (to history with a status, or back to the live table at a
//! time) and hands that to the backend, which only applies it, fenced on the
//! lease.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::add_micros;
// How a job ended is the job's own (`NewJob::unique_states` names it); an
// outcome leads to one, so it is named here too.
use crate::error::Result;
pub use crate::job::FinalStatus;
use crate::lease::Job;
use crate::retry::RetryPolicy;

/// How a claimed job's attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Success: the job moves to history as `completed`, with an optional
    /// JSON result.
    Complete(Option<Value>),
    /// Failure: retried after the retry policy's backoff (or `retry_after`,
    /// when set), or dead-lettered when this was the last attempt.
    Fail {
        /// The error, recorded in the job's error list.
        error: String,
        /// Overrides the retry policy's backoff for this retry.
        retry_after: Option<Duration>,
    },
    /// Run again after this delay, without using an attempt.
    Snooze(Duration),
    /// Permanent failure: the job moves to history as `discarded` at once.
    Discard(String),
    /// The job moves to history as `cancelled`.
    Cancel(String),
    /// Give the job back, available at once, without using an attempt (used on
    /// shutdown).
    Release,
    /// Permanent failure that no retry can fix (a payload its handler cannot
    /// decode): the job moves to history as `dead` at once, whatever attempts
    /// it has left.
    Dead(String),
}

impl Outcome {
    /// A failure retried by the policy.
    pub fn fail(error: impl Into<String>) -> Self {
        Outcome::Fail {
            error: error.into(),
            retry_after: None,
        }
    }
}

/// One entry of a job's error list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt that failed, 1-based.
    pub attempt: u32,
    /// When it failed (stored as unix µs).
    #[serde(with = "crate::clock::serde_micros")]
    pub at: SystemTime,
    /// What went wrong.
    pub message: String,
}

/// An attempt's error as every database stores it in the settle: its JSON
/// text, `None` when the outcome recorded none.
pub(crate) fn error_json(error: Option<&AttemptError>) -> Result<Option<String>> {
    Ok(error.map(serde_json::to_string).transpose()?)
}

/// How many errors a job keeps; older ones are dropped.
pub const MAX_ERRORS_KEPT: usize = 20;

/// Where an outcome takes a leased job: the explicit target state the backend
/// applies.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Transition {
    /// Delete the live row and write its history row.
    Finish {
        status: FinalStatus,
        result: Option<String>,
        error: Option<AttemptError>,
    },
    /// Keep the job live, unleased, available at `available_at`.
    Reschedule {
        available_at: i64,
        error: Option<AttemptError>,
        /// Give the claim back: `attempts - 1` (snooze, release).
        refund_attempt: bool,
    },
}

/// The error a cancel of a waiting job records.
pub(crate) const CANCELLED: &str = "cancelled by request";

/// The error an operator's cancel or discard records for a waiting job: of
/// attempt 0 (no attempt ran it), at `now`.
pub(crate) fn operator_error(message: &str, now: i64) -> AttemptError {
    AttemptError {
        attempt: 0,
        at: crate::clock::at(now),
        message: message.to_owned(),
    }
}

/// Where a claim that never reached a handler takes its job (a lease whose
/// answer the worker lost): back to waiting, due at once in the place in
/// line it had, with the attempt given back as a release gives it back. A
/// cancel requested meanwhile finishes it as cancelled, like a cancel of a
/// waiting job (attempt 0: nothing ran it).
pub(crate) fn unclaim(available_at: i64, cancel_requested: bool, now: i64) -> Transition {
    if cancel_requested {
        return Transition::Finish {
            status: FinalStatus::Cancelled,
            result: None,
            error: Some(operator_error(CANCELLED, now)),
        };
    }
    Transition::Reschedule {
        available_at: available_at.min(now),
        error: None,
        refund_attempt: true,
    }
}

/// Decides where `outcome` takes `job` at `now`.
pub(crate) fn decide(
    job: &Job,
    outcome: Outcome,
    now: i64,
    policy: &RetryPolicy,
) -> Result<Transition> {
    let error = |message: String| AttemptError {
        attempt: job.attempt,
        at: crate::clock::at(now),
        message,
    };
    Ok(match outcome {
        Outcome::Complete(result) => Transition::Finish {
            status: FinalStatus::Completed,
            result: result.map(|v| serde_json::to_string(&v)).transpose()?,
            error: None,
        },
        Outcome::Fail {
            error: message,
            retry_after,
        } => {
            if job.is_last_attempt() {
                Transition::Finish {
                    status: FinalStatus::Dead,
                    result: None,
                    error: Some(error(message)),
                }
            } else {
                let wait = retry_after.unwrap_or_else(|| policy.backoff(job.attempt));
                Transition::Reschedule {
                    available_at: add_micros(now, wait).unwrap_or(i64::MAX),
                    error: Some(error(message)),
                    refund_attempt: false,
                }
            }
        }
        Outcome::Snooze(delay) => Transition::Reschedule {
            available_at: add_micros(now, delay).unwrap_or(i64::MAX),
            error: None,
            refund_attempt: true,
        },
        Outcome::Discard(message) => Transition::Finish {
            status: FinalStatus::Discarded,
            result: None,
            error: Some(error(message)),
        },
        Outcome::Cancel(message) => Transition::Finish {
            status: FinalStatus::Cancelled,
            result: None,
            error: Some(error(message)),
        },
        Outcome::Release => Transition::Reschedule {
            available_at: now,
            error: None,
            refund_attempt: true,
        },
        Outcome::Dead(message) => Transition::Finish {
            status: FinalStatus::Dead,
            result: None,
            error: Some(error(message)),
        },
    })
}
