//! What backlog logs, shown with `tracing-subscriber`'s fmt layer: each job
//! runs inside a `job` span (id, kind, queue, attempt) with a start and a
//! finish event (duration, outcome); a failure, a timeout and a dead job are
//! warnings and errors. The library prints nothing itself.
//!
//! Run it with `cargo run --example tracing`.

use std::time::{Duration, Instant};

use backlog::{Event, JobArgs, JobError, NewJob, Queue, Worker};
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
    // The application's subscriber: human-readable lines on stdout, debug
    // and up, with the thread that logged each.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_thread_names(true)
        .with_ansi(false)
        .init();

    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("app.db"))?;
    let events = queue.subscribe();

    queue.enqueue(SendEmail {
        to: "ada@example.com".into(),
    })?;
    // Fails once, then succeeds on its retry.
    queue.enqueue(SendEmail {
        to: "bob@flaky.example".into(),
    })?;
    // Runs past its timeout.
    queue.enqueue(NewJob::new("resize", json!({"image": 7})))?;
    // Its payload does not decode into `SendEmail`: dead at once.
    queue.enqueue(NewJob::new("send_email", json!({"to": 42})))?;

    let worker = Worker::builder(queue.clone())
        .concurrency(2)
        .timeout_for("resize", Duration::from_millis(100))
        .handle(|args: SendEmail, ctx| {
            // Inside the job's span: this line carries its id, kind, queue
            // and attempt.
            tracing::info!(to = %args.to, "sending");
            if args.to.ends_with("@flaky.example") && ctx.attempt() == 1 {
                return Err(JobError::retry_after(
                    Duration::from_millis(50),
                    "SMTP 421: try again later",
                ));
            }
            Ok(())
        })
        .handle_raw("resize", |_, ctx| {
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err::<(), _>(JobError::discard("took too long"))
        })
        .start()?;

    // Four jobs end: two completed, one discarded, one dead.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ended = 0;
    while ended < 4 {
        match events.recv_deadline(deadline)? {
            Event::Completed { .. } | Event::Discarded { .. } | Event::Dead { .. } => ended += 1,
            _ => {}
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}
