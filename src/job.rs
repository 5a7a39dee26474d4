//! What goes into the queue: [`NewJob`], typed [`JobArgs`], what an enqueue
//! returns, and the plain data every layer names with a job: its dependency
//! edges and the statuses it can finish with ([`FinalStatus`]).

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// The queue a job goes to unless told otherwise.
pub const DEFAULT_QUEUE: &str = "default";

/// How many times a job is claimed before it is dead-lettered, unless told otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// Typed job arguments with a stable kind.
///
/// The kind is the name a handler is registered under and is stored with every
/// job, so it must not change between releases while jobs of the old name may
/// still be queued.
///
/// ```
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail {
///     to: String,
/// }
///
/// impl backlog::JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned {
    /// The job kind these arguments are stored under.
    const KIND: &'static str;
}

/// Which jobs a unique key is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UniqueScope {
    /// Only live jobs (available, scheduled or running) of the same queue.
    /// A job that finished no longer blocks the key. The default.
    #[default]
    Live,
    /// Live jobs, and jobs of the same queue that finished within this period.
    /// Periodic jobs use this so a tick that already ran is not enqueued again.
    LiveAndHistory(Duration),
}

/// When a job may first run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Schedule {
    Now,
    Delay(Duration),
    DelaySecs(f64),
    At(SystemTime),
}

/// A job to enqueue: kind, JSON payload and options.
///
/// ```
/// use std::time::Duration;
/// use backlog::NewJob;
/// use serde_json::json;
///
/// let job = NewJob::new("resize", json!({"w": 64}))
///     .queue("media")
///     .priority(5)
///     .delay(Duration::from_secs(30))
///     .unique_key("img-42")
///     .max_attempts(5);
/// ```
///
/// The builder never fails; everything is validated at enqueue, before any
/// database call.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub(crate) kind: String,
    pub(crate) payload: Payload,
    pub(crate) queue: String,
    pub(crate) priority: i32,
    pub(crate) schedule: Schedule,
    pub(crate) max_attempts: u32,
    pub(crate) unique_key: Option<String>,
    pub(crate) unique_scope: UniqueScope,
    pub(crate) group: Option<crate::group::Group>,
    /// The jobs it waits for (see [`NewJob::depends_on`]).
    pub(crate) depends_on: Vec<Edge>,
    /// Every dependency counts whatever its end.
    pub(crate) run_anyway: bool,
    pub(crate) batch: Option<i64>,
    /// The sequence it joins (see [`NewJob::sequence`]).
    pub(crate) sequence: Option<String>,
    pub(crate) unique_states: Option<Vec<FinalStatus>>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Payload {
    Value(Value),
    Text(String),
}

impl NewJob {
    /// A job of `kind` with a JSON payload.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self::with_payload(kind.into(), Payload::Value(payload))
    }

    /// A job of `kind` whose payload is raw JSON text. The text is parsed at
    /// enqueue; text that is not JSON is rejected with [`Error::InvalidPayload`].
    pub fn from_json_str(kind: impl Into<String>, json: impl Into<String>) -> Self {
        Self::with_payload(kind.into(), Payload::Text(json.into()))
    }

    /// A job from typed arguments, under `T::KIND`.
    pub fn from_args<T: JobArgs>(args: &T) -> Result<Self> {
        Ok(Self::new(T::KIND, serde_json::to_value(args)?))
    }

    fn with_payload(kind: String, payload: Payload) -> Self {
        NewJob {
            kind,
            payload,
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            schedule: Schedule::Now,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            unique_key: None,
            unique_scope: UniqueScope::Live,
            group: None,
            depends_on: Vec::new(),
            run_anyway: false,
            batch: None,
            sequence: None,
            unique_states: None,
        }
    }

    /// The queue. Defaults to `"default"`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The priority; higher runs first. Defaults to 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Runs no earlier than `delay` from now. Defaults to no delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.schedule = Schedule::Delay(delay);
        self
    }

    /// Runs no earlier than `secs` seconds from now, for delays read from
    /// configuration or user input. Negative, NaN or infinite values are
    /// rejected at enqueue with [`Error::InvalidSchedule`].
    pub fn delay_secs(mut self, secs: f64) -> Self {
        self.schedule = Schedule::DelaySecs(secs);
        self
    }

    /// Runs no earlier than `at`. A time in the past means now. Defaults to now.
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.schedule = Schedule::At(at);
        self
    }

    /// How many claims the job gets before it is dead-lettered; at least 1.
    /// Defaults to 25.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// A deduplication key, unique per queue among live jobs. Enqueueing a
    /// duplicate returns the existing job's id with `existed: true`.
    /// Defaults to none.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// Enqueues the job into `group`: it waits there, then runs together
    /// with the group's other jobs as one job whose handler gets all of
    /// their arguments (see [`crate::group`]). A grouped job can have
    /// neither a delay nor a unique key ([`Error::InvalidArgument`] at
    /// enqueue); its priority and max attempts are the combined job's when
    /// it is the group's oldest member.
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    pub fn group(mut self, group: crate::group::Group) -> Self {
        self.group = Some(group);
        self
    }

    /// Makes the job wait until every job of `ids` has finished: it is
    /// [`JobState::Pending`](crate::JobState::Pending), never leased, until
    /// the transaction that finishes the last of them makes it available
    /// (at its own run time, when that is later). A dependency that does
    /// not complete (discarded, cancelled, dead, or deleted) cancels it, and
    /// so what waits on it in turn; [`NewJob::run_anyway`] lets it run then
    /// too. A dependency already finished at enqueue counts at once. An id
    /// no job has is [`Error::UnknownDependency`] at enqueue, with nothing
    /// written. A job with dependencies can have neither a unique key nor a
    /// group ([`Error::InvalidArgument`]). Calls add up. Defaults to none.
    ///
    /// [`Error::UnknownDependency`]: crate::Error::UnknownDependency
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    pub fn depends_on(mut self, ids: impl IntoIterator<Item = i64>) -> Self {
        self.depends_on.extend(ids.into_iter().map(|id| Edge {
            on: DependsOn::Job(id),
            run_anyway: false,
        }));
        self
    }

    /// Lets the job run once its dependencies ended however they ended,
    /// instead of being cancelled when one did not complete. Applies to
    /// every dependency of [`NewJob::depends_on`] (given before or after).
    /// Defaults to cancelling.
    pub fn run_anyway(mut self) -> Self {
        self.run_anyway = true;
        self
    }

    /// Enqueues the job into the open batch `id` (see `backlog::batch`). A
    /// batch that is sealed or does not exist is refused with
    /// [`Error::InvalidArgument`] at enqueue, and nothing is written. A
    /// grouped job cannot join a batch. Defaults to none.
    pub fn batch(mut self, id: i64) -> Self {
        self.batch = Some(id);
        self
    }

    /// Joins the sequence `key` of the job's queue (see `backlog::sequence`):
    /// the job runs once the job enqueued into the sequence before it has
    /// finished, however that one ended, so the sequence's jobs run one at
    /// a time in the order they were enqueued, across every worker. Until
    /// then it is [`JobState::Pending`](crate::JobState::Pending). A key is
    /// checked like a queue name (1 to [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES)
    /// bytes, no control characters); a sequenced job can have neither a
    /// unique key, a group nor a batch ([`Error::InvalidArgument`] at
    /// enqueue, nothing written). Combined with [`NewJob::depends_on`], it
    /// waits for both. Defaults to none.
    ///
    /// ```
    /// use backlog::NewJob;
    /// use serde_json::json;
    ///
    /// // Each account's ledger entries are applied one at a time, in order.
    /// let job = NewJob::new("apply_entry", json!({"account": 7, "amount": 30}))
    ///     .sequence("account-7");
    /// ```
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    pub fn sequence(mut self, key: impl Into<String>) -> Self {
        self.sequence = Some(key.into());
        self
    }

    /// Unique for a period: with a [`NewJob::unique_key`], a new job is also
    /// refused (the existing id comes back with `existed: true`) while a job
    /// of the same queue with that key finished less than `period` ago,
    /// whatever its status (River's `ByPeriod`, Sidekiq's `unique_for`).
    /// Shorthand for `unique_scope(UniqueScope::LiveAndHistory(period))`.
    ///
    /// On PostgreSQL and MySQL two enqueues racing the finish of the job
    /// holding the key cannot both get in: the history is looked at again
    /// after the insert, and a job inserted while a finished one is inside
    /// the period is taken back. Run such enqueues at READ COMMITTED (the
    /// default on PostgreSQL; MySQL reads history with a locking read).
    ///
    /// ```
    /// use std::time::Duration;
    /// use backlog::NewJob;
    /// use serde_json::json;
    ///
    /// // At most one digest per user per hour, running or done.
    /// let job = NewJob::new("digest", json!({"user": 7}))
    ///     .unique_key("digest-7")
    ///     .unique_for(Duration::from_secs(3600));
    /// ```
    pub fn unique_for(self, period: Duration) -> Self {
        self.unique_scope(UniqueScope::LiveAndHistory(period))
    }

    /// With [`NewJob::unique_for`]: only finished jobs of these statuses
    /// block the key (River's `ByState`), so that, say, a dead or cancelled
    /// job does not hold it for the period. Live jobs always do. Defaults to
    /// every status.
    ///
    /// ```
    /// use std::time::Duration;
    /// use backlog::{FinalStatus, NewJob};
    /// use serde_json::json;
    ///
    /// // One successful digest per hour; a failed one may be enqueued again.
    /// let job = NewJob::new("digest", json!({"user": 7}))
    ///     .unique_key("digest-7")
    ///     .unique_for(Duration::from_secs(3600))
    ///     .unique_states([FinalStatus::Completed]);
    /// ```
    pub fn unique_states(mut self, states: impl IntoIterator<Item = FinalStatus>) -> Self {
        self.unique_states = Some(states.into_iter().collect());
        self
    }

    /// Which jobs the unique key is checked against. Defaults to
    /// [`UniqueScope::Live`].
    pub fn unique_scope(mut self, scope: UniqueScope) -> Self {
        self.unique_scope = scope;
        self
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

/// Anything that can be enqueued: a [`NewJob`], or typed [`JobArgs`] (which go
/// to the default queue with default options).
pub trait IntoNewJob {
    /// Converts into a job to enqueue.
    fn into_new_job(self) -> Result<NewJob>;
}

impl IntoNewJob for NewJob {
    fn into_new_job(self) -> Result<NewJob> {
        Ok(self)
    }
}

impl<T: JobArgs> IntoNewJob for T {
    fn into_new_job(self) -> Result<NewJob> {
        NewJob::from_args(&self)
    }
}

/// The terminal statuses of `backlog_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinalStatus {
    /// The handler succeeded.
    Completed,
    /// The handler (or an operator) discarded the job.
    Discarded,
    /// The job was cancelled.
    Cancelled,
    /// Attempts ran out: the dead-letter queue.
    Dead,
    /// A grouped job combined with its group into another job
    /// ([`JobRecord::aggregated_into`](crate::JobRecord::aggregated_into)).
    Aggregated,
}

impl FinalStatus {
    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            FinalStatus::Completed => "completed",
            FinalStatus::Discarded => "discarded",
            FinalStatus::Cancelled => "cancelled",
            FinalStatus::Dead => "dead",
            FinalStatus::Aggregated => "aggregated",
        }
    }

    /// Parses a stored status.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "completed" => FinalStatus::Completed,
            "discarded" => FinalStatus::Discarded,
            "cancelled" => FinalStatus::Cancelled,
            "dead" => FinalStatus::Dead,
            "aggregated" => FinalStatus::Aggregated,
            _ => return None,
        })
    }

    /// Every status, in display order.
    pub const ALL: [FinalStatus; 5] = [
        FinalStatus::Completed,
        FinalStatus::Discarded,
        FinalStatus::Cancelled,
        FinalStatus::Dead,
        FinalStatus::Aggregated,
    ];
}

/// One dependency of a job being enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edge {
    pub on: DependsOn,
    /// Any end of the dependency counts; otherwise one that did not
    /// complete cancels the dependent.
    pub run_anyway: bool,
}

/// The job depended on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DependsOn {
    /// A job already enqueued.
    Job(i64),
    /// The job at this index of the same batch, enqueued before this one
    /// (a workflow's step).
    Earlier(usize),
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id: the new job's, or the existing one's for a duplicate.
    pub id: i64,
    /// True when a job with the same unique key already existed and nothing
    /// was inserted.
    pub existed: bool,
}

/// Decodes a stored JSON payload into typed arguments.
pub(crate) fn decode_args<T: DeserializeOwned>(payload: &str) -> Result<T> {
    serde_json::from_str(payload).map_err(Error::Serialization)
}
