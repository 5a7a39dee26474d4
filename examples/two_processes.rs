//! Two processes, one file: this program enqueues jobs while a second copy of
//! itself, started as a child process, works them. The worker notices the
//! other process's enqueues through `PRAGMA data_version` within
//! milliseconds. Run with `cargo run --example two_processes`.

use std::process::Command;
use std::time::Duration;

use backlog::{Event, JobArgs, JobFilter, JobState, Queue, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Greet {
    name: String,
}

impl JobArgs for Greet {
    const KIND: &'static str = "greet";
}

const NAMES: [&str; 5] = ["Ada", "Grace", "Edsger", "Barbara", "Ken"];
const ROLE: &str = "BACKLOG_EXAMPLE_ROLE";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    if std::env::var(ROLE).as_deref() == Ok("worker") {
        let path = args.next().ok_or("the worker needs the database path")?;
        return work(Queue::open(path)?);
    }

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shared.db");
    let queue = Queue::open(&path)?;

    // Start the worker process on the same file, then enqueue from this one.
    let mut child = Command::new(std::env::current_exe()?)
        .arg(&path)
        .env(ROLE, "worker")
        .spawn()?;
    for name in NAMES {
        queue.enqueue(Greet { name: name.into() })?;
        println!(
            "[enqueuer pid {}] enqueued greet {name}",
            std::process::id()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("the worker process failed: {status}").into());
    }

    let done = queue.list(&JobFilter::new(JobState::Finished(
        backlog::FinalStatus::Completed,
    )))?;
    println!("\ncompleted, as seen by the enqueuing process:");
    for job in &done.jobs {
        println!(
            "job {} by {}: {}",
            job.id,
            job.worker.as_deref().unwrap_or("?"),
            job.result.as_deref().unwrap_or("-")
        );
    }
    if done.jobs.len() != NAMES.len() {
        return Err(format!("{} of {} jobs completed", done.jobs.len(), NAMES.len()).into());
    }
    Ok(())
}

/// The worker process: works until every name was greeted, then stops.
fn work(queue: Queue) -> Result<(), Box<dyn std::error::Error>> {
    let events = queue.subscribe();
    let pid = std::process::id();
    let worker = Worker::builder(queue.clone())
        .worker_id(format!("worker-pid-{pid}"))
        .handle(move |args: Greet, ctx| {
            println!("[worker pid {pid}] job {}: hello, {}!", ctx.id(), args.name);
            Ok(format!("greeted {}", args.name))
        })
        .start()?;
    let mut completed = 0;
    while completed < NAMES.len() {
        if let Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            completed += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}
