//! The cost of a scheduler running in every process: N processes each run a
//! `Scheduler` with the same S schedules on one SQLite file.
//!
//! - idle: schedules that do not tick in the window (daily): CPU and
//!   wake-ups per process;
//! - ticking: every schedule ticks every second, so each second every
//!   process wakes S times and races the others for S claims: CPU and
//!   wake-ups per process, ticks enqueued and claims lost;
//! - enqueue: this process enqueues jobs one at a time (a commit each) on
//!   a file with no scheduler, then on a file with the N processes ticking
//!   every 100 ms: the ratio is what the schedulers' claims cost an
//!   application's writes.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{Durability, NewJob, Schedule, Scheduler};
use serde_json::{json, Value};

use crate::db::{durability_name, fresh_db, open_queue, BoxResult};
use crate::on_time::{rusage_micros, threads_cpu};
use crate::report::{Report, Target};

#[derive(clap::Args, Debug, Clone)]
pub struct PeriodicArgs {
    /// Scheduler processes.
    #[arg(long, default_value_t = 4)]
    pub processes: usize,
    /// Schedules per process (the same in each).
    #[arg(long, default_value_t = 10)]
    pub schedules: usize,
    /// Seconds each process is measured.
    #[arg(long, default_value_t = 10.0)]
    pub secs: f64,
    /// Jobs enqueued one at a time, without and with schedulers.
    #[arg(long, default_value_t = 2_000)]
    pub jobs: usize,
}

#[derive(clap::Args, Debug, Clone)]
pub struct PeriodicChildArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub schedules: usize,
    /// Interval of every schedule, ms; 0: a daily cron (idle).
    #[arg(long)]
    pub every_ms: u64,
    #[arg(long)]
    pub secs: f64,
    #[arg(long)]
    pub warmup: f64,
}

/// A scheduler process: runs the schedules, measures itself after the
/// warm-up, prints one JSON line.
pub fn child(a: &PeriodicChildArgs, d: Durability) -> BoxResult<()> {
    let queue = open_queue(&a.db, d)?;
    let scheduler = Scheduler::start(queue)?;
    for i in 0..a.schedules {
        let name = format!("s{i}");
        let job = NewJob::new("tick", json!({}));
        scheduler.add(if a.every_ms == 0 {
            Schedule::cron(name, "0 3 * * *", job)?
        } else {
            Schedule::every(name, Duration::from_millis(a.every_ms), job)?
        })?;
    }
    thread::sleep(Duration::from_secs_f64(a.warmup));
    let threads_before = threads_cpu();
    let before = rusage_micros();
    let stats_before = scheduler.stats();
    let start = Instant::now();
    thread::sleep(Duration::from_secs_f64(a.secs));
    let secs = start.elapsed().as_secs_f64();
    let after = rusage_micros();
    let threads_after = threads_cpu();
    let stats = scheduler.stats();
    let (mut wakeups, mut periodic_wakeups) = (0, 0);
    for (name, (_, slices)) in &threads_after {
        let (_, slices0) = threads_before.get(name).copied().unwrap_or((0, 0));
        wakeups += slices - slices0;
        // Linux keeps 15 bytes of a thread's name: `backlog-periodi`.
        if name.starts_with("backlog-period") {
            periodic_wakeups += slices - slices0;
        }
    }
    scheduler.shutdown();
    println!(
        "{}",
        json!({
            "secs": secs,
            "cpu_percent": (after - before) / 1e6 / secs * 100.0,
            "wakeups_per_sec": wakeups as f64 / secs,
            "periodic_wakeups_per_sec": periodic_wakeups as f64 / secs,
            "enqueued": stats.enqueued - stats_before.enqueued,
            "lost": stats.lost - stats_before.lost,
            "duplicates": stats.duplicates,
            "errors": stats.errors,
        })
    );
    Ok(())
}

fn spawn(
    path: &Path,
    d: Durability,
    a: &PeriodicArgs,
    every_ms: u64,
    secs: f64,
) -> BoxResult<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .arg("periodic-child")
        .arg("--db")
        .arg(path)
        .args(["--schedules", &a.schedules.to_string()])
        .args(["--every-ms", &every_ms.to_string()])
        .args(["--secs", &secs.to_string()])
        .args(["--warmup", if secs < 2.0 { "0.2" } else { "1" }])
        .args(["--durability", &durability_name(d).to_ascii_lowercase()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?)
}

fn collect(child: Child) -> BoxResult<Value> {
    let output = child.wait_with_output()?;
    if !output.status.success() {
        return Err(format!("periodic child failed: {}", output.status).into());
    }
    let line = output
        .stdout
        .lines()
        .map_while(Result::ok)
        .last()
        .ok_or("periodic child printed nothing")?;
    Ok(serde_json::from_str(&line)?)
}

fn mean(values: &[Value], key: &str) -> f64 {
    values.iter().filter_map(|v| v[key].as_f64()).sum::<f64>() / values.len().max(1) as f64
}

fn sum(values: &[Value], key: &str) -> u64 {
    values.iter().filter_map(|v| v[key].as_u64()).sum()
}

/// Enqueues `jobs` one at a time on `path`: jobs per second.
fn enqueue_rate(path: &Path, d: Durability, jobs: usize) -> BoxResult<f64> {
    let queue = open_queue(path, d)?;
    let start = Instant::now();
    for n in 0..jobs {
        queue.enqueue(NewJob::new("app", json!({ "n": n })))?;
    }
    Ok(jobs as f64 / start.elapsed().as_secs_f64())
}

pub fn periodic(report: &mut Report, dir: &Path, d: Durability, a: &PeriodicArgs) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    let sub = dir.join("periodic");
    std::fs::create_dir_all(&sub)?;
    let (n, s) = (a.processes, a.schedules);

    for (label, every_ms) in [("idle (daily)", 0), ("every 1 s", 1000)] {
        let path = fresh_db(&sub, "schedules")?;
        let children = (0..n)
            .map(|_| spawn(&path, d, a, every_ms, a.secs))
            .collect::<BoxResult<Vec<_>>>()?;
        let results = children
            .into_iter()
            .map(collect)
            .collect::<BoxResult<Vec<_>>>()?;
        let name = format!("{n} processes × {s} schedules {label}");
        let cpu = mean(&results, "cpu_percent");
        if every_ms == 0 {
            report.target(
                "periodic",
                dn,
                &format!("{name}: CPU per process"),
                "% of a core",
                cpu,
                Target::AtMost(0.1),
            );
        } else {
            report.value(
                "periodic",
                dn,
                &format!("{name}: CPU per process"),
                "% of a core",
                cpu,
            );
        }
        report.value(
            "periodic",
            dn,
            &format!("{name}: scheduler wake-ups per process"),
            "per s",
            mean(&results, "periodic_wakeups_per_sec"),
        );
        if every_ms > 0 {
            let secs = mean(&results, "secs");
            report.value(
                "periodic",
                dn,
                &format!("{name}: ticks enqueued"),
                "per s",
                sum(&results, "enqueued") as f64 / secs,
            );
            report.value(
                "periodic",
                dn,
                &format!("{name}: claims lost to another process"),
                "per s",
                sum(&results, "lost") as f64 / secs,
            );
        }
        let duplicates = sum(&results, "duplicates") + sum(&results, "errors");
        report.gate(
            "periodic",
            dn,
            &format!("{name}: no tick claimed twice, no error"),
            crate::db::Gate {
                ok: duplicates == 0,
                detail: format!("duplicates + errors = {duplicates}"),
            },
        );
    }

    // The application's enqueues, without and with the schedulers ticking
    // every 100 ms on the same file.
    let alone = enqueue_rate(&fresh_db(&sub, "alone")?, d, a.jobs)?;
    let path = fresh_db(&sub, "shared")?;
    // Long enough to cover the timed enqueues; they are stopped after.
    let children = (0..n)
        .map(|_| spawn(&path, d, a, 100, 3600.0))
        .collect::<BoxResult<Vec<_>>>()?;
    thread::sleep(Duration::from_secs(1));
    let shared = enqueue_rate(&path, d, a.jobs);
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let shared = shared?;
    let name = format!("enqueue one at a time, {n} processes × {s} schedules every 100 ms");
    report.value("periodic", dn, &format!("{name}: with"), "jobs/s", shared);
    report.value(
        "periodic",
        dn,
        "enqueue one at a time, no scheduler",
        "jobs/s",
        alone,
    );
    report.target(
        "periodic",
        dn,
        &format!("{name}: with / without"),
        "ratio",
        shared / alone,
        Target::AtLeast(0.8),
    );
    Ok(())
}
