//! Pruning finished jobs (history retention) takes their dependency edges,
//! their workflow steps and each workflow whose last step they were with
//! them, in the same bounded batches; a finished job that a pending or live
//! job depends on is kept past its retention until that job finishes, so
//! its dependent's handler can still read its result.

use std::time::Duration;

use backlog::{Outcome, Retention, Workflow};
use serde_json::{json, Value};

use crate::dependencies::run;
use crate::harness::{Backend, Harness, TestResult};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn job(kind: &str) -> backlog::NewJob {
    backlog::NewJob::new(kind, json!({}))
}

/// Rows of the dependency and workflow tables: `(edges, steps, workflows)`.
fn graph_rows(h: &Harness) -> TestResult<(i64, i64, i64)> {
    Ok((
        h.count("SELECT count(*) FROM backlog_dependencies")?,
        h.count("SELECT count(*) FROM backlog_workflow_steps")?,
        h.count("SELECT count(*) FROM backlog_workflows")?,
    ))
}

fn pruning_a_finished_workflow_deletes_its_edges_steps_and_row(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let flow = h.queue.enqueue_workflow(
        Workflow::new("pruned")
            .step("a", job("a"))
            .step_after("b", job("b"), &["a"])
            .step_after("c", job("c"), &["a", "b"]),
    )?;
    // Another workflow, finished later: kept with all its rows.
    h.advance(DAY);
    let kept = h
        .queue
        .enqueue_workflow(Workflow::new("kept").step("x", job("x")).step_after(
            "y",
            job("y"),
            &["x"],
        ))?;
    h.advance(DAY);
    for name in ["a", "b", "c"] {
        run(
            &h,
            flow.step(name).ok_or("no step")?,
            Outcome::Complete(None),
        )?;
    }
    h.advance(DAY);
    for name in ["x", "y"] {
        run(
            &h,
            kept.step(name).ok_or("no step")?,
            Outcome::Complete(None),
        )?;
    }
    assert_eq!(graph_rows(&h)?, (4, 5, 2));

    // Seven days after the first workflow finished, not the second.
    h.advance(6 * DAY + Duration::from_secs(1));
    let retention = Retention::default();
    assert_eq!(h.queue.prune_history(&retention, 2)?, 2, "a bounded batch");
    assert_eq!(h.queue.prune_history(&retention, 2)?, 1);
    assert_eq!(h.queue.prune_history(&retention, 2)?, 0);
    assert_eq!(
        graph_rows(&h)?,
        (1, 2, 1),
        "the first workflow's edges, steps and row are gone with its jobs"
    );
    assert!(h.queue.workflow(flow.id)?.is_none());
    let info = h.queue.workflow(kept.id)?.ok_or("the second workflow")?;
    assert_eq!(info.steps.len(), 2);
    assert_eq!(
        h.queue
            .dependencies(kept.step("y").ok_or("no step")?)?
            .len(),
        1
    );

    h.advance(2 * DAY);
    assert_eq!(h.queue.prune_history(&retention, 10)?, 2);
    assert_eq!(graph_rows(&h)?, (0, 0, 0));
    Ok(())
}

fn a_finished_dependency_is_kept_while_a_dependent_waits_for_its_result(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let flow = h.queue.enqueue_workflow(
        Workflow::new("slow")
            .step("fetch", job("fetch"))
            .step("other", job("other"))
            .step_after("merge", job("merge"), &["fetch", "other"]),
    )?;
    let id = |name: &str| flow.step(name).ok_or("no step");
    run(
        &h,
        id("fetch")?,
        Outcome::Complete(Some(json!({"rows": 7}))),
    )?;
    // `other` takes longer than fetch's retention: merge is still pending.
    h.advance(8 * DAY);
    let retention = Retention::default();
    assert_eq!(
        h.queue.prune_history(&retention, 100)?,
        0,
        "a job a pending job depends on is kept"
    );
    assert_eq!(graph_rows(&h)?, (2, 3, 1));

    run(&h, id("other")?, Outcome::Complete(None))?;
    // Merge is live now; still kept.
    h.advance(8 * DAY);
    assert_eq!(
        h.queue.prune_history(&retention, 100)?,
        0,
        "a job a live job depends on is kept"
    );
    let merge = h.lease_one("w")?;
    assert_eq!(merge.id, id("merge")?);
    let deps = h.queue.dependencies(merge.id)?;
    let fetch = deps
        .iter()
        .find(|d| d.step.as_deref() == Some("fetch"))
        .ok_or("fetch is a dependency")?;
    assert_eq!(fetch.result::<Value>()?, Some(json!({"rows": 7})));
    h.queue.complete(&merge, None)?;

    // Once merge finished, its dependencies go at their own retention.
    assert_eq!(h.queue.prune_history(&retention, 100)?, 2);
    assert_eq!(graph_rows(&h)?, (0, 1, 1), "merge's step and workflow stay");
    h.advance(8 * DAY);
    assert_eq!(h.queue.prune_history(&retention, 100)?, 1);
    assert_eq!(graph_rows(&h)?, (0, 0, 0));
    Ok(())
}

conformance!(
    pruning_a_finished_workflow_deletes_its_edges_steps_and_row,
    a_finished_dependency_is_kept_while_a_dependent_waits_for_its_result,
);
