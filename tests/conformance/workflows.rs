//! Workflows: a graph of named steps enqueued in one transaction (or in the
//! application's own), run in order, each step reading what the steps
//! before it returned; seen, cancelled and resumed by an operator.

use backlog::testing;
use backlog::{Error, JobContext, JobState, NewJob, Outcome, Worker, Workflow};
use serde_json::{json, Value};

use crate::harness::{Backend, Harness, TestResult};

fn job(kind: &str, n: i64) -> NewJob {
    NewJob::new(kind, json!({ "n": n }))
}

/// fetch-a and fetch-b, then merge after both, then publish after merge.
fn report() -> Workflow {
    Workflow::new("report")
        .step_after("merge", job("merge", 0), &["fetch-a", "fetch-b"])
        .step("fetch-a", job("fetch", 1))
        .step("fetch-b", job("fetch", 2))
        .step_after("publish", job("publish", 0), &["merge"])
}

/// Leases the available job of step `id` and settles it with `outcome`.
fn run(h: &Harness, id: i64, outcome: Outcome) -> TestResult {
    let jobs = h.lease("w", 100)?;
    let job = jobs
        .iter()
        .find(|j| j.id == id)
        .ok_or_else(|| format!("job {id} was not leased"))?;
    h.queue.settle(job, outcome)?;
    for other in jobs.iter().filter(|j| j.id != id) {
        h.queue.release(other)?;
    }
    Ok(())
}

fn step(h: &Harness, name: &str) -> TestResult<(i64, JobState)> {
    let info = h.queue.workflow("report")?.ok_or("no workflow")?;
    let step = info.step(name).ok_or("no step")?;
    Ok((step.job_id, step.state))
}

fn a_workflow_runs_each_step_after_the_steps_it_comes_after(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let flow = h.queue.enqueue_workflow(report())?;
    assert_eq!(flow.steps.len(), 4);
    let id = |name: &str| flow.step(name).ok_or("no step");
    assert_eq!(h.state(id("merge")?)?, JobState::Pending);
    assert_eq!(h.state(id("publish")?)?, JobState::Pending);
    // Steps go in dependency order, whatever order they were added in.
    let order: Vec<&str> = flow.steps.iter().map(|(n, _)| n.as_str()).collect();
    let at = |n: &str| order.iter().position(|s| *s == n);
    assert!(at("merge") > at("fetch-a") && at("merge") > at("fetch-b"));

    let worker = Worker::builder(h.queue.clone())
        .handle_raw("fetch", |args: Value, _ctx: &JobContext| {
            Ok(args["n"].clone())
        })
        .handle_raw("merge", |_: Value, ctx: &JobContext| {
            let a: i64 = ctx.result_of("fetch-a")?.ok_or("no result of fetch-a")?;
            let b: i64 = ctx.result_of("fetch-b")?.ok_or("no result of fetch-b")?;
            Ok(a * 10 + b)
        })
        .handle_raw("publish", |_: Value, ctx: &JobContext| {
            let deps = ctx.dependencies()?;
            Ok(deps.first().and_then(|d| d.result.clone()))
        });
    let runs = testing::drain(&worker)?;
    let kinds: Vec<&str> = runs.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["fetch", "fetch", "merge", "publish"]);
    assert_eq!(h.record(id("merge")?)?.result.as_deref(), Some("12"));
    assert_eq!(h.record(id("publish")?)?.result.as_deref(), Some("\"12\""));
    let info = h.queue.workflow(flow.id)?.ok_or("no workflow")?;
    assert!(info.is_finished());
    assert!(info.steps.iter().all(|s| s.state == JobState::COMPLETED));
    Ok(())
}

fn a_cycle_or_an_unknown_step_is_refused_and_nothing_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let cycle = Workflow::new("bad")
        .step("start", job("s", 0))
        .step_after("a", job("a", 0), &["start", "c"])
        .step_after("b", job("b", 0), &["a"])
        .step_after("c", job("c", 0), &["b"]);
    match h.queue.enqueue_workflow(cycle) {
        Err(Error::InvalidWorkflow { reason, .. }) => {
            assert!(reason.contains("cycle"), "{reason}");
            for name in ["a", "b", "c"] {
                assert!(reason.contains(name), "{reason}");
            }
        }
        other => return Err(format!("expected a cycle error, got {other:?}").into()),
    }
    let unknown = Workflow::new("bad").step_after("a", job("a", 0), &["nope"]);
    assert!(matches!(
        h.queue.enqueue_workflow(unknown),
        Err(Error::InvalidWorkflow { .. })
    ));
    let twice = Workflow::new("bad")
        .step("a", job("a", 0))
        .step("a", job("a", 1));
    assert!(matches!(
        h.queue.enqueue_workflow(twice),
        Err(Error::InvalidWorkflow { .. })
    ));
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_workflows")?, 0);
    assert!(h.queue.workflow("bad")?.is_none());
    Ok(())
}

fn a_workflow_in_a_rolled_back_transaction_leaves_nothing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let rolled_back = b.in_queue_transaction(&h.queue, |tx| {
        tx.enqueue_workflow_in(&h.queue, report())?;
        Err::<(), _>("the application changed its mind".into())
    });
    assert!(rolled_back.is_err());
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_pending")?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_dependencies")?, 0);
    assert!(h.queue.workflow("report")?.is_none());

    let flow = b.in_queue_transaction(&h.queue, |tx| {
        Ok(tx.enqueue_workflow_in(&h.queue, report())?)
    })?;
    let info = h.queue.workflow("report")?.ok_or("committed")?;
    assert_eq!(info.id, flow.id);
    assert_eq!(info.steps.len(), 4);
    Ok(())
}

fn cancelling_a_workflow_cancels_every_step_not_finished(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue_workflow(report())?;
    let (a, _) = step(&h, "fetch-a")?;
    run(&h, a, Outcome::Complete(None))?;
    let (fetch_b, _) = step(&h, "fetch-b")?;
    let running = h.lease("w", 10)?;
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, fetch_b);

    let report = h.queue.cancel_workflow("report")?;
    assert_eq!(report.requested, 1, "fetch-b runs: asked to stop");
    let info = h.queue.workflow("report")?.ok_or("workflow")?;
    let state = |n: &str| info.step(n).map(|s| s.state);
    assert_eq!(state("fetch-a"), Some(JobState::COMPLETED));
    assert_eq!(state("fetch-b"), Some(JobState::Running));
    assert_eq!(state("merge"), Some(JobState::CANCELLED));
    assert_eq!(state("publish"), Some(JobState::CANCELLED));
    Ok(())
}

/// Ten running steps completed by another thread while the workflow is
/// cancelled: the cancel only asks them to stop, so every completion lands
/// and every one of them ends completed, never cancelled; the step waiting
/// on them is cancelled, and the report counts the asked ones and it.
fn a_concurrent_completion_never_makes_cancel_workflow_cancel_a_finished_step(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let names: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    let after: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut flow = Workflow::new("race").step_after("last", job("last", 0), &after);
    for (i, name) in names.iter().enumerate() {
        flow = flow.step(name.clone(), job("part", i64::try_from(i)?));
    }
    let flow = h.queue.enqueue_workflow(flow)?;
    let running = h.lease("w", 20)?;
    assert_eq!(running.len(), 10);
    let queue = h.queue.clone();
    let completer = std::thread::spawn(move || -> backlog::Result<()> {
        for job in &running {
            queue.complete(job, None)?;
        }
        Ok(())
    });
    let report = h.queue.cancel_workflow(flow.id)?;
    completer.join().map_err(|_| "completer panicked")??;
    for name in &names {
        let id = flow.step(name).ok_or("no step")?;
        assert_eq!(h.state(id)?, JobState::COMPLETED, "step {name}");
    }
    assert_eq!(
        h.state(flow.step("last").ok_or("no step")?)?,
        JobState::CANCELLED
    );
    assert_eq!(report.skipped, 0, "{report:?}");
    assert_eq!(report.done, report.requested + 1, "{report:?}");
    Ok(())
}

fn retrying_a_failed_step_resumes_the_workflow_from_it(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue_workflow(report())?;
    let (a, _) = step(&h, "fetch-a")?;
    let (fetch_b, _) = step(&h, "fetch-b")?;
    run(&h, a, Outcome::Complete(Some(json!(1))))?;
    run(&h, fetch_b, Outcome::Discard("source down".into()))?;
    assert_eq!(step(&h, "merge")?.1, JobState::CANCELLED);
    assert_eq!(step(&h, "publish")?.1, JobState::CANCELLED);

    h.queue.retry(fetch_b)?;
    assert_eq!(step(&h, "fetch-b")?.1, JobState::Available);
    assert_eq!(step(&h, "merge")?.1, JobState::Pending);
    assert_eq!(step(&h, "publish")?.1, JobState::Pending);
    run(&h, fetch_b, Outcome::Complete(Some(json!(2))))?;
    let (merge, state) = step(&h, "merge")?;
    assert_eq!(state, JobState::Available, "fetch-a counted already");
    run(&h, merge, Outcome::Complete(None))?;
    let (publish, state) = step(&h, "publish")?;
    assert_eq!(state, JobState::Available);
    run(&h, publish, Outcome::Complete(None))?;
    assert!(h.queue.workflow("report")?.ok_or("workflow")?.is_finished());
    Ok(())
}

conformance!(
    a_workflow_runs_each_step_after_the_steps_it_comes_after,
    a_cycle_or_an_unknown_step_is_refused_and_nothing_is_written,
    a_workflow_in_a_rolled_back_transaction_leaves_nothing,
    cancelling_a_workflow_cancels_every_step_not_finished,
    a_concurrent_completion_never_makes_cancel_workflow_cancel_a_finished_step,
    retrying_a_failed_step_resumes_the_workflow_from_it,
);
