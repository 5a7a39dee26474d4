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
//!
//! [`Queue::prune_history`]: crate::Queue::prune_history
//! [`Queue::compact_finished_counts`]: crate::Queue::compact_finished_counts

use std::time::Duration;

use crate::outcome::FinalStatus;

/// Width of the fine buckets, in seconds: the last hour's chart.
pub(crate) const MINUTE: i64 = 60;
/// Width of the coarse buckets, in seconds: the 24 h and 7 d charts.
pub(crate) const HOUR: i64 = 3600;
/// The span of the row that hour buckets are folded into.
pub(crate) const ALL_TIME: i64 = 0;

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

    pub(crate) fn span_secs(self) -> i64 {
        match self {
            Window::Hour => MINUTE,
            Window::Day | Window::Week => HOUR,
        }
    }
}

/// How many jobs of one queue and kind finished with one status in one
/// bucket of a [`Window`]: what [`Queue::finished_buckets`] reports.
///
/// [`Queue::finished_buckets`]: crate::Queue::finished_buckets
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
///
/// [`Queue::finished_totals`]: crate::Queue::finished_totals
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
