//! Quick start: open a queue file, enqueue jobs, lease them and record what
//! happened. Run with `cargo run --example quickstart`.

use std::time::Duration;

use backlog::{JobArgs, JobFilter, JobState, LeaseRequest, NewJob, Queue};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("app.db"))?;

    queue.enqueue(SendEmail { to: "ada@example.com".into() })?;
    queue.enqueue(SendEmail { to: "bob@example.com".into() })?;
    queue.enqueue(NewJob::new("resize", json!({"w": 64})).priority(5))?;

    let jobs = queue.lease(&LeaseRequest::new("quickstart", 10).ttl(Duration::from_secs(30)))?;
    for job in &jobs {
        match job.kind.as_str() {
            "send_email" => {
                let args: SendEmail = job.args()?;
                if args.to.starts_with("bob") {
                    queue.fail(job, "mailbox full")?;
                } else {
                    queue.complete(job, Some(json!({"delivered_to": args.to})))?;
                }
            }
            _ => queue.complete(job, None)?,
        }
    }

    for state in [JobState::Finished(backlog::FinalStatus::Completed), JobState::Retrying] {
        for job in queue.list(&JobFilter::new(state))?.jobs {
            println!(
                "job {} {:<10} {:<9} attempts={} errors={:?}",
                job.id,
                job.kind,
                job.state.as_str(),
                job.attempts,
                job.errors.iter().map(|e| &e.message).collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}
