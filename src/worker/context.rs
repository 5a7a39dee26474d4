//! [`JobContext`]: what a handler knows about the job it runs, its
//! cancellation flag, and transactional completion.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::backend::ProgressWrite;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::lease::Job;
use crate::queue::Queue;
use crate::sync;
use crate::worker::error::JobError;

/// Why a running job was asked to stop. See [`JobContext::cancel_reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The worker no longer holds the job's lease: it expired and was
    /// rescued, or the job was deleted. Another worker may be running it; any
    /// completion from this handler is refused with `LeaseLost`.
    LeaseLost,
    /// [`Queue::cancel`] was called on the running job.
    CancelRequested,
    /// The job ran past its timeout.
    Timeout,
    /// The worker is shutting down and the grace period is over; the job has
    /// been released to run again elsewhere.
    Shutdown,
}

impl CancelReason {
    const ALL: [CancelReason; 4] = [
        CancelReason::LeaseLost,
        CancelReason::CancelRequested,
        CancelReason::Timeout,
        CancelReason::Shutdown,
    ];

    fn code(self) -> u8 {
        match self {
            CancelReason::LeaseLost => 1,
            CancelReason::CancelRequested => 2,
            CancelReason::Timeout => 3,
            CancelReason::Shutdown => 4,
        }
    }
}

/// A job's cancellation flag, shared by its handler and the worker's threads.
/// The first reason set is kept; a lost lease is also remembered on its own,
/// so it is reported once even when another reason came first.
///
/// It also carries the progress the handler reported and not yet written:
/// the heartbeater and the completer write it, on the threads that already
/// share this flag.
#[derive(Debug, Default)]
pub(crate) struct CancelFlag {
    reason: AtomicU8,
    lost: AtomicBool,
    /// Set in the job's own transaction, before it commits its completion.
    completing: AtomicBool,
    progress: Mutex<PendingProgress>,
}

/// A handler's latest progress, and which of its versions was written.
#[derive(Debug, Default)]
struct PendingProgress {
    value: Option<String>,
    version: u64,
    written: u64,
}

impl CancelFlag {
    /// Sets the flag; true when it was not set before.
    pub(crate) fn cancel(&self, reason: CancelReason) -> bool {
        self.reason
            .compare_exchange(0, reason.code(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Sets the flag for a lost lease; true the first time the loss is seen.
    pub(crate) fn lose_lease(&self) -> bool {
        self.cancel(CancelReason::LeaseLost);
        !self.lost.swap(true, Ordering::SeqCst)
    }

    /// True once the handler's transaction completed the job (or is
    /// committing its completion): a heartbeat that finds the lease gone
    /// read it before that commit.
    pub(crate) fn is_completing(&self) -> bool {
        self.completing.load(Ordering::SeqCst)
    }

    pub(crate) fn set_completing(&self, completing: bool) {
        self.completing.store(completing, Ordering::SeqCst);
    }

    pub(crate) fn reason(&self) -> Option<CancelReason> {
        let code = self.reason.load(Ordering::SeqCst);
        CancelReason::ALL.into_iter().find(|r| r.code() == code)
    }

    fn pending(&self) -> MutexGuard<'_, PendingProgress> {
        sync::lock(&self.progress)
    }

    /// Keeps `progress` (JSON text) as the job's latest, to be written.
    pub(crate) fn set_progress(&self, progress: String) {
        let mut pending = self.pending();
        pending.value = Some(progress);
        pending.version += 1;
    }

    /// The latest progress reported, written or not.
    pub(crate) fn progress(&self) -> Option<String> {
        self.pending().value.clone()
    }

    /// The latest progress when it was not written yet, with its version
    /// for [`CancelFlag::progress_written`].
    pub(crate) fn unwritten_progress(&self) -> Option<(String, u64)> {
        let pending = self.pending();
        match &pending.value {
            Some(value) if pending.version > pending.written => {
                Some((value.clone(), pending.version))
            }
            _ => None,
        }
    }

    /// Records that `version` (and so every earlier one) was written.
    pub(crate) fn progress_written(&self, version: u64) {
        let mut pending = self.pending();
        pending.written = pending.written.max(version);
    }
}

/// What a handler gets with its arguments: the job, a cancellation flag, a
/// manual heartbeat and transactional completion (`ctx.transaction(..)`, from
/// the extension trait of the database's module:
/// `backlog::sqlite::JobContextExt`, `backlog::postgres::JobContextExt`,
/// `backlog::mysql::JobContextExt`).
///
/// Handlers run on plain threads and cannot be interrupted; a long handler
/// should check [`JobContext::is_cancelled`] now and then and return when it
/// is set.
#[derive(Debug)]
pub struct JobContext {
    job: Arc<Job>,
    queue: Queue,
    cancel: Arc<CancelFlag>,
    deadline: Option<Instant>,
    lease_ttl: Duration,
    completed: AtomicBool,
}

/// The extension traits extend a `JobContext` (see `sealed.rs`).
impl crate::sealed::Sealed for JobContext {}

impl JobContext {
    pub(crate) fn new(
        job: Arc<Job>,
        queue: Queue,
        cancel: Arc<CancelFlag>,
        deadline: Option<Instant>,
        lease_ttl: Duration,
    ) -> Self {
        JobContext {
            job,
            queue,
            cancel,
            deadline,
            lease_ttl,
            completed: AtomicBool::new(false),
        }
    }

    /// A context for `job`, leased from `queue` by hand, so that a handler can
    /// be called without a running [`Worker`](crate::Worker): in a unit test,
    /// or in a loop that leases jobs itself.
    ///
    /// Everything works on it as in a worker: `ctx.transaction(..)`
    /// (`backlog::sqlite::JobContextExt`) completes the job (fenced on its
    /// lease), [`JobContext::heartbeat`] extends the lease by
    /// [`DEFAULT_LEASE_TTL`](crate::DEFAULT_LEASE_TTL).
    /// Nothing else happens behind the handler's back: no heartbeats, no
    /// timeout, no cancellation flag. Settling the job after the handler
    /// returns is the caller's ([`Queue::complete`], [`Queue::fail`], ...).
    ///
    /// ```
    /// use backlog::sqlite::JobContextExt;
    /// use backlog::{JobArgs, JobContext, JobError, LeaseRequest, Queue};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Greet {
    ///     name: String,
    /// }
    /// impl JobArgs for Greet {
    ///     const KIND: &'static str = "greet";
    /// }
    ///
    /// /// The handler under test, as registered with `.handle(greet)`.
    /// fn greet(args: Greet, ctx: &JobContext) -> Result<String, JobError> {
    ///     if args.name.is_empty() {
    ///         return Err(JobError::discard("nobody to greet"));
    ///     }
    ///     ctx.transaction(|tx| {
    ///         tx.execute("INSERT INTO greetings (name) VALUES (?1)", [&args.name])?;
    ///         Ok(format!("hello, {}", args.name))
    ///     })
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let queue = Queue::open(dir.path().join("test.db"))?;
    /// # backlog::sqlite::rusqlite::Connection::open(dir.path().join("test.db"))?
    /// #     .execute_batch("CREATE TABLE greetings (name TEXT)")?;
    /// queue.enqueue(Greet { name: "Ada".into() })?;
    /// let job = queue.lease(&LeaseRequest::new("test", 1))?.remove(0);
    ///
    /// let ctx = JobContext::for_test(queue.clone(), job.clone());
    /// let greeting = greet(job.args()?, &ctx).map_err(|e| e.to_string())?;
    /// assert_eq!(greeting, "hello, Ada");
    /// assert_eq!(queue.get(job.id)?.state, backlog::JobState::COMPLETED);
    /// # Ok(())
    /// # }
    /// ```
    pub fn for_test(queue: Queue, job: Job) -> JobContext {
        JobContext::new(
            Arc::new(job),
            queue,
            Arc::new(CancelFlag::default()),
            None,
            crate::lease::DEFAULT_LEASE_TTL,
        )
    }

    /// The job's id.
    pub fn id(&self) -> i64 {
        self.job.id
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.job.kind
    }

    /// The queue the job was leased from.
    pub fn queue(&self) -> &str {
        &self.job.queue
    }

    /// Which claim this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.job.attempt
    }

    /// The payload, JSON text.
    pub fn payload(&self) -> &str {
        &self.job.payload
    }

    /// The whole claimed job: priority, max attempts, unique key, lease.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// When the job's timeout passes, if it has one. At that instant the
    /// cancellation flag is set.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once the job was asked to stop: its lease was lost, its
    /// cancellation requested, its timeout passed, or the worker is shutting
    /// down past its grace period. See [`JobContext::cancel_reason`].
    pub fn is_cancelled(&self) -> bool {
        self.cancel.reason().is_some()
    }

    /// Why the job was asked to stop, if it was.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel.reason()
    }

    /// Extends this job's lease now, beyond the worker's own heartbeats, and
    /// writes the progress set since the last write
    /// ([`JobContext::set_progress`]). Sets the cancellation flag and returns
    /// [`Error::LeaseLost`] when the lease is no longer held (nothing is
    /// written then); sets it too when a cancel was requested.
    ///
    /// Inside `ctx.transaction(..)` it returns [`Error::InsideTransaction`]
    /// at once, on every backend: that transaction holds SQLite's write
    /// connection, or on a server the job's row lock, which the heartbeat
    /// would wait for. [`JobContext::set_progress`] works there.
    pub fn heartbeat(&self) -> Result<()> {
        // The lease first: inside `ctx.transaction(..)` this returns before
        // the progress gate is taken (the worker's heartbeater may hold the
        // gate, waiting for that transaction's write lock or row lock).
        let report = self.queue.heartbeat(&[self.job.lease()], self.lease_ttl)?;
        if !report.lost.is_empty() {
            self.lease_lost();
            return Err(Error::LeaseLost {
                job_id: self.job.id,
            });
        }
        if !report.cancel_requested.is_empty() {
            self.cancel.cancel(CancelReason::CancelRequested);
        }
        let _gate = self.queue.progress_gate();
        if let Some((progress, version)) = self.cancel.unwritten_progress() {
            let written = self.queue.write_progress(
                &[ProgressWrite {
                    lease: self.job.lease(),
                    progress,
                }],
                false,
            )?;
            if written.contains(&self.job.id) {
                self.cancel.progress_written(version);
            }
        }
        Ok(())
    }

    /// Reports the job's progress or a partial result: any value that
    /// serializes to JSON (a percentage, `{"done": 40, "of": 100}`, the rows
    /// handled so far), replacing the one reported before. It shows in
    /// [`JobRecord::progress`](crate::JobRecord::progress) (through
    /// [`Queue::get`], [`Queue::list`] and the `backlog show` command) and
    /// stays in history when the job finishes, whatever its status.
    ///
    /// The call only keeps the value: the worker writes the latest one with
    /// its next heartbeat (so a running job's progress becomes visible
    /// within one `heartbeat_interval`, by default 10 s) and before the job
    /// settles, in batches, fenced on the lease like every other write.
    /// [`JobContext::heartbeat`] writes it at once. A value set faster than
    /// that is written only as the latest.
    ///
    /// Errors, with nothing kept: [`Error::ProgressTooLarge`] past
    /// [`MAX_PROGRESS_BYTES`](crate::MAX_PROGRESS_BYTES) (64 KiB of JSON),
    /// [`Error::InvalidPayload`] when it nests deeper than
    /// [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH), [`Error::Serialization`]
    /// when it does not serialize, and [`Error::LeaseLost`] once the worker
    /// knows the lease is lost (another worker may own the job: its progress
    /// is not this handler's to write).
    ///
    /// ```
    /// use backlog::{JobContext, JobError};
    /// use serde_json::json;
    ///
    /// fn import(rows: Vec<String>, ctx: &JobContext) -> Result<(), JobError> {
    ///     for (done, _row) in rows.iter().enumerate() {
    ///         // ... import the row ...
    ///         ctx.set_progress(&json!({ "done": done + 1, "of": rows.len() }))?;
    ///     }
    ///     Ok(())
    /// }
    /// # let _ = import;
    /// ```
    pub fn set_progress<T: Serialize + ?Sized>(&self, progress: &T) -> Result<()> {
        let text = crate::validate::progress(&serde_json::to_value(progress)?)?;
        if self.cancel.reason() == Some(CancelReason::LeaseLost) {
            return Err(Error::LeaseLost {
                job_id: self.job.id,
            });
        }
        self.cancel.set_progress(text);
        Ok(())
    }

    /// The progress last reported with [`JobContext::set_progress`], JSON
    /// text, whether written yet or not: what a unit test of a handler run
    /// with [`JobContext::for_test`] looks at.
    pub fn progress(&self) -> Option<String> {
        self.cancel.progress()
    }

    /// The jobs this job depends on (see
    /// [`NewJob::depends_on`](crate::NewJob::depends_on) and
    /// [`Workflow`](crate::Workflow)), with how they ended and what they
    /// returned, by id. One read of the database.
    pub fn dependencies(&self) -> Result<Vec<crate::Dependency>> {
        self.queue.dependencies(self.job.id)
    }

    /// What the workflow step `step` this job depends on returned, decoded
    /// as `T`; `None` when it has no result. [`Error::InvalidArgument`] when
    /// this job does not depend on a step of that name.
    pub fn result_of<T: serde::de::DeserializeOwned>(&self, step: &str) -> Result<Option<T>> {
        self.dependencies()?
            .into_iter()
            .find(|d| d.step.as_deref() == Some(step))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "job {} does not depend on step {step:?}",
                    self.job.id
                ))
            })?
            .result()
    }

    /// The queue the job came from.
    pub(crate) fn source(&self) -> &Queue {
        &self.queue
    }

    /// Transactional completion, the part every backend shares: `commit`
    /// opens the backend's transaction, checks the lease (fence first), runs
    /// the handler's closure, completes the job, calls
    /// [`JobContext::mark_completing`] and commits. This refuses a second
    /// completion, and records the outcome: the completion event, or the lost
    /// lease.
    pub(crate) fn complete_transactionally<T>(
        &self,
        commit: impl FnOnce() -> std::result::Result<T, JobError>,
    ) -> std::result::Result<T, JobError> {
        if self.completed.load(Ordering::SeqCst) {
            return Err(JobError::from(Error::InvalidState {
                job_id: self.job.id,
                reason: "the job was already completed in a transaction".into(),
            }));
        }
        let committed = commit();
        if committed.is_err() {
            self.cancel.set_completing(false);
        }
        match committed {
            Ok(value) => {
                failpoint!("transaction-after-commit");
                self.completed.store(true, Ordering::SeqCst);
                self.queue.emit([Event::Completed {
                    job_id: self.job.id,
                }]);
                Ok(value)
            }
            Err(e) => {
                if e.is_lease_lost() {
                    self.lease_lost();
                }
                Err(e)
            }
        }
    }

    /// Called inside the completing transaction, after the completion was
    /// written and before the commit. On SQLite this process's write gate is
    /// held then, so no heartbeat of this worker can find the job gone before
    /// it is set; on a server the job's row is locked by the transaction.
    pub(crate) fn mark_completing(&self) {
        self.cancel.set_completing(true);
    }

    /// True when the handler completed the job in `ctx.transaction(..)`.
    pub(crate) fn completed_in_transaction(&self) -> bool {
        self.completed.load(Ordering::SeqCst)
    }

    fn lease_lost(&self) {
        if self.cancel.lose_lease() {
            tracing::warn!(
                job_id = self.job.id,
                "lease lost: the job is no longer held by this worker (its lease \
                 expired and it was rescued, or it was deleted); nothing it commits \
                 applies"
            );
            self.queue.emit([Event::LeaseLost {
                job_id: self.job.id,
            }]);
        }
    }
}

/// A handler's output as a stored result: JSON `null` stores none.
pub(crate) fn to_result<T: Serialize>(value: &T) -> Result<Option<Value>> {
    Ok(match serde_json::to_value(value)? {
        Value::Null => None,
        v => Some(v),
    })
}
