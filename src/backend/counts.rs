//! What the backends store for finished-job counts
//! (`backlog_finished_counts`, V10): the [`Counts`] part of the
//! [`Store`](super::Store), and its rows. The statements are in each
//! database's `counts.rs`, which also has the one call every path that
//! moves jobs to history makes in its own transaction (`count_moved`):
//! settle and complete, operator cancel and discard, rescue, group
//! aggregation, and `copy`'s import of finished jobs.
//!
//! Buckets are [`MINUTE`] and [`HOUR`] wide (`span`, in seconds), aligned on
//! the clock that stamps `finished_at` (the server's on PostgreSQL and
//! MySQL). Every finished job is counted once in each. [`ALL_TIME`] holds,
//! under bucket 0, the hours that [`Counts::compact_counts`] folded.

// The buckets' widths are the engine's (its windows read them); the
// statements here store by them.
pub(crate) use crate::finished::{ALL_TIME, HOUR, MINUTE};

/// One bucket's count, as [`Counts::finished_buckets`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BucketRow {
    pub queue: String,
    pub kind: String,
    pub status: String,
    /// Whole buckets between this one and the one holding now (0: current).
    pub buckets_ago: i64,
    pub count: i64,
}

/// One queue, kind and status's all-time count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TotalRow {
    pub queue: String,
    pub kind: String,
    pub status: String,
    pub count: i64,
}

/// Reading and compacting finished-job counts: the part of
/// [`Store`](super::Store) each backend implements in its `counts.rs`.
pub(crate) trait Counts {
    /// The `buckets` most recent buckets of `span` seconds ([`MINUTE`] or
    /// [`HOUR`]), the current one included, at `now`; buckets with nothing
    /// finished are left out. Reads a range of the primary key
    /// (on PostgreSQL, of the key's index, summing the key's delta rows).
    fn finished_buckets(&self, span: i64, buckets: i64, now: i64) -> crate::Result<Vec<BucketRow>>;

    /// Every queue, kind and status's count since the counts began: the
    /// all-time row plus the hour buckets.
    fn finished_totals(&self) -> crate::Result<Vec<TotalRow>>;

    /// In one transaction: deletes minute buckets that started before
    /// `minutes_before` (the hours hold them too), and folds hour buckets
    /// that started before `hours_before` into the all-time row. Times are
    /// the engine's (the servers apply them as offsets from `now`). Nonzero
    /// when it changed anything.
    fn compact_counts(
        &self,
        minutes_before: i64,
        hours_before: i64,
        now: i64,
    ) -> crate::Result<usize>;
}
