//! Leasing and keeping leases: claims, heartbeats, progress writes and the
//! rescue of expired leases.

use std::time::Duration;

use crate::backend::params::{
    ExpiredLease, HeartbeatParams, LeaseParams, ProgressWrite, ReleaseUnheldParams, RescueParams,
    SettleParams,
};
use crate::clock::{self, add_micros};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::lease::{HeartbeatReport, Job, Lease, LeaseRequest, RescueReport};
use crate::outcome::{AttemptError, FinalStatus, Transition};
use crate::sync;
use crate::validate;

use super::Queue;

impl Queue {
    /// The plan of the statement [`Queue::lease`] would run for `request`
    /// (SQLite's `EXPLAIN QUERY PLAN`, the server's `EXPLAIN`), one line per
    /// plan node. Claims nothing. For tests that pin the lease to its index.
    #[doc(hidden)]
    pub fn explain_lease(&self, request: &LeaseRequest) -> Result<Vec<String>> {
        let now = self.now_micros();
        self.store().explain_lease(&LeaseParams {
            queues: &request.queues,
            kinds: request.kinds.as_deref(),
            limit: request.limit,
            worker_id: &request.worker_id,
            now,
            lease_until: add_micros(now, request.ttl)?,
            caps: &request.queue_caps,
        })
    }

    /// Claims up to the request's limit of available jobs, in `priority DESC,
    /// available_at, id` order, skipping paused queues. Each claim increments
    /// the job's attempts and gets a fresh random lease token.
    pub fn lease(&self, request: &LeaseRequest) -> Result<Vec<Job>> {
        let (queues, kinds) = self.check_lease(request)?;
        if kinds.as_ref().is_some_and(|k| k.is_empty()) {
            return Ok(Vec::new());
        }
        let now = self.now_micros();
        let jobs = self.store().lease(&LeaseParams {
            queues: &queues,
            kinds: kinds.as_deref(),
            limit: request.limit,
            worker_id: &request.worker_id,
            now,
            lease_until: add_micros(now, request.ttl)?,
            caps: &request.queue_caps,
        })?;
        if !jobs.is_empty() {
            failpoint!("lease-after-commit");
        }
        self.emit_leased(&jobs);
        Ok(jobs)
    }

    pub(super) fn emit_leased(&self, jobs: &[Job]) {
        self.inner.bus.emit(jobs.iter().map(|j| Event::Leased {
            job_id: j.id,
            attempt: j.attempt,
            queue: j.queue.clone(),
            kind: j.kind.clone(),
            available_at: j.available_at,
        }));
    }

    /// Validates a lease request; its queues and kinds sorted, without
    /// duplicates (a queue or kind named twice would be walked twice, and
    /// its candidates counted twice against the limit).
    #[allow(clippy::type_complexity)]
    pub(super) fn check_lease(
        &self,
        request: &LeaseRequest,
    ) -> Result<(Vec<String>, Option<Vec<String>>)> {
        if request.limit == 0 {
            return Err(Error::InvalidArgument(
                "a lease must ask for at least 1 job".into(),
            ));
        }
        if request.queues.is_empty() {
            return Err(Error::InvalidArgument(
                "a lease needs at least one queue".into(),
            ));
        }
        validate::name("worker id", &request.worker_id)?;
        for queue in &request.queues {
            validate::name("queue", queue)?;
        }
        if let Some(kinds) = &request.kinds {
            for kind in kinds {
                validate::name("kind", kind)?;
            }
        }
        for (queue, _) in &request.queue_caps {
            validate::name("queue", queue)?;
        }
        let mut queues = request.queues.clone();
        queues.sort_unstable();
        queues.dedup();
        let kinds = request.kinds.clone().map(|mut kinds| {
            kinds.sort_unstable();
            kinds.dedup();
            kinds
        });
        Ok((queues, kinds))
    }

    /// Extends every given lease still held to `ttl` from now, in one
    /// statement, and reports the leases lost and the jobs asked to cancel.
    pub fn heartbeat(&self, leases: &[Lease], ttl: Duration) -> Result<HeartbeatReport> {
        if leases.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let now = self.now_micros();
        self.store().heartbeat(&HeartbeatParams {
            leases,
            lease_until: add_micros(now, ttl)?,
            now,
        })
    }

    /// Taken around reading the progress to write and writing it, so an
    /// older value read by one writer (heartbeater, completer, a handler's
    /// manual heartbeat) never lands after a newer one written by another.
    pub(crate) fn progress_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        sync::lock(&self.inner.progress_gate)
    }

    /// Writes running jobs' progress, fenced on their leases, in one
    /// transaction; returns the ids written (the others' leases were lost,
    /// or on a server, without `wait`, their rows were held by another
    /// transaction).
    pub(crate) fn write_progress(&self, writes: &[ProgressWrite], wait: bool) -> Result<Vec<i64>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        self.store().write_progress(writes, self.now_micros(), wait)
    }

    /// Releases every job leased under `worker_id` whose id is not in
    /// `held`, and returns their ids: the claims of a lease whose commit
    /// reached the database while its answer was lost (a network cut), so
    /// that nobody runs them. Each goes back to waiting, due at once in the
    /// place in line it had, its attempt given back (nothing ran it); one
    /// whose cancel was requested meanwhile is cancelled. A job in `held` and
    /// a job leased under another worker id are left alone.
    ///
    /// A [`Worker`](crate::Worker) calls this itself when the server answers
    /// again after a lease failed for want of it. Call it only while no
    /// lease of `worker_id` is on its way, with every job that worker holds:
    /// a job missing from `held` loses its lease.
    pub fn release_unheld(&self, worker_id: &str, held: &[i64]) -> Result<Vec<i64>> {
        let now = self.now_micros();
        let decide = |unheld: &ExpiredLease| SettleParams {
            lease: unheld.lease,
            transition: crate::outcome::unclaim(unheld.available_at, unheld.cancel_requested, now),
            now,
        };
        let done = self.store().release_unheld(&ReleaseUnheldParams {
            worker_id,
            held,
            now,
            decide: &decide,
        })?;
        for (unheld, _) in &done {
            tracing::warn!(
                job_id = unheld.lease.job_id,
                worker_id,
                "released a job leased by a lease whose answer was lost; \
                 it runs again without losing an attempt"
            );
        }
        self.inner.bus.emit(done.iter().map(|(unheld, p)| {
            let job_id = unheld.lease.job_id;
            match p.transition {
                Transition::Finish { .. } => Event::Cancelled { job_id },
                Transition::Reschedule { .. } => Event::Released { job_id },
            }
        }));
        Ok(done.iter().map(|(unheld, _)| unheld.lease.job_id).collect())
    }

    /// Makes up to `limit` jobs whose lease expired available again, in the
    /// place in line they had (their `available_at` is kept), or moves them to
    /// history as `dead` when their last attempt expired. Never decodes
    /// payloads. Call repeatedly until it reports fewer than `limit`.
    pub fn rescue(&self, limit: usize) -> Result<RescueReport> {
        let now = self.now_micros();
        let decide = |expired: &ExpiredLease| {
            let error = AttemptError {
                attempt: expired.attempts,
                at: clock::at(now),
                message:
                    "lease expired: the worker stopped heartbeating (crashed, hung or stopped)"
                        .to_owned(),
            };
            let transition = if expired.cancel_requested {
                // Its worker died before it could honour the cancel request.
                Transition::Finish {
                    status: FinalStatus::Cancelled,
                    result: None,
                    error: Some(AttemptError {
                        message: "cancelled by request; the worker's lease expired first".into(),
                        ..error
                    }),
                }
            } else if expired.attempts >= expired.max_attempts {
                Transition::Finish {
                    status: FinalStatus::Dead,
                    result: None,
                    error: Some(error),
                }
            } else {
                // The expired claim counts as an attempt, so a job that kills
                // its worker every time still ends up dead. The job keeps its
                // place in line: due now would put it behind every job that
                // is waiting, and a backlog would delay its recovery past
                // lease TTL + rescue interval.
                Transition::Reschedule {
                    available_at: expired.available_at.min(now),
                    error: Some(error),
                    refund_attempt: false,
                }
            };
            SettleParams {
                lease: expired.lease,
                transition,
                now,
            }
        };
        let done = self.store().rescue(&RescueParams {
            now,
            limit,
            decide: &decide,
        })?;
        if !done.is_empty() {
            failpoint!("rescue");
        }
        for (expired, p) in &done {
            let became = match p.transition {
                Transition::Finish { status, .. } => status.as_str(),
                Transition::Reschedule { .. } => "available",
            };
            tracing::warn!(
                job_id = expired.lease.job_id,
                attempt = expired.attempts,
                max_attempts = expired.max_attempts,
                became,
                "rescued a job whose lease expired: its worker stopped heartbeating \
                 (crashed, hung or stopped)"
            );
        }
        self.inner
            .bus
            .emit(done.iter().map(|(expired, p)| match p.transition {
                Transition::Finish {
                    status: FinalStatus::Cancelled,
                    ..
                } => Event::Cancelled {
                    job_id: expired.lease.job_id,
                },
                Transition::Finish { .. } => Event::Dead {
                    job_id: expired.lease.job_id,
                },
                Transition::Reschedule { .. } => Event::Rescued {
                    job_id: expired.lease.job_id,
                },
            }));
        let finished = |wanted: FinalStatus| {
            done.iter()
                .filter(|(_, s)| {
                    matches!(s.transition, Transition::Finish { status, .. } if status == wanted)
                })
                .count()
        };
        let (dead, cancelled) = (
            finished(FinalStatus::Dead),
            finished(FinalStatus::Cancelled),
        );
        Ok(RescueReport {
            rescued: done.len() - dead - cancelled,
            dead,
            cancelled,
        })
    }
}
