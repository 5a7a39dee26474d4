//! A workflow: two fetches, then a merge that reads their results, then a
//! report that runs even when the merge fails. Run with
//! `cargo run --example workflow`.

use std::time::Duration;

use backlog::{JobState, NewJob, Queue, Worker, Workflow};
use serde_json::{json, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("app.db"))?;
    let worker = Worker::builder(queue.clone())
        .concurrency(4)
        .handle_raw("fetch", |args: Value, _ctx| {
            Ok(json!({ "rows": args["rows"].as_i64().unwrap_or(0) }))
        })
        .handle_raw("merge", |_: Value, ctx| {
            let mut rows = 0;
            for dependency in ctx.dependencies()? {
                let result: Option<Value> = dependency.result()?;
                rows += result.and_then(|r| r["rows"].as_i64()).unwrap_or(0);
            }
            Ok(rows)
        })
        .handle_raw("report", |_: Value, ctx| {
            let merged: Option<i64> = ctx.result_of("merge")?;
            println!("report: merged {merged:?} rows");
            Ok(())
        })
        .start()?;

    let flow = queue.enqueue_workflow(
        Workflow::new("nightly")
            .step("fetch-eu", NewJob::new("fetch", json!({ "rows": 120 })))
            .step("fetch-us", NewJob::new("fetch", json!({ "rows": 80 })))
            .step_after(
                "merge",
                NewJob::new("merge", json!({})),
                &["fetch-eu", "fetch-us"],
            )
            .step_after_anyway("report", NewJob::new("report", json!({})), &["merge"]),
    )?;
    let report = flow.step("report").ok_or("no report step")?;
    queue.wait(report, Duration::from_secs(30))?;

    let info = queue.workflow(flow.id)?.ok_or("no workflow")?;
    for step in &info.steps {
        println!(
            "{:<9} job {:>2}  {}",
            step.name,
            step.job_id,
            step.state.as_str()
        );
        assert_eq!(step.state, JobState::COMPLETED);
    }
    let merge = queue.get(flow.step("merge").ok_or("no merge step")?)?;
    assert_eq!(merge.result.as_deref(), Some("200"));
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}
