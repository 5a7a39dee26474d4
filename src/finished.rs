//! Finished jobs counted as they finish: totals per queue, kind and status,
//! and buckets of time for the 1 h, 24 h and 7 d charts, read without
//! scanning history (which retention prunes anyway).
//!
//! Every path that moves a job to history (complete, discard, cancel, dead
//! after its last attempt or a rescue, a group's members `aggregated`, and
//! `backlog copy`'s finished jobs) adds it to a minute bucket and an hour
//! bucket in the same transaction (V10, `backlog_finished_counts`). Counts
//! are of finishes, not of rows: they survive
//! [`Queue::prune_history`] and a delete, and a job retried from history
//! and finished again counts twice. A database migrated to V10 starts with
//! the jobs its history held then.
//!
//! [`Queue::compact_finished_counts`] (run by every worker's maintenance)
//! deletes minute buckets older than [`MINUTES_KEPT`] and folds hour buckets
//! older than [`HOURS_KEPT`] into one all-time row, so the table stays small
//! and the totals stay whole.

use std::time::Duration;

use crate::backend::counts::{HOUR, MINUTE};
use crate::error::Result;
use crate::outcome::FinalStatus;
use crate::Queue;

/// How long minute buckets are kept: past the last hour's chart.
pub const MINUTES_KEPT: Duration = Duration::from_secs(2 * 3600);

/// How long hour buckets are kept before they are folded into the all-time
/// totals: past the 7-day chart.
pub const HOURS_KEPT: Duration = Duration::from_secs(8 * 24 * 3600);

/// A chart's time window and the width of its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Window {
    /// The last hour, per minute (60 buckets).
    Hour,
    /// The last 24 hours, per hour (24 buckets).
    Day,
    /// The last 7 days, per hour (168 buckets).
    Week,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 3] = [Window::Hour, Window::Day, Window::Week];

    /// The width of one bucket.
    pub fn bucket(self) -> Duration {
        Duration::from_secs(self.span_secs().unsigned_abs())
    }

    /// How many buckets the window has, the current one included.
    pub fn buckets(self) -> u32 {
        match self {
            Window::Hour => 60,
            Window::Day => 24,
            Window::Week => 168,
        }
    }

    /// Its name: `1h`, `24h` or `7d`.
    pub fn as_str(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
            Window::Week => "7d",
        }
    }

    /// Parses a name of [`Window::as_str`].
    pub fn parse(s: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.as_str() == s)
    }

    fn span_secs(self) -> i64 {
        match self {
            Window::Hour => MINUTE,
            Window::Day | Window::Week => HOUR,
        }
    }
}

/// How many jobs of one queue and kind finished with one status in one
/// bucket of a [`Window`]: what [`Queue::finished_buckets`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FinishedBucket {
    /// The queue.
    pub queue: String,
    /// The job kind.
    pub kind: String,
    /// How the jobs finished.
    pub status: FinalStatus,
    /// Which bucket: 0 is the current minute (or hour), 1 the one before,
    /// up to [`Window::buckets`] - 1. Buckets are aligned on the clock's
    /// whole minutes and hours (the database server's on PostgreSQL and
    /// MySQL).
    pub buckets_ago: u32,
    /// How many jobs.
    pub count: u64,
}

/// Finished jobs per status since the counts began: one queue's in
/// [`QueueStats::finished`](crate::QueueStats::finished), one queue and
/// kind's in [`FinishedTotal`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FinishedTotals {
    /// Completed by their handlers.
    pub completed: u64,
    /// Discarded by their handlers or an operator.
    pub discarded: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Dead: attempts ran out (pruned dead jobs included, unlike
    /// [`QueueStats::dead`](crate::QueueStats::dead)).
    pub dead: u64,
    /// Grouped jobs combined into another job.
    pub aggregated: u64,
}

impl FinishedTotals {
    /// The count of one status.
    pub fn get(&self, status: FinalStatus) -> u64 {
        match status {
            FinalStatus::Completed => self.completed,
            FinalStatus::Discarded => self.discarded,
            FinalStatus::Cancelled => self.cancelled,
            FinalStatus::Dead => self.dead,
            FinalStatus::Aggregated => self.aggregated,
        }
    }

    pub(crate) fn add(&mut self, status: FinalStatus, n: u64) {
        let slot = match status {
            FinalStatus::Completed => &mut self.completed,
            FinalStatus::Discarded => &mut self.discarded,
            FinalStatus::Cancelled => &mut self.cancelled,
            FinalStatus::Dead => &mut self.dead,
            FinalStatus::Aggregated => &mut self.aggregated,
        };
        *slot = slot.saturating_add(n);
    }
}

/// One queue and kind's finished jobs since the counts began: what
/// [`Queue::finished_totals`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FinishedTotal {
    /// The queue.
    pub queue: String,
    /// The job kind.
    pub kind: String,
    /// Per status.
    pub totals: FinishedTotals,
}

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
