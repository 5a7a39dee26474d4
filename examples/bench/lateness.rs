//! `lateness`: how long after its due time a job starts, for the three ways
//! a job waits for a time (a delayed enqueue, a retry after its backoff, a
//! snooze), when the worker's own process scheduled it and when another
//! process did.
//!
//! The worker is otherwise idle. Jobs are scheduled in an open loop, one
//! every `gap` with a due time drawn uniformly from `min..max` ahead, so
//! several wait at once and a sooner one often arrives while the fetcher
//! sleeps toward a later one. The lateness of a job is the first line of its
//! handler minus the due time stored with it (`Job::available_at`, unix µs,
//! the clock both processes share); a negative one would be a job run early,
//! and fails the run.
//!
//! Same process: the worker's own handler fails (retry) or snoozes the job
//! on its first run; delayed jobs are enqueued by a thread of this process.
//! Another process: a child process (`schedule`) enqueues the delayed jobs,
//! or leases the jobs first and then fails or snoozes them one by one
//! through `Queue::fail` / `Queue::snooze`, while this process's worker runs
//! them when they come due.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{
    Durability, JobError, LeaseRequest, NewJob, Queue, QueueOptions, RetryPolicy, Worker,
};
use clap::ValueEnum;
use serde_json::json;

use crate::db::{
    durability_name, exactly_once, fresh_db, micros, now_micros, open_queue, BoxResult, Gate,
};
use crate::report::{percentile, Report, Target};

#[derive(clap::Args, Debug, Clone)]
pub struct LatenessArgs {
    /// Jobs per case (3 kinds × 2 origins).
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// One job scheduled every this many ms.
    #[arg(long, default_value_t = 10.0)]
    pub gap_ms: f64,
    /// The shortest delay, backoff or snooze, ms.
    #[arg(long, default_value_t = 20.0)]
    pub min_ms: f64,
    /// The longest, ms.
    #[arg(long, default_value_t = 80.0)]
    pub max_ms: f64,
    /// Handler threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

impl Default for LatenessArgs {
    fn default() -> Self {
        LatenessArgs {
            jobs: 200,
            gap_ms: 10.0,
            min_ms: 20.0,
            max_ms: 80.0,
            threads: 4,
        }
    }
}

/// How a job comes to wait for a time.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Delayed,
    Retry,
    Snooze,
}

impl What {
    fn name(self) -> &'static str {
        match self {
            What::Delayed => "delayed job",
            What::Retry => "retry after backoff",
            What::Snooze => "snoozed job",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            What::Delayed => "delayed",
            What::Retry => "retry",
            What::Snooze => "snooze",
        }
    }
}

/// The arguments of the scheduling child process.
#[derive(clap::Args, Debug, Clone)]
pub struct ScheduleArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long, value_enum)]
    pub what: What,
    #[arg(long)]
    pub jobs: usize,
    #[arg(long)]
    pub gap_ms: f64,
    #[arg(long)]
    pub min_ms: f64,
    #[arg(long)]
    pub max_ms: f64,
}

/// A retry policy whose backoff (for the first failure) spans `min..max`:
/// base in the middle, jitter to either end.
fn policy(min_ms: f64, max_ms: f64) -> RetryPolicy {
    let mid = (min_ms + max_ms) / 2.0;
    RetryPolicy {
        base: Duration::from_secs_f64(mid / 1000.0),
        jitter: if mid > 0.0 { (max_ms - mid) / mid } else { 0.0 },
        max: Duration::from_secs(3600),
    }
}

/// A delay drawn uniformly from `min..=max` ms.
fn draw(min_ms: f64, max_ms: f64) -> Duration {
    let us = rand::random_range((min_ms * 1000.0) as u64..=(max_ms * 1000.0) as u64);
    Duration::from_micros(us)
}

fn late_job(n: usize) -> NewJob {
    NewJob::new("late", json!({ "n": n }))
}

/// Calls `f(i)` for job `i` at `start + i × gap` by the wall clock.
fn open_loop(jobs: usize, gap_ms: f64, mut f: impl FnMut(usize) -> BoxResult<()>) -> BoxResult<()> {
    let start = Instant::now();
    for i in 0..jobs {
        let at = Duration::from_secs_f64(i as f64 * gap_ms / 1000.0);
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        f(i)?;
    }
    Ok(())
}

/// The scheduling child process. For retries and snoozes it first enqueues
/// and leases every job (so no worker can take them before they are
/// rescheduled) and says `ready`; after `go` on stdin it schedules one job
/// every gap, then exits.
pub fn schedule(a: &ScheduleArgs, d: Durability) -> BoxResult<()> {
    let queue = QueueOptions::new()
        .durability(d)
        .retry_policy(policy(a.min_ms, a.max_ms))
        .open(&a.db)?;
    let mut leased = Vec::new();
    if a.what != What::Delayed {
        queue.enqueue_many((0..a.jobs).map(late_job))?;
        let request = LeaseRequest::new("scheduler", a.jobs).ttl(Duration::from_secs(600));
        leased = queue.lease(&request)?;
        if leased.len() != a.jobs {
            return Err(format!("leased {} of {} jobs", leased.len(), a.jobs).into());
        }
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    open_loop(a.jobs, a.gap_ms, |i| {
        match a.what {
            What::Delayed => {
                queue.enqueue(late_job(i).delay(draw(a.min_ms, a.max_ms)))?;
            }
            What::Retry => queue.fail(&leased[i], "first attempt")?,
            What::Snooze => queue.snooze(&leased[i], draw(a.min_ms, a.max_ms))?,
        }
        Ok(())
    })
}

/// What the handlers measured: lateness in ms, one per job.
type Delays = Arc<Mutex<Vec<f64>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A worker whose handler records each job's lateness; with `first_run`, the
/// job's first run fails (retry) or snoozes instead.
fn start_worker(
    queue: &Queue,
    a: &LatenessArgs,
    first_run: Option<What>,
    delays: &Delays,
) -> BoxResult<Worker> {
    let seen: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let delays = delays.clone();
    let (min_ms, max_ms) = (a.min_ms, a.max_ms);
    Ok(Worker::builder(queue.clone())
        .concurrency(a.threads)
        .retry_policy(policy(a.min_ms, a.max_ms))
        .handle_raw("late", move |_payload, ctx| {
            let started = now_micros();
            match first_run {
                Some(What::Retry) if ctx.attempt() == 1 => {
                    return Err(JobError::retry("first attempt"));
                }
                Some(What::Snooze) if lock(&seen).insert(ctx.id()) => {
                    return Err(JobError::snooze(draw(min_ms, max_ms)));
                }
                _ => {}
            }
            let late = (started - micros(ctx.job().available_at)) as f64 / 1000.0;
            lock(&delays).push(late);
            Ok::<(), JobError>(())
        })
        .start()?)
}

/// One case: `what`, scheduled in this process or another; returns the
/// sorted lateness in ms.
fn case(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    a: &LatenessArgs,
    what: What,
    cross_process: bool,
) -> BoxResult<Vec<f64>> {
    let dn = durability_name(d);
    let path = fresh_db(dir, "lateness")?;
    let queue = open_queue(&path, d)?;
    let delays: Delays = Arc::default();
    let worker;
    if cross_process {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("schedule")
            .arg("--db")
            .arg(&path)
            .arg("--what")
            .arg(what.arg())
            .arg("--jobs")
            .arg(a.jobs.to_string())
            .arg("--gap-ms")
            .arg(a.gap_ms.to_string())
            .arg("--min-ms")
            .arg(a.min_ms.to_string())
            .arg("--max-ms")
            .arg(a.max_ms.to_string())
            .arg("--durability")
            .arg(dn.to_ascii_lowercase())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            return Err(format!("schedule child said {line:?}").into());
        }
        // The worker starts once the child holds its jobs, and idles a little.
        worker = start_worker(&queue, a, None, &delays)?;
        thread::sleep(Duration::from_millis(50));
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        writeln!(stdin, "go")?;
        drop(stdin);
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("schedule child failed: {status}").into());
        }
    } else {
        let first_run = (what != What::Delayed).then_some(what);
        worker = start_worker(&queue, a, first_run, &delays)?;
        thread::sleep(Duration::from_millis(50));
        open_loop(a.jobs, a.gap_ms, |i| {
            let job = match what {
                What::Delayed => late_job(i).delay(draw(a.min_ms, a.max_ms)),
                What::Retry | What::Snooze => late_job(i),
            };
            queue.enqueue(job)?;
            Ok(())
        })?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock(&delays).len() < a.jobs && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    worker.shutdown(Duration::from_secs(10))?;
    let mut sorted = lock(&delays).clone();
    sorted.sort_by(f64::total_cmp);
    let origin = if cross_process {
        "another process"
    } else {
        "same process"
    };
    let early = sorted.iter().filter(|&&l| l < 0.0).count();
    report.gate(
        "lateness",
        dn,
        &format!("{}, {origin}: none early", what.name()),
        Gate {
            ok: early == 0 && sorted.len() == a.jobs,
            detail: format!(
                "{} of {} jobs ran, {early} before their due time (earliest {:.3} ms)",
                sorted.len(),
                a.jobs,
                sorted.first().copied().unwrap_or(f64::NAN)
            ),
        },
    );
    report.gate(
        "lateness",
        dn,
        &format!("{}, {origin}", what.name()),
        exactly_once(&path, a.jobs)?,
    );
    Ok(sorted)
}

/// The machine's floor for the same open loop, with no database: one thread
/// keeps the due times in a heap and sleeps toward the earliest
/// (`recv_timeout`, the primitive the fetcher's `select!` uses), woken when a
/// sooner one is sent; the lateness is its wake-up after each due time. What
/// a loaded 2-core machine adds to any wake-up, before backlog does anything.
fn sleeper_floor(a: &LatenessArgs) -> BoxResult<Vec<f64>> {
    use crossbeam_channel::RecvTimeoutError;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let (tx, rx) = crossbeam_channel::unbounded::<Instant>();
    let sleeper = thread::spawn(move || {
        let mut heap: BinaryHeap<Reverse<Instant>> = BinaryHeap::new();
        let mut late = Vec::new();
        let mut open = true;
        loop {
            while let Some(&Reverse(due)) = heap.peek() {
                let now = Instant::now();
                if due > now {
                    break;
                }
                heap.pop();
                late.push((now - due).as_secs_f64() * 1000.0);
            }
            let next = heap.peek().map(|&Reverse(due)| due);
            match (open, next) {
                (false, None) => return late,
                (false, Some(due)) => thread::sleep(due.saturating_duration_since(Instant::now())),
                (true, None) => match rx.recv() {
                    Ok(due) => heap.push(Reverse(due)),
                    Err(_) => open = false,
                },
                (true, Some(due)) => {
                    match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                        Ok(due) => heap.push(Reverse(due)),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => open = false,
                    }
                }
            }
        }
    });
    open_loop(a.jobs, a.gap_ms, |_| {
        tx.send(Instant::now() + draw(a.min_ms, a.max_ms))?;
        Ok(())
    })?;
    drop(tx);
    let mut late = sleeper.join().map_err(|_| "the sleeper thread panicked")?;
    late.sort_by(f64::total_cmp);
    Ok(late)
}

/// Every case at durability `d`. Targets (Fast, as for the latency mode):
/// p99 ≤ 5 ms in the same process, and from another process no more than
/// the cross-process pickup target, 2 ms.
pub fn lateness(report: &mut Report, dir: &Path, d: Durability, a: &LatenessArgs) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    for cross_process in [false, true] {
        for what in [What::Delayed, What::Retry, What::Snooze] {
            let sorted = case(report, dir, d, a, what, cross_process)?;
            let origin = if cross_process {
                "another process"
            } else {
                "same process"
            };
            let target = if cross_process { 2.0 } else { 5.0 };
            for (label, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0)] {
                let name = format!("{}, {origin}: {label}", what.name());
                let value = percentile(&sorted, p);
                if label == "p99" && d == Durability::Fast {
                    report.target("lateness", dn, &name, "ms", value, Target::AtMost(target));
                } else {
                    report.value("lateness", dn, &name, "ms", value);
                }
            }
        }
    }
    let floor = sleeper_floor(a)?;
    for (label, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0)] {
        let name = format!("floor: a bare thread sleeping to the same due times: {label}");
        report.value("lateness", dn, &name, "ms", percentile(&floor, p));
    }
    report.value(
        "lateness",
        dn,
        "load average (1 min) after the run",
        "",
        crate::worker::load_average(),
    );
    Ok(())
}
