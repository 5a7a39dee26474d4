//! A handler thread: takes leased jobs from the fetcher, runs their handler
//! under `catch_unwind`, and sends the outcome to the completer.
//!
//! A panic is recorded as a failed attempt with the panic's message and the
//! thread goes on with the next job. After shutdown began, a job still
//! waiting in the channel is released instead of started.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

use crate::events::Event;
use crate::inspect::JobState;
use crate::lease::Job;
use crate::outcome::{FinalStatus, Outcome};
use crate::retry::RetryPolicy;
use crate::worker::completer::Settle;
use crate::worker::context::{CancelFlag, CancelReason, JobContext};
use crate::worker::error::JobError;
use crate::worker::fetcher::Run;
use crate::worker::handler::{Handled, Handlers};
use crate::worker::Shared;

pub(crate) struct Executor {
    pub shared: Arc<Shared>,
    pub jobs: Receiver<Run>,
    /// Disconnects when shutdown begins.
    pub stop: Receiver<()>,
    pub outcomes: Sender<Settle>,
    pub slot_freed: Sender<()>,
    pub deadline_set: Sender<()>,
    /// The queue runs on a manual clock: handler time is also read on it.
    pub manual: bool,
    /// Dropped when the thread ends: shutdown waits for every clone to go.
    pub _alive: Sender<()>,
}

impl Executor {
    pub(crate) fn run(self) {
        loop {
            // Once shutdown began, a thread leaves when the channel is empty,
            // even while the fetcher, held up by another process's write
            // lock, still has its sender.
            let run = select! {
                recv(self.jobs) -> run => match run {
                    Ok(run) => run,
                    Err(_) => return,
                },
                recv(self.stop) -> _ => match self.jobs.try_recv() {
                    Ok(run) => run,
                    Err(_) => return,
                },
            };
            for (job, cancel) in run {
                self.shared.busy.fetch_add(1, Ordering::SeqCst);
                // After shutdown began, the rest of a run is released.
                if self.shared.stopping.load(Ordering::SeqCst) {
                    self.settle(job, Outcome::Release);
                } else {
                    self.execute(job, cancel);
                }
                self.shared.busy.fetch_sub(1, Ordering::SeqCst);
                self.shared.free.fetch_add(1, Ordering::SeqCst);
                if self.fetcher_wants_slot() {
                    let _ = self.slot_freed.try_send(());
                }
            }
        }
    }

    /// Whether the fetcher should hear of a freed slot: always without a
    /// look-ahead (it waits for each one) and with per-queue caps (a finished
    /// job frees room in its cap); with one, only once enough slots are
    /// claimable for a lease, so short jobs do not wake it once each.
    fn fetcher_wants_slot(&self) -> bool {
        let shared = &self.shared;
        shared.completer_refills()
            || !shared.config.queue_concurrency.is_empty()
            || shared.claimable() >= shared.refill_at()
    }

    fn execute(&self, job: Arc<Job>, cancel: Arc<CancelFlag>) {
        let shared = &self.shared;
        let timeout = shared.config.timeout_for(&job.kind);
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        if !shared.inflight.start(job.id, deadline) {
            return; // released by shutdown while it waited
        }
        if deadline.is_some() {
            let _ = self.deadline_set.try_send(());
        }
        shared.queue.emit([Event::Started {
            job_id: job.id,
            attempt: job.attempt,
        }]);
        failpoint!("handler-start");
        let ctx = JobContext::new(
            job.clone(),
            shared.queue.clone(),
            cancel.clone(),
            deadline,
            shared.config.lease_ttl,
        );
        let policy = shared.config.retry_policy_for(&job.kind);
        let (started, clock_started) = (Instant::now(), self.manual.then(|| shared.queue.now()));
        let outcome = run_handler(&shared.handlers, &ctx, policy);
        let mut took = started.elapsed();
        if let Some(at) = clock_started {
            // A test's handler may stand for a long job by moving the clock.
            let moved = shared.queue.now().duration_since(at).unwrap_or_default();
            took = took.max(moved);
        }
        shared.lookahead.record(took);
        // Settling from here on: no heartbeat reports the job lost any more.
        let held = shared.inflight.finish(job.id);
        // A lease settled in a caller's transaction is recorded by the queue
        // (by `ctx.transaction` too): always take the record, so none is left
        // behind. A heartbeat that found the job gone took it already.
        let settled_in = shared.queue.take_settled_in(job.lease()) || cancel.is_completing();
        if !held {
            return; // released by shutdown meanwhile
        }
        // Completed in `ctx.transaction`, owned by another worker now, or
        // settled by the handler with `complete_in` in a transaction of its
        // own: there is nothing left for the completer to apply.
        if ctx.completed_in_transaction()
            || cancel.reason() == Some(CancelReason::LeaseLost)
            || (settled_in && self.settled_by_handler(&job))
        {
            shared.inflight.remove([job.id]);
        } else {
            self.shared.settle(&self.outcomes, job, outcome);
        }
    }

    /// For a job whose handler settled it in a transaction of its own (with
    /// `complete_in` or `settle_in`, not `ctx.transaction`): true when that
    /// transaction committed, after sending the event of what it did (the
    /// caller's transaction sends none). False when it rolled back and the
    /// job is still running on this claim; then the handler's return value
    /// settles it as usual.
    fn settled_by_handler(&self, job: &Job) -> bool {
        let Ok(record) = self.shared.queue.get(job.id) else {
            // Not found (deleted) or unreadable: settling reports what is true.
            return false;
        };
        let job_id = job.id;
        let event = match record.state {
            JobState::Running
                if record.attempts == job.attempt
                    && record.worker.as_deref() == Some(self.shared.config.worker_id.as_str()) =>
            {
                return false;
            }
            // Rescheduled by the handler and claimed again since.
            JobState::Running => None,
            JobState::Finished(status) => match status {
                FinalStatus::Completed => Some(Event::Completed { job_id }),
                FinalStatus::Discarded => Some(Event::Discarded { job_id }),
                FinalStatus::Cancelled => Some(Event::Cancelled { job_id }),
                FinalStatus::Dead => Some(Event::Dead { job_id }),
                // A leased job is never a group member.
                FinalStatus::Aggregated => None,
            },
            // Back in line: with the attempt used (a failure), or given back.
            _ if record.attempts >= job.attempt => Some(Event::Retried {
                job_id,
                attempt: job.attempt,
                available_at: record.available_at,
            }),
            _ => Some(Event::Snoozed {
                job_id,
                available_at: record.available_at,
            }),
        };
        self.shared.queue.emit(event);
        true
    }

    /// Hands the outcome to the completer, unless shutdown released the job.
    fn settle(&self, job: Arc<Job>, outcome: Outcome) {
        if self.shared.inflight.finish(job.id) {
            self.shared.settle(&self.outcomes, job, outcome);
        }
    }
}

/// Runs the job's handler under `catch_unwind`, inside the job's span (id,
/// kind, queue, attempt), and turns what it returned into an outcome: what a
/// handler thread does, and what `backlog::testing::drain` does inline.
/// Logs the start, and the end with the run's duration and outcome.
pub(crate) fn run_handler(
    handlers: &Handlers,
    ctx: &JobContext,
    policy: Option<&RetryPolicy>,
) -> Outcome {
    let job = ctx.job();
    let span = tracing::info_span!(
        "job",
        id = job.id,
        kind = %job.kind,
        queue = %job.queue,
        attempt = job.attempt
    );
    let _entered = span.enter();
    tracing::debug!("job started");
    let started = Instant::now();
    let handled = match handlers.get(&job.kind) {
        Some(handler) => catch_unwind(AssertUnwindSafe(|| handler(ctx))),
        // Not reached by a worker: only registered kinds are leased.
        None => Ok(Handled::Failed(JobError::retry(format!(
            "no handler for kind {:?} in this worker",
            job.kind
        )))),
    };
    let outcome = match handled {
        Ok(Handled::Output(result)) => Outcome::Complete(result),
        Ok(Handled::Failed(error)) => error.into_outcome(job.attempt, policy),
        Ok(Handled::Undecodable(message)) => Outcome::Dead(message),
        Err(panic) => JobError::retry(format!(
            "handler panicked: {}",
            panic_message(panic.as_ref())
        ))
        .into_outcome(job.attempt, policy),
    };
    log_finished(
        job,
        &outcome,
        started.elapsed(),
        ctx.completed_in_transaction(),
    );
    outcome
}

/// The "job finished" event: info for a success, warn for a failure that
/// will be retried or a discard, error for a job that goes dead.
fn log_finished(job: &Job, outcome: &Outcome, duration: Duration, in_transaction: bool) {
    match outcome {
        // Completed in `ctx.transaction`: whatever the handler returned next
        // changes nothing.
        _ if in_transaction => tracing::info!(
            ?duration,
            outcome = "completed",
            in_transaction,
            "job finished"
        ),
        Outcome::Complete(_) => tracing::info!(?duration, outcome = "completed", "job finished"),
        Outcome::Fail { error, retry_after } if !job.is_last_attempt() => tracing::warn!(
            ?duration,
            outcome = "retry",
            error = %error,
            retry_in = ?retry_after,
            "job failed; it will be retried"
        ),
        Outcome::Fail { error, .. } => tracing::error!(
            ?duration,
            outcome = "dead",
            error = %error,
            max_attempts = job.max_attempts,
            "job failed on its last attempt; it is dead"
        ),
        Outcome::Dead(error) => tracing::error!(
            ?duration,
            outcome = "dead",
            error = %error,
            "job cannot run (its payload does not decode); it is dead"
        ),
        Outcome::Snooze(delay) => {
            tracing::info!(?duration, outcome = "snoozed", ?delay, "job finished")
        }
        Outcome::Discard(reason) => tracing::warn!(
            ?duration,
            outcome = "discarded",
            reason = %reason,
            "job discarded"
        ),
        Outcome::Cancel(reason) => tracing::info!(
            ?duration,
            outcome = "cancelled",
            reason = %reason,
            "job cancelled"
        ),
        Outcome::Release => tracing::info!(?duration, outcome = "released", "job finished"),
    }
}

/// A panic's message, when it is a string.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use serde_json::json;

    use crate::lease::Lease;
    use crate::sqlite::{JobContextExt, QueueExt};
    use crate::{Event, NewJob, Queue, Worker};

    /// Every lease settled inside a transaction is recorded by the queue
    /// (`ctx.transaction` records its own too); the worker takes each record
    /// when the handler returns, so none outlives its job.
    #[test]
    fn no_settled_in_record_outlives_its_job() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|e| crate::Error::Database(Box::new(e)))?;
        let queue = Queue::open(dir.path().join("q.db"))?;
        let events = queue.subscribe();
        for kind in ["in_ctx_tx", "in_own_tx"] {
            for n in 0..5 {
                queue.enqueue(NewJob::new(kind, json!(n)))?;
            }
        }
        let leases: Arc<Mutex<Vec<Lease>>> = Arc::default();
        let (seen, seen2, q) = (leases.clone(), leases.clone(), queue.clone());
        let worker = Worker::builder(queue.clone())
            .handle_raw("in_ctx_tx", move |_, ctx| {
                seen.lock().unwrap().push(ctx.job().lease());
                ctx.transaction(|_| Ok(()))
            })
            .handle_raw("in_own_tx", move |_, ctx| {
                seen2.lock().unwrap().push(ctx.job().lease());
                q.transaction(|tx| q.complete_in(tx, ctx.job(), None))?;
                Ok(())
            })
            .start()?;
        let mut completed = 0;
        while completed < 10 {
            match events.recv_timeout(Duration::from_secs(30)) {
                Ok(Event::Completed { .. }) => completed += 1,
                Ok(_) => {}
                Err(_) => panic!("timed out: {completed} of 10 completed"),
            }
        }
        worker.shutdown(Duration::from_secs(10))?;
        let leases = leases.lock().unwrap();
        assert_eq!(leases.len(), 10);
        for lease in leases.iter() {
            assert!(!queue.take_settled_in(*lease), "{lease:?} left behind");
        }
        Ok(())
    }
}
