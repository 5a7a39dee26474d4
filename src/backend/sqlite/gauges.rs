//! The metrics' batch and workflow gauges on SQLite (see
//! [`crate::backend::gauges`]).

// Read only by a metrics scrape (feature `metrics`).
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use super::connection::Connections;
use crate::backend::gauges::{FlowCounts, FlowGauges};
use crate::error::Result;

/// The open batches, counted in V12's partial index (it holds those
/// alone), and the workflows with a live step: each live job (waiting in
/// `backlog_pending`, or in `backlog_jobs`) seeks the unique step index
/// once, within the range of ids the steps span (the first and last entry
/// of that index): a queue without workflows walks nothing. `CROSS JOIN`
/// keeps the live tables outside, so the steps kept for history are never
/// walked. The live tables are read by a range of their primary keys, not
/// their partial indexes (as `queries::COUNT_WAITING_DUE` reads), which
/// would each look every row up again for the terms of their `WHERE`.
pub const FLOW_COUNTS: &str = "
SELECT (SELECT count(*) FROM backlog_batches WHERE finished_at IS NULL),
       (SELECT count(*) FROM (
            SELECT s.workflow_id FROM backlog_pending AS p
            CROSS JOIN backlog_workflow_steps AS s ON s.job_id = p.id
            WHERE p.id BETWEEN (SELECT min(job_id) FROM backlog_workflow_steps)
                           AND (SELECT max(job_id) FROM backlog_workflow_steps)
            UNION
            SELECT s.workflow_id FROM backlog_jobs AS j
            CROSS JOIN backlog_workflow_steps AS s ON s.job_id = j.id
            WHERE j.id BETWEEN (SELECT min(job_id) FROM backlog_workflow_steps)
                           AND (SELECT max(job_id) FROM backlog_workflow_steps)))";

impl FlowGauges for Connections {
    fn flow_counts(&self) -> Result<FlowCounts> {
        self.read(|c| {
            Ok(c.prepare_cached(FLOW_COUNTS)?.query_row([], |r| {
                Ok(FlowCounts {
                    open_batches: r.get(0)?,
                    live_workflows: r.get(1)?,
                })
            })?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::QueueOptions;

    /// The scrape reads the open-batch index and the live tables within the
    /// steps' id range, with a seek of the step index each: never the batch
    /// rows, history, or a walk of the workflow steps.
    #[test]
    fn flow_counts_seek_indexes_only() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let db = Connections::open(&dir.path().join("q.db"), &QueueOptions::new())?;
        super::super::migrate::migrate(&mut *db.writer()?, std::time::Duration::from_secs(5))?;
        let conn = db.writer()?;
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {FLOW_COUNTS}"))?;
        let plan = stmt
            .query_map([], |r| r.get::<_, String>(3))?
            .collect::<rusqlite::Result<Vec<_>>>()?
            .join("; ");
        // The partial index holds the open batches alone: its walk is theirs.
        assert!(
            plan.contains("SCAN backlog_batches USING INDEX backlog_batches_open"),
            "{plan}"
        );
        for live in ["p", "j"] {
            assert!(
                plan.contains(&format!(
                    "SEARCH {live} USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"
                )),
                "the live jobs within the steps' id range: {plan}"
            );
        }
        assert!(
            !plan.contains("SCAN s"),
            "the steps are sought, not walked: {plan}"
        );
        assert_eq!(
            plan.matches("USING INDEX backlog_workflow_steps_job")
                .count(),
            2,
            "{plan}"
        );
        assert!(!plan.contains("history"), "{plan}");
        Ok(())
    }
}
