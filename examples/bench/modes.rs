//! The modes that need no worker: `raw` (the ceiling), `enqueue` (backlog
//! against the raw inserts, in the same run) and `lease-depth` (the lease at a
//! small and a large queue depth).

use std::path::Path;
use std::time::{Duration, Instant};

use backlog::{Durability, LeaseRequest, NewJob, Outcome, Queue};
use rusqlite::Connection;
use serde_json::json;

use crate::db::{
    self, drain_queue, durability_name, exactly_once, fresh_db, open_queue, BoxResult, Gate,
    Pragmas,
};
use crate::raw::Raw;
use crate::report::{Report, Target};

fn per_sec(jobs: usize, took: Duration) -> f64 {
    jobs as f64 / took.as_secs_f64().max(1e-9)
}

/// Reads back and records both sides' pragmas for `durability`.
pub fn record_env(report: &mut Report, dir: &Path, durability: Durability) -> BoxResult<()> {
    let path = fresh_db(dir, "env")?;
    let queue = open_queue(&path, durability)?;
    let raw = Raw::open(&path, durability)?;
    report.env(
        durability_name(durability),
        &Pragmas::of_queue(&queue)?,
        &raw.pragmas()?,
    );
    Ok(())
}

// ---- raw -------------------------------------------------------------------

pub struct RawSizes {
    /// Jobs for the one-insert-per-commit loop (each commit may fsync).
    pub single: usize,
    /// Jobs for the batched loops and the drains.
    pub batched: usize,
}

/// The ceiling alone: inserts one per commit and in batches of 100 and 1000,
/// then drains each file in batches (lease n, complete n, one transaction each).
pub fn raw(report: &mut Report, dir: &Path, d: Durability, sizes: &RawSizes) -> BoxResult<()> {
    record_env(report, dir, d)?;
    let dn = durability_name(d);
    let cases = [
        ("insert, 1 per commit", sizes.single, 1, "drain, batch 1", 1),
        (
            "insert, batch 100",
            sizes.batched,
            100,
            "drain, batch 100",
            100,
        ),
        (
            "insert, batch 1000",
            sizes.batched,
            1000,
            "drain, batch 1000",
            1000,
        ),
    ];
    for (insert_name, count, batch, drain_name, drain_batch) in cases {
        let path = fresh_db(dir, "raw")?;
        let mut raw = Raw::open(&path, d)?;
        let took = raw.insert(0, count, batch)?;
        report.value("raw", dn, insert_name, "jobs/s", per_sec(count, took));
        // Draining one at a time takes two commits per job: keep it short.
        let (took, done) = raw.drain(drain_batch)?;
        report.value("raw", dn, drain_name, "jobs/s", per_sec(done, took));
        report.gate("raw", dn, drain_name, exactly_once(&path, count)?);
    }
    Ok(())
}

// ---- enqueue ---------------------------------------------------------------

pub struct EnqueueSizes {
    pub single: usize,
    pub batched: usize,
}

fn job(n: usize) -> NewJob {
    NewJob::new("noop", json!({ "n": n }))
}

/// backlog's enqueue against the raw insert loop with the same batch size, on
/// fresh files, in alternating order from run to run.
pub fn enqueue(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    sizes: &EnqueueSizes,
    run: usize,
) -> BoxResult<()> {
    record_env(report, dir, d)?;
    let dn = durability_name(d);
    let cases = [
        ("one at a time", sizes.single, 1, Some(Target::AtLeast(0.8))),
        ("enqueue_many(100)", sizes.batched, 100, None),
        (
            "enqueue_many(1000)",
            sizes.batched,
            1000,
            Some(Target::AtLeast(0.7)),
        ),
    ];
    for (name, count, batch, target) in cases {
        let mut backlog_rate = 0.0;
        let mut raw_rate = 0.0;
        for side in 0..2 {
            if (side + run).is_multiple_of(2) {
                backlog_rate = enqueue_backlog(report, dir, d, count, batch)?;
            } else {
                raw_rate = enqueue_raw(report, dir, d, count, batch)?;
            }
        }
        report.value(
            "enqueue",
            dn,
            &format!("backlog {name}"),
            "jobs/s",
            backlog_rate,
        );
        report.value(
            "enqueue",
            dn,
            &format!("raw, batch {batch}"),
            "jobs/s",
            raw_rate,
        );
        let ratio = backlog_rate / raw_rate;
        let ratio_name = format!("{name} / raw batch {batch}");
        match target {
            Some(t) => report.target("enqueue", dn, &ratio_name, "ratio", ratio, t),
            None => report.value("enqueue", dn, &ratio_name, "ratio", ratio),
        }
    }
    Ok(())
}

fn enqueue_backlog(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    count: usize,
    batch: usize,
) -> BoxResult<f64> {
    let path = fresh_db(dir, "enqueue-backlog")?;
    let queue = open_queue(&path, d)?;
    let start = Instant::now();
    if batch == 1 {
        for n in 0..count {
            queue.enqueue(job(n))?;
        }
    } else {
        let mut n = 0;
        while n < count {
            let end = (n + batch).min(count);
            queue.enqueue_many((n..end).map(job))?;
            n = end;
        }
    }
    let rate = per_sec(count, start.elapsed());
    drain_queue(&queue)?;
    report.gate(
        "enqueue",
        durability_name(d),
        &format!("backlog batch {batch}"),
        exactly_once(&path, count)?,
    );
    Ok(rate)
}

fn enqueue_raw(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    count: usize,
    batch: usize,
) -> BoxResult<f64> {
    let path = fresh_db(dir, "enqueue-raw")?;
    let mut raw = Raw::open(&path, d)?;
    let rate = per_sec(count, raw.insert(0, count, batch)?);
    raw.drain(1000)?;
    report.gate(
        "enqueue",
        durability_name(d),
        &format!("raw batch {batch}"),
        exactly_once(&path, count)?,
    );
    Ok(rate)
}

// ---- lease-depth -----------------------------------------------------------

pub struct Depths {
    pub small: usize,
    pub large: usize,
    /// Timed leases per depth and batch size.
    pub leases: usize,
}

/// Files prefilled once per invocation and shared by every run and durability
/// (durability is a property of the connection, not of the file).
pub struct DepthFiles {
    small: std::path::PathBuf,
    large: std::path::PathBuf,
}

pub fn prefill_depths(dir: &Path, depths: &Depths) -> BoxResult<DepthFiles> {
    let small = fresh_db(dir, "depth-small")?;
    db::prefill(&small, depths.small)?;
    let large = fresh_db(dir, "depth-large")?;
    db::prefill(&large, depths.large)?;
    Ok(DepthFiles { small, large })
}

/// The mean time of one lease of `batch` jobs over `count` leases; each lease
/// is released (untimed) so the depth stays constant.
fn lease_cost(queue: &Queue, batch: usize, count: usize) -> BoxResult<Duration> {
    let request = LeaseRequest::new("bench", batch);
    let mut spent = Duration::ZERO;
    for i in 0..count + count / 10 {
        let start = Instant::now();
        let jobs = queue.lease(&request)?;
        let took = start.elapsed();
        // The first tenth warms the caches and is not counted.
        if i >= count / 10 {
            spent += took;
        }
        if jobs.len() != batch {
            return Err(format!("leased {} jobs, expected {batch}", jobs.len()).into());
        }
        for result in queue.settle_many(jobs.iter().map(|j| (j, Outcome::Release)))? {
            result?;
        }
    }
    Ok(spent / count as u32)
}

/// The lease at both depths, batch 1 and 100, and the large/small ratio.
pub fn lease_depth(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    depths: &Depths,
    files: &DepthFiles,
) -> BoxResult<()> {
    record_env(report, dir, d)?;
    let dn = durability_name(d);
    let small = open_queue(&files.small, d)?;
    let large = open_queue(&files.large, d)?;
    for batch in [1, 100] {
        let at_small = lease_cost(&small, batch, depths.leases)?;
        let at_large = lease_cost(&large, batch, depths.leases)?;
        let us = |t: Duration| t.as_secs_f64() * 1e6;
        let label = |n: usize| {
            if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
                format!("{}M", n / 1_000_000)
            } else if n >= 1000 && n.is_multiple_of(1000) {
                format!("{}k", n / 1000)
            } else {
                n.to_string()
            }
        };
        let (s, l) = (label(depths.small), label(depths.large));
        report.value(
            "lease-depth",
            dn,
            &format!("lease {batch} at {s} queued"),
            "µs",
            us(at_small),
        );
        report.value(
            "lease-depth",
            dn,
            &format!("lease {batch} at {l} queued"),
            "µs",
            us(at_large),
        );
        report.target(
            "lease-depth",
            dn,
            &format!("lease {batch}: cost at {l} / at {s}"),
            "x",
            us(at_large) / us(at_small),
            Target::AtMost(1.5),
        );
    }
    Ok(())
}

/// After every run: each file still holds its depth, nothing leased, nothing
/// finished; then the small file is drained and must complete exactly once.
pub fn lease_depth_gate(report: &mut Report, depths: &Depths, files: &DepthFiles) -> BoxResult<()> {
    for (path, depth) in [(&files.small, depths.small), (&files.large, depths.large)] {
        let conn = Connection::open(path)?;
        let (live, leased): (i64, i64) = conn.query_row(
            "SELECT count(*), count(lease_token) FROM backlog_jobs",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let finished: i64 =
            conn.query_row("SELECT count(*) FROM backlog_history", [], |r| r.get(0))?;
        let ok = live == depth as i64 && leased == 0 && finished == 0;
        report.gate(
            "lease-depth",
            "-",
            &format!("depth {depth} intact"),
            Gate {
                ok,
                detail: format!("live {live}, leased {leased}, finished {finished}"),
            },
        );
    }
    let queue = open_queue(&files.small, Durability::Fast)?;
    drain_queue(&queue)?;
    report.gate(
        "lease-depth",
        "-",
        &format!("depth {} drained", depths.small),
        exactly_once(&files.small, depths.small)?,
    );
    Ok(())
}
