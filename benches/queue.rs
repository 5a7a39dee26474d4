//! Micro-benchmarks of the queue's operations on a file-backed database.
//!
//! `cargo bench --bench queue` runs them all in a few minutes; pass a filter
//! to run some (`cargo bench --bench queue -- lease`). The end-to-end figures
//! and the comparison with raw SQLite are in `examples/bench.rs`; see
//! BENCHMARKS.md.
//!
//! Lease benchmarks run on queues prefilled to a fixed depth (1k, 100k, 1M,
//! each prefilled once, in one raw transaction on the queue's own schema);
//! every leased job is released, untimed, so the depth stays constant.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use backlog::{Durability, Job, LeaseRequest, NewJob, Outcome, Queue, QueueOptions};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rusqlite::{params, Connection};
use serde_json::json;
use tempfile::TempDir;

const DURABILITIES: [Durability; 2] = [Durability::Full, Durability::Fast];
const DEPTHS: [usize; 3] = [1_000, 100_000, 1_000_000];

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Full => "full",
        Durability::Fast => "fast",
    }
}

/// A fresh queue in its own temporary directory (kept alive by the `TempDir`).
fn fresh_queue(durability: Durability) -> (TempDir, Queue) {
    let dir = tempfile::tempdir().expect("temp dir");
    let queue = QueueOptions::new()
        .durability(durability)
        .open(dir.path().join("bench.db"))
        .expect("open queue");
    (dir, queue)
}

fn job(n: usize) -> NewJob {
    NewJob::new("noop", json!({ "n": n }))
}

/// Inserts `count` available jobs in one raw transaction, far faster than the
/// public API; the rows are what `enqueue` would write.
fn prefill(path: &Path, count: usize) {
    let mut conn = Connection::open(path).expect("open raw");
    conn.pragma_update(None, "synchronous", "OFF")
        .expect("pragma");
    let tx = conn.transaction().expect("begin");
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO backlog_jobs (queue, kind, payload, available_at, due, created_at, updated_at)
                 VALUES ('default', 'noop', ?1, ?2, 1, ?2, ?2)",
            )
            .expect("prepare");
        // Times in the past, so every job is available (and due: in the lease
        // index, as `enqueue` writes a job due now).
        let base = 1_000_000_000_000_000_i64;
        for n in 0..count {
            let at = base + n as i64;
            insert
                .execute(params![format!("{{\"n\":{n}}}"), at])
                .expect("insert");
        }
    }
    tx.commit().expect("commit");
}

/// Leases `batch` jobs then releases them, timing only the lease. A short
/// lease fails the benchmark: an empty queue must not pass for a fast one.
fn timed_leases(queue: &Queue, batch: usize, iters: u64) -> Duration {
    let request = LeaseRequest::new("bench", batch);
    let mut spent = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        let jobs = queue.lease(&request).expect("lease");
        spent += start.elapsed();
        assert_eq!(jobs.len(), batch, "the queue ran dry");
        release(queue, &jobs);
    }
    spent
}

fn release(queue: &Queue, jobs: &[Job]) {
    let results = queue
        .settle_many(jobs.iter().map(|j| (j, Outcome::Release)))
        .expect("release");
    assert!(results.iter().all(Result::is_ok));
}

fn enqueue(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue");
    for durability in DURABILITIES {
        let (_dir, queue) = fresh_queue(durability);
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new("one", durability_name(durability)), |b| {
            let mut n = 0;
            b.iter(|| {
                n += 1;
                black_box(queue.enqueue(job(n)).expect("enqueue"))
            })
        });
        for batch in [100, 1000] {
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(
                BenchmarkId::new(format!("many_{batch}"), durability_name(durability)),
                |b| {
                    b.iter(|| {
                        black_box(
                            queue
                                .enqueue_many((0..batch).map(job))
                                .expect("enqueue_many"),
                        )
                    })
                },
            );
        }
    }
    group.finish();
}

fn lease(c: &mut Criterion) {
    let mut group = c.benchmark_group("lease");
    for depth in DEPTHS {
        let (_dir, queue) = fresh_queue(Durability::Fast);
        prefill(queue.path().expect("a SQLite queue"), depth);
        for batch in [1, 100] {
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_function(
                BenchmarkId::new(format!("batch_{batch}"), format!("depth_{depth}")),
                |b| b.iter_custom(|iters| timed_leases(&queue, batch, iters)),
            );
        }
    }
    group.finish();
}

fn complete(c: &mut Criterion) {
    let mut group = c.benchmark_group("complete");
    const BATCH: usize = 100;
    group.throughput(Throughput::Elements(BATCH as u64));
    for durability in DURABILITIES {
        let (_dir, queue) = fresh_queue(durability);
        let request = LeaseRequest::new("bench", BATCH);
        group.bench_function(
            BenchmarkId::new(format!("settle_many_{BATCH}"), durability_name(durability)),
            |b| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        queue
                            .enqueue_many((0..BATCH).map(job))
                            .expect("enqueue_many");
                        let jobs = queue.lease(&request).expect("lease");
                        assert_eq!(jobs.len(), BATCH);
                        let start = Instant::now();
                        let results = queue
                            .settle_many(jobs.iter().map(|j| (j, Outcome::Complete(None))))
                            .expect("complete");
                        spent += start.elapsed();
                        assert!(results.iter().all(Result::is_ok));
                    }
                    spent
                })
            },
        );
    }
    group.finish();
}

fn cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(1));
    for durability in DURABILITIES {
        let (_dir, queue) = fresh_queue(durability);
        let request = LeaseRequest::new("bench", 1);
        group.bench_function(
            BenchmarkId::new("enqueue_lease_complete", durability_name(durability)),
            |b| {
                let mut n = 0;
                b.iter(|| {
                    n += 1;
                    queue.enqueue(job(n)).expect("enqueue");
                    let jobs = queue.lease(&request).expect("lease");
                    assert_eq!(jobs.len(), 1);
                    queue.complete(&jobs[0], None).expect("complete");
                })
            },
        );
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = enqueue, lease, complete, cycle
}
criterion_main!(benches);
