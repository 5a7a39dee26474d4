//! What the live-worker check costs an idle worker's heartbeat tick: each
//! tick writes the worker's registry row (one upsert in one transaction)
//! and then runs `Queue::unhandled()`: one read of the live workers, one
//! count of the due jobs per queue and kind, and, only when some due job
//! has no worker, one read of the paused queues. This times the write and
//! the check alternately on the same database and reports their medians and
//! the check's cost as a ratio to the write.
//!
//! ```text
//! cargo run --release --example heartbeat_cost                        # SQLite
//! cargo run --release --example heartbeat_cost --features postgres,mysql -- URL...
//! ```
//!
//! The database holds three registered workers, 200 due jobs they handle,
//! and, with `unhandled` as the last argument, 20 due jobs of a kind none
//! handles (so the paused queues are read too).

use std::time::{Duration, Instant};

use backlog::{NewJob, Queue};
use serde_json::json;

const TICKS: usize = 2000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let unhandled = args.last().is_some_and(|a| a == "unhandled");
    if unhandled {
        args.pop();
    }
    let dir = tempfile::tempdir()?;
    let mut targets = vec![("sqlite".to_owned(), Queue::open(dir.path().join("hb.db"))?)];
    for url in args {
        let name = url.split(':').next().unwrap_or("server").to_owned();
        targets.push((name, Queue::connect(&url)?));
    }
    for (name, queue) in targets {
        measure(&name, &queue, unhandled)?;
    }
    Ok(())
}

fn measure(name: &str, queue: &Queue, unhandled: bool) -> Result<(), Box<dyn std::error::Error>> {
    let queues = vec!["default".to_owned(), "mail".to_owned()];
    let kinds = vec!["email".to_owned(), "resize".to_owned()];
    for w in 0..3 {
        queue.register_worker_row(&format!("hb-{w}"), &queues, &kinds)?;
    }
    queue.enqueue_many((0..200).map(|i| NewJob::new("email", json!(i))))?;
    if unhandled {
        queue.enqueue_many((0..20).map(|i| NewJob::new("orphan", json!(i))))?;
    }
    let (mut writes, mut checks) = (Vec::with_capacity(TICKS), Vec::with_capacity(TICKS));
    for _ in 0..TICKS {
        let t = Instant::now();
        queue.register_worker_row("hb-0", &queues, &kinds)?;
        writes.push(t.elapsed());
        let t = Instant::now();
        let found = queue.unhandled()?;
        checks.push(t.elapsed());
        assert_eq!(found.is_empty(), !unhandled);
    }
    let (write, check) = (median(&mut writes), median(&mut checks));
    println!(
        "{name}: heartbeat write median {write:?}, unhandled check median {check:?}, \
         check/write {:.2} ({} queries per check, {TICKS} ticks)",
        check.as_secs_f64() / write.as_secs_f64(),
        if unhandled { 3 } else { 2 },
    );
    Ok(())
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}
