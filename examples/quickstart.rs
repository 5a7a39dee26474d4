//! Quick start: open a queue file, register handlers, start a worker, enqueue
//! a few typed jobs (one fails twice before it succeeds), and print the
//! history. Run with `cargo run --example quickstart`.

use std::time::Duration;

use backlog::{Event, JobArgs, JobError, JobFilter, JobState, NewJob, Queue, RetryPolicy, Worker};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

#[derive(Serialize, Deserialize)]
struct Resize {
    width: u32,
}

impl JobArgs for Resize {
    const KIND: &'static str = "resize";
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("app.db"))?; // WAL, synchronous=FULL, migrated
    let events = queue.subscribe();

    let worker = Worker::builder(queue.clone())
        .queues(["default", "media"])
        .concurrency(4)
        // Short backoff so the flaky job's retries show up at once here.
        .retry_policy(RetryPolicy {
            base: Duration::from_millis(20),
            ..RetryPolicy::default()
        })
        .handle(|args: SendEmail, ctx| {
            if args.to.starts_with("flaky") && ctx.attempt() < 3 {
                // Any error works with `?`: the attempt fails and is retried.
                Err(std::io::Error::other(format!(
                    "SMTP timeout (attempt {})",
                    ctx.attempt()
                )))?;
            }
            Ok(json!({"delivered_to": args.to, "attempt": ctx.attempt()}))
        })
        .handle(|args: Resize, _ctx| {
            if args.width == 0 {
                return Err(JobError::discard("width 0 can never be resized"));
            }
            Ok(json!({"thumbnail": format!("{}px.png", args.width)}))
        })
        .start()?;

    queue.enqueue(SendEmail {
        to: "ada@example.com".into(),
    })?;
    queue.enqueue(SendEmail {
        to: "flaky@example.com".into(),
    })?;
    queue.enqueue(
        NewJob::from_args(&Resize { width: 64 })?
            .queue("media")
            .priority(5),
    )?;
    queue.enqueue(NewJob::from_args(&Resize { width: 0 })?.queue("media"))?;

    // Wait until all four jobs finished (completed or discarded).
    let mut finished = 0;
    while finished < 4 {
        match events.recv_timeout(Duration::from_secs(30))? {
            Event::Completed { .. } | Event::Discarded { .. } => finished += 1,
            Event::Retried {
                job_id, attempt, ..
            } => {
                println!("job {job_id}: attempt {attempt} failed, retrying")
            }
            _ => {}
        }
    }
    worker.shutdown(Duration::from_secs(5))?;

    println!("\nhistory:");
    let finished_states = [
        JobState::Finished(backlog::FinalStatus::Completed),
        JobState::Finished(backlog::FinalStatus::Discarded),
    ];
    for state in finished_states {
        for job in queue.list(&JobFilter::new(state))?.jobs {
            println!(
                "job {} {:<10} {:<9} attempts={} result={} errors={:?}",
                job.id,
                job.kind,
                job.state.as_str(),
                job.attempts,
                job.result.as_deref().unwrap_or("-"),
                job.errors.iter().map(|e| &e.message).collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}
