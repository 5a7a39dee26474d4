//! Helpers for your own tests: what did my code enqueue, and what happens
//! when those jobs run.
//!
//! Like River's `rivertest` and `Oban.Testing`. Three tools:
//!
//! - **assertions on enqueued jobs**: [`assert_enqueued`] (a job of a kind,
//!   optionally with arguments, a queue or a priority, described by an
//!   [`Expected`]), [`assert_not_enqueued`], and [`enqueued`] to look at
//!   them; each with an `_in` form that reads through your open transaction
//!   (SQLite, PostgreSQL or MySQL, see [`ReadThrough`]), seeing what it
//!   wrote before it commits;
//! - **running jobs inline**: [`drain`] runs every available job with the
//!   handlers of a [`WorkerBuilder`] (the same registration your program
//!   starts its worker with) on the calling thread, until none is left, and
//!   returns what happened to each ([`Run`], [`RunOutcome`]);
//! - **moving time**: a queue opened with a [`ManualClock`]
//!   ([`QueueOptions::clock`](crate::QueueOptions::clock)) sees scheduled
//!   jobs and retries come due when the test says so.
//!
//! The assertions return a [`Result`] rather than panic, so a test that
//! returns `Result` uses `?` on them; the error ([`AssertError`]) says what
//! was expected and lists the jobs of that kind that were there instead.
//!
//! This module is always compiled: it adds no dependency and nothing runs
//! unless it is called, so a test needs no feature switched on in
//! `[dev-dependencies]`, and `drain` also serves a program that wants to run
//! a queue's jobs on its own thread (a command-line "run everything now").
//!
//! ```
//! use std::time::Duration;
//!
//! use backlog::testing::{self, Expected, RunOutcome};
//! use backlog::{JobArgs, JobError, ManualClock, NewJob, Queue, QueueOptions, Worker, WorkerBuilder};
//! use serde::{Deserialize, Serialize};
//! use serde_json::json;
//!
//! // ---- the application ----
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//! impl JobArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//! }
//!
//! /// What the code under test does: sign a user up, mail them.
//! fn sign_up(queue: &Queue, email: &str) -> backlog::Result<()> {
//!     queue.enqueue(NewJob::new(SendEmail::KIND, json!({ "to": email })).queue("mail"))?;
//!     Ok(())
//! }
//!
//! /// The worker's handlers, registered once for the program and its tests.
//! fn handlers(builder: WorkerBuilder) -> WorkerBuilder {
//!     builder.queues(["mail"]).handle(|args: SendEmail, _ctx| {
//!         if !args.to.contains('@') {
//!             return Err(JobError::discard("not an address"));
//!         }
//!         if args.to.ends_with("@down.example") {
//!             return Err(JobError::retry_after(Duration::from_secs(60), "mail server down"));
//!         }
//!         Ok(format!("sent to {}", args.to))
//!     })
//! }
//!
//! // ---- its test ----
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("test.db");
//! let clock = ManualClock::new();
//! let queue = QueueOptions::new().clock(clock.clone()).open(&path)?;
//!
//! sign_up(&queue, "ada@example.com")?;
//! sign_up(&queue, "bob@down.example")?;
//!
//! testing::assert_enqueued(&queue, Expected::of::<SendEmail>()
//!     .args(json!({ "to": "ada@example.com" }))
//!     .queue("mail"))?;
//! testing::assert_not_enqueued(&queue, "send_sms")?;
//!
//! let worker = handlers(Worker::builder(queue.clone()));
//! let runs = testing::drain(&worker)?;
//! assert_eq!(runs.len(), 2);
//! assert_eq!(runs[0].outcome, RunOutcome::Completed { result: Some(json!("sent to ada@example.com")) });
//! assert!(matches!(&runs[1].outcome, RunOutcome::Retried { error, .. } if error == "mail server down"));
//!
//! // The retry is due in a minute: nothing runs until the clock gets there.
//! assert!(testing::drain(&worker)?.is_empty());
//! clock.advance(Duration::from_secs(60));
//! let runs = testing::drain(&worker)?;
//! assert_eq!(runs[0].attempt, 2);
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::backend::params::ProgressWrite;
use crate::error::{Error, Result};
use crate::inspect::{JobFilter, JobRecord, JobState, Page};
use crate::job::JobArgs;
use crate::lease::{Job, LeaseRequest};
use crate::queue::Queue;
use crate::worker::{run_handler, JobContext, WorkerBuilder};

pub use crate::clock::ManualClock;

/// The states a job is in between its enqueue and its end: what
/// [`Expected`] looks at unless [`Expected::state`] says otherwise.
pub const LIVE_STATES: [JobState; 4] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Retrying,
    JobState::Running,
];

/// How many times [`drain`] runs one job before it gives up: a handler that
/// snoozes with no delay would otherwise run forever.
pub const MAX_RUNS_PER_JOB: u32 = 100;

/// How many jobs of the kind an [`AssertError`] lists.
const LISTED: usize = 10;

/// A description of the job a test expects: its kind, and optionally its
/// arguments, queue, priority and state.
///
/// A `&str` or `String` converts into one that matches any job of that kind.
pub struct Expected {
    kind: String,
    queue: Option<String>,
    priority: Option<i32>,
    states: Vec<JobState>,
    args: Option<ArgsMatch>,
}

enum ArgsMatch {
    Subset(Value),
    Predicate(Box<dyn Fn(&str) -> bool>),
}

impl Expected {
    /// A job of `kind`, live (see [`LIVE_STATES`]), in any queue, with any
    /// arguments and priority.
    pub fn kind(kind: impl Into<String>) -> Self {
        Expected {
            kind: kind.into(),
            queue: None,
            priority: None,
            states: LIVE_STATES.to_vec(),
            args: None,
        }
    }

    /// A job of the kind of `T` ([`JobArgs::KIND`]).
    pub fn of<T: JobArgs>() -> Self {
        Self::kind(T::KIND)
    }

    /// Only a job whose arguments contain `subset`: every key of an object
    /// present with a matching value (compared the same way, so nested
    /// objects may leave keys out too), arrays of the same length matching
    /// element by element, and any other value equal.
    pub fn args(mut self, subset: Value) -> Self {
        self.args = Some(ArgsMatch::Subset(subset));
        self
    }

    /// Only a job whose arguments decode into `T` and satisfy `predicate`
    /// (`T` may be the job's argument type, or [`serde_json::Value`]).
    pub fn args_where<T, F>(mut self, predicate: F) -> Self
    where
        T: DeserializeOwned,
        F: Fn(&T) -> bool + 'static,
    {
        self.args = Some(ArgsMatch::Predicate(Box::new(move |payload| {
            serde_json::from_str::<T>(payload).is_ok_and(|args| predicate(&args))
        })));
        self
    }

    /// Only a job in this queue. Defaults to any queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only a job with this priority. Defaults to any priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Only a job in this state; a finished state ([`JobState::COMPLETED`],
    /// ...) looks in history. Defaults to any live state ([`LIVE_STATES`]).
    pub fn state(mut self, state: JobState) -> Self {
        self.states = vec![state];
        self
    }

    fn matches(&self, record: &JobRecord) -> bool {
        self.priority.is_none_or(|p| p == record.priority)
            && match &self.args {
                None => true,
                Some(ArgsMatch::Subset(subset)) => serde_json::from_str::<Value>(&record.payload)
                    .is_ok_and(|args| contains(&args, subset)),
                Some(ArgsMatch::Predicate(predicate)) => predicate(&record.payload),
            }
    }

    /// Every job of the kind, queue and states, matching or not, by id.
    fn candidates(
        &self,
        mut list: impl FnMut(&JobFilter) -> Result<Page>,
    ) -> Result<Vec<JobRecord>> {
        let mut all = Vec::new();
        for state in &self.states {
            let mut filter = JobFilter::new(*state).kind(self.kind.clone()).limit(500);
            if let Some(queue) = &self.queue {
                filter = filter.queue(queue.clone());
            }
            loop {
                let page = list(&filter)?;
                all.extend(page.jobs);
                match page.next_after {
                    Some(after) => filter = filter.after(after),
                    None => break,
                }
            }
        }
        all.sort_by_key(|r| r.id);
        Ok(all)
    }
}

impl From<&str> for Expected {
    fn from(kind: &str) -> Self {
        Expected::kind(kind)
    }
}

impl From<String> for Expected {
    fn from(kind: String) -> Self {
        Expected::kind(kind)
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a job of kind {:?}", self.kind)?;
        if let Some(queue) = &self.queue {
            write!(f, " in queue {queue:?}")?;
        }
        if let Some(priority) = self.priority {
            write!(f, " with priority {priority}")?;
        }
        match &self.args {
            Some(ArgsMatch::Subset(subset)) => write!(f, " with args containing {subset}")?,
            Some(ArgsMatch::Predicate(_)) => write!(f, " with args matching the predicate")?,
            None => {}
        }
        let states: Vec<&str> = self.states.iter().map(|s| s.as_str()).collect();
        write!(f, " ({})", states.join(", "))
    }
}

impl fmt::Debug for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expected({self})")
    }
}

/// Whether `actual` contains `subset` (see [`Expected::args`]).
fn contains(actual: &Value, subset: &Value) -> bool {
    match (actual, subset) {
        (Value::Object(actual), Value::Object(subset)) => subset
            .iter()
            .all(|(k, v)| actual.get(k).is_some_and(|a| contains(a, v))),
        (Value::Array(actual), Value::Array(subset)) => {
            actual.len() == subset.len() && actual.iter().zip(subset).all(|(a, s)| contains(a, s))
        }
        (actual, subset) => actual == subset,
    }
}

/// Why an assertion of this module failed. Its message says what was
/// expected and lists the jobs of that kind that were found instead.
#[derive(Debug)]
#[non_exhaustive]
pub enum AssertError {
    /// No job matched.
    NotEnqueued {
        /// What was expected, as text.
        expected: String,
        /// The jobs of the kind (in the expected queue and states) that did
        /// not match, by id.
        found: Vec<JobRecord>,
    },
    /// Jobs matched that were expected not to be there.
    Enqueued {
        /// What was not expected, as text.
        expected: String,
        /// The jobs that matched, by id.
        found: Vec<JobRecord>,
    },
    /// Reading the jobs failed.
    Database(Error),
}

impl From<Error> for AssertError {
    fn from(error: Error) -> Self {
        AssertError::Database(error)
    }
}

impl fmt::Display for AssertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (headline, found, none) = match self {
            AssertError::Database(error) => {
                return write!(f, "could not read the enqueued jobs: {error}")
            }
            AssertError::NotEnqueued { expected, found } => (
                format!("expected {expected} to be enqueued"),
                found,
                "no job of that kind was there",
            ),
            AssertError::Enqueued { expected, found } => (
                format!("expected no {}", expected.trim_start_matches("a ")),
                found,
                "",
            ),
        };
        write!(f, "{headline}")?;
        if found.is_empty() {
            return write!(f, "; {none}");
        }
        let what = match self {
            AssertError::Enqueued { .. } => "found",
            _ => "found of that kind, not matching",
        };
        write!(f, "; {} {what}:", found.len())?;
        for r in found.iter().take(LISTED) {
            write!(
                f,
                "\n  #{} {} queue={:?} priority={} args={}",
                r.id,
                r.state.as_str(),
                r.queue,
                r.priority,
                r.payload
            )?;
        }
        if found.len() > LISTED {
            write!(f, "\n  ... and {} more", found.len() - LISTED)?;
        }
        Ok(())
    }
}

impl std::error::Error for AssertError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AssertError::Database(error) => Some(error),
            _ => None,
        }
    }
}

/// The jobs matching `expected`, by id (none is not an error).
pub fn enqueued(queue: &Queue, expected: impl Into<Expected>) -> Result<Vec<JobRecord>> {
    let expected = expected.into();
    Ok(split(&expected, expected.candidates(|f| queue.list(f))?).0)
}

/// [`enqueued`], read through `conn`: the application's connection to the
/// queue's database, usually inside a transaction that is still open, whose
/// own uncommitted enqueues (`enqueue_in` of `backlog::sqlite`,
/// `backlog::postgres` or `backlog::mysql`) it sees. See [`ReadThrough`]
/// for what `conn` may be.
pub fn enqueued_in(
    queue: &Queue,
    mut conn: impl ReadThrough,
    expected: impl Into<Expected>,
) -> Result<Vec<JobRecord>> {
    let expected = expected.into();
    Ok(split(&expected, candidates_in(queue, &mut conn, &expected)?).0)
}

/// Succeeds with the first job (lowest id) matching `expected`; otherwise
/// [`AssertError::NotEnqueued`], listing the jobs of that kind found.
pub fn assert_enqueued(
    queue: &Queue,
    expected: impl Into<Expected>,
) -> std::result::Result<JobRecord, AssertError> {
    let expected = expected.into();
    first_match(&expected, expected.candidates(|f| queue.list(f))?)
}

/// [`assert_enqueued`] inside an open transaction: read through `conn` (see
/// [`enqueued_in`]).
pub fn assert_enqueued_in(
    queue: &Queue,
    mut conn: impl ReadThrough,
    expected: impl Into<Expected>,
) -> std::result::Result<JobRecord, AssertError> {
    let expected = expected.into();
    first_match(&expected, candidates_in(queue, &mut conn, &expected)?)
}

/// Succeeds when no job matches `expected` (pass a kind to say "nothing of
/// this kind"); otherwise [`AssertError::Enqueued`], listing the jobs that
/// matched.
pub fn assert_not_enqueued(
    queue: &Queue,
    expected: impl Into<Expected>,
) -> std::result::Result<(), AssertError> {
    let expected = expected.into();
    no_match(&expected, expected.candidates(|f| queue.list(f))?)
}

/// [`assert_not_enqueued`] inside an open transaction: read through `conn`
/// (see [`enqueued_in`]).
pub fn assert_not_enqueued_in(
    queue: &Queue,
    mut conn: impl ReadThrough,
    expected: impl Into<Expected>,
) -> std::result::Result<(), AssertError> {
    let expected = expected.into();
    no_match(&expected, candidates_in(queue, &mut conn, &expected)?)
}

fn candidates_in(
    queue: &Queue,
    conn: &mut impl ReadThrough,
    expected: &Expected,
) -> Result<Vec<JobRecord>> {
    let now = queue.now_micros();
    expected.candidates(|f| conn.list_through(queue, f, now))
}

mod sealed {
    pub trait Sealed {}
}

/// What the `_in` helpers ([`enqueued_in`], [`assert_enqueued_in`],
/// [`assert_not_enqueued_in`]) read through: the application's own
/// connection or transaction, on the queue's database.
///
/// - SQLite: `&rusqlite::Connection`, `&rusqlite::Transaction` or
///   `&rusqlite::Savepoint`, open on the queue's file (another file is
///   [`Error::InvalidArgument`]);
/// - PostgreSQL: `&mut backlog::postgres::Transaction`;
/// - MySQL: `&mut backlog::mysql::Transaction`.
///
/// A queue on another database than the connection's is
/// [`Error::InvalidArgument`]. The matching is the same as the plain forms';
/// only the read differs. Implemented by backlog only.
pub trait ReadThrough: sealed::Sealed {
    #[doc(hidden)]
    fn list_through(&mut self, queue: &Queue, filter: &JobFilter, now: i64) -> Result<Page>;
}

fn sqlite_list(
    queue: &Queue,
    conn: &crate::sqlite::Connection,
    f: &JobFilter,
    now: i64,
) -> Result<Page> {
    crate::sqlite::check_same_database(queue, conn)?;
    crate::backend::sqlite::inspect::list(conn, f, now)
}

/// SQLite: a connection, or what derefs to one.
macro_rules! read_through_sqlite {
    ($($conn:ty),*) => {$(
        impl sealed::Sealed for $conn {}
        impl ReadThrough for $conn {
            fn list_through(&mut self, queue: &Queue, filter: &JobFilter, now: i64) -> Result<Page> {
                sqlite_list(queue, self, filter, now)
            }
        }
    )*};
}

read_through_sqlite!(
    &crate::sqlite::Connection,
    &rusqlite::Transaction<'_>,
    &rusqlite::Savepoint<'_>
);

#[cfg(feature = "postgres")]
impl sealed::Sealed for &mut crate::postgres::Transaction<'_> {}
#[cfg(feature = "postgres")]
impl ReadThrough for &mut crate::postgres::Transaction<'_> {
    fn list_through(&mut self, queue: &Queue, filter: &JobFilter, now: i64) -> Result<Page> {
        let db = crate::app_transaction::postgres_db(queue)?;
        crate::backend::postgres::inspect::list(
            &mut crate::backend::postgres::on_transaction(self),
            db.queries(),
            filter,
            now,
        )
    }
}

#[cfg(feature = "mysql")]
impl sealed::Sealed for &mut crate::mysql::Transaction<'_> {}
#[cfg(feature = "mysql")]
impl ReadThrough for &mut crate::mysql::Transaction<'_> {
    fn list_through(&mut self, queue: &Queue, filter: &JobFilter, now: i64) -> Result<Page> {
        let db = crate::app_transaction::mysql_db(queue)?;
        crate::backend::mysql::inspect::list(
            &db.sql,
            *self,
            filter,
            crate::app_transaction::clocked(queue, now),
        )
    }
}

/// (matching, not matching)
fn split(expected: &Expected, candidates: Vec<JobRecord>) -> (Vec<JobRecord>, Vec<JobRecord>) {
    candidates.into_iter().partition(|r| expected.matches(r))
}

fn first_match(
    expected: &Expected,
    candidates: Vec<JobRecord>,
) -> std::result::Result<JobRecord, AssertError> {
    let (matching, other) = split(expected, candidates);
    matching
        .into_iter()
        .next()
        .ok_or_else(|| AssertError::NotEnqueued {
            expected: expected.to_string(),
            found: other,
        })
}

fn no_match(
    expected: &Expected,
    candidates: Vec<JobRecord>,
) -> std::result::Result<(), AssertError> {
    let (matching, _) = split(expected, candidates);
    if matching.is_empty() {
        Ok(())
    } else {
        Err(AssertError::Enqueued {
            expected: expected.to_string(),
            found: matching,
        })
    }
}

/// One job run by [`drain`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Run {
    /// The job's id.
    pub job_id: i64,
    /// Its kind.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Which claim this was, starting at 1.
    pub attempt: u32,
    /// What became of the job.
    pub outcome: RunOutcome,
    /// The progress its handler last reported
    /// ([`JobContext::set_progress`]), as stored afterwards.
    pub progress: Option<Value>,
}

impl Run {
    /// The result of a completed run, decoded into `T`; `None` when the job
    /// did not complete or stored no result.
    pub fn result<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        match &self.outcome {
            RunOutcome::Completed { result: Some(v) } => Ok(Some(T::deserialize(v)?)),
            _ => Ok(None),
        }
    }

    /// The error of a failed run (retried or dead), or the reason of a
    /// discard or cancel.
    pub fn error(&self) -> Option<&str> {
        match &self.outcome {
            RunOutcome::Retried { error, .. }
            | RunOutcome::Dead { error }
            | RunOutcome::Discarded { reason: error }
            | RunOutcome::Cancelled { reason: error } => Some(error),
            _ => None,
        }
    }
}

/// What one run of a job led to, as stored afterwards.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunOutcome {
    /// The handler succeeded (or completed the job in its transaction); the
    /// stored result, `None` for JSON `null`.
    Completed {
        /// The stored result.
        result: Option<Value>,
    },
    /// The attempt failed (an error, or a panic: `"handler panicked: .."`)
    /// and the job will run again at `available_at` (by the queue's clock):
    /// [`drain`] again once the clock passes it.
    Retried {
        /// The attempt's error.
        error: String,
        /// When the retry is due.
        available_at: std::time::SystemTime,
    },
    /// The handler snoozed the job (no attempt used) until `available_at`.
    Snoozed {
        /// When the job is due again.
        available_at: std::time::SystemTime,
    },
    /// The handler discarded the job.
    Discarded {
        /// The reason it gave.
        reason: String,
    },
    /// The handler cancelled the job (or its cancellation was requested).
    Cancelled {
        /// The reason recorded.
        reason: String,
    },
    /// The job is dead: its last attempt failed, or its payload does not
    /// decode into the handler's arguments.
    Dead {
        /// The last error.
        error: String,
    },
    /// Something else took the job while its handler ran (it was deleted, or
    /// its lease was lost): nothing the run returned was applied.
    LeaseLost,
}

/// Runs every available job of `worker`'s kinds and queues on the calling
/// thread, one at a time in lease order (priority, then due time, then id),
/// until none is left; returns what happened to each run, in order.
///
/// The worker is not started: its handlers are called with a
/// [`JobContext::for_test`] context, each outcome is settled as the worker
/// would settle it (its retry policies included), and a panic is caught and
/// recorded as a failed attempt. Jobs the handlers enqueue run too if they
/// are due, and so does what the runs release: a job waiting for its
/// dependencies (a workflow's step) runs after the last of them finished,
/// and a sealed batch's callbacks after its last member; so a workflow runs
/// in order, to its end, in one call. Jobs scheduled later and retries with a backoff do not: move the
/// queue's [`ManualClock`] past them and drain again. With a group handler
/// ([`WorkerBuilder::handle_group`]), groups that are ready (full, or past
/// their grace or max delay on the queue's clock) are combined first and
/// their jobs run. There are no heartbeats and no timeouts.
///
/// Errors: a setting the worker would refuse at
/// [`start`](WorkerBuilder::start), a database error, or
/// [`Error::InvalidState`] for a job that ran [`MAX_RUNS_PER_JOB`] times
/// without finishing or waiting (a handler that snoozes with no delay).
pub fn drain(worker: &WorkerBuilder) -> Result<Vec<Run>> {
    let (queue, handlers, config) = worker.inline_parts()?;
    let request = LeaseRequest {
        queues: config.queues.clone(),
        kinds: Some(handlers.kinds()),
        limit: 1,
        worker_id: config.worker_id.clone(),
        ttl: config.lease_ttl,
        queue_caps: Vec::new(),
    };
    let mut runs = Vec::new();
    let mut runs_of: HashMap<i64, u32> = HashMap::new();
    let aggregate = |queue: &Queue| -> Result<()> {
        // Ready groups are combined first, as a worker with a group handler
        // would: their jobs then run like any other.
        if !handlers.grouped.is_empty() {
            while queue.aggregate(100)?.jobs.len() == 100 {}
        }
        Ok(())
    };
    aggregate(queue)?;
    while let Some(job) = queue.lease(&request)?.pop() {
        let count = runs_of.entry(job.id).or_default();
        *count += 1;
        if *count > MAX_RUNS_PER_JOB {
            // Give it back so the database is as it was before this run.
            let _ = queue.release(&job);
            return Err(Error::InvalidState {
                job_id: job.id,
                reason: format!(
                    "drain ran it {MAX_RUNS_PER_JOB} times and it is still due: \
                     a handler that snoozes or retries with no delay?"
                ),
            });
        }
        let ctx = JobContext::for_test(queue.clone(), job.clone());
        let outcome = run_handler(handlers, &ctx, config.retry_policy_for(&job.kind));
        // As the worker's completer does: the last progress first.
        if let Some(progress) = ctx.progress() {
            queue.write_progress(
                &[ProgressWrite {
                    lease: job.lease(),
                    progress,
                }],
                true,
            )?;
        }
        // Settled by the handler in a transaction of its own, or not at all.
        queue.take_settled_in(job.lease());
        if !ctx.completed_in_transaction() {
            // Fenced on the lease: a handler that settled the job itself
            // (`complete_in`, `settle_in`) makes this a `LeaseLost` no-op.
            match queue.settle(&job, outcome) {
                Ok(()) => {}
                Err(e) if e.is_lease_lost() => {}
                Err(e) => return Err(e),
            }
        }
        runs.push(Run {
            job_id: job.id,
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            attempt: job.attempt,
            outcome: read_outcome(queue, &job)?,
            progress: match queue.get(job.id) {
                Ok(record) => record
                    .progress
                    .as_deref()
                    .map(serde_json::from_str)
                    .transpose()?,
                Err(_) => None,
            },
        });
        aggregate(queue)?;
    }
    Ok(runs)
}

/// What the run of `job` left in the database.
fn read_outcome(queue: &Queue, job: &Job) -> Result<RunOutcome> {
    let record = match queue.get(job.id) {
        Ok(record) => record,
        Err(Error::NotFound { .. }) => return Ok(RunOutcome::LeaseLost),
        Err(e) => return Err(e),
    };
    let error = || {
        record
            .errors
            .iter()
            .rev()
            .find(|e| e.attempt == job.attempt)
            .map(|e| e.message.clone())
            .unwrap_or_default()
    };
    Ok(match record.state {
        JobState::COMPLETED => RunOutcome::Completed {
            result: record
                .result
                .as_deref()
                .map(serde_json::from_str)
                .transpose()?,
        },
        JobState::DISCARDED => RunOutcome::Discarded { reason: error() },
        JobState::CANCELLED => RunOutcome::Cancelled { reason: error() },
        JobState::DEAD => RunOutcome::Dead { error: error() },
        JobState::Running => RunOutcome::LeaseLost,
        _ if record.attempts >= job.attempt => RunOutcome::Retried {
            error: error(),
            available_at: record.available_at,
        },
        _ => RunOutcome::Snoozed {
            available_at: record.available_at,
        },
    })
}
