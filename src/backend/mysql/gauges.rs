//! The metrics' batch and workflow gauges on MySQL/MariaDB, as
//! `sqlite/gauges.rs`.

// Read only by a metrics scrape (feature `metrics`).
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use mysql::prelude::Queryable;
use mysql::Row;

use super::db::{take, Db};
use crate::backend::gauges::{FlowCounts, FlowGauges};
use crate::error::{Error, Result};

/// As SQLite's `FLOW_COUNTS`. Differs in that V12's index holds every
/// batch (no partial index here) and the count seeks its NULL range,
/// `STRAIGHT_JOIN` stands for `CROSS JOIN` (the live jobs drive the join),
/// and the steps' id range is in each branch of the union: MariaDB does not
/// push a condition on the derived table into it, and would walk every
/// live job's key.
pub const FLOW_COUNTS: &str = "
SELECT (SELECT COUNT(*) FROM {batches} FORCE INDEX (batches_open) WHERE finished_at IS NULL),
       (SELECT COUNT(DISTINCT s.workflow_id) FROM (
            SELECT id FROM {pending}
            WHERE id BETWEEN (SELECT MIN(job_id) FROM {workflow_steps})
                         AND (SELECT MAX(job_id) FROM {workflow_steps})
            UNION ALL
            SELECT id FROM {jobs}
            WHERE id BETWEEN (SELECT MIN(job_id) FROM {workflow_steps})
                         AND (SELECT MAX(job_id) FROM {workflow_steps})) AS l
        STRAIGHT_JOIN {workflow_steps} AS s FORCE INDEX (workflow_steps_job)
        ON s.job_id = l.id)";

impl FlowGauges for Db {
    fn flow_counts(&self) -> Result<FlowCounts> {
        let sql = self.sql.tables.render(FLOW_COUNTS);
        self.read(|conn| {
            let mut row: Row = conn
                .exec_first(&sql, ())?
                .ok_or_else(|| Error::Database("the flow counts returned no row".into()))?;
            Ok(FlowCounts {
                open_batches: take(&mut row, 0)?,
                live_workflows: take(&mut row, 1)?,
            })
        })
    }
}
