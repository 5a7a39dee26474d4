//! Looking at jobs: states, records, filters and counts.
//!
//! A job's life:
//!
//! ```text
//!  enqueue ──► scheduled ──(available_at passes)──► available ──(lease)──► running
//!                 ▲                                     ▲                    │
//!                 │ fail with attempts left, snooze     │ release, rescue    │
//!                 └─────────────────────────────────────┴────────────────────┤
//!                                                                            ▼
//!                             history: completed │ discarded │ cancelled │ dead
//!                                          retry(id) ──► back to available
//!
//!  enqueue into a group ──► grouped ──(group combined)──► history: aggregated
//!                                  └─► one new job (available) holding all their payloads
//!
//!  enqueue with dependencies ──► pending ──(last dependency finished)──► available
//!                                   └──(a dependency did not complete)──► history: cancelled
//! ```
//!
//! Live states are derived from the lease and schedule columns; the lease
//! moves a job from available to running, the completer or
//! [`Queue::fail`](crate::Queue::fail) moves it out of running, and the rescuer
//! moves jobs whose lease expired back to available (or to `dead`). A
//! worker with a group handler (or [`Queue::aggregate`](crate::Queue::aggregate))
//! moves grouped jobs to `aggregated` (see [`crate::group`]).

use std::time::SystemTime;

use serde::de::DeserializeOwned;

use crate::error::Result;
use crate::job::decode_args;
use crate::outcome::{AttemptError, FinalStatus};

/// Where a job is in its life: one of four live states, or finished with a
/// history status.
///
/// The finished states have short names, so matching one takes no nesting:
///
/// ```
/// use backlog::JobState;
///
/// fn describe(state: JobState) -> &'static str {
///     match state {
///         JobState::COMPLETED => "done",
///         JobState::DEAD => "needs a look",
///         s if s.is_finished() => "stopped",
///         _ => "still live",
///     }
/// }
/// assert_eq!(describe(JobState::COMPLETED), "done");
/// assert_eq!(describe(JobState::CANCELLED), "stopped");
/// assert_eq!(describe(JobState::Running), "still live");
/// assert_eq!(JobState::DEAD.final_status(), Some(backlog::FinalStatus::Dead));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Live, not leased, due now.
    Available,
    /// Live, not leased, due later, never attempted.
    Scheduled,
    /// Live, not leased, due later, after a failed attempt.
    Retrying,
    /// Live and leased by a worker.
    Running,
    /// Waiting in its group to be combined with the group's other jobs
    /// (see [`crate::group`]); never leased on its own.
    Grouped,
    /// Waiting for the jobs it depends on to finish (see
    /// [`NewJob::depends_on`](crate::NewJob::depends_on)); never leased
    /// until the last of them has.
    Pending,
    /// Finished: in history with this status.
    Finished(FinalStatus),
}

impl JobState {
    /// Finished: completed by its handler.
    pub const COMPLETED: JobState = JobState::Finished(FinalStatus::Completed);
    /// Finished: discarded by its handler or an operator.
    pub const DISCARDED: JobState = JobState::Finished(FinalStatus::Discarded);
    /// Finished: cancelled.
    pub const CANCELLED: JobState = JobState::Finished(FinalStatus::Cancelled);
    /// Finished: its attempts ran out (the dead-letter history).
    pub const DEAD: JobState = JobState::Finished(FinalStatus::Dead);
    /// Finished: combined with its group into another job.
    pub const AGGREGATED: JobState = JobState::Finished(FinalStatus::Aggregated);

    /// True for a job in history (any [`FinalStatus`]); false for a live one.
    pub fn is_finished(self) -> bool {
        matches!(self, JobState::Finished(_))
    }

    /// The history status of a finished job; `None` for a live one.
    pub fn final_status(self) -> Option<FinalStatus> {
        match self {
            JobState::Finished(status) => Some(status),
            _ => None,
        }
    }

    /// The state's name: `available`, `scheduled`, `retrying`, `running`, or
    /// the history status.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Available => "available",
            JobState::Scheduled => "scheduled",
            JobState::Retrying => "retrying",
            JobState::Running => "running",
            JobState::Grouped => "grouped",
            JobState::Pending => "pending",
            JobState::Finished(status) => status.as_str(),
        }
    }

    /// Parses a state name as returned by [`JobState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "available" => JobState::Available,
            "scheduled" => JobState::Scheduled,
            "retrying" => JobState::Retrying,
            "running" => JobState::Running,
            "grouped" => JobState::Grouped,
            "pending" => JobState::Pending,
            other => JobState::Finished(FinalStatus::parse(other)?),
        })
    }

    /// Every state, live ones first.
    pub const ALL: [JobState; 11] = [
        JobState::Available,
        JobState::Scheduled,
        JobState::Retrying,
        JobState::Running,
        JobState::Grouped,
        JobState::Pending,
        JobState::Finished(FinalStatus::Completed),
        JobState::Finished(FinalStatus::Discarded),
        JobState::Finished(FinalStatus::Cancelled),
        JobState::Finished(FinalStatus::Dead),
        JobState::Finished(FinalStatus::Aggregated),
    ];
}

/// Everything known about one job, live or finished.
///
/// Every point in time is a [`SystemTime`], as everywhere in the public API
/// (records, leased jobs, events, `run_at`), kept to the microsecond:
///
/// ```
/// # use backlog::{NewJob, Queue};
/// # use serde_json::json;
/// use std::time::{Duration, SystemTime};
/// # fn main() -> backlog::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let queue = Queue::open(dir.path().join("app.db"))?;
/// let at = SystemTime::now() + Duration::from_secs(3600);
/// let id = queue.enqueue(NewJob::new("report", json!({})).run_at(at))?.id;
/// let record = queue.get(id)?;
/// let due_in = record.available_at.duration_since(record.created_at).unwrap();
/// assert!(due_in > Duration::from_secs(3599));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// The job's id.
    pub id: i64,
    /// Its state now.
    pub state: JobState,
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The priority.
    pub priority: i32,
    /// The unique key, if any.
    pub unique_key: Option<String>,
    /// The payload, JSON text.
    pub payload: String,
    /// Claims so far.
    pub attempts: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// When it is (or was last) due.
    pub available_at: SystemTime,
    /// The errors of its last failed attempts, oldest first.
    pub errors: Vec<AttemptError>,
    /// The worker holding the lease (live) or that finished it (history).
    pub worker: Option<String>,
    /// When the lease expires, for a running job.
    pub lease_until: Option<SystemTime>,
    /// When it was first claimed.
    pub started_at: Option<SystemTime>,
    /// Whether cancellation was requested while it ran.
    pub cancel_requested: bool,
    /// The handler's result, for a completed job, JSON text.
    pub result: Option<String>,
    /// When it finished.
    pub finished_at: Option<SystemTime>,
    /// When it was enqueued.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// The last progress its handler reported with
    /// [`JobContext::set_progress`](crate::JobContext::set_progress), JSON
    /// text; kept in history when the job finishes (whatever its status).
    /// Written with the worker's heartbeats and before the job settles, so
    /// a running job's value here may lag its handler's by up to one
    /// heartbeat interval.
    pub progress: Option<String>,
    /// The group a grouped job waits in (or waited in, for an aggregated
    /// one).
    pub group_key: Option<String>,
    /// For a job combined with its group ([`JobState::AGGREGATED`]): the id
    /// of the job it went into, whose payload holds its own.
    pub aggregated_into: Option<i64>,
    /// The sequence it was enqueued into ([`NewJob::sequence`]), in its
    /// queue; kept in history. `None` for a job of no sequence, and for
    /// one enqueued before the schema's V12.
    ///
    /// [`NewJob::sequence`]: crate::NewJob::sequence
    pub sequence_key: Option<String>,
}

/// The keys of some jobs' sequences, as a backend's `sequences::keys_of`
/// reads them: (job id, key) for each of the ids that has one.
pub(crate) type SequenceKeys = Vec<(i64, String)>;

/// A job as each backend's `get` returns it: `found` (looked up wherever it
/// is) with its sequence key, read by `keys_of`. Written once, so that
/// every database reads the key the same way, and only for a job it found.
pub(crate) fn with_sequence_key(
    found: Option<JobRecord>,
    keys_of: impl FnOnce(&[i64]) -> Result<SequenceKeys>,
) -> Result<Option<JobRecord>> {
    let Some(mut record) = found else {
        return Ok(None);
    };
    with_sequence_keys(std::slice::from_mut(&mut record), keys_of)?;
    Ok(Some(record))
}

/// Sets the sequence key of each of `records`, read by `keys_of` for
/// their ids, as each backend's `get` and `list` return them.
pub(crate) fn with_sequence_keys(
    records: &mut [JobRecord],
    keys_of: impl FnOnce(&[i64]) -> Result<SequenceKeys>,
) -> Result<()> {
    let ids: Vec<i64> = records.iter().map(|j| j.id).collect();
    let keys = keys_of(&ids)?;
    if keys.is_empty() {
        return Ok(());
    }
    let mut keys: std::collections::HashMap<i64, String> = keys.into_iter().collect();
    for record in records {
        record.sequence_key = keys.remove(&record.id);
    }
    Ok(())
}

impl JobRecord {
    /// Decodes the payload into typed arguments, as [`Job::args`] does.
    ///
    /// [`Job::args`]: crate::Job::args
    ///
    /// ```
    /// # use backlog::{JobArgs, Queue};
    /// # use serde::{Deserialize, Serialize};
    /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
    /// struct SendEmail {
    ///     to: String,
    /// }
    /// impl JobArgs for SendEmail {
    ///     const KIND: &'static str = "send_email";
    /// }
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = Queue::open(dir.path().join("app.db"))?;
    /// let id = queue.enqueue(SendEmail { to: "a@b.c".into() })?.id;
    /// let record = queue.get(id)?;
    /// assert_eq!(record.args::<SendEmail>()?, SendEmail { to: "a@b.c".into() });
    /// assert_eq!(record.result::<String>()?, None); // not run yet
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Error::Serialization`](crate::Error::Serialization) when it does not
    /// decode into `T`.
    pub fn args<T: DeserializeOwned>(&self) -> Result<T> {
        decode_args(&self.payload)
    }

    /// Decodes the handler's result into `T`: `None` when the job stored no
    /// result (not completed, or its handler returned a value that serializes
    /// to JSON `null`, such as `()`).
    /// [`Error::Serialization`](crate::Error::Serialization) when it does not
    /// decode into `T`.
    pub fn result<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.result.as_deref().map(decode_args).transpose()
    }

    /// Decodes the progress its handler last reported into `T`: `None` when
    /// none was reported (or written yet).
    /// [`Error::Serialization`](crate::Error::Serialization) when it does not
    /// decode into `T`.
    pub fn progress<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        self.progress.as_deref().map(decode_args).transpose()
    }
}

/// Which jobs [`Queue::list`](crate::Queue::list) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFilter {
    pub(crate) state: JobState,
    pub(crate) queue: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) after_id: Option<i64>,
    pub(crate) limit: usize,
}

impl JobFilter {
    /// Jobs in `state`, 100 per page, oldest id first.
    pub fn new(state: JobState) -> Self {
        JobFilter {
            state,
            queue: None,
            kind: None,
            after_id: None,
            limit: 100,
        }
    }

    /// Only this queue. Defaults to every queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only this kind. Defaults to every kind.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Keyset paging: only ids greater than this (pass the previous page's
    /// [`Page::next_after`]). Defaults to the start.
    pub fn after(mut self, id: i64) -> Self {
        self.after_id = Some(id);
        self
    }

    /// Page size, at least 1. Defaults to 100.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The jobs, by ascending id.
    pub jobs: Vec<JobRecord>,
    /// Pass to [`JobFilter::after`] for the next page; `None` when this was the last.
    pub next_after: Option<i64>,
}

impl Page {
    /// The page of `jobs` read with `limit`: a full page may have a next
    /// one, after its last id; a shorter one was the last.
    pub(crate) fn of(jobs: Vec<JobRecord>, limit: usize) -> Page {
        let next_after = if jobs.len() == limit {
            jobs.last().map(|j| j.id)
        } else {
            None
        };
        Page { jobs, next_after }
    }
}

/// How many jobs one queue holds in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// The queue.
    pub queue: String,
    /// The state.
    pub state: JobState,
    /// How many jobs.
    pub count: u64,
}

impl StateCount {
    /// A count read from a backend's `(queue, state name, count)` row;
    /// `None` for a state this build does not know.
    pub(crate) fn from_row(queue: String, state: &str, count: i64) -> Option<StateCount> {
        Some(StateCount {
            queue,
            state: JobState::parse(state)?,
            count: count.max(0) as u64,
        })
    }

    /// Sorts counts by queue, then in [`JobState::ALL`] order: the order
    /// every backend reports them in.
    pub(crate) fn sort(counts: &mut [StateCount]) {
        let rank = |s: JobState| JobState::ALL.iter().position(|a| *a == s);
        counts.sort_by(|a, b| {
            (a.queue.as_str(), rank(a.state)).cmp(&(b.queue.as_str(), rank(b.state)))
        });
    }
}

/// What [`Queue::cancel`](crate::Queue::cancel) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The job was not running; it moved to history as `cancelled`.
    Cancelled,
    /// The job is running; its handler is asked to stop (the next heartbeat
    /// sets its cancellation flag).
    Requested,
}

/// How long finished jobs are kept, per status. `None` keeps forever.
///
/// A pruned job takes its dependency edges and workflow step with it, and
/// its workflow once no step is left. A finished job that a pending or live
/// job depends on is kept past its retention until that job has finished
/// too: its handler may read the result
/// ([`JobContext::result_of`](crate::JobContext::result_of)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Defaults to 7 days. Grouped jobs combined into another
    /// ([`FinalStatus::Aggregated`]) are kept as long.
    pub completed: Option<std::time::Duration>,
    /// Defaults to 30 days.
    pub discarded: Option<std::time::Duration>,
    /// Defaults to 30 days.
    pub cancelled: Option<std::time::Duration>,
    /// Defaults to 90 days.
    pub dead: Option<std::time::Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 60 * 60;
        Retention {
            completed: Some(std::time::Duration::from_secs(7 * DAY)),
            discarded: Some(std::time::Duration::from_secs(30 * DAY)),
            cancelled: Some(std::time::Duration::from_secs(30 * DAY)),
            dead: Some(std::time::Duration::from_secs(90 * DAY)),
        }
    }
}

impl Retention {
    /// The retention for one status.
    pub fn for_status(&self, status: FinalStatus) -> Option<std::time::Duration> {
        match status {
            FinalStatus::Completed => self.completed,
            FinalStatus::Discarded => self.discarded,
            FinalStatus::Cancelled => self.cancelled,
            FinalStatus::Dead => self.dead,
            // Kept as long as completed jobs: the job they went into
            // finishes with its own status.
            FinalStatus::Aggregated => self.completed,
        }
    }
}

/// A change to a job that is waiting to run: see
/// [`Queue::update`](crate::Queue::update). Fields left `None` keep their
/// value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobUpdate {
    /// The new priority (higher runs first).
    pub priority: Option<i32>,
    /// When the job becomes due; a time in the past means now.
    pub run_at: Option<std::time::SystemTime>,
    /// The queue to move the job to.
    pub queue: Option<String>,
}

impl JobUpdate {
    /// A change of nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets when the job becomes due.
    pub fn run_at(mut self, at: std::time::SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Moves the job to another queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// True when the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.priority.is_none() && self.run_at.is_none() && self.queue.is_none()
    }
}

/// One queue at a glance: what [`Queue::stats`](crate::Queue::stats)
/// reports, what `backlog stats` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Live, due now, waiting for a worker.
    pub available: u64,
    /// Live, due later, never attempted.
    pub scheduled: u64,
    /// Live, due later, after a failed attempt.
    pub retrying: u64,
    /// Leased by a worker.
    pub running: u64,
    /// Waiting in their groups (see [`crate::group`]).
    pub grouped: u64,
    /// Waiting for their dependencies (see `backlog::flow`).
    pub pending: u64,
    /// In history as `dead` (the dead-letter count), of any age.
    pub dead: u64,
    /// Completed in the last hour.
    pub completed_last_hour: u64,
    /// Completed in the last minute: the throughput, in jobs per minute.
    pub completed_last_minute: u64,
    /// Finished jobs per status since the counts began (completed,
    /// discarded, cancelled, dead, aggregated), kept as jobs finish: pruned
    /// history included (see [`crate::finished`]).
    pub finished: crate::finished::FinishedTotals,
    /// Whether leases skip the queue.
    pub paused: bool,
    /// The queue's limits ([`Queue::set_limits`](crate::Queue::set_limits)).
    pub limits: crate::limits::QueueLimits,
    /// Its due jobs of kinds no live worker handles on this queue, by kind:
    /// they wait until a worker for them starts (see
    /// [`Queue::unhandled`](crate::Queue::unhandled)). Empty when every due
    /// job has a worker.
    pub unhandled: Vec<UnhandledJobs>,
}

/// Due jobs of a queue and kind that no live worker handles: no worker
/// serves the queue with a handler for the kind. See
/// [`Queue::unhandled`](crate::Queue::unhandled); a worker's registry
/// (`backlog::worker`) answers it, and [`QueueStats::unhandled`] holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnhandledJobs {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// How many of its jobs are due (available) now.
    pub due: u64,
}

/// How many jobs of one queue finished with one status in one minute: what
/// [`Queue::finished_per_minute`](crate::Queue::finished_per_minute) reports,
/// what the dashboard charts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedCount {
    /// The queue.
    pub queue: String,
    /// How the jobs finished.
    pub status: FinalStatus,
    /// Which minute: 0 is the last 60 seconds, 1 the minute before, and so on.
    pub minutes_ago: u32,
    /// How many jobs.
    pub count: u64,
}

/// What a bulk operation ([`Queue::retry_matching`](crate::Queue::retry_matching),
/// `cancel_matching`, `delete_matching`) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkReport {
    /// Jobs the operation applied to.
    pub done: u64,
    /// Jobs that matched but changed state (or were deleted) before the
    /// operation reached them, or that it refused (a retry whose unique key a
    /// live job holds): left as they were.
    pub skipped: u64,
    /// Of the cancelled jobs, those that were running: their handlers are
    /// asked to stop and they finish as `cancelled` later.
    pub requested: u64,
}
