//! The jobs a worker holds leases on, from lease to settled: what the
//! heartbeater extends, what timeouts watch, and what shutdown releases.
//!
//! One mutex guards the map; every transition of an entry happens under it,
//! so a job released by shutdown can never also be settled by its handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::backend::ProgressWrite;
use crate::lease::{Job, Lease};
use crate::sync;
use crate::worker::context::{CancelFlag, CancelReason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Leased, waiting in the handler channel.
    Queued,
    /// Its handler is running.
    Running,
    /// Its handler returned; the outcome waits in the completer.
    Settling,
}

#[derive(Debug)]
struct Entry {
    job: Arc<Job>,
    cancel: Arc<CancelFlag>,
    stage: Stage,
    deadline: Option<Instant>,
}

/// The worker's leased jobs.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    entries: Mutex<HashMap<i64, Entry>>,
    /// Signalled whenever a handler finishes, for shutdown's wait.
    finished: Condvar,
    /// Threads waiting on `finished`, changed under the mutex. A notify is a
    /// system call even with no waiter; with none, it is skipped, which
    /// saves one per job.
    waiters: AtomicUsize,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<i64, Entry>> {
        sync::lock(&self.entries)
    }

    /// Records a freshly leased job.
    pub(crate) fn insert(&self, job: Arc<Job>) -> Arc<CancelFlag> {
        let cancel = Arc::new(CancelFlag::default());
        self.lock().insert(
            job.id,
            Entry {
                job,
                cancel: cancel.clone(),
                stage: Stage::Queued,
                deadline: None,
            },
        );
        cancel
    }

    /// Jobs of `queue` held and not yet finished by their handler (queued or
    /// running): what a per-queue cap of the worker counts.
    pub(crate) fn held_of(&self, queue: &str) -> usize {
        self.lock()
            .values()
            .filter(|e| e.stage != Stage::Settling && e.job.queue == queue)
            .count()
    }

    /// Marks a job's handler as started, with its deadline. False when the
    /// job is no longer held here (released by shutdown).
    pub(crate) fn start(&self, job_id: i64, deadline: Option<Instant>) -> bool {
        match self.lock().get_mut(&job_id) {
            Some(entry) if entry.stage == Stage::Queued => {
                entry.stage = Stage::Running;
                entry.deadline = deadline;
                true
            }
            _ => false,
        }
    }

    /// Marks a job's handler as finished. True when its outcome should be
    /// settled; false when shutdown released it meanwhile.
    pub(crate) fn finish(&self, job_id: i64) -> bool {
        let settle = match self.lock().get_mut(&job_id) {
            Some(entry) => {
                entry.stage = Stage::Settling;
                true
            }
            None => false,
        };
        self.notify_finished();
        settle
    }

    /// Wakes shutdown's wait, if one is waiting. Called after the change,
    /// once the mutex is released: a waiter counted itself under the mutex
    /// before it last looked, so it either saw the change or is counted.
    fn notify_finished(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.finished.notify_all();
        }
    }

    /// Forgets jobs that were settled (or whose settling failed: their leases
    /// will expire and the rescuer makes them available again).
    pub(crate) fn remove(&self, job_ids: impl IntoIterator<Item = i64>) {
        let mut entries = self.lock();
        for id in job_ids {
            entries.remove(&id);
        }
        drop(entries);
        self.notify_finished();
    }

    /// The ids of every job held, in any stage.
    pub(crate) fn ids(&self) -> Vec<i64> {
        self.lock().keys().copied().collect()
    }

    /// The leases to extend: every job held whose lease is not known lost.
    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.lock()
            .values()
            .filter(|e| e.cancel.reason() != Some(CancelReason::LeaseLost))
            .map(|e| e.job.lease())
            .collect()
    }

    /// Writes the progress their handlers reported since the last write, of
    /// every job held (`only` `None`) or of the jobs in `only`, whose lease
    /// is not known lost: one transaction for all of them, none without
    /// progress to write. What is not written (a write that fails, a row a
    /// server skipped as locked) stays pending for the next call.
    ///
    /// With `wait`, a server backend waits for a row another transaction
    /// holds (the write before a settle) instead of skipping it.
    pub(crate) fn write_progress(&self, queue: &crate::Queue, only: Option<&[i64]>, wait: bool) {
        let _gate = queue.progress_gate();
        let entries = self.lock();
        // The completer's call names its batch (up to 100 of the 132 jobs a
        // look-ahead holds): looked up by id, not each entry searched for in
        // the batch, which cost 13,000 comparisons a flush.
        let chosen: Vec<&Entry> = match only {
            Some(ids) => {
                let mut ids = ids.to_vec();
                ids.sort_unstable();
                ids.dedup();
                ids.iter().filter_map(|id| entries.get(id)).collect()
            }
            None => entries.values().collect(),
        };
        let pending: Vec<(ProgressWrite, u64, Arc<CancelFlag>)> = chosen
            .into_iter()
            .filter(|e| e.cancel.reason() != Some(CancelReason::LeaseLost))
            .filter_map(|e| {
                let (progress, version) = e.cancel.unwritten_progress()?;
                let write = ProgressWrite {
                    lease: e.job.lease(),
                    progress,
                };
                Some((write, version, e.cancel.clone()))
            })
            .collect();
        drop(entries);
        if pending.is_empty() {
            return;
        }
        let writes: Vec<ProgressWrite> = pending.iter().map(|(w, _, _)| w.clone()).collect();
        match queue.write_progress(&writes, wait) {
            Ok(written) => {
                for (write, version, cancel) in &pending {
                    if written.contains(&write.lease.job_id) {
                        cancel.progress_written(*version);
                    }
                }
            }
            Err(error) => tracing::warn!(
                %error,
                jobs = writes.len(),
                "writing jobs' progress failed; it is tried again with the next heartbeat"
            ),
        }
    }

    /// Sets the flag of each job whose lease was lost; returns the jobs for
    /// which this is news.
    pub(crate) fn lose(&self, leases: &[Lease]) -> Vec<i64> {
        let entries = self.lock();
        leases
            .iter()
            .filter_map(|l| entries.get(&l.job_id).filter(|e| e.job.lease() == *l))
            .filter(|e| e.cancel.lose_lease())
            .map(|e| e.job.id)
            .collect()
    }

    /// [`InFlight::lose`] for a heartbeat's report, which may be older than
    /// this worker's own settling: a job completed in its handler's
    /// transaction, or whose outcome is with the completer (which fences it
    /// and reports a lost lease itself), was settled here, not lost.
    ///
    /// `settled_in` takes the queue's record of a lease its handler settled
    /// in a transaction of its own (`complete_in`); such a job is marked
    /// completing instead, for its handler thread to find. Under this lock,
    /// so that the handler thread, which marks the job settling under it
    /// before it takes the record itself, sees one or the other.
    pub(crate) fn lose_unsettled(
        &self,
        leases: &[Lease],
        settled_in: impl Fn(Lease) -> bool,
    ) -> Vec<i64> {
        let entries = self.lock();
        leases
            .iter()
            .filter_map(|l| entries.get(&l.job_id).filter(|e| e.job.lease() == *l))
            .filter(|e| e.stage != Stage::Settling && !e.cancel.is_completing())
            .filter(|e| {
                let settled = settled_in(e.job.lease());
                if settled {
                    e.cancel.set_completing(true);
                }
                !settled
            })
            .filter(|e| e.cancel.lose_lease())
            .map(|e| e.job.id)
            .collect()
    }

    /// Sets the flag of each job whose cancellation was requested.
    pub(crate) fn cancel(&self, job_ids: &[i64], reason: CancelReason) {
        let entries = self.lock();
        for id in job_ids {
            if let Some(entry) = entries.get(id) {
                entry.cancel.cancel(reason);
            }
        }
    }

    /// Flags the running jobs whose deadline passed; returns the next deadline
    /// still ahead.
    pub(crate) fn check_deadlines(&self, now: Instant) -> Option<Instant> {
        let entries = self.lock();
        let mut next: Option<Instant> = None;
        for entry in entries.values().filter(|e| e.stage == Stage::Running) {
            match entry.deadline {
                Some(d) if d <= now => {
                    let first = entry.cancel.cancel(CancelReason::Timeout);
                    if first {
                        tracing::warn!(
                            job_id = entry.job.id,
                            kind = %entry.job.kind,
                            overdue = ?now.saturating_duration_since(d),
                            "job ran past its timeout; its cancellation flag is set"
                        );
                    }
                }
                Some(d) if entry.cancel.reason().is_none() => {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
                _ => {}
            }
        }
        next
    }

    /// Waits until no handler is queued or running, or `until` passes. True
    /// when none is.
    pub(crate) fn wait_handlers_done(&self, until: Instant) -> bool {
        let mut entries = self.lock();
        loop {
            if !entries.values().any(|e| e.stage != Stage::Settling) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.waiters.fetch_add(1, Ordering::SeqCst);
            entries = sync::wait_timeout(&self.finished, entries, left);
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Takes every job whose handler has not finished, setting its flag: the
    /// jobs shutdown releases. Their handlers' outcomes are dropped later.
    pub(crate) fn take_unfinished(&self, reason: CancelReason) -> Vec<Arc<Job>> {
        let mut entries = self.lock();
        let ids: Vec<i64> = entries
            .iter()
            .filter(|(_, e)| e.stage != Stage::Settling)
            .map(|(id, _)| *id)
            .collect();
        ids.iter()
            .filter_map(|id| entries.remove(id))
            .map(|e| {
                e.cancel.cancel(reason);
                e.job
            })
            .collect()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// How many jobs are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64) -> Arc<Job> {
        Arc::new(Job {
            id,
            lease_token: 7,
            queue: "default".into(),
            kind: "k".into(),
            priority: 0,
            unique_key: None,
            payload: "{}".into(),
            attempt: 1,
            max_attempts: 25,
            available_at: std::time::UNIX_EPOCH,
            lease_until: std::time::UNIX_EPOCH,
            created_at: std::time::UNIX_EPOCH,
        })
    }

    /// A heartbeat that read its leases before this worker settled a job
    /// finds that job gone; that is no lost lease (the hog suite saw
    /// `LeaseLost` events for jobs completed exactly once).
    #[test]
    fn a_heartbeat_reporting_a_job_this_worker_settled_loses_nothing() {
        let inflight = InFlight::default();
        let (running, settling, completing) = (job(1), job(2), job(3));
        for j in [&running, &settling, &completing] {
            inflight.insert(j.clone());
            assert!(inflight.start(j.id, None));
        }
        assert!(inflight.finish(settling.id));
        inflight.lock()[&completing.id].cancel.set_completing(true);

        let report = [running.lease(), settling.lease(), completing.lease()];
        let none = |_| false;
        assert_eq!(inflight.lose_unsettled(&report, none), vec![running.id]);
        assert_eq!(
            inflight.lose_unsettled(&report, none),
            Vec::<i64>::new(),
            "news once"
        );
        let cancelled = |id| inflight.lock()[&id].cancel.reason();
        assert_eq!(cancelled(running.id), Some(CancelReason::LeaseLost));
        assert_eq!(cancelled(settling.id), None);
        assert_eq!(cancelled(completing.id), None);
    }

    /// A handler that completed its job with `complete_in` in a transaction
    /// of its own makes the job vanish for the heartbeat too: not a loss.
    #[test]
    fn a_heartbeat_reporting_a_job_its_handler_settled_in_loses_nothing() {
        let inflight = InFlight::default();
        let (settled_in, lost) = (job(1), job(2));
        for j in [&settled_in, &lost] {
            inflight.insert(j.clone());
            assert!(inflight.start(j.id, None));
        }
        let report = [settled_in.lease(), lost.lease()];
        let news = inflight.lose_unsettled(&report, |l| l == settled_in.lease());
        assert_eq!(news, vec![lost.id]);
        let entry = |id| inflight.lock()[&id].cancel.clone();
        assert_eq!(entry(settled_in.id).reason(), None);
        assert!(entry(settled_in.id).is_completing(), "left for its handler");
    }
}
