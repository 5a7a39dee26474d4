//! What a sequence costs (issue 23): a sequenced enqueue against a plain one,
//! and the drain of sequenced jobs (many keys) against plain ones, measured
//! in the same process, runs alternating, on SQLite (default FULL
//! durability) and, when given a URL, on PostgreSQL or MySQL/MariaDB.
//!
//! Each run enqueues N jobs in `enqueue_many` batches of 500, plain, then
//! sequenced over K keys (the jobs of a key interleaved with the others'),
//! each on fresh tables; then N/10 more one per `enqueue` (one transaction
//! each); then drains each set with a default worker (4 handler threads,
//! no-op handler) and reports jobs per second. Medians and per-run ratios.
//!
//! ```sh
//! cargo run --release --example sequence_cost -- 10000 100 3          # SQLite
//! cargo run --release --features postgres --example sequence_cost -- 10000 100 3 postgres://..
//! ```
//!
//! Defaults: 2,000 jobs, 50 keys, 1 run, SQLite: small enough for CI.

use std::time::{Duration, Instant};

use backlog::{NewJob, Queue, QueueOptions, Worker};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().map_or(Ok(2_000), |a| a.parse())?;
    let keys: usize = args.next().map_or(Ok(50), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let url = args.next();
    let dir = tempfile::tempdir()?;
    let open = |name: String| -> backlog::Result<Queue> {
        match &url {
            None => Queue::open(dir.path().join(format!("{name}.db"))),
            Some(url) => QueueOptions::new()
                .table_prefix(format!("{name}_"))
                .connect(url),
        }
    };
    let stamp = std::process::id();
    let (mut enq_ratio, mut one_ratio, mut drain_ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut enq, mut one, mut drain) = (
        [Vec::new(), Vec::new()],
        [Vec::new(), Vec::new()],
        [Vec::new(), Vec::new()],
    );
    for run in 0..runs {
        for (side, sequenced) in [(0, false), (1, true)] {
            let queue = open(format!(
                "sc{stamp}r{run}{}",
                if sequenced { "s" } else { "p" }
            ))?;
            let all: Vec<NewJob> = (0..jobs)
                .map(|n| {
                    let job = NewJob::new("noop", json!({ "n": n }));
                    if sequenced {
                        job.sequence(format!("key-{}", n % keys))
                    } else {
                        job
                    }
                })
                .collect();
            let start = Instant::now();
            for chunk in all.chunks(500) {
                queue.enqueue_many(chunk.to_vec())?;
            }
            enq[side].push(start.elapsed().as_secs_f64() * 1e6 / jobs as f64);
            let singles = &all[..jobs / 10];
            let start = Instant::now();
            for job in singles {
                queue.enqueue(job.clone())?;
            }
            one[side].push(start.elapsed().as_secs_f64() * 1e6 / singles.len() as f64);
            let total = jobs + singles.len();
            drain[side].push(total as f64 / drain_all(&queue, total)?.as_secs_f64());
        }
        enq_ratio.push(enq[1][run] / enq[0][run]);
        one_ratio.push(one[1][run] / one[0][run]);
        drain_ratio.push(drain[1][run] / drain[0][run]);
        println!(
            "run {run}: enqueue_many plain {:.1} µs/job, sequenced {:.1} µs/job (×{:.2}); \
             enqueue plain {:.0} µs, sequenced {:.0} µs (×{:.2}); \
             drain plain {:.0} jobs/s, sequenced {:.0} jobs/s (×{:.2})",
            enq[0][run],
            enq[1][run],
            enq_ratio[run],
            one[0][run],
            one[1][run],
            one_ratio[run],
            drain[0][run],
            drain[1][run],
            drain_ratio[run]
        );
    }
    let backend = url
        .as_deref()
        .map_or("sqlite", |u| u.split(':').next().unwrap_or("server"));
    println!(
        "medians of {runs} ({jobs} jobs, {keys} keys, {backend}): enqueue_many plain {:.1} µs/job, \
         sequenced {:.1} µs/job, ratio {:.2}; enqueue plain {:.0} µs, sequenced {:.0} µs, \
         ratio {:.2}; drain plain {:.0} jobs/s, sequenced {:.0} jobs/s, ratio {:.2}",
        median(&enq[0]),
        median(&enq[1]),
        median(&enq_ratio),
        median(&one[0]),
        median(&one[1]),
        median(&one_ratio),
        median(&drain[0]),
        median(&drain[1]),
        median(&drain_ratio)
    );
    Ok(())
}

/// Runs every job with a default worker; how long until the last handler
/// returned (its commit follows within the completer's batch).
fn drain_all(queue: &Queue, jobs: usize) -> Result<Duration, Box<dyn std::error::Error>> {
    let (done, finished) = crossbeam_channel::unbounded();
    let start = Instant::now();
    let worker = Worker::builder(queue.clone())
        .handle_raw("noop", move |_: serde_json::Value, _ctx| {
            let _ = done.send(());
            Ok(())
        })
        .start()?;
    for _ in 0..jobs {
        finished.recv_timeout(Duration::from_secs(60))?;
    }
    let took = start.elapsed();
    worker.shutdown(Duration::from_secs(10))?;
    Ok(took)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
