//! The on-time modes of issue 10 (see BENCHMARKS.md, "On time (SQLite)"):
//!
//! - `lateness`: how long after its due time a delayed job, a retry after
//!   its backoff and a snoozed job start, scheduled in this process or in
//!   another one (`lateness.rs`);
//! - `idle-cpu`: what a worker with 8 handler threads and nothing to do
//!   costs, measured in a process of its own;
//! - `wait`: how soon `Queue::wait` returns after a worker in another
//!   process committed the job's completion (`waiting.rs`);
//! - `lease-unrunnable`: the lease's cost next to 50,000 jobs it cannot
//!   run (future-scheduled, of a kind it does not handle, in a paused
//!   queue), against 1,000 of the same (`unrunnable.rs`).
//!
//! `on-time` runs all four; `all` and the smoke run include them.

#[path = "lateness.rs"]
mod lateness;
#[path = "unrunnable.rs"]
mod unrunnable;
#[path = "waiting.rs"]
mod waiting;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use backlog::{Durability, JobError, Worker};
use serde_json::json;

use crate::db::{durability_name, fresh_db, open_queue, BoxResult};
use crate::report::{Report, Target};

pub use lateness::{schedule, LatenessArgs, ScheduleArgs};
pub use unrunnable::UnrunnableArgs;
pub use waiting::{serve, ServeArgs, WaitArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct IdleCpuArgs {
    /// Handler threads of the idle worker.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// How long the idle worker is measured, after a second of warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub secs: f64,
}

#[derive(clap::Args, Debug, Clone)]
pub struct IdleChildArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub secs: f64,
    #[arg(long)]
    pub warmup: f64,
}

/// The sizes of the on-time modes in one invocation.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub lateness: Option<LatenessArgs>,
    pub idle_cpu: Option<IdleCpuArgs>,
    pub wait: Option<WaitArgs>,
    pub unrunnable: Option<UnrunnableArgs>,
}

impl Plan {
    /// The sizes of BENCHMARKS.md.
    pub fn all() -> Plan {
        Plan {
            lateness: Some(LatenessArgs::default()),
            idle_cpu: Some(IdleCpuArgs {
                threads: 8,
                secs: 10.0,
            }),
            wait: Some(WaitArgs::default()),
            unrunnable: Some(UnrunnableArgs::default()),
        }
    }

    /// Tiny sizes: correctness only, a few seconds in a debug build.
    pub fn smoke() -> Plan {
        Plan {
            lateness: Some(LatenessArgs {
                jobs: 5,
                gap_ms: 2.0,
                min_ms: 2.0,
                max_ms: 10.0,
                threads: 2,
            }),
            idle_cpu: Some(IdleCpuArgs {
                threads: 8,
                secs: 0.2,
            }),
            wait: Some(WaitArgs {
                jobs: 5,
                handler_ms: 1.0,
            }),
            unrunnable: Some(UnrunnableArgs {
                runnable: 20,
                small: 20,
                large: 200,
                leases: 5,
            }),
        }
    }
}

/// Runs the modes of `plan`, `runs` times each, at each durability (in a
/// different order each run).
pub fn run(
    report: &mut Report,
    dir: &Path,
    durabilities: &[Durability],
    runs: usize,
    plan: &Plan,
) -> BoxResult<()> {
    let order = |run: usize| {
        let mut v = durabilities.to_vec();
        if !v.is_empty() {
            let k = run % v.len();
            v.rotate_left(k);
        }
        v
    };
    if let Some(a) = &plan.lateness {
        for run in 0..runs {
            for d in order(run) {
                lateness::lateness(report, dir, d, a)?;
            }
        }
    }
    if let Some(a) = &plan.wait {
        for run in 0..runs {
            for d in order(run) {
                waiting::wait(report, dir, d, a)?;
            }
        }
    }
    if let Some(a) = &plan.unrunnable {
        let files = unrunnable::prefill(dir, a)?;
        for run in 0..runs {
            for d in order(run) {
                unrunnable::lease_unrunnable(report, dir, d, a, &files)?;
            }
        }
        unrunnable::gate(report, &files)?;
    }
    if let Some(a) = &plan.idle_cpu {
        for run in 0..runs {
            for d in order(run) {
                idle_cpu(report, dir, d, a)?;
            }
        }
    }
    Ok(())
}

// ---- idle CPU --------------------------------------------------------------

/// CPU time and timeslices (how often a thread was scheduled in: its
/// wake-ups) of every thread of this process, by thread name with trailing
/// digits dropped, from `/proc/self/task/*/schedstat` (nanoseconds, exact,
/// where `/proc/self/stat` counts in 10 ms ticks).
pub fn threads_cpu() -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let name = comm
            .trim()
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
            .to_string();
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        let mut fields = stat
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0));
        let ns = fields.next().unwrap_or(0);
        let slices = fields.nth(1).unwrap_or(0);
        let e = out.entry(name).or_default();
        e.0 += ns;
        e.1 += slices;
    }
    out
}

/// User + system CPU time of this process, µs (`getrusage(RUSAGE_SELF)`).
pub fn rusage_micros() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// The child process of `idle-cpu`: a worker with nothing to do, measured
/// after a warm-up; prints one JSON line.
pub fn idle_child(a: &IdleChildArgs, d: Durability) -> BoxResult<()> {
    let queue = open_queue(&a.db, d)?;
    let worker = Worker::builder(queue.clone())
        .concurrency(a.threads)
        .handle_raw("noop", |_payload, _ctx| Ok::<(), JobError>(()))
        .start()?;
    thread::sleep(Duration::from_secs_f64(a.warmup));
    // Reading /proc costs this thread more than the worker's whole idle
    // second: the process's CPU time is read inside those reads.
    let threads_before = threads_cpu();
    let before = rusage_micros();
    let start = std::time::Instant::now();
    thread::sleep(Duration::from_secs_f64(a.secs));
    let secs = start.elapsed().as_secs_f64();
    let after = rusage_micros();
    let threads_after = threads_cpu();
    let mut threads = serde_json::Map::new();
    let mut wakeups = 0;
    for (name, (ns, slices)) in &threads_after {
        let (ns0, slices0) = threads_before.get(name).copied().unwrap_or((0, 0));
        wakeups += slices - slices0;
        threads.insert(
            name.clone(),
            json!({"cpu_ms": (ns - ns0) as f64 / 1e6, "wakeups": slices - slices0}),
        );
    }
    worker.shutdown(Duration::from_secs(5))?;
    let line = json!({
        "secs": secs,
        "cpu_percent": (after - before) / 1e6 / secs * 100.0,
        "wakeups_per_sec": wakeups as f64 / secs,
        "threads": threads,
    });
    println!("{line}");
    Ok(())
}

/// An idle worker (nothing queued, nothing scheduled) in a process of its
/// own, so that nothing else this program ran shows in its CPU time.
pub fn idle_cpu(report: &mut Report, dir: &Path, d: Durability, a: &IdleCpuArgs) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    // A directory of its own: the worker's file watcher sees no other file.
    let sub = dir.join("idle-cpu");
    std::fs::create_dir_all(&sub)?;
    let path = fresh_db(&sub, "idle")?;
    let output = Command::new(std::env::current_exe()?)
        .arg("idle-child")
        .arg("--db")
        .arg(&path)
        .arg("--threads")
        .arg(a.threads.to_string())
        .arg("--secs")
        .arg(a.secs.to_string())
        .arg("--warmup")
        .arg(if a.secs < 1.0 { "0.1" } else { "1" })
        .arg("--durability")
        .arg(dn.to_ascii_lowercase())
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(format!("idle-cpu child failed: {}", output.status).into());
    }
    let line = output
        .stdout
        .lines()
        .map_while(Result::ok)
        .last()
        .ok_or("idle-cpu child printed nothing")?;
    let v: serde_json::Value = serde_json::from_str(&line)?;
    let name = format!("idle worker, {} threads: CPU", a.threads);
    let cpu = v["cpu_percent"].as_f64().unwrap_or(f64::NAN);
    report.target(
        "idle-cpu",
        dn,
        &name,
        "% of a core",
        cpu,
        Target::AtMost(0.1),
    );
    report.value(
        "idle-cpu",
        dn,
        "idle worker: thread wake-ups",
        "per s",
        v["wakeups_per_sec"].as_f64().unwrap_or(f64::NAN),
    );
    if let Some(threads) = v["threads"].as_object() {
        for (thread, t) in threads {
            let ms = t["cpu_ms"].as_f64().unwrap_or(f64::NAN);
            let secs = v["secs"].as_f64().unwrap_or(f64::NAN);
            report.value(
                "idle-cpu",
                dn,
                &format!("thread {thread}: CPU"),
                "µs/s",
                ms * 1000.0 / secs,
            );
            report.value(
                "idle-cpu",
                dn,
                &format!("thread {thread}: wake-ups"),
                "per s",
                t["wakeups"].as_f64().unwrap_or(f64::NAN) / secs,
            );
        }
    }
    Ok(())
}
