//! `fairness`: processes sharing one SQLite file. One process writes flat
//! out (an enqueue loop, or a worker draining a prefilled queue) while
//! others sample: a single enqueue every few milliseconds, each timed. The
//! samplers' p50/p99/max say how long an application waits for its turn at
//! the write lock; the flat-out process's throughput, against the same
//! process alone on a fresh file in the same run, says what yielding cost.
//!
//! Every process is a child (`fair-child`), all started at one instant so
//! that opening the file is not timed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::sqlite::QueueExt;
use backlog::{Durability, NewJob, Worker};
use serde_json::json;

use crate::db::{durability_name, fresh_db, now_micros, open_queue, BoxResult};
use crate::report::{percentile, Report, Target};

/// What the flat-out process does.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flat {
    /// Single enqueues in a loop, each its own commit.
    Enqueue,
    /// A worker (4 handler threads) draining a prefilled queue of no-ops.
    Drain,
}

impl Flat {
    fn name(self) -> &'static str {
        match self {
            Flat::Enqueue => "enqueue",
            Flat::Drain => "drain",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct FairnessArgs {
    /// Sampling processes next to the flat-out one.
    #[arg(long, default_value_t = 2)]
    pub samplers: usize,
    /// How long each phase (alone, then shared) runs.
    #[arg(long, default_value_t = 5.0)]
    pub secs: f64,
    /// A sampler's pause between two enqueues.
    #[arg(long, default_value_t = 20)]
    pub every_ms: u64,
    /// What the flat-out process does, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Flat::Enqueue, Flat::Drain])]
    pub flat: Vec<Flat>,
    /// Expired leases a worker's maintenance rescues, for the longest hold.
    #[arg(long, default_value_t = 20_000)]
    pub rescue_expired: usize,
}

/// (internal) One process of the fairness mode.
#[derive(clap::Args, Debug, Clone)]
pub struct FairChildArgs {
    #[arg(long)]
    pub db: PathBuf,
    /// `enqueue`, `drain` or `sample`.
    #[arg(long)]
    pub role: String,
    #[arg(long)]
    pub secs: f64,
    #[arg(long, default_value_t = 20)]
    pub every_ms: u64,
    /// Unix µs at which to begin.
    #[arg(long)]
    pub start_us: i64,
}

/// Jobs prefilled for the drain role: more than a worker drains in a phase.
const DRAIN_PREFILL: usize = 300_000;

pub fn run(report: &mut Report, dir: &Path, d: Durability, a: &FairnessArgs) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    for &flat in &a.flat {
        let mode = format!("fairness-{}", flat.name());
        // Alone before and after the shared phase: the machine's drift (other
        // work on it, the disk) weighs on both sides alike.
        let before = phase(dir, d, a, flat, 0)?;
        let shared = phase(dir, d, a, flat, a.samplers)?;
        let after = phase(dir, d, a, flat, 0)?;
        let base = (before.flat_per_sec + after.flat_per_sec) / 2.0;
        let with = shared.flat_per_sec;
        let hold = [&before, &shared, &after]
            .iter()
            .map(|p| p.maintenance_hold_ms)
            .fold(0.0, f64::max);
        report.target(
            &mode,
            dn,
            "longest maintenance hold",
            "ms",
            hold,
            Target::AtMost(50.0),
        );
        let mut lat = shared.latencies_ms;
        lat.sort_by(f64::total_cmp);
        report.value(&mode, dn, "flat-out alone", "jobs/s", base);
        report.value(&mode, dn, "flat-out with samplers", "jobs/s", with);
        report.target(
            &mode,
            dn,
            "flat-out throughput kept",
            "ratio",
            with / base,
            Target::AtLeast(0.8),
        );
        report.value(&mode, dn, "sampler enqueues", "count", lat.len() as f64);
        report.target(
            &mode,
            dn,
            "sampler enqueue p50",
            "ms",
            percentile(&lat, 50.0),
            Target::AtMost(50.0),
        );
        report.target(
            &mode,
            dn,
            "sampler enqueue p99",
            "ms",
            percentile(&lat, 99.0),
            Target::AtMost(50.0),
        );
        report.target(
            &mode,
            dn,
            "sampler enqueue max",
            "ms",
            lat.last().copied().unwrap_or(f64::NAN),
            Target::AtMost(200.0),
        );
        report.target(
            &mode,
            dn,
            "sampler errors",
            "count",
            shared.errors as f64,
            Target::AtMost(0.0),
        );
    }
    Ok(())
}

struct Phase {
    flat_per_sec: f64,
    /// The flat-out process's longest maintenance hold of the write gate.
    maintenance_hold_ms: f64,
    latencies_ms: Vec<f64>,
    errors: u64,
}

fn phase(
    dir: &Path,
    d: Durability,
    a: &FairnessArgs,
    flat: Flat,
    samplers: usize,
) -> BoxResult<Phase> {
    let path = fresh_db(dir, &format!("fairness-{}", flat.name()))?;
    if flat == Flat::Drain {
        crate::db::prefill(&path, DRAIN_PREFILL)?;
    }
    // Far enough ahead for every child to have opened the file.
    let start_us = now_micros() + 1_500_000;
    let spawn = |role: &str| {
        Command::new(std::env::current_exe()?)
            .arg("fair-child")
            .args([
                "--durability",
                durability_name(d).to_ascii_lowercase().as_str(),
            ])
            .arg("--db")
            .arg(&path)
            .args(["--role", role])
            .args(["--secs", &a.secs.to_string()])
            .args(["--every-ms", &a.every_ms.to_string()])
            .args(["--start-us", &start_us.to_string()])
            .stdout(Stdio::piped())
            .spawn()
    };
    let flat_child = spawn(flat.name())?;
    let sampler_children = (0..samplers)
        .map(|_| spawn("sample"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let parse = |child: std::process::Child| -> BoxResult<serde_json::Value> {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(format!("a fairness child failed: {}", out.status).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let last = text
            .lines()
            .last()
            .ok_or("a fairness child printed nothing")?;
        Ok(serde_json::from_str(last)?)
    };
    let flat_out = parse(flat_child)?;
    let mut latencies_ms = Vec::new();
    let mut errors = flat_out["errors"].as_u64().unwrap_or(0);
    for child in sampler_children {
        let v = parse(child)?;
        errors += v["errors"].as_u64().unwrap_or(0);
        latencies_ms.extend(
            v["latencies_us"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_f64())
                .map(|us| us / 1000.0),
        );
    }
    Ok(Phase {
        flat_per_sec: flat_out["count"].as_f64().unwrap_or(0.0) / a.secs,
        maintenance_hold_ms: flat_out["maintenance_hold_us"].as_f64().unwrap_or(0.0) / 1000.0,
        latencies_ms,
        errors,
    })
}

/// One child: waits for the common start, does its role for `secs`, prints
/// one JSON line.
pub fn child(a: &FairChildArgs, d: Durability) -> BoxResult<()> {
    let queue = open_queue(&a.db, d)?;
    let wait_us = a.start_us - now_micros();
    if wait_us > 0 {
        std::thread::sleep(Duration::from_micros(wait_us as u64));
    }
    let secs = Duration::from_secs_f64(a.secs);
    let start = Instant::now();
    let (mut count, mut errors, mut latencies_us) = (0u64, 0u64, Vec::new());
    match a.role.as_str() {
        "enqueue" => {
            while start.elapsed() < secs {
                match queue.enqueue(NewJob::new("flat", json!({ "n": count }))) {
                    Ok(_) => count += 1,
                    Err(_) => errors += 1,
                }
            }
        }
        "drain" => {
            let done = Arc::new(AtomicU64::new(0));
            let counter = done.clone();
            let worker = Worker::builder(queue.clone())
                .concurrency(4)
                .handle_raw("noop", move |_args, _ctx| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
                .start()?;
            std::thread::sleep(secs);
            count = done.load(Ordering::Relaxed);
            worker.shutdown(Duration::from_secs(5))?;
        }
        "sample" => {
            let every = Duration::from_millis(a.every_ms);
            while start.elapsed() < secs {
                let began = Instant::now();
                match queue.enqueue(NewJob::new("sample", json!({ "t": now_micros() }))) {
                    Ok(_) => latencies_us.push(began.elapsed().as_micros() as u64),
                    Err(_) => errors += 1,
                }
                std::thread::sleep(every);
            }
        }
        other => return Err(format!("unknown fairness role {other:?}").into()),
    }
    let maintenance_hold_us = queue
        .longest_maintenance_hold()
        .map_or(0, |h| h.as_micros() as u64);
    println!(
        "{}",
        json!({
            "role": a.role, "count": count, "errors": errors, "latencies_us": latencies_us,
            "maintenance_hold_us": maintenance_hold_us,
        })
    );
    Ok(())
}

/// The rescue's slices: a worker's maintenance rescues a backlog of
/// expired leases (a crashed worker's), one transaction per batch; the
/// longest of them, as the queue records it.
pub fn rescue(report: &mut Report, dir: &Path, d: Durability, expired: usize) -> BoxResult<()> {
    let dn = durability_name(d);
    let path = fresh_db(dir, "fairness-rescue")?;
    crate::db::prefill(&path, expired)?;
    let conn = rusqlite::Connection::open(&path)?;
    conn.execute(
        "UPDATE backlog_jobs SET lease_token = id, lease_until = 1, locked_by = 'gone',
                 attempts = 1, first_leased_at = created_at",
        [],
    )?;
    let queue = open_queue(&path, d)?;
    let began = Instant::now();
    let worker = Worker::builder(queue.clone())
        .rescue_interval(Duration::from_millis(20))
        .handle_raw("unrelated", |_args, _ctx| Ok(()))
        .start()?;
    let leased = || -> rusqlite::Result<i64> {
        conn.query_row(
            "SELECT count(*) FROM backlog_jobs WHERE lease_token IS NOT NULL",
            [],
            |r| r.get(0),
        )
    };
    while leased()? > 0 && began.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = began.elapsed();
    worker.shutdown(Duration::from_secs(5))?;
    let left = leased()?;
    report.gate(
        "fairness-rescue",
        dn,
        "every expired lease rescued",
        crate::db::Gate {
            ok: left == 0,
            detail: format!("{expired} expired, {left} left after {took:?}"),
        },
    );
    report.value(
        "fairness-rescue",
        dn,
        "rescued",
        "jobs/s",
        expired as f64 / took.as_secs_f64(),
    );
    report.target(
        "fairness-rescue",
        dn,
        "longest maintenance hold",
        "ms",
        queue
            .longest_maintenance_hold()
            .map_or(f64::NAN, |h| h.as_secs_f64() * 1000.0),
        Target::AtMost(50.0),
    );
    Ok(())
}
