//! Batches: a set of jobs, possibly enqueued over time, with a callback job
//! enqueued once every member has finished (*complete*, whatever their
//! statuses) and one enqueued once every member has completed (*success*):
//! Sidekiq's batches.
//!
//! ```
//! use backlog::{NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let queue = Queue::open(dir.path().join("app.db"))?;
//! let batch = queue
//!     .batch()
//!     .on_complete(NewJob::new("import_report", json!({"file": "a.csv"})))
//!     .on_success(NewJob::new("import_done", json!({"file": "a.csv"})))
//!     .create()?; // open: members may join
//! for row in 0..3 {
//!     queue.enqueue(NewJob::new("import_row", json!({"row": row})).batch(batch.id))?;
//! }
//! queue.seal_batch(batch.id)?; // no more members: the callbacks may fire
//! let status = queue.batch_status(batch.id)?;
//! assert_eq!((status.total, status.pending), (3, 3));
//! # Ok(())
//! # }
//! ```
//!
//! ## Open, then sealed
//!
//! A batch is created *open*: jobs join it with [`NewJob::batch`], in as many
//! enqueues as the application needs. Its callbacks cannot fire while it is
//! open, even when every member so far has finished, so a batch filled over
//! time never fires early. [`Queue::seal_batch`] closes it: no job may join
//! any more ([`Error::InvalidArgument`]), and when every member has finished
//! already, the callbacks are enqueued by the seal itself. An empty batch
//! sealed fires both callbacks at once.
//!
//! ## Exactly once
//!
//! Each batch has one counter row. The transaction that moves a member to
//! history (a completion, a discard, a cancel, a dead letter, a rescue that
//! dead-letters it, an operator's cancel or discard) adds it to its status's
//! counter, and when the counters say the batch is done, inserts the
//! callbacks and marks the batch finished, in that same transaction. The
//! counter row is locked by the update, so of several transactions finishing
//! the last members at once, exactly one sees the batch done and not yet
//! finished; a transaction rolled back (a crash, the application's own
//! rollback of a `complete_in`) takes its count and its callbacks with it.
//! A retried attempt is not a finish: the member stays pending.
//!
//! ## What else counts
//!
//! - A member is counted once, at its first finish: an operator's retry of a
//!   finished member runs it again outside its batch.
//! - Deleting a live member takes it out of the batch (the total goes down),
//!   and may finish the batch. Deleting a finished member changes nothing.
//! - A job enqueued into a batch with a unique key already held joins
//!   nothing: the existing job (`existed: true`) keeps its own batch, if any.
//! - A callback's payload, when it is a JSON object, gets the field
//!   `batch_id`. Callbacks go to their own queue, due at once, with their own
//!   priority and max attempts; they can have no delay, unique key, group or
//!   batch ([`Error::InvalidArgument`] at [`BatchBuilder::create`]).
//! - `backlog copy` copies batches with their ids, counters, callbacks and
//!   live members: the callbacks fire once, on the target.
//!
//! The `_in` forms (`create_batch_in`, `seal_batch_in`, and `enqueue_in`
//! with a batch) run in the application's own transaction, on each database's
//! `QueueExt`.
//!
//! ## Deleted with history
//!
//! [`Queue::prune_history`] deletes a finished batch once its `finished_at`
//! is older than the longest of the [`Retention`](crate::Retention) periods
//! and its callback jobs have finished (none live, waiting or grouped): as
//! Sidekiq's batch data expires a while after the batch finished, kept as
//! long as any of its members' history may be. [`Queue::batch_status`] then
//! says what it says of an unknown batch. An open batch, one still
//! counting, or one whose callback has not finished is kept, and every batch
//! is while any retention is `None`.
//!
//! [`Queue::seal_batch`]: crate::Queue::seal_batch
//! [`Queue::prune_history`]: crate::Queue::prune_history
//! [`Queue::batch_status`]: crate::Queue::batch_status

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::params::EnqueueParams;
use crate::clock;
use crate::error::{Error, Result};
use crate::job::{NewJob, Payload, Schedule};

/// A batch just created: its id is what members join with
/// ([`NewJob::batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// The batch's id.
    pub id: i64,
}

/// Builds a batch: its callbacks, then [`BatchBuilder::create`]. From
/// [`Queue::batch`].
///
/// [`Queue::batch`]: crate::Queue::batch
#[derive(Debug, Clone)]
#[must_use = "a batch is created by `create()`"]
pub struct BatchBuilder<'q> {
    queue: &'q dyn BatchQueue,
    on_complete: Option<NewJob>,
    on_success: Option<NewJob>,
}

/// A batch's progress: its members counted per state, and its callbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchStatus {
    /// The batch's id.
    pub id: i64,
    /// Sealed: no job may join any more.
    pub sealed: bool,
    /// Members that joined (less those deleted while live).
    pub total: i64,
    /// Members not finished yet (waiting, scheduled, retrying or running).
    pub pending: i64,
    /// Members that completed.
    pub completed: i64,
    /// Members that were discarded.
    pub discarded: i64,
    /// Members that were cancelled.
    pub cancelled: i64,
    /// Members that ran out of attempts (dead-lettered).
    pub dead: i64,
    /// When the batch finished: sealed with every member finished. Its
    /// callbacks were enqueued then.
    pub finished_at: Option<SystemTime>,
    /// The *complete* callback's job, once enqueued.
    pub complete_job_id: Option<i64>,
    /// The *success* callback's job, once enqueued (only when every member
    /// completed).
    pub success_job_id: Option<i64>,
    /// When the batch was created.
    pub created_at: SystemTime,
}

/// What a [`BatchBuilder`] asks of the queue it came from. The
/// [`Queue`](crate::Queue) is the one implementation (`queue/enqueue.rs`):
/// the builder is a queue call, but its callbacks' rules are this module's,
/// which the backends apply, so the module reaches the queue through this
/// rather than importing it.
/// `Send + Sync`, so a builder can move between threads as a `&Queue` can.
pub(crate) trait BatchQueue: std::fmt::Debug + Send + Sync {
    /// The queue's clock, unix µs.
    fn now_micros(&self) -> i64;
    /// Validates `job` as an enqueue at `now` would.
    fn check_job(&self, job: &NewJob, now: i64) -> Result<()>;
    /// Inserts the batch and commits; its id.
    fn create_batch(&self, p: &CreateBatchParams<'_>) -> Result<i64>;
}

impl<'q> BatchBuilder<'q> {
    pub(crate) fn new(queue: &'q dyn BatchQueue) -> Self {
        BatchBuilder {
            queue,
            on_complete: None,
            on_success: None,
        }
    }

    /// The job enqueued once every member has finished, whatever their
    /// statuses. Defaults to none.
    pub fn on_complete(mut self, job: NewJob) -> Self {
        self.on_complete = Some(job);
        self
    }

    /// The job enqueued once every member has completed; never when one was
    /// discarded, cancelled or dead. Defaults to none.
    pub fn on_success(mut self, job: NewJob) -> Self {
        self.on_success = Some(job);
        self
    }

    /// Creates the batch, open (see the [module docs](crate::batch)), and
    /// commits. The callbacks are validated first: nothing is written for a
    /// bad one.
    pub fn create(self) -> Result<Batch> {
        let p = self.params()?;
        let id = self.queue.create_batch(&p.borrowed())?;
        Ok(Batch { id })
    }

    /// Validates and encodes the callbacks, stamped with the queue's now.
    pub(crate) fn params(&self) -> Result<OwnedCreateBatch> {
        let now = self.queue.now_micros();
        let encode = |job: &Option<NewJob>| {
            job.as_ref()
                .map(|j| Callback::encode(self.queue, j, now))
                .transpose()
        };
        Ok(OwnedCreateBatch {
            on_complete: encode(&self.on_complete)?,
            on_success: encode(&self.on_success)?,
            now,
        })
    }
}

/// A batch to insert: its encoded callbacks (see [`Callback`]) and now.
#[derive(Debug)]
pub(crate) struct CreateBatchParams<'a> {
    pub on_complete: Option<&'a str>,
    pub on_success: Option<&'a str>,
    pub now: i64,
}

/// [`CreateBatchParams`], owning its text.
#[derive(Debug)]
pub(crate) struct OwnedCreateBatch {
    on_complete: Option<String>,
    on_success: Option<String>,
    now: i64,
}

impl OwnedCreateBatch {
    pub(crate) fn borrowed(&self) -> CreateBatchParams<'_> {
        CreateBatchParams {
            on_complete: self.on_complete.as_deref(),
            on_success: self.on_success.as_deref(),
            now: self.now,
        }
    }
}

/// A batch's row as stored, read in the transaction that changed it (on the
/// servers, locked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRow {
    pub id: i64,
    pub sealed: bool,
    pub total: i64,
    pub completed: i64,
    pub discarded: i64,
    pub cancelled: i64,
    pub dead: i64,
    pub on_complete: Option<String>,
    pub on_success: Option<String>,
    pub finished_at: Option<i64>,
    pub complete_job_id: Option<i64>,
    pub success_job_id: Option<i64>,
    pub created_at: i64,
}

impl BatchRow {
    fn finished_members(&self) -> i64 {
        self.completed + self.discarded + self.cancelled + self.dead
    }

    /// The engine's verdict on a batch whose counters just changed: the
    /// callbacks to enqueue now, or `None` when the batch is not done (open,
    /// or members pending) or already finished (its callbacks were enqueued
    /// by an earlier transaction).
    pub(crate) fn due(&self) -> Option<Due<'_>> {
        if !self.sealed || self.finished_at.is_some() || self.finished_members() < self.total {
            return None;
        }
        Some(Due {
            complete: self.on_complete.as_deref(),
            success: self
                .on_success
                .as_deref()
                .filter(|_| self.completed == self.total),
        })
    }

    pub(crate) fn status(&self) -> BatchStatus {
        BatchStatus {
            id: self.id,
            sealed: self.sealed,
            total: self.total,
            pending: (self.total - self.finished_members()).max(0),
            completed: self.completed,
            discarded: self.discarded,
            cancelled: self.cancelled,
            dead: self.dead,
            finished_at: self.finished_at.map(clock::at),
            complete_job_id: self.complete_job_id,
            success_job_id: self.success_job_id,
            created_at: clock::at(self.created_at),
        }
    }
}

/// The callbacks a finished batch enqueues (encoded, see [`Callback`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Due<'a> {
    pub complete: Option<&'a str>,
    pub success: Option<&'a str>,
}

/// A callback job as stored in its batch's row: everything an enqueue needs,
/// validated at the batch's creation.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Callback {
    kind: String,
    queue: String,
    priority: i32,
    max_attempts: u32,
    payload: Value,
}

impl Callback {
    /// Validates `job` as an enqueue would and encodes it.
    fn encode(queue: &dyn BatchQueue, job: &NewJob, now: i64) -> Result<String> {
        if job.unique_key.is_some()
            || job.group.is_some()
            || job.batch.is_some()
            || !matches!(job.schedule, Schedule::Now)
        {
            return Err(Error::InvalidArgument(
                "a batch callback can have no delay, unique key, group or batch: its batch \
                 decides when it runs"
                    .into(),
            ));
        }
        queue.check_job(job, now)?;
        let payload = match &job.payload {
            Payload::Value(v) => v.clone(),
            Payload::Text(t) => serde_json::from_str(t)?,
        };
        Ok(serde_json::to_string(&Callback {
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            payload,
        })?)
    }

    /// Decodes a stored callback of batch `batch_id`, its payload given the
    /// batch's id when it is an object.
    pub(crate) fn decode(text: &str, batch_id: i64) -> Result<Callback> {
        let mut callback: Callback = serde_json::from_str(text)?;
        if let Value::Object(fields) = &mut callback.payload {
            fields.insert("batch_id".into(), Value::from(batch_id));
        }
        Ok(callback)
    }

    /// The enqueue of this callback at `now`, due at once. `payload` is its
    /// encoded payload ([`Callback::payload_text`]).
    pub(crate) fn params<'a>(&'a self, payload: &'a str, now: i64) -> EnqueueParams<'a> {
        EnqueueParams {
            queue: &self.queue,
            kind: &self.kind,
            priority: self.priority,
            unique_key: None,
            unique_history_since: None,
            unique_statuses: None,
            payload,
            max_attempts: self.max_attempts,
            available_at: now,
            now,
            group: None,
            depends_on: &[],
            sequence: None,
            batch: None,
        }
    }

    /// The payload as JSON text.
    pub(crate) fn payload_text(&self) -> Result<String> {
        Ok(serde_json::to_string(&self.payload)?)
    }
}

/// Inserts the callbacks `due` says, with `enqueue` (the backend's own, in
/// the finishing transaction); returns the ids of the complete and success
/// jobs.
pub(crate) fn enqueue_callbacks(
    batch_id: i64,
    due: Due<'_>,
    now: i64,
    mut enqueue: impl FnMut(&EnqueueParams<'_>) -> Result<i64>,
) -> Result<(Option<i64>, Option<i64>)> {
    let mut one = |text: Option<&str>| -> Result<Option<i64>> {
        let Some(text) = text else {
            return Ok(None);
        };
        let callback = Callback::decode(text, batch_id)?;
        let payload = callback.payload_text()?;
        enqueue(&callback.params(&payload, now)).map(Some)
    };
    let complete = one(due.complete)?;
    let success = one(due.success)?;
    Ok((complete, success))
}

/// The engine's refusal of a job joining batch `id`: `found` is the batch's
/// `sealed` flag, `None` when there is no such batch.
pub(crate) fn join_verdict(id: i64, found: Option<bool>) -> Result<()> {
    match found {
        None => Err(Error::InvalidArgument(format!("no batch has id {id}"))),
        Some(true) => Err(Error::InvalidArgument(format!(
            "batch {id} is sealed: no job may join it"
        ))),
        Some(false) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    /// A builder moves between threads (or across an `.await`), as it did
    /// when it held a `&Queue`.
    #[test]
    fn a_batch_builder_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::BatchBuilder<'static>>();
    }
}
