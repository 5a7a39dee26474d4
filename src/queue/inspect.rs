//! Reading jobs and queues, and the per-job and per-queue controls: get,
//! wait, list, counts, retry, run-now, cancel, delete, pause, limits and
//! history pruning; and the finished-job counts' reads and compaction (what
//! they are: [`crate::finished`]).

use std::time::Duration;

use crate::action::{self, Action};
use crate::clock::duration_micros;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::finished::{
    FinishedBucket, FinishedTotal, FinishedTotals, Window, HOURS_KEPT, MINUTES_KEPT,
};
use crate::inspect::{CancelOutcome, JobFilter, JobRecord, JobState, Page, Retention, StateCount};
use crate::limits::QueueLimits;
use crate::outcome::FinalStatus;
use crate::validate;

use super::Queue;

impl Queue {
    /// A job by id, live or finished.
    pub fn get(&self, id: i64) -> Result<JobRecord> {
        self.store()
            .get(id, self.now_micros())?
            .ok_or(Error::NotFound { job_id: id })
    }

    /// Waits until job `id` has finished (completed, dead, discarded or
    /// cancelled), whichever process or node ran it, and returns its final
    /// record: the result of a job enqueued here and run elsewhere.
    ///
    /// It sleeps between looks: this process's own events wake it at once,
    /// another process's commit on SQLite within the watch interval
    /// (`PRAGMA data_version`, every 2 ms), and on a server a look every few
    /// milliseconds, backing off to [`WAIT_MAX_POLL`]. Returns
    /// [`Error::Timeout`] after `timeout` (the job may still finish later) and
    /// [`Error::NotFound`] for an unknown id.
    pub fn wait(&self, id: i64, timeout: Duration) -> Result<JobRecord> {
        let deadline = std::time::Instant::now() + timeout;
        let events = self.subscribe();
        // Polling: a file-notification thread per call would cost more than
        // a counter read every couple of milliseconds for a wait's span.
        let mut watcher = self.store().watch_changes(WAIT_WATCH_INTERVAL, false)?;
        let watch = watcher.signal();
        let mut poll = WAIT_WATCH_INTERVAL;
        loop {
            let record = self.get(id)?;
            if matches!(record.state, JobState::Finished(_)) {
                return Ok(record);
            }
            let next_look = std::time::Instant::now() + poll;
            poll = (poll * 2).min(WAIT_MAX_POLL);
            // Sleep until something may have finished it.
            loop {
                let now = std::time::Instant::now();
                if now >= deadline {
                    return Err(Error::Timeout { job_id: id });
                }
                let left = deadline.min(next_look).saturating_duration_since(now);
                crossbeam_channel::select! {
                    recv(events) -> event => match event {
                        // A lagged subscription may have missed the finish.
                        Ok(e) if e.finishes(id) || matches!(e, Event::Lagged { .. }) => break,
                        Ok(_) => {}
                        // The bus never drops its subscribers while the queue lives.
                        Err(_) => break,
                    },
                    recv(watch) -> _ => {
                        // An error (a lock during WAL recovery) counts as a change.
                        if watcher.changed().unwrap_or(true) {
                            break;
                        }
                    }
                    default(left) => {
                        if std::time::Instant::now() >= next_look {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One page of jobs matching `filter`, by ascending id.
    pub fn list(&self, filter: &JobFilter) -> Result<Page> {
        if filter.limit == 0 {
            return Err(Error::InvalidArgument(
                "page limit must be at least 1".into(),
            ));
        }
        self.store().list(filter, self.now_micros())
    }

    /// How many jobs each queue holds in each state; empty states are left out.
    ///
    /// The list mixes two kinds of count: live jobs by their state now
    /// (available, scheduled, retrying, running), and finished jobs by their
    /// history status ([`JobState::Finished`], for as long as
    /// [`Retention`] keeps them). Tell them apart with
    /// [`JobState::is_finished`]:
    ///
    /// ```
    /// # use backlog::{NewJob, Queue};
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = Queue::open(dir.path().join("app.db"))?;
    /// # queue.enqueue(NewJob::new("k", serde_json::json!({})))?;
    /// let counts = queue.counts()?;
    /// let live: u64 = counts.iter().filter(|c| !c.state.is_finished()).map(|c| c.count).sum();
    /// let dead: u64 = counts.iter().filter(|c| c.state == backlog::JobState::DEAD).map(|c| c.count).sum();
    /// assert_eq!((live, dead), (1, 0));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`JobState::Finished`]: crate::JobState::Finished
    /// [`JobState::is_finished`]: crate::JobState::is_finished
    pub fn counts(&self) -> Result<Vec<StateCount>> {
        self.store().counts(self.now_micros())
    }

    /// Runs a dead, discarded or cancelled job again: it moves back from
    /// history to live, available at once, attempts reset, errors kept.
    /// [`Error::InvalidState`] for a completed job, a live one (see
    /// [`Queue::run_now`]), or one whose unique key a live job now holds.
    pub fn retry(&self, id: i64) -> Result<()> {
        let result = self.store().retry(id, self.now_micros());
        self.not_a_member(
            id,
            result.and_then(|acted| Action::Retry.verdict(id, acted, None)),
        )
    }

    /// Makes a scheduled or retrying job due now (a manual trigger), keeping
    /// its attempts; a job already available keeps its place.
    /// [`Error::InvalidState`] for a running or finished job.
    pub fn run_now(&self, id: i64) -> Result<()> {
        let result = self.store().run_now(id, self.now_micros());
        self.not_a_member(
            id,
            result.and_then(|acted| Action::RunNow.verdict(id, acted, None)),
        )
    }

    /// Cancels a job. One that is not running moves to history as `cancelled`
    /// at once; a running one is flagged and its handler told at the next
    /// heartbeat.
    pub fn cancel(&self, id: i64) -> Result<CancelOutcome> {
        let result = self.store().cancel(id, self.now_micros());
        self.not_a_member(
            id,
            result.and_then(|acted| Action::cancel_verdict(id, acted)),
        )
    }

    /// Deletes a job, live or finished. A worker running it gets `LeaseLost`.
    pub fn delete(&self, id: i64) -> Result<()> {
        let result = self.store().delete(id, self.now_micros());
        self.not_a_member(
            id,
            result.and_then(|deleted| action::delete_verdict(id, deleted)),
        )
    }

    /// Pauses a queue: leases skip it until it is resumed.
    pub fn pause(&self, queue: &str) -> Result<()> {
        validate::name("queue", queue)?;
        self.store().set_paused(queue, true, self.now_micros())
    }

    /// Resumes a paused queue.
    pub fn resume(&self, queue: &str) -> Result<()> {
        validate::name("queue", queue)?;
        self.store().set_paused(queue, false, self.now_micros())
    }

    /// Sets a queue's limits, replacing the ones it had; `QueueLimits::default()`
    /// clears them. Every lease from then on honours them, in every process
    /// and node (see [`limits`](crate::limits) for how, and for the rate
    /// window). [`Error::InvalidLimit`] for a zero or out-of-range value, or
    /// `InvalidName` for the queue; nothing is written then.
    pub fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        validate::name("queue", queue)?;
        limits.validate()?;
        self.store().set_limits(queue, &limits, self.now_micros())
    }

    /// A queue's limits; `QueueLimits::default()` (none) for a queue never
    /// limited.
    pub fn limits(&self, queue: &str) -> Result<QueueLimits> {
        validate::name("queue", queue)?;
        Ok(self
            .all_limits()?
            .into_iter()
            .find(|(name, _)| name == queue)
            .map(|(_, limits)| limits)
            .unwrap_or_default())
    }

    /// Every queue that has a limit, with its limits, by name.
    pub fn all_limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.store().limits()
    }

    /// The names of the paused queues.
    pub fn paused_queues(&self) -> Result<Vec<String>> {
        self.store().paused_queues()
    }

    /// Deletes up to `limit` finished jobs per status that are older than
    /// `retention` allows, oldest first, and up to `limit` finished batches
    /// (see below). Returns how many jobs and batches were deleted; call
    /// again while it returns a full batch.
    ///
    /// A batch ([`Queue::batch`]) is deleted once it has finished (sealed,
    /// every member counted, its callbacks enqueued), its `finished_at` is
    /// older than the longest of the retentions, and its callback jobs have
    /// finished too: as Sidekiq's batch data expires a while after the batch
    /// finished, kept as long as any of its members' history may be. Its
    /// [`Queue::batch_status`] is then the error of an unknown batch. An
    /// open batch, one still counting, or one whose callback is still live
    /// or waiting is kept; with any retention `None` (kept forever), every
    /// batch is.
    pub fn prune_history(&self, retention: &Retention, limit: usize) -> Result<usize> {
        let now = self.now_micros();
        let mut deleted = 0;
        for status in FinalStatus::ALL {
            if let Some(keep) = retention.for_status(status) {
                let cutoff = now.saturating_sub(duration_micros(keep)?);
                let pruned = self.store().prune(status, cutoff, limit)?;
                if pruned > 0 {
                    failpoint!("prune");
                }
                deleted += pruned;
            }
        }
        let longest = FinalStatus::ALL
            .into_iter()
            .map(|status| retention.for_status(status))
            .collect::<Option<Vec<_>>>()
            .and_then(|keeps| keeps.into_iter().max());
        if let Some(keep) = longest {
            let cutoff = now.saturating_sub(duration_micros(keep)?);
            deleted += self.store().prune_batches(cutoff, limit)?;
        }
        Ok(deleted)
    }
}

/// How often [`Queue::wait`] checks for other processes' commits.
const WAIT_WATCH_INTERVAL: Duration = Duration::from_millis(2);

/// The longest [`Queue::wait`] goes without reading the job again, for
/// changes no watcher reports (another node's completion on a server).
pub const WAIT_MAX_POLL: Duration = Duration::from_millis(250);

impl Queue {
    /// How many jobs finished in each bucket of `window`, per queue, kind
    /// and status, from the counts kept as jobs finish (see
    /// [`crate::finished`]); buckets with nothing finished are left out.
    /// Sorted by bucket (most recent first), queue, kind and status.
    ///
    /// One read of a range of the counts' key: at most
    /// [`Window::buckets`] rows per queue, kind and status (on PostgreSQL,
    /// a row per finishing transaction until maintenance merges them).
    ///
    /// ```
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = backlog::Queue::open(dir.path().join("app.db"))?;
    /// use backlog::finished::Window;
    /// use backlog::{FinalStatus, LeaseRequest, NewJob};
    ///
    /// queue.enqueue(NewJob::new("email", serde_json::json!({})))?;
    /// let job = queue.lease(&LeaseRequest::new("worker-1", 1))?.remove(0);
    /// queue.complete(&job, None)?;
    /// let week = queue.finished_buckets(Window::Week)?;
    /// assert_eq!((week[0].kind.as_str(), week[0].status), ("email", FinalStatus::Completed));
    /// assert_eq!((week[0].buckets_ago, week[0].count), (0, 1));
    /// # Ok(())
    /// # }
    /// ```
    pub fn finished_buckets(&self, window: Window) -> Result<Vec<FinishedBucket>> {
        let last = window.buckets() - 1;
        let mut rows: Vec<FinishedBucket> = self
            .store()
            .finished_buckets(
                window.span_secs(),
                i64::from(window.buckets()),
                self.now_micros(),
            )?
            .into_iter()
            .filter_map(|r| {
                Some(FinishedBucket {
                    status: FinalStatus::parse(&r.status)?,
                    // A bucket ahead of now (a clock moved back) is shown
                    // as the current one.
                    buckets_ago: u32::try_from(r.buckets_ago.max(0)).ok()?.min(last),
                    count: u64::try_from(r.count).ok()?,
                    queue: r.queue,
                    kind: r.kind,
                })
            })
            .collect();
        rows.sort_by(|a, b| {
            (a.buckets_ago, &a.queue, &a.kind, a.status.as_str()).cmp(&(
                b.buckets_ago,
                &b.queue,
                &b.kind,
                b.status.as_str(),
            ))
        });
        Ok(rows)
    }

    /// Finished jobs per queue and kind since the counts began, by status,
    /// sorted by queue and kind. Reads the all-time rows and the hour
    /// buckets of the counts (at most [`HOURS_KEPT`] of them per queue,
    /// kind and status), never history.
    pub fn finished_totals(&self) -> Result<Vec<FinishedTotal>> {
        let mut by_kind = std::collections::BTreeMap::<(String, String), FinishedTotals>::new();
        for r in self.store().finished_totals()? {
            let (Some(status), Ok(n)) = (FinalStatus::parse(&r.status), u64::try_from(r.count))
            else {
                continue;
            };
            by_kind.entry((r.queue, r.kind)).or_default().add(status, n);
        }
        Ok(by_kind
            .into_iter()
            .map(|((queue, kind), totals)| FinishedTotal {
                queue,
                kind,
                totals,
            })
            .collect())
    }

    /// Deletes minute buckets older than [`MINUTES_KEPT`] and folds hour
    /// buckets older than [`HOURS_KEPT`] into the all-time totals, in one
    /// transaction; nonzero when it changed anything. Every worker's
    /// maintenance runs it; a process without a worker may call it now and
    /// then. Totals are the same before and after.
    pub fn compact_finished_counts(&self) -> Result<usize> {
        let now = self.now_micros();
        let minutes_before = now.saturating_sub(MINUTES_KEPT.as_micros() as i64);
        let hours_before = now.saturating_sub(HOURS_KEPT.as_micros() as i64);
        self.store()
            .compact_counts(minutes_before, hours_before, now)
    }
}
