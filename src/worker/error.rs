//! [`JobError`]: what a handler returns when its job did not succeed, and what
//! should happen next.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::error::Error;
use crate::outcome::Outcome;
use crate::retry::RetryPolicy;

/// A handler's failure, saying what should happen to the job.
///
/// Any error converts into a `JobError` with `?`, and means **retry** by the
/// retry policy: the attempt is recorded with the error's message, and the
/// job runs again after a backoff, or lands in the dead-letter history when
/// it was the last attempt. The constructors say otherwise:
///
/// | constructor | the job | attempt used |
/// |---|---|---|
/// | `?` on any error, [`JobError::retry`] | retried after the policy's backoff | yes |
/// | [`JobError::retry_after`] | retried after the given delay | yes |
/// | [`JobError::snooze`] | runs again after the delay | no |
/// | [`JobError::discard`] | history, `discarded` | — |
/// | [`JobError::cancel`] | history, `cancelled` | — |
///
/// ```
/// use std::time::Duration;
/// use backlog::{JobContext, JobError};
///
/// fn fetch(url: &str, ctx: &JobContext) -> Result<String, JobError> {
///     if url.is_empty() {
///         return Err(JobError::discard("no url: retrying cannot help"));
///     }
///     if ctx.attempt() == 1 && url.contains("slow") {
///         return Err(JobError::snooze(Duration::from_secs(60)));
///     }
///     let n: u32 = "42".parse()?; // any error: retry by the policy
///     Ok(format!("{url} #{n}"))
/// }
/// ```
///
/// Each of these converts with `?` (or `.into()`), meaning retry:
///
/// ```
/// # use backlog::JobError;
/// // Any std::error::Error + Send + Sync + 'static:
/// fn parse(s: &str) -> Result<u32, JobError> {
///     Ok(s.parse::<u32>()?)
/// }
/// assert!(parse("x").unwrap_err().message().contains("invalid digit"));
/// ```
///
/// ```
/// # use backlog::JobError;
/// # use std::error::Error;
/// // A boxed error, as many libraries return:
/// fn boxed() -> Result<(), Box<dyn Error + Send + Sync>> {
///     Err("the upstream said no".into())
/// }
/// fn handler() -> Result<(), JobError> {
///     boxed()?;
///     Ok(())
/// }
/// assert_eq!(handler().unwrap_err().message(), "the upstream said no");
/// ```
///
/// ```
/// # use backlog::JobError;
/// // anyhow::Error, through anyhow's conversion into a boxed error; the
/// // context chain becomes the message:
/// use anyhow::Context;
///
/// fn read_config() -> anyhow::Result<String> {
///     std::fs::read_to_string("/no/such/file").context("reading the config")
/// }
/// fn handler() -> Result<String, JobError> {
///     Ok(read_config()?)
/// }
/// let e = handler().unwrap_err();
/// assert!(e.message().starts_with("reading the config: "), "{e}");
/// ```
///
/// ```
/// # use backlog::JobError;
/// // A String or a &str:
/// fn check(n: i64) -> Result<(), String> {
///     if n < 0 { Err(format!("{n} is negative")) } else { Ok(()) }
/// }
/// fn handler(n: i64) -> Result<(), JobError> {
///     check(n)?;
///     if n == 0 {
///         return Err("zero".into());
///     }
///     Ok(())
/// }
/// assert_eq!(handler(-1).unwrap_err().message(), "-1 is negative");
/// assert_eq!(handler(0).unwrap_err().message(), "zero");
/// ```
///
/// A handler may also return its own error type instead of `JobError`:
/// register it with [`WorkerBuilder::handle_fn`](crate::WorkerBuilder::handle_fn).
///
/// `JobError` does not implement `std::error::Error`, on purpose: that is what
/// lets every error convert into it (as `anyhow::Error` does).
pub struct JobError {
    action: Action,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// What a [`JobError`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Retry after the retry policy's backoff (or the given delay); the
    /// attempt counts.
    Retry(Option<Duration>),
    /// Run again after the delay, without using an attempt.
    Snooze(Duration),
    /// Move the job to history as `discarded`.
    Discard,
    /// Move the job to history as `cancelled`.
    Cancel,
}

impl JobError {
    /// A failed attempt, retried after the retry policy's backoff. What `?`
    /// produces from any error.
    pub fn retry(message: impl Into<String>) -> Self {
        Self::new(Action::Retry(None), message)
    }

    /// A failed attempt, retried after `delay` instead of the policy's
    /// backoff. Still dead-lettered when it was the last attempt.
    pub fn retry_after(delay: Duration, message: impl Into<String>) -> Self {
        Self::new(Action::Retry(Some(delay)), message)
    }

    /// Not now: run the job again after `delay` without using an attempt
    /// (a rate limit, a resource not ready yet).
    pub fn snooze(delay: Duration) -> Self {
        Self::new(Action::Snooze(delay), format!("snoozed for {delay:?}"))
    }

    /// A permanent failure: the job moves to history as `discarded` at once,
    /// with `message` recorded as its last error.
    pub fn discard(message: impl Into<String>) -> Self {
        Self::new(Action::Discard, message)
    }

    /// The job should not run any more: it moves to history as `cancelled`.
    pub fn cancel(message: impl Into<String>) -> Self {
        Self::new(Action::Cancel, message)
    }

    fn new(action: Action, message: impl Into<String>) -> Self {
        JobError {
            action,
            message: message.into(),
            source: None,
        }
    }

    /// What this error asks for.
    pub fn action(&self) -> Action {
        self.action
    }

    /// The message recorded in the job's error list.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error this was converted from with `?`, if any.
    pub fn source(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// The backlog [`Error`] this was converted from, if it was one.
    pub fn backlog_error(&self) -> Option<&Error> {
        self.source
            .as_deref()
            .and_then(|e| e.downcast_ref::<Error>())
    }

    /// True when this came from [`Error::LeaseLost`]: the job belongs to
    /// another worker now and whatever this handler committed with
    /// `ctx.transaction(..)` was rolled back.
    pub fn is_lease_lost(&self) -> bool {
        self.backlog_error().is_some_and(Error::is_lease_lost)
    }

    /// The outcome this asks for. A plain retry follows `policy` when the
    /// worker has one for the kind, else the queue's.
    pub(crate) fn into_outcome(self, attempt: u32, policy: Option<&RetryPolicy>) -> Outcome {
        match self.action {
            Action::Retry(after) => Outcome::Fail {
                error: self.message,
                retry_after: after.or_else(|| policy.map(|p| p.backoff(attempt))),
            },
            Action::Snooze(delay) => Outcome::Snooze(delay),
            Action::Discard => Outcome::Discard(self.message),
            Action::Cancel => Outcome::Cancel(self.message),
        }
    }
}

/// Every error converts: what converts into a boxed error converts into a
/// `JobError` meaning *retry by the policy*. That covers any
/// `std::error::Error + Send + Sync + 'static`,
/// `Box<dyn Error + Send + Sync>`, `anyhow::Error` (through its own conversion
/// into a boxed error), `String` and `&str`.
///
/// (A blanket impl over `E: Error` could not also take a boxed error: the
/// standard library may one day make `Box<dyn Error>` an `Error` itself, and
/// the two impls would overlap.)
impl<E> From<E> for JobError
where
    E: Into<Box<dyn StdError + Send + Sync + 'static>>,
{
    fn from(error: E) -> Self {
        let error = error.into();
        JobError {
            action: Action::Retry(None),
            message: chain(error.as_ref()),
            source: Some(error),
        }
    }
}

/// The error's message followed by its sources', `: `-separated.
fn chain(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = e.source();
    }
    message
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("action", &self.action)
            .field("message", &self.message)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_mark_on_any_error_means_retry_by_policy() {
        fn parse() -> Result<u32, JobError> {
            Ok("x".parse::<u32>()?)
        }
        let e = parse().unwrap_err();
        assert_eq!(e.action(), Action::Retry(None));
        assert!(e.message().contains("invalid digit"));
        assert!(matches!(
            e.into_outcome(1, None),
            Outcome::Fail {
                retry_after: None,
                ..
            }
        ));
    }

    #[test]
    fn a_worker_policy_sets_the_retry_delay() {
        let policy = RetryPolicy {
            base: Duration::from_millis(10),
            jitter: 0.0,
            max: Duration::from_secs(1),
        };
        let outcome = JobError::retry("x").into_outcome(3, Some(&policy));
        assert_eq!(
            outcome,
            Outcome::Fail {
                error: "x".into(),
                retry_after: Some(Duration::from_millis(40))
            }
        );
        let explicit =
            JobError::retry_after(Duration::from_secs(5), "y").into_outcome(3, Some(&policy));
        assert!(
            matches!(explicit, Outcome::Fail { retry_after: Some(d), .. } if d == Duration::from_secs(5))
        );
    }

    #[test]
    fn lease_lost_is_recognised_through_the_conversion() {
        let e = JobError::from(Error::LeaseLost { job_id: 7 });
        assert!(e.is_lease_lost());
        assert!(!JobError::retry("x").is_lease_lost());
    }

    #[test]
    fn explicit_outcomes_map_one_to_one() {
        let d = Duration::from_secs(1);
        assert_eq!(
            JobError::snooze(d).into_outcome(1, None),
            Outcome::Snooze(d)
        );
        assert_eq!(
            JobError::discard("no").into_outcome(1, None),
            Outcome::Discard("no".into())
        );
        assert_eq!(
            JobError::cancel("stop").into_outcome(1, None),
            Outcome::Cancel("stop".into())
        );
    }
}
