//! Settling leased jobs: complete, fail, snooze, discard, release, one at a
//! time or in batches, and the events their transitions produce.

use std::time::Duration;

use serde_json::Value;

use crate::backend::params::{LeaseParams, SettleAndLeaseParams, SettleParams};
use crate::clock::{self, add_micros};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::lease::{Job, LeaseRequest};
use crate::outcome::{decide, FinalStatus, Outcome, Transition};

use super::Queue;

impl Queue {
    /// Completes a leased job: it moves to history as `completed` with an
    /// optional JSON result. `LeaseLost` if the lease is no longer held.
    pub fn complete(&self, job: &Job, result: Option<Value>) -> Result<()> {
        self.settle(job, Outcome::Complete(result))
    }

    /// Records a failed attempt: retried after the kind's backoff, or moved to
    /// history as `dead` when this was the last attempt.
    pub fn fail(&self, job: &Job, error: impl Into<String>) -> Result<()> {
        self.settle(job, Outcome::fail(error))
    }

    /// Reschedules a leased job after `delay` without using an attempt.
    pub fn snooze(&self, job: &Job, delay: Duration) -> Result<()> {
        self.settle(job, Outcome::Snooze(delay))
    }

    /// Discards a leased job: it moves to history as `discarded`.
    pub fn discard(&self, job: &Job, reason: impl Into<String>) -> Result<()> {
        self.settle(job, Outcome::Discard(reason.into()))
    }

    /// Gives a leased job back, available at once, without using an attempt.
    pub fn release(&self, job: &Job) -> Result<()> {
        self.settle(job, Outcome::Release)
    }

    /// Applies any outcome to a leased job, in its own transaction.
    pub fn settle(&self, job: &Job, outcome: Outcome) -> Result<()> {
        let mut results = self.settle_many([(job, outcome)])?;
        results
            .pop()
            .unwrap_or_else(|| Err(Error::Database("settle returned no result".into())))
    }

    /// Applies many outcomes in one transaction (group commit). The outer
    /// `Result` fails only if the transaction does; each item's own result is
    /// `Err(LeaseLost)` when its lease was no longer held (that item changed
    /// nothing, the others were applied).
    pub fn settle_many<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a Job, Outcome)>,
    ) -> Result<Vec<Result<()>>> {
        Ok(self.settle_many_and_lease(items, None, None)?.0)
    }

    /// [`Queue::settle_many`], and in the same transaction a lease of
    /// `refill` (when given and its limit is not zero): the worker's
    /// completer hands the slots its outcomes free to the next jobs with one
    /// commit for both. With `until`, given up then (a worker's shutdown).
    pub(crate) fn settle_many_and_lease<'a>(
        &self,
        items: impl IntoIterator<Item = (&'a Job, Outcome)>,
        refill: Option<&LeaseRequest>,
        until: Option<std::time::Instant>,
    ) -> Result<(Vec<Result<()>>, Vec<Job>)> {
        let now = self.now_micros();
        let refill = match refill {
            Some(r) if r.limit > 0 && r.kinds.as_ref().is_none_or(|k| !k.is_empty()) => {
                let (queues, kinds) = self.check_lease(r)?;
                Some((r, queues, kinds, add_micros(now, r.ttl)?))
            }
            _ => None,
        };
        let lease = refill
            .as_ref()
            .map(|(r, queues, kinds, until)| LeaseParams {
                queues,
                kinds: kinds.as_deref(),
                limit: r.limit,
                worker_id: &r.worker_id,
                now,
                lease_until: *until,
                caps: &r.queue_caps,
            });
        // (job, released, params): a release and a snooze make the same
        // transition but are different events.
        let items: Vec<(&Job, bool, SettleParams)> = items
            .into_iter()
            .map(|(job, outcome)| {
                let released = matches!(outcome, Outcome::Release);
                Ok((job, released, self.settle_params(job, outcome, now)?))
            })
            .collect::<Result<_>>()?;
        let params: Vec<&SettleParams> = items.iter().map(|(_, _, p)| p).collect();
        let queues: Vec<&str> = items.iter().map(|(job, _, _)| job.queue.as_str()).collect();
        let (results, jobs) = self.store().settle_and_lease(&SettleAndLeaseParams {
            items: &params,
            queues: &queues,
            lease: lease.as_ref(),
            until,
        })?;
        if !jobs.is_empty() {
            // A lease committed here as in `lease`: the completer's refill.
            failpoint!("lease-after-commit");
        }
        // A job made runnable again at some time (a retry, a snooze) may be
        // due before whatever this process's fetchers are sleeping toward;
        // no server notification says so (PostgreSQL notifies enqueues only).
        let rescheduled = items.iter().zip(&results).any(|((_, _, p), r)| {
            matches!(r, Ok(false)) && matches!(p.transition, Transition::Reschedule { .. })
        });
        if rescheduled {
            self.inner.bus.ring();
        }
        if self.inner.bus.has_listeners() {
            self.inner.bus.emit(items.iter().zip(&results).filter_map(
                |((job, released, p), r)| match r {
                    Ok(true) => Some(Event::Cancelled { job_id: job.id }),
                    Ok(false) => Some(settled_event(job, *released, &p.transition)),
                    Err(_) => None,
                },
            ));
            self.emit_leased(&jobs);
        }
        Ok((results.into_iter().map(|r| r.map(|_| ())).collect(), jobs))
    }

    /// Completes every job in one transaction.
    pub fn complete_many<'a>(
        &self,
        jobs: impl IntoIterator<Item = &'a Job>,
    ) -> Result<Vec<Result<()>>> {
        self.settle_many(jobs.into_iter().map(|j| (j, Outcome::Complete(None))))
    }

    pub(crate) fn settle_params(
        &self,
        job: &Job,
        outcome: Outcome,
        now: i64,
    ) -> Result<SettleParams> {
        let policy = self.inner.options.policy_for(&job.kind);
        Ok(SettleParams {
            lease: job.lease(),
            transition: decide(job, outcome, now, policy)?,
            now,
        })
    }
}

/// The event a committed transition produces. `released`: the outcome was
/// [`Outcome::Release`], which reschedules as a snooze does.
fn settled_event(job: &Job, released: bool, transition: &Transition) -> Event {
    let (job_id, attempt) = (job.id, job.attempt);
    match transition {
        Transition::Finish { status, .. } => match status {
            // Only the aggregator writes `aggregated`, never a settle.
            FinalStatus::Completed | FinalStatus::Aggregated => Event::Completed { job_id },
            FinalStatus::Discarded => Event::Discarded { job_id },
            FinalStatus::Cancelled => Event::Cancelled { job_id },
            FinalStatus::Dead => Event::Dead { job_id },
        },
        Transition::Reschedule { .. } if released => Event::Released { job_id },
        Transition::Reschedule {
            available_at,
            refund_attempt: true,
            ..
        } => Event::Snoozed {
            job_id,
            available_at: clock::at(*available_at),
        },
        Transition::Reschedule { available_at, .. } => Event::Retried {
            job_id,
            attempt,
            available_at: clock::at(*available_at),
        },
    }
}

/// The handler's half of every database's `JobContextExt::transaction`,
/// once: in the caller's transaction `tx`, its lease already fenced, runs
/// `f`, then completes the job with `f`'s value as its result (`complete`,
/// the database's own completion in `tx`), and marks the job completing so
/// the worker does not complete it again. The crash points of the
/// reliability tests sit between the steps.
pub(crate) fn run_then_complete<X, T: serde::Serialize>(
    ctx: &crate::worker::JobContext,
    tx: &mut X,
    f: impl FnOnce(&mut X) -> std::result::Result<T, crate::worker::JobError>,
    complete: impl FnOnce(&mut X, Option<Value>) -> Result<()>,
) -> std::result::Result<T, crate::worker::JobError> {
    let value = f(tx)?;
    let result = crate::worker::to_result(&value).map_err(crate::worker::JobError::from)?;
    failpoint!("transaction-before-fence");
    complete(tx, result)?;
    failpoint!("transaction-before-commit");
    ctx.mark_completing();
    Ok(value)
}
