//! What a metrics scrape reads about batches and workflows: the
//! [`FlowGauges`] part of the [`Store`](super::Store). The statements are in
//! each database's `gauges.rs`. Each seeks an index over live rows only,
//! never history nor the batch rows kept after their batch finished.

// Read only by a metrics scrape (feature `metrics`).
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

/// Batches and workflows not finished yet, at one scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FlowCounts {
    /// Batches created and not finished: open to new members, or sealed
    /// with members still to finish. Counted from the open-batch index
    /// (V12), one entry per such batch.
    pub open_batches: i64,
    /// Workflows with at least one step not finished (waiting for its
    /// dependencies, available, scheduled, retrying or running). Counted
    /// from the live jobs within the id range the steps span, one seek of
    /// the step index each.
    pub live_workflows: i64,
}

/// Reading [`FlowCounts`]: the part of [`Store`](super::Store) each backend
/// implements in its `gauges.rs`.
pub(crate) trait FlowGauges {
    /// The open batches and the live workflows, in one read.
    fn flow_counts(&self) -> crate::Result<FlowCounts>;
}
