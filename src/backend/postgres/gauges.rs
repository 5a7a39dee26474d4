//! The metrics' batch and workflow gauges on PostgreSQL, as
//! `sqlite/gauges.rs`.

// Read only by a metrics scrape (feature `metrics`).
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use super::db::Db;
use crate::backend::gauges::{FlowCounts, FlowGauges};
use crate::error::{Error, Result};

/// As SQLite's `FLOW_COUNTS`. Differs in that the planner orders the join
/// itself: with the step index unique on `job_id`, a nested loop from the
/// live jobs is its plan while history outweighs the live jobs.
pub const FLOW_COUNTS: &str = "
SELECT (SELECT count(*) FROM {batches} WHERE finished_at IS NULL),
       (SELECT count(DISTINCT s.workflow_id) FROM (
            SELECT id FROM {pending} UNION ALL SELECT id FROM {jobs}) AS l
        JOIN {workflow_steps} AS s ON s.job_id = l.id
        WHERE l.id BETWEEN (SELECT min(job_id) FROM {workflow_steps})
                       AND (SELECT max(job_id) FROM {workflow_steps}))";

impl FlowGauges for Db {
    fn flow_counts(&self) -> Result<FlowCounts> {
        let sql = self.q.tables.render(FLOW_COUNTS);
        self.pool.read(|tx| {
            let row = tx
                .query_opt(&sql, &[])?
                .ok_or_else(|| Error::Database("the flow counts returned no row".into()))?;
            Ok(FlowCounts {
                open_batches: row.try_get(0)?,
                live_workflows: row.try_get(1)?,
            })
        })
    }
}
