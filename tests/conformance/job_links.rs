//! Where a job stands among others (`Queue::job_links`), as `backlog show`
//! and the dashboard's job page show it: its workflow and step, its batch
//! while it is a live member, and the jobs that depend on it.

use backlog::{LeaseRequest, NewJob, Outcome, StepOf, Workflow};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn job(kind: &str) -> NewJob {
    NewJob::new(kind, json!({}))
}

fn a_job_links_to_its_workflow_step_its_batch_and_its_dependents(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let flow = h.queue.enqueue_workflow(
        Workflow::new("report")
            .step("fetch", job("fetch"))
            .step("other", job("other"))
            .step_after("merge", job("merge"), &["fetch", "other"])
            .step_after("publish", job("publish"), &["merge"]),
    )?;
    let id = |name: &str| flow.step(name).ok_or("no step");
    let links = h.queue.job_links(id("merge")?)?;
    assert_eq!(
        links.workflow,
        Some(StepOf {
            workflow_id: flow.id,
            workflow: "report".into(),
            step: "merge".into(),
        })
    );
    assert_eq!(links.dependents, [id("publish")?]);
    assert_eq!(links.batch, None);
    let mut both = vec![id("merge")?];
    // A plain job depending on a step is a dependent too, outside the
    // workflow.
    let outside = h.queue.enqueue(job("audit").depends_on([id("fetch")?]))?.id;
    both.push(outside);
    both.sort_unstable();
    assert_eq!(h.queue.job_links(id("fetch")?)?.dependents, both);
    assert_eq!(h.queue.job_links(outside)?.workflow, None);

    let batch = h.queue.batch().create()?;
    let member = h.queue.enqueue(job("member").batch(batch.id))?.id;
    let links = h.queue.job_links(member)?;
    assert_eq!((links.batch, links.workflow), (Some(batch.id), None));
    assert!(links.dependents.is_empty());
    // Finished, a member has been counted and leaves its batch's list.
    let leased = h
        .queue
        .lease(&LeaseRequest::new("w", 1).kinds(["member"]))?;
    h.queue.settle(&leased[0], Outcome::Complete(None))?;
    assert_eq!(h.queue.job_links(member)?.batch, None);

    // An id no job has links to nothing.
    assert_eq!(h.queue.job_links(i64::MAX)?, backlog::JobLinks::default());
    Ok(())
}

conformance!(a_job_links_to_its_workflow_step_its_batch_and_its_dependents);
