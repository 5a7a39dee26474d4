//! The fan-in figure of batches (issue 23): N members into one callback, on
//! SQLite with the default (FULL) durability.
//!
//! Each run completes N plain jobs, then N members of one sealed batch, the
//! same way (leases of `CHUNK` jobs, each settled with one `complete_many`
//! transaction, as a worker's completer does), and reports:
//!
//! - the completion cost per job, plain and as a batch member, and their
//!   ratio (the cost of counting a member: its membership row deleted and the
//!   batch's counter row updated, in the completing transaction);
//! - the time from the last member's commit (the return of its
//!   `complete_many`) to the callback being visible to a lease, and the
//!   duration of that last commit itself (the callback is inserted in it).
//!
//! Medians over the runs. `cargo run --release --example batch_fanin -- 10000 5`
//! (members, runs); the defaults are 2,000 members and 1 run, small enough
//! for CI.

use std::time::{Duration, Instant};

use backlog::{LeaseRequest, NewJob, Queue};
use serde_json::json;

/// Jobs per lease and per completing transaction.
const CHUNK: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let members: usize = args.next().map_or(Ok(2_000), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(1), |a| a.parse())?;

    let mut plain = Vec::new();
    let mut member = Vec::new();
    let mut visible = Vec::new();
    let mut last_commit = Vec::new();
    for run in 0..runs {
        let dir = tempfile::tempdir()?;
        let queue = Queue::open(dir.path().join("fanin.db"))?;

        let jobs = (0..members).map(|n| NewJob::new("plain", json!({ "n": n })));
        queue.enqueue_many(jobs)?;
        let (took, _) = complete_all(&queue, "plain", members)?;
        plain.push(per_job(took, members));

        let batch = queue
            .batch()
            .on_complete(NewJob::new("report", json!({})).queue("callbacks"))
            .create()?;
        for chunk in (0..members).collect::<Vec<_>>().chunks(1_000) {
            let jobs = chunk
                .iter()
                .map(|n| NewJob::new("member", json!({ "n": n })).batch(batch.id));
            queue.enqueue_many(jobs)?;
        }
        queue.seal_batch(batch.id)?;
        let (took, last) = complete_all(&queue, "member", members)?;
        member.push(per_job(took, members));
        last_commit.push(last);

        // The last commit has returned: the callback must be there already.
        let returned = Instant::now();
        let fired = queue.lease(&LeaseRequest::new("cb", 10).queues(["callbacks"]))?;
        visible.push(returned.elapsed());
        if fired.len() != 1 {
            return Err(format!("expected one callback, found {}", fired.len()).into());
        }
        let status = queue.batch_status(batch.id)?;
        if status.completed != members as i64 || status.complete_job_id != Some(fired[0].id) {
            return Err(format!("unexpected batch status {status:?}").into());
        }
        println!(
            "run {run}: plain {:.1} µs/job, member {:.1} µs/job, last commit {:.2} ms, \
             callback visible {:.2} ms after it",
            plain[run],
            member[run],
            ms(last_commit[run]),
            ms(visible[run])
        );
    }
    let (p, m) = (median(&mut plain), median(&mut member));
    let mut last_ms: Vec<f64> = last_commit.iter().map(|d| ms(*d)).collect();
    let mut visible_ms: Vec<f64> = visible.iter().map(|d| ms(*d)).collect();
    println!(
        "fan-in of {members} members, median of {runs}: completion {p:.1} µs/job plain, \
         {m:.1} µs/job in a batch (ratio {:.2}); last member's commit {:.2} ms (callback \
         inserted in it); callback visible {:.2} ms after that commit returned",
        m / p,
        median(&mut last_ms),
        median(&mut visible_ms)
    );
    Ok(())
}

/// Leases and completes `n` jobs of `kind`, `CHUNK` per transaction; the
/// time it all took, and the duration of the last transaction.
fn complete_all(queue: &Queue, kind: &str, n: usize) -> backlog::Result<(Duration, Duration)> {
    let start = Instant::now();
    let mut done = 0;
    let mut last = Duration::ZERO;
    while done < n {
        let jobs = queue.lease(&LeaseRequest::new("w", CHUNK).kinds([kind]))?;
        if jobs.is_empty() {
            return Err(backlog::Error::InvalidArgument(format!(
                "only {done} of {n} jobs were leased"
            )));
        }
        let commit = Instant::now();
        for result in queue.complete_many(&jobs)? {
            result?;
        }
        last = commit.elapsed();
        done += jobs.len();
    }
    Ok((start.elapsed(), last))
}

fn per_job(took: Duration, n: usize) -> f64 {
    took.as_secs_f64() * 1e6 / n as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
