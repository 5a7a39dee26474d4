//! The completer: applies handlers' outcomes in batches, one transaction per
//! batch (group commit), flushed when the batch is full or a short delay after
//! its first outcome.
//!
//! Without a look-ahead (jobs of 20 ms or more, a concurrency limit that
//! binds, or `.prefetch(0)`) the same transaction also leases the next jobs
//! for the free handler slots (complete-and-lease): such a worker commits
//! once per batch, not once per batch plus once per freed slot. With one,
//! the fetcher leases in batches and the completer only settles.
//!
//! Such a batch is also committed once no further outcome came within
//! [`REFILL_LINGER`]: each outcome waiting in it holds a handler thread idle
//! (and, under a concurrency limit, a place) until the commit that refills
//! it. Threads that finish together still share one commit; one that
//! finishes alone no longer waits out the delay for others that may take
//! tens of milliseconds more.
//!
//! A batch whose transaction fails because the server cannot be reached (a
//! lost connection, a network cut, a restart) is kept and tried again, every
//! [`UNREACHABLE_RETRY_MAX`] at most, until the server answers: the outcomes
//! are settled moments after it is back, while their leases still hold,
//! instead of waiting for lease expiry and the rescuer. Outcomes that come
//! meanwhile join the batch. Each change stays fenced on its lease token, so
//! an outcome whose lease expired and was rescued meanwhile changes nothing
//! and is reported as a lost lease. Only a shutdown's bound ends the wait.
//!
//! A batch that fails for another reason is retried a few times; if it still
//! fails its jobs are forgotten here and their leases expire, so the rescuer
//! makes them available again: at-least-once holds without the completer.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use crate::events::Event;
use crate::lease::{Job, LeaseRequest};
use crate::outcome::Outcome;
use crate::sync;
use crate::worker::fetcher::hand_over;
use crate::worker::Shared;

/// A message to the completer.
pub(crate) enum Settle {
    /// Apply this outcome to this leased job.
    Apply(Arc<Job>, Outcome),
    /// Flush what came before, giving up at this instant (the shutdown's
    /// bound: what is left is for lease expiry and the rescuer), and stop.
    Stop(Instant),
}

/// What [`Completer::take_queued`] found.
enum Taken {
    None,
    Some,
    /// A stop, with the shutdown's bound when one was sent.
    Stop(Option<Instant>),
}

/// While a batch collects, how often the completer checks whether any
/// handler is still running (an outcome may still come).
const IDLE_CHECK: Duration = Duration::from_micros(250);

/// Without a look-ahead, how long a batch waits for one more outcome before
/// it is committed (see the module's doc): outcomes of threads that finish
/// together come microseconds apart.
const REFILL_LINGER: Duration = Duration::from_micros(250);

/// How often a batch that failed for a reason other than an unreachable
/// server is tried again before it is left to the rescuer.
const ATTEMPTS: u32 = 3;

/// The longest wait between two tries of a batch while the server cannot be
/// reached: the outcomes are settled at most this long (plus a connection's
/// set-up) after it answers again, at a cost of two connection attempts a
/// second while it does not.
const UNREACHABLE_RETRY_MAX: Duration = Duration::from_millis(500);

pub(crate) struct Completer {
    pub shared: Arc<Shared>,
    pub outcomes: Receiver<Settle>,
    /// The worker's lease, to refill the slots a batch frees in its own
    /// transaction.
    pub refill: LeaseRequest,
    pub slot_freed: Sender<()>,
}

impl Completer {
    pub(crate) fn run(self) {
        let size = self.shared.config.completer_batch;
        let delay = self.shared.config.completer_delay;
        let mut batch: Vec<(Arc<Job>, Outcome)> = Vec::with_capacity(size);
        let mut until = None;
        loop {
            let mut stop = match self.outcomes.recv() {
                Ok(Settle::Apply(job, outcome)) => {
                    batch.push((job, outcome));
                    false
                }
                Ok(Settle::Stop(at)) => {
                    until = Some(at);
                    true
                }
                Err(_) => true,
            };
            let flush_at = Instant::now() + delay;
            while !stop && batch.len() < size {
                // No outcome can come soon: waiting would only delay the
                // commit (and, without a look-ahead, the jobs it leases for
                // the idle threads).
                if self.no_outcome_coming() {
                    break;
                }
                if !self.shared.completer_refills() {
                    let step = flush_at.min(Instant::now() + IDLE_CHECK);
                    // Short jobs: outcomes come every few microseconds. A
                    // receive would wake this thread (and make the handler
                    // thread that sends pay for the wake-up) once per job;
                    // sleeping a step and taking what came costs one
                    // wake-up per step.
                    match self.take_queued(&mut batch, size) {
                        Taken::Stop(at) => {
                            until = at.or(until);
                            stop = true;
                        }
                        Taken::Some if batch.len() < size && Instant::now() < flush_at => {
                            thread::sleep(step.saturating_duration_since(Instant::now()));
                        }
                        Taken::Some => {}
                        Taken::None if Instant::now() >= flush_at => break,
                        Taken::None => {
                            thread::sleep(step.saturating_duration_since(Instant::now()));
                        }
                    }
                    continue;
                }
                // Each outcome here keeps its thread idle until the commit:
                // no outcome within the linger (or the delay up), commit.
                let linger = flush_at.min(Instant::now() + REFILL_LINGER);
                match self.outcomes.recv_deadline(linger) {
                    Ok(Settle::Apply(job, outcome)) => batch.push((job, outcome)),
                    Ok(Settle::Stop(at)) => {
                        until = Some(at);
                        stop = true;
                    }
                    Err(RecvTimeoutError::Disconnected) => stop = true,
                    Err(RecvTimeoutError::Timeout) => break,
                }
            }
            if !batch.is_empty() && self.flush(&mut batch, &mut until) {
                stop = true;
            }
            if stop {
                return;
            }
        }
    }

    /// Moves the outcomes queued now into `batch`, up to `size`, without
    /// waiting.
    fn take_queued(&self, batch: &mut Vec<(Arc<Job>, Outcome)>, size: usize) -> Taken {
        let mut taken = Taken::None;
        while batch.len() < size {
            match self.outcomes.try_recv() {
                Ok(Settle::Apply(job, outcome)) => {
                    batch.push((job, outcome));
                    taken = Taken::Some;
                }
                Ok(Settle::Stop(at)) => return Taken::Stop(Some(at)),
                Err(TryRecvError::Disconnected) => return Taken::Stop(None),
                Err(TryRecvError::Empty) => break,
            }
        }
        taken
    }

    /// True when nothing is queued and no job is on its way to an outcome:
    /// without a look-ahead, no handler is running; with one, the worker
    /// holds no job at all (held jobs finish within moments: short jobs,
    /// whose outcomes ride in the same batch).
    fn no_outcome_coming(&self) -> bool {
        let shared = &self.shared;
        self.outcomes.is_empty()
            && if shared.completer_refills() {
                shared.busy.load(Ordering::SeqCst) == 0
            } else {
                shared.free.load(Ordering::SeqCst) == shared.config.slots()
            }
    }

    /// Commits a batch of outcomes and, without a look-ahead, leases jobs
    /// for every free slot in the same transaction: the slots the batch's
    /// handlers freed go to the next jobs with one commit for both
    /// (complete-and-lease). True when a stop arrived while the server was
    /// unreachable (`until` then holds its bound).
    fn flush(&self, batch: &mut Vec<(Arc<Job>, Outcome)>, until: &mut Option<Instant>) -> bool {
        let shared = &self.shared;
        let queue = &shared.queue;
        let claimed = if shared.completer_refills() && !shared.stopping.load(Ordering::SeqCst) {
            shared.claim_slots()
        } else {
            0
        };
        let mut request = self.refill.clone();
        request.limit = claimed;
        let leasing = (claimed > 0).then(|| shared.lease_on_its_way());
        // Held until the jobs are in `inflight`, which the caps count.
        let gate = match (claimed > 0).then(|| shared.queue_caps()).flatten() {
            Some((gate, caps)) => {
                request.queue_caps = caps;
                Some(gate)
            }
            None => None,
        };
        let refill = (claimed > 0).then_some(&request);
        let mut leased = Vec::new();
        let mut wait = Duration::from_millis(50);
        // The batch's last progress goes first, so that history keeps it.
        let ids: Vec<i64> = batch.iter().map(|(job, _)| job.id).collect();
        shared.inflight.write_progress(queue, Some(&ids), true);
        let mut stopped = false;
        let mut attempt = 0;
        let mut unreachable_since: Option<Instant> = None;
        loop {
            let items = batch.iter().map(|(job, o)| (job.as_ref(), o.clone()));
            let error = match queue.settle_many_and_lease(items, refill, *until) {
                Ok((results, jobs)) => {
                    failpoint!("completer-after-commit");
                    let lost: Vec<_> = batch
                        .iter()
                        .zip(&results)
                        .filter(|(_, r)| matches!(r, Err(e) if e.is_lease_lost()))
                        .map(|((job, _), _)| job.lease())
                        .collect();
                    let news = shared.inflight.lose(&lost);
                    for job_id in &news {
                        tracing::warn!(
                            job_id,
                            "lease lost: the job's outcome was not applied (its lease \
                             expired and it was rescued, or it was deleted)"
                        );
                    }
                    queue.emit(news.into_iter().map(|job_id| Event::LeaseLost { job_id }));
                    if let Some(since) = unreachable_since {
                        tracing::info!(
                            jobs = batch.len(),
                            unreachable_for = ?since.elapsed(),
                            "the database answers again; settled the outcomes held meanwhile"
                        );
                    }
                    leased = jobs;
                    break;
                }
                Err(error) => error,
            };
            let unreachable = is_unreachable(&error);
            if refill.is_some() {
                shared.lease_failed(&error);
            }
            if unreachable {
                unreachable_since.get_or_insert_with(Instant::now);
                wait = wait.min(UNREACHABLE_RETRY_MAX);
            } else {
                attempt += 1;
            }
            let in_time = until.is_none_or(|u| Instant::now() + wait < u);
            if (unreachable || attempt < ATTEMPTS) && in_time {
                tracing::warn!(
                    %error,
                    busy = error.is_busy(),
                    unreachable,
                    jobs = batch.len(),
                    attempt,
                    retry_in = ?wait,
                    "settling a batch of outcomes failed; retrying"
                );
                // Outcomes that come meanwhile join this batch, and a
                // shutdown's bound is heard, while the server is away.
                let wake = Instant::now() + wait;
                if !stopped {
                    if let Taken::Stop(at) = self.take_queued(batch, usize::MAX) {
                        // No bound sent: the worker is gone, and nobody
                        // waits for these outcomes (nor for this thread).
                        *until = at.or(*until).or(Some(Instant::now()));
                        stopped = true;
                    }
                }
                thread::sleep(wake.saturating_duration_since(Instant::now()));
                wait = (wait * 2).min(if unreachable {
                    UNREACHABLE_RETRY_MAX
                } else {
                    Duration::from_secs(1)
                });
                continue;
            }
            shared.unsettled.fetch_add(batch.len(), Ordering::SeqCst);
            tracing::error!(
                %error,
                busy = error.is_busy(),
                jobs = batch.len(),
                job_ids = ?batch.iter().map(|(job, _)| job.id).collect::<Vec<_>>(),
                attempts = attempt,
                "gave up settling a batch of outcomes; their leases will expire \
                 and the rescuer will make the jobs available again"
            );
            break;
        }
        shared.inflight.remove(batch.iter().map(|(job, _)| job.id));
        shared.settling.fetch_sub(batch.len(), Ordering::SeqCst);
        batch.clear();
        let handed = self.hand_over(leased);
        drop(gate);
        drop(leasing);
        shared.release_unheld_if_lost();
        shared.give_back(claimed - handed);
        if shared.claimable() > 0 {
            // Slots this batch did not refill: the fetcher's now.
            let _ = self.slot_freed.try_send(());
        }
        stopped
    }

    /// Gives leased jobs to the handler threads; returns how many. Jobs that
    /// cannot be handed over (shutdown began) are released at once.
    fn hand_over(&self, jobs: Vec<Job>) -> usize {
        if jobs.is_empty() {
            return 0;
        }
        let shared = &self.shared;
        let leased = jobs.len();
        let refused = {
            let handoff = sync::lock(&shared.handoff);
            hand_over(shared, jobs, |run| match handoff.as_ref() {
                // Never full: the jobs held never exceed the slots, and the
                // channel holds as many runs.
                Some(tx) => tx.try_send(run).map_err(|e| e.into_inner()),
                None => Err(run),
            })
        };
        let handed = leased - refused.len();
        if !refused.is_empty() {
            let items = refused.iter().map(|j| (j.as_ref(), Outcome::Release));
            // On failure their leases expire and the rescuer frees them.
            if let Err(error) = shared.queue.settle_many(items) {
                tracing::warn!(
                    %error,
                    jobs = refused.len(),
                    "releasing jobs leased during shutdown failed; their leases will expire"
                );
            }
        }
        handed
    }
}

/// True when `error` says the database could not be reached (a connection
/// lost or refused, a pool that could not open one): the batch is kept for
/// when it answers again. Other errors (a lock wait, a bad statement) are not
/// the network's and keep the bounded retries.
pub(crate) fn is_unreachable(error: &crate::error::Error) -> bool {
    #[cfg(feature = "postgres")]
    if crate::backend::postgres::connection::is_unreachable(error) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if crate::backend::mysql::connection::is_connectivity(error)
        || crate::backend::mysql::connection::is_refused(error)
    {
        return true;
    }
    let _ = error;
    false
}
