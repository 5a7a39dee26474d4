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
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::events::Event;
use crate::lease::Job;
use crate::outcome::Outcome;
use crate::worker::completer::Settle;
use crate::worker::context::{CancelFlag, CancelReason, JobContext};
use crate::worker::error::JobError;
use crate::worker::fetcher::Leased;
use crate::worker::handler::Handled;
use crate::worker::Shared;

pub(crate) struct Executor {
    pub shared: Arc<Shared>,
    pub jobs: Receiver<Leased>,
    pub outcomes: Sender<Settle>,
    pub slot_freed: Sender<()>,
    pub deadline_set: Sender<()>,
    /// Dropped when the thread ends: shutdown waits for every clone to go.
    pub _alive: Sender<()>,
}

impl Executor {
    pub(crate) fn run(self) {
        for (job, cancel) in self.jobs.iter() {
            if self.shared.stopping.load(Ordering::SeqCst) {
                self.settle(job, Outcome::Release);
            } else {
                self.execute(job, cancel);
            }
            self.shared.free.fetch_add(1, Ordering::SeqCst);
            let _ = self.slot_freed.try_send(());
        }
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
        let handled = match shared.handlers.get(&job.kind) {
            Some(handler) => catch_unwind(AssertUnwindSafe(|| handler(&ctx))),
            // Not reached: only registered kinds are leased.
            None => Ok(Handled::Failed(JobError::retry(format!(
                "no handler for kind {:?} in this worker",
                job.kind
            )))),
        };
        let policy = shared.config.retry_policy_for(&job.kind);
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
        // Completed in the handler's own transaction, or owned by another
        // worker now: there is nothing left for the completer to apply.
        if ctx.completed_in_transaction() || cancel.reason() == Some(CancelReason::LeaseLost) {
            shared.inflight.finish(job.id);
            shared.inflight.remove([job.id]);
        } else {
            self.settle(job, outcome);
        }
    }

    /// Hands the outcome to the completer, unless shutdown released the job.
    fn settle(&self, job: Arc<Job>, outcome: Outcome) {
        if self.shared.inflight.finish(job.id) {
            let _ = self.outcomes.send(Settle::Apply(job, outcome));
        }
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
