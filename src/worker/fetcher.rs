//! The fetcher: leases as many jobs as there are free handler slots and hands
//! them to the handler threads, then waits for a reason to lease again.
//!
//! Reasons, in a `select!`: an enqueue in this process (the queue's
//! doorbell), a commit by another connection (`PRAGMA data_version`, checked
//! every watch interval), a handler slot coming free while all were busy, the
//! next scheduled job coming due (delayed, retrying or snoozed: a moment that
//! commits nothing, so the fetcher asks the database when it is and sleeps
//! until then), the idle poll (a safety net), and shutdown. With nothing to
//! do it sleeps in that `select!`: no busy loop.
//!
//! A place of a concurrency limit that another process frees commits
//! nothing that a server's watcher reports (PostgreSQL notifies enqueues,
//! MySQL's poller watches new ids; SQLite's data version sees every
//! commit). So a lease of a limited queue that came back short is tried
//! again soon: after [`PLACE_RETRY_MIN`], doubling while leases find
//! nothing, up to [`PLACE_RETRY_MAX`], and at once when this process
//! settles a job (its place is free). Once at the longest wait, a look at
//! whether the limited queues have jobs waiting at all decides: if not,
//! the queue ran dry rather than full, and the fetcher waits as any idle
//! one, until a change or its idle poll. An idle worker pays one such look,
//! and up to seven leases, each with the reads of when the next job comes
//! due and of the limits that follow every short lease, each time it runs
//! dry.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, SendError, Sender};

use crate::backend::ChangeWatcher;
use crate::inspect::{JobFilter, JobState};
use crate::lease::{Job, LeaseRequest};
use crate::outcome::Outcome;
use crate::worker::context::CancelFlag;
use crate::worker::Shared;

/// After a lease of a concurrency-limited queue came back short, the wait
/// before the next one (on a server; see the module's doc).
pub(crate) const PLACE_RETRY_MIN: Duration = Duration::from_millis(2);

/// The longest wait between two leases while a limited queue's places are
/// all taken and its jobs wait: how late at most a place freed by another
/// process is taken up here. Bounds the cost to ten leases a second, each
/// with its reads (see the module's doc).
pub(crate) const PLACE_RETRY_MAX: Duration = Duration::from_millis(100);

/// A leased job on its way to a handler thread.
pub(crate) type Leased = (Arc<Job>, Arc<CancelFlag>);

/// Leased jobs that one handler thread takes in one hand-off, in lease
/// order ([`crate::worker::lookahead::LookAhead::run_length`] of them).
pub(crate) type Run = Vec<Leased>;

/// Records `jobs` in flight and hands them to the handler threads in runs,
/// through `send`. Returns the jobs that could not be handed over (shutdown
/// began, the channel is gone), out of `inflight` again, for release.
pub(crate) fn hand_over(
    shared: &Shared,
    jobs: Vec<Job>,
    mut send: impl FnMut(Run) -> Result<(), Run>,
) -> Vec<Arc<Job>> {
    let mut refused = Vec::new();
    let run_length = shared.lookahead.run_length(jobs.len());
    let mut run: Run = Vec::with_capacity(run_length);
    let mut jobs = jobs.into_iter().map(Arc::new).peekable();
    while let Some(job) = jobs.next() {
        if !refused.is_empty() || shared.stopping.load(Ordering::SeqCst) {
            refused.push(job);
            continue;
        }
        let cancel = shared.inflight.insert(job.clone());
        run.push((job, cancel));
        if run.len() == run_length || jobs.peek().is_none() {
            let full = std::mem::replace(&mut run, Vec::with_capacity(run_length));
            if let Err(back) = send(full) {
                shared.inflight.remove(back.iter().map(|(job, _)| job.id));
                refused.extend(back.into_iter().map(|(job, _)| job));
            }
        }
    }
    refused
}

pub(crate) struct Fetcher {
    pub shared: Arc<Shared>,
    pub request: LeaseRequest,
    pub jobs: Sender<Run>,
    pub doorbell: Receiver<()>,
    pub slot_freed: Receiver<()>,
    pub stop: Receiver<()>,
    pub watcher: ChangeWatcher,
    /// When the next job of the fetcher's queues that is not due yet comes
    /// due, as of the last lease that left slots free.
    pub next_due: Option<Instant>,
    /// The fetcher's queues that had a concurrency limit at the last look.
    pub limited: Vec<String>,
    /// The wait before leasing again while a limited queue's places may be
    /// taken (see the module's doc); `None` otherwise.
    pub place_retry: Option<Duration>,
    /// The limited queues were found with no job waiting, and nothing was
    /// enqueued since: a short lease is a dry queue, not a full one.
    pub dry: bool,
}

/// The idle poll's wait: from a tenth of the poll interval, doubling up to it.
struct IdleBackoff {
    max: Duration,
    current: Duration,
}

impl IdleBackoff {
    fn new(max: Duration) -> Self {
        let mut b = IdleBackoff { max, current: max };
        b.reset();
        b
    }

    fn reset(&mut self) {
        self.current = (self.max / 10).max(Duration::from_millis(1)).min(self.max);
    }

    fn grow(&mut self) {
        self.current = self.current.saturating_mul(2).min(self.max);
    }
}

impl Fetcher {
    pub(crate) fn run(mut self) {
        let config = &self.shared.config;
        let mut idle = IdleBackoff::new(config.poll_interval);
        let watch = self.watcher.signal();
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            self.shared.release_unheld_if_lost();
            self.look_at_limits();
            if self.shared.claimable() >= self.shared.refill_at() && !self.completer_refills() {
                match self.lease() {
                    Some((n, claimed)) if n == claimed => {
                        self.place_retry = None;
                        continue; // maybe more waiting
                    }
                    Some((n, _)) => {
                        if n > 0 {
                            idle.reset();
                        }
                        self.short_lease(n);
                        // Nothing more is due now: when is the next one?
                        self.next_due = match self.shared.queue.next_due_in(&self.request.queues) {
                            Ok(due) => due.map(|d| Instant::now() + d),
                            Err(error) => {
                                // The idle poll finds scheduled jobs meanwhile.
                                tracing::warn!(
                                    %error,
                                    busy = error.is_busy(),
                                    "could not read when the next scheduled job is due; \
                                     polling instead"
                                );
                                None
                            }
                        };
                    }
                    None => idle.grow(), // a database error: back off
                }
            }
            if !self.wait(&watch, &mut idle) {
                return;
            }
        }
    }

    /// After a lease that came back short with `n` jobs: under a
    /// concurrency limit, the limit may be full (the look-ahead gives its
    /// places up, and the next lease comes soon), or the queue dry.
    fn short_lease(&mut self, n: usize) {
        if self.limited.is_empty() {
            self.place_retry = None;
            return;
        }
        self.shared.lookahead.note_binding();
        if self.watcher.sees_every_commit() {
            return; // a place freed anywhere is a commit it reports
        }
        if n > 0 {
            self.dry = false;
        }
        self.place_retry = match self.place_retry {
            _ if self.dry => None,
            Some(wait) if n == 0 && wait >= PLACE_RETRY_MAX => {
                if self.jobs_wait() {
                    Some(PLACE_RETRY_MAX)
                } else {
                    self.dry = true;
                    None
                }
            }
            Some(wait) if n == 0 => Some(wait.saturating_mul(2).min(PLACE_RETRY_MAX)),
            _ => Some(PLACE_RETRY_MIN),
        };
    }

    /// True when a limited queue of the fetcher's has a job due and not
    /// leased (of any kind); true on an error too (the retries go on).
    fn jobs_wait(&self) -> bool {
        self.limited.iter().any(|q| {
            let filter = JobFilter::new(JobState::Available).queue(q).limit(1);
            self.shared
                .queue
                .list(&filter)
                .map_or(true, |page| !page.jobs.is_empty())
        })
    }

    /// True while the completer has outcomes to commit and will refill the
    /// free slots in the same transaction: leasing now would take a commit
    /// of its own for what the completer's carries anyway.
    fn completer_refills(&self) -> bool {
        self.shared.completer_refills() && self.shared.settling.load(Ordering::SeqCst) > 0
    }

    /// Reads the concurrency limits of the worker's queues when due: which
    /// are limited (their short leases are retried soon), and the tightest
    /// limit, for the look-ahead (which a limit it would fill turns off;
    /// not with a prefetch: that is the caller's choice).
    fn look_at_limits(&mut self) {
        let lookahead = &self.shared.lookahead;
        if !lookahead.limits_due() {
            return;
        }
        match self.shared.queue.all_limits() {
            Ok(all) => {
                let limited: Vec<(&String, u32)> = all
                    .iter()
                    .filter(|(name, _)| self.request.queues.contains(name))
                    .filter_map(|(name, limits)| Some((name, limits.concurrency?)))
                    .collect();
                if self.shared.config.prefetch.is_none() {
                    lookahead.set_places(limited.iter().map(|(_, n)| *n).min());
                }
                self.limited = limited.into_iter().map(|(q, _)| q.clone()).collect();
            }
            // The last look stands; the next one is a look later.
            Err(error) => tracing::debug!(%error, "could not read the queues' limits"),
        }
    }

    /// Claims the free slots, leases up to as many jobs and hands them over.
    /// Returns (jobs leased, slots claimed); `None` on a database error (it
    /// is retried after the idle wait).
    fn lease(&mut self) -> Option<(usize, usize)> {
        let claimed = self.shared.claim_slots();
        if claimed == 0 {
            return Some((0, 0)); // the completer took them
        }
        self.request.limit = claimed;
        let _leasing = self.shared.lease_on_its_way();
        // Held until the jobs are in `inflight`, which the caps count.
        let _gate = self.shared.queue_caps().map(|(gate, caps)| {
            self.request.queue_caps = caps;
            gate
        });
        let jobs = match self.shared.queue.lease(&self.request) {
            Ok(jobs) => jobs,
            Err(error) => {
                tracing::warn!(
                    %error,
                    busy = error.is_busy(),
                    "leasing jobs failed; retrying after the idle wait"
                );
                self.shared.lease_failed(&error);
                self.shared.give_back(claimed);
                return None;
            }
        };
        let n = jobs.len();
        self.shared.give_back(claimed - n);
        // A lease that another process's lock held up past the start of a
        // shutdown comes back when no handler thread may be left to release
        // its jobs: release them here.
        // Never blocks: the channel holds as many runs as there are slots.
        let refused = hand_over(&self.shared, jobs, |run| {
            self.jobs.send(run).map_err(|SendError(run)| run)
        });
        if !refused.is_empty() {
            self.shared.give_back(refused.len());
            let items = refused.iter().map(|j| (j.as_ref(), Outcome::Release));
            // On failure their leases expire and the rescuer frees them.
            if let Err(error) = self.shared.queue.settle_many(items) {
                tracing::warn!(
                    %error,
                    jobs = refused.len(),
                    "releasing jobs leased during shutdown failed; their leases will expire"
                );
            }
        }
        Some((n, claimed))
    }

    /// Waits for a reason to lease again. False on shutdown.
    fn wait(&mut self, watch: &Receiver<Instant>, idle: &mut IdleBackoff) -> bool {
        let polled_at = Instant::now() + idle.current;
        let mut deadline = match self.next_due {
            Some(due) if due < polled_at => due,
            _ => polled_at,
        };
        let place_at = self.place_retry.map(|wait| Instant::now() + wait);
        if let Some(at) = place_at.filter(|at| *at < deadline) {
            deadline = at;
        }
        loop {
            if self.shared.claimable() < self.shared.refill_at() || self.completer_refills() {
                // Too few slots free to lease, or the completer is about to
                // refill them: only a freed slot (or shutdown) matters.
                select! {
                    recv(self.stop) -> _ => return false,
                    recv(self.slot_freed) -> _ => return true,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            select! {
                recv(self.stop) -> _ => return false,
                recv(self.doorbell) -> _ => {
                    self.dry = false;
                    return true;
                }
                recv(self.slot_freed) -> _ => {
                    // Slots were free already; but a job of a capped queue
                    // finishing frees room in its cap, and one of a limited
                    // queue a place of its limit.
                    if !self.shared.config.queue_concurrency.is_empty()
                        || self.place_retry.is_some()
                    {
                        return true;
                    }
                }
                recv(watch) -> _ => {
                    // An error (say, a lock during WAL recovery) counts as a change.
                    if self.watcher.changed().unwrap_or(true) {
                        self.dry = false;
                        return true;
                    }
                }
                default(left) => {
                    if Some(deadline) == place_at {
                        // A place may have come free: lease.
                    } else if deadline == polled_at {
                        idle.grow();
                    } else {
                        self.next_due = None; // it came due: lease it
                    }
                    return true;
                }
            }
        }
    }
}
