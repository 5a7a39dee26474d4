//! What one metrics scrape costs on a large queue: fills a fresh SQLite file
//! with N live jobs (default 10 000; `-- 1000000` for the BENCHMARKS.md
//! figure) over four queues, some due later, some leased, some dead, then
//! times `Queue::metrics()` and `Queue::stats()`.
//!
//! cargo run --release --example metrics_scrape -- 1000000

use std::time::{Duration, Instant};

use backlog::{Durability, LeaseRequest, NewJob, QueueOptions};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let queue = QueueOptions::new()
        .durability(Durability::Fast)
        .open(dir.path().join("scrape.db"))?;
    let fill = Instant::now();
    const BATCH: usize = 10_000;
    for start in (0..n).step_by(BATCH) {
        let jobs = (start..(start + BATCH).min(n)).map(|i| {
            let job = NewJob::new("work", json!({ "n": i, "pad": "x".repeat(64) }))
                .queue(["a", "b", "c", "d"][i % 4])
                .priority((i % 3) as i32);
            if i % 10 == 0 {
                job.delay(Duration::from_secs(3600))
            } else {
                job
            }
        });
        queue.enqueue_many(jobs)?;
    }
    let leased = queue.lease(&LeaseRequest::new("w", 100).queues(["a"]))?;
    for job in leased.iter().take(10) {
        queue.discard(job, "x")?;
    }
    println!("filled {n} live jobs in {:?}", fill.elapsed());

    for what in ["metrics", "stats"] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            match what {
                "metrics" => drop(queue.metrics()?),
                _ => drop(queue.stats()?),
            }
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "{what}: median {:?}, min {:?}, max {:?} (5 runs)",
            times[2], times[0], times[4]
        );
    }
    print!("{}", queue.metrics()?);
    Ok(())
}
