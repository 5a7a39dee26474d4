//! What the CLI and the dashboard share: updating a waiting job, group
//! aggregation, per-queue statistics, throughput, unique-key lookups,
//! metrics depth and the bulk operations over a filter.

use std::time::{Duration, UNIX_EPOCH};

use crate::action::Action;
use crate::backend::params::UpdateParams;
use crate::clock::system_time_to_micros;
use crate::error::{Error, Result};
use crate::events::Event;
use crate::group::AggregateReport;
use crate::inspect::{
    BulkReport, CancelOutcome, FinishedCount, JobFilter, JobRecord, JobState, JobUpdate,
    QueueStats, StateCount,
};
use crate::outcome::FinalStatus;
use crate::validate;

use super::Queue;

/// How many finished jobs [`Queue::find_by_unique_key`] returns at most.
pub const FIND_UNIQUE_HISTORY: usize = 20;

impl Queue {
    /// Changes a waiting job (available, scheduled or retrying): its
    /// priority, when it is due, or its queue. Every value is checked before
    /// anything is written; a `run_at` in the past means now. Attempts and
    /// errors are kept.
    ///
    /// [`Error::NotFound`] for an unknown id; [`Error::InvalidState`] for a
    /// running or finished job, or when a live job of the target queue
    /// already holds the job's unique key; [`Error::InvalidArgument`] for an
    /// update that changes nothing.
    pub fn update(&self, id: i64, update: &JobUpdate) -> Result<()> {
        if update.is_empty() {
            return Err(Error::InvalidArgument(
                "an update needs a priority, a run time or a queue".into(),
            ));
        }
        if let Some(queue) = &update.queue {
            validate::name("queue", queue)?;
        }
        let now = self.now_micros();
        let available_at = match update.run_at {
            None => None,
            Some(at) if at < UNIX_EPOCH => Some(now),
            Some(at) => Some(system_time_to_micros(at)?.max(now)),
        };
        let result = self.store().update(&UpdateParams {
            id,
            priority: update.priority,
            available_at,
            queue: update.queue.as_deref(),
            now,
        });
        let verdict = |acted| Action::Update.verdict(id, acted, update.queue.as_deref());
        self.not_a_member(id, result.and_then(verdict))
    }

    /// An operator action's `NotFound` for a job waiting in its group:
    /// [`Error::InvalidState`] instead, since the job exists but belongs to
    /// its group until the group is combined.
    pub(super) fn not_a_member<T>(&self, id: i64, result: Result<T>) -> Result<T> {
        match result {
            Err(Error::NotFound { .. })
                if self.get(id).is_ok_and(|r| r.state == JobState::Grouped) =>
            {
                Err(Error::InvalidState {
                    job_id: id,
                    reason: "it waits in its group, which decides when it runs; it leaves \
                             the group only when the group is combined"
                        .into(),
                })
            }
            Err(Error::NotFound { .. })
                if self.get(id).is_ok_and(|r| r.state == JobState::Pending) =>
            {
                Err(Error::InvalidState {
                    job_id: id,
                    reason: "it waits for its dependencies, which decide when it runs; \
                             cancel or delete it, or let them finish"
                        .into(),
                })
            }
            other => other,
        }
    }

    /// Combines up to `limit` groups that are ready (see [`crate::group`]),
    /// each into one job due now, in one transaction; returns the jobs
    /// inserted. A worker with a group handler calls this on time by itself;
    /// call it to combine groups without one. Safe on any number of
    /// processes at once: each member goes into exactly one job.
    pub fn aggregate(&self, limit: usize) -> Result<AggregateReport> {
        if limit == 0 {
            return Err(Error::InvalidArgument(
                "aggregate needs a limit of at least 1".into(),
            ));
        }
        let done = self.store().aggregate(self.now_micros(), limit)?;
        if !done.is_empty() && self.inner.bus.has_listeners() {
            self.inner.bus.ring();
            self.inner.bus.emit(done.iter().map(|a| Event::Enqueued {
                job_id: a.job_id,
                queue: a.queue.clone(),
                kind: a.kind.clone(),
            }));
        }
        Ok(AggregateReport {
            jobs: done.iter().map(|a| (a.job_id, a.members)).collect(),
        })
    }

    /// How long until the next group is ready (zero when one is); `None`
    /// when no group has members waiting.
    pub(crate) fn next_group_ready_in(&self) -> Result<Option<Duration>> {
        let due = self.store().next_group_ready(self.now_micros())?;
        Ok(due.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))))
    }

    /// Every queue at a glance, by name: its live jobs by state, its dead
    /// jobs, completions in the last hour and minute, its finished totals
    /// ([`QueueStats::finished`]), whether it is paused, its limits, and its
    /// due jobs no live worker handles ([`QueueStats::unhandled`]). A queue
    /// is listed when it has live or dead jobs, ever finished one, is paused
    /// or has a limit.
    ///
    /// Counts the live jobs (a scan of the live table), reads the dead and
    /// recently completed ranges of history, never the rest of it, and the
    /// finished counts' totals ([`Queue::finished_totals`]).
    pub fn stats(&self) -> Result<Vec<QueueStats>> {
        let now = self.now_micros();
        let hour_ago = now.saturating_sub(3_600_000_000);
        let minute_ago = now.saturating_sub(60_000_000);
        let mut by_queue = std::collections::BTreeMap::<String, QueueStats>::new();
        fn entry<'m>(
            by_queue: &'m mut std::collections::BTreeMap<String, QueueStats>,
            queue: &str,
        ) -> &'m mut QueueStats {
            by_queue
                .entry(queue.to_owned())
                .or_insert_with(|| QueueStats {
                    queue: queue.to_owned(),
                    ..QueueStats::default()
                })
        }
        for c in self.store().depth(now)? {
            let stats = entry(&mut by_queue, &c.queue);
            match c.state {
                JobState::Available => stats.available += c.count,
                JobState::Scheduled => stats.scheduled += c.count,
                JobState::Retrying => stats.retrying += c.count,
                JobState::Running => stats.running += c.count,
                JobState::Grouped => stats.grouped += c.count,
                JobState::Pending => stats.pending += c.count,
                JobState::Finished(FinalStatus::Dead) => stats.dead += c.count,
                JobState::Finished(_) => {}
            }
        }
        for r in self.store().recent_completions(hour_ago, minute_ago)? {
            let stats = entry(&mut by_queue, &r.queue);
            stats.completed_last_hour = r.hour;
            stats.completed_last_minute = r.minute;
        }
        for t in self.finished_totals()? {
            let stats = entry(&mut by_queue, &t.queue);
            for status in FinalStatus::ALL {
                stats.finished.add(status, t.totals.get(status));
            }
        }
        let paused = self.paused_queues()?;
        for queue in &paused {
            entry(&mut by_queue, queue).paused = true;
        }
        for (queue, limits) in self.all_limits()? {
            entry(&mut by_queue, &queue).limits = limits;
        }
        for unhandled in self.unhandled()? {
            entry(&mut by_queue, &unhandled.queue.clone())
                .unhandled
                .push(unhandled);
        }
        Ok(by_queue.into_values().collect())
    }

    /// How many jobs finished in each of the last `minutes` minutes, per
    /// queue and status (completed, discarded, cancelled, dead): throughput
    /// and failures over time, as the dashboard charts them. Minutes without
    /// finished jobs are left out; `minutes` is at most 1440 (a day).
    ///
    /// Reads the recent range of the history's `(status, finished_at)`
    /// index, never the rest of it.
    ///
    /// ```
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = backlog::Queue::open(dir.path().join("app.db"))?;
    /// use backlog::{FinalStatus, LeaseRequest, NewJob};
    ///
    /// queue.enqueue(NewJob::new("email", serde_json::json!({})))?;
    /// let job = queue.lease(&LeaseRequest::new("worker-1", 1))?.remove(0);
    /// queue.complete(&job, None)?;
    /// let last_hour = queue.finished_per_minute(60)?;
    /// assert_eq!(last_hour[0].status, FinalStatus::Completed);
    /// assert_eq!((last_hour[0].minutes_ago, last_hour[0].count), (0, 1));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Error::InvalidArgument`] when `minutes` is 0 or more than 1440.
    pub fn finished_per_minute(&self, minutes: u32) -> Result<Vec<FinishedCount>> {
        if !(1..=1440).contains(&minutes) {
            return Err(crate::Error::InvalidArgument(format!(
                "finished_per_minute looks back 1 to 1440 minutes, not {minutes}"
            )));
        }
        let now = self.now_micros();
        // The oldest minute reported is `minutes - 1` ago, in full.
        let since = now.saturating_sub(i64::from(minutes) * 60_000_000 - 1);
        let mut counts: Vec<FinishedCount> = self
            .store()
            .finished_per_minute(since, now)?
            .into_iter()
            .filter_map(|row| {
                Some(FinishedCount {
                    queue: row.queue,
                    status: FinalStatus::parse(&row.status)?,
                    minutes_ago: u32::try_from(row.minutes_ago).ok()?.min(minutes - 1),
                    count: row.count.max(0) as u64,
                })
            })
            .collect();
        counts.sort_by(|a, b| {
            (a.minutes_ago, &a.queue, a.status.as_str()).cmp(&(
                b.minutes_ago,
                &b.queue,
                b.status.as_str(),
            ))
        });
        Ok(counts)
    }

    /// The jobs of `queue` holding unique key `key`: the live one (there is
    /// at most one) first, then the finished ones, most recent first, at most
    /// [`FIND_UNIQUE_HISTORY`] of those. Empty when no job holds it.
    /// Two indexed reads.
    ///
    /// ```
    /// # fn main() -> backlog::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = backlog::Queue::open(dir.path().join("app.db"))?;
    /// use backlog::NewJob;
    ///
    /// let job = NewJob::new("invoice", serde_json::json!({})).unique_key("INV-7");
    /// let id = queue.enqueue(job)?.id;
    /// let found = queue.find_by_unique_key("default", "INV-7")?;
    /// assert_eq!(found.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
    /// assert!(queue.find_by_unique_key("default", "INV-8")?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn find_by_unique_key(&self, queue: &str, key: &str) -> Result<Vec<JobRecord>> {
        let ids = self
            .store()
            .find_unique(queue, key, FIND_UNIQUE_HISTORY as i64)?;
        let mut records = Vec::with_capacity(ids.len());
        for id in ids {
            match self.get(id) {
                Ok(record) => records.push(record),
                // Deleted (or pruned) since the lookup.
                Err(crate::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(records)
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    /// Live jobs per queue and state, and dead jobs per queue: the cheap
    /// part of [`Queue::counts`] that metrics scrape.
    pub(crate) fn depth(&self) -> Result<Vec<StateCount>> {
        self.store().depth(self.now_micros())
    }

    /// Discards a job that is waiting to run (available, scheduled or
    /// retrying): it moves to history as `discarded`, with `reason` as its
    /// last error. What an operator does to a job that must not run; a
    /// handler discards its own job with [`Queue::discard`].
    /// [`Error::NotFound`], or [`Error::InvalidState`] for a running job
    /// (see [`Queue::cancel`]) or a finished one.
    pub fn discard_job(&self, id: i64, reason: &str) -> Result<()> {
        let result = self.store().discard(id, reason, self.now_micros());
        self.not_a_member(
            id,
            result.and_then(|acted| Action::Discard.verdict(id, acted, None)),
        )
    }

    /// Discards every waiting job matching `filter`, page by page; see
    /// [`Queue::discard_job`].
    pub fn discard_matching(&self, filter: &JobFilter, reason: &str) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.discard_job(id, reason).map(|()| false))
    }

    /// Retries every job matching `filter` (a dead, discarded or cancelled
    /// state), page by page, each in its own transaction; see
    /// [`Queue::retry`].
    pub fn retry_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.retry(id).map(|()| false))
    }

    /// Cancels every job matching `filter`, page by page; see
    /// [`Queue::cancel`]. Running jobs are asked to stop
    /// ([`BulkReport::requested`]).
    pub fn cancel_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| {
            self.cancel(id).map(|o| o == CancelOutcome::Requested)
        })
    }

    /// Deletes every job matching `filter`, page by page; see
    /// [`Queue::delete`].
    pub fn delete_matching(&self, filter: &JobFilter) -> Result<BulkReport> {
        self.for_each_matching(filter, |id| self.delete(id).map(|()| false))
    }

    /// Applies `op` to every job `filter` lists, in id order. A job that
    /// moved on since it was listed (`NotFound`, `InvalidState`) is skipped;
    /// any other error stops the walk. `op` returns whether the job's change
    /// is only requested.
    fn for_each_matching(
        &self,
        filter: &JobFilter,
        op: impl Fn(i64) -> Result<bool>,
    ) -> Result<BulkReport> {
        let mut report = BulkReport::default();
        let mut filter = filter.clone();
        loop {
            let page = self.list(&filter)?;
            for job in &page.jobs {
                match op(job.id) {
                    Ok(requested) => {
                        report.done += 1;
                        report.requested += u64::from(requested);
                    }
                    Err(Error::NotFound { .. } | Error::InvalidState { .. }) => report.skipped += 1,
                    Err(e) => return Err(e),
                }
            }
            match page.next_after {
                Some(after) => filter = filter.after(after),
                None => return Ok(report),
            }
        }
    }
}
