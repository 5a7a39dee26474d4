//! `lease-unrunnable`: what a lease costs next to jobs it cannot run.
//!
//! Three kinds of unrunnable job, each of higher priority than the runnable
//! ones, so a lease that walked the table in claim order would meet them
//! all first:
//!
//! - future-scheduled: kind `noop` in `default`, due in an hour;
//! - unhandled kind: kind `other` in `default`, due now;
//! - paused queue: kind `noop` in the paused queue `paused`, due now.
//!
//! Each kind gets two files, prefilled once per invocation through the
//! public API: `small` (1,000) and `large` (50,000) unrunnable jobs, both
//! with the same `runnable` due `noop` jobs in `default`. Every lease asks
//! what a worker with a `noop` handler on `default` and `paused` asks:
//! queues `default, paused`, kinds `noop`. The figure is the median cost of
//! one lease (batch 1 and 100; each lease released again, untimed, so the
//! files stay as they are; leases on the two files alternate) at `large`
//! over the same at `small`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use backlog::{Durability, LeaseRequest, NewJob, Outcome, Queue};
use rusqlite::Connection;
use serde_json::json;

use crate::db::{durability_name, fresh_db, open_queue, BoxResult, Gate};
use crate::report::{median, Report, Target};

#[derive(clap::Args, Debug, Clone)]
pub struct UnrunnableArgs {
    /// Runnable jobs in every file.
    #[arg(long, default_value_t = 1_000)]
    pub runnable: usize,
    /// Unrunnable jobs in the small files.
    #[arg(long, default_value_t = 1_000)]
    pub small: usize,
    /// Unrunnable jobs in the large files.
    #[arg(long, default_value_t = 50_000)]
    pub large: usize,
    /// Timed leases per file and batch size.
    #[arg(long, default_value_t = 200)]
    pub leases: usize,
}

impl Default for UnrunnableArgs {
    fn default() -> Self {
        UnrunnableArgs {
            runnable: 1_000,
            small: 1_000,
            large: 50_000,
            leases: 200,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Unrunnable {
    Future,
    OtherKind,
    Paused,
}

impl Unrunnable {
    const ALL: [Unrunnable; 3] = [
        Unrunnable::Future,
        Unrunnable::OtherKind,
        Unrunnable::Paused,
    ];

    fn name(self) -> &'static str {
        match self {
            Unrunnable::Future => "future-scheduled",
            Unrunnable::OtherKind => "unhandled kind",
            Unrunnable::Paused => "paused queue",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Unrunnable::Future => "future",
            Unrunnable::OtherKind => "kind",
            Unrunnable::Paused => "paused",
        }
    }

    fn job(self, n: usize) -> NewJob {
        let job = match self {
            Unrunnable::Future => {
                NewJob::new("noop", json!({ "n": n })).delay(Duration::from_secs(3600))
            }
            Unrunnable::OtherKind => NewJob::new("other", json!({ "n": n })),
            Unrunnable::Paused => NewJob::new("noop", json!({ "n": n })).queue("paused"),
        };
        job.priority(10)
    }
}

/// One prefilled file: which kind, how many unrunnable jobs.
pub struct File {
    what: Unrunnable,
    unrunnable: usize,
    runnable: usize,
    path: PathBuf,
}

pub struct Files(Vec<(File, File)>);

fn fill(dir: &Path, what: Unrunnable, unrunnable: usize, runnable: usize) -> BoxResult<File> {
    let path = fresh_db(dir, &format!("unrunnable-{}-{unrunnable}", what.file()))?;
    let queue = open_queue(&path, Durability::Fast)?;
    let mut n = 0;
    while n < unrunnable {
        let end = (n + 1000).min(unrunnable);
        queue.enqueue_many((n..end).map(|i| what.job(i)))?;
        n = end;
    }
    queue.enqueue_many((0..runnable).map(|i| NewJob::new("noop", json!({ "n": i }))))?;
    if let Unrunnable::Paused = what {
        queue.pause("paused")?;
    }
    Ok(File {
        what,
        unrunnable,
        runnable,
        path,
    })
}

/// The six files, prefilled once per invocation (durability is a property
/// of the connection, not of the file).
pub fn prefill(dir: &Path, a: &UnrunnableArgs) -> BoxResult<Files> {
    let mut files = Vec::new();
    for what in Unrunnable::ALL {
        files.push((
            fill(dir, what, a.small, a.runnable)?,
            fill(dir, what, a.large, a.runnable)?,
        ));
    }
    Ok(Files(files))
}

fn request(batch: usize) -> LeaseRequest {
    LeaseRequest::new("bench", batch)
        .queues(["default", "paused"])
        .kinds(["noop"])
}

/// One lease of `batch`, timed, then released (untimed).
fn timed_lease(queue: &Queue, request: &LeaseRequest, batch: usize) -> BoxResult<f64> {
    let start = Instant::now();
    let jobs = queue.lease(request)?;
    let took = start.elapsed();
    if jobs.len() != batch {
        return Err(format!("leased {} jobs, expected {batch}", jobs.len()).into());
    }
    if let Some(j) = jobs
        .iter()
        .find(|j| j.kind != "noop" || j.queue != "default")
    {
        return Err(format!("leased an unrunnable job: {j:?}").into());
    }
    for result in queue.settle_many(jobs.iter().map(|j| (j, Outcome::Release)))? {
        result?;
    }
    Ok(took.as_secs_f64() * 1e6)
}

/// The median time (µs) of one lease of `batch` on each file, over `count`
/// leases after a tenth as warm-up. The two files' leases alternate, so a
/// burst of load on the shared machine hits both alike, and the median
/// leaves out the leases a preemption stretched.
fn lease_costs(small: &Queue, large: &Queue, batch: usize, count: usize) -> BoxResult<(f64, f64)> {
    let request = request(batch);
    let (mut at_small, mut at_large) = (Vec::new(), Vec::new());
    for i in 0..count + count / 10 {
        let s = timed_lease(small, &request, batch)?;
        let l = timed_lease(large, &request, batch)?;
        if i >= count / 10 {
            at_small.push(s);
            at_large.push(l);
        }
    }
    Ok((median(&at_small), median(&at_large)))
}

fn label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

pub fn lease_unrunnable(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    a: &UnrunnableArgs,
    files: &Files,
) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    for (small, large) in &files.0 {
        let name = small.what.name();
        let (s, l) = (label(small.unrunnable), label(large.unrunnable));
        let small_q = open_queue(&small.path, d)?;
        let large_q = open_queue(&large.path, d)?;
        // 100, or every runnable job when there are fewer (the smoke run).
        for batch in [1, a.runnable.min(100)] {
            let (at_small, at_large) = lease_costs(&small_q, &large_q, batch, a.leases)?;
            report.value(
                "lease-unrunnable",
                dn,
                &format!("lease {batch} next to {s} {name}"),
                "µs",
                at_small,
            );
            report.value(
                "lease-unrunnable",
                dn,
                &format!("lease {batch} next to {l} {name}"),
                "µs",
                at_large,
            );
            report.target(
                "lease-unrunnable",
                dn,
                &format!("lease {batch}, {name}: cost at {l} / at {s}"),
                "x",
                at_large / at_small,
                Target::AtMost(1.5),
            );
        }
    }
    Ok(())
}

/// After every run: each file holds what it was filled with, nothing leased,
/// nothing finished.
pub fn gate(report: &mut Report, files: &Files) -> BoxResult<()> {
    for file in files.0.iter().flat_map(|(s, l)| [s, l]) {
        let conn = Connection::open(&file.path)?;
        let (live, leased): (i64, i64) = conn.query_row(
            "SELECT count(*), count(lease_token) FROM backlog_jobs",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let finished: i64 =
            conn.query_row("SELECT count(*) FROM backlog_history", [], |r| r.get(0))?;
        let expected = (file.unrunnable + file.runnable) as i64;
        report.gate(
            "lease-unrunnable",
            "-",
            &format!("{} {} intact", label(file.unrunnable), file.what.name()),
            Gate {
                ok: live == expected && leased == 0 && finished == 0,
                detail: format!(
                    "live {live} (expected {expected}), leased {leased}, finished {finished}"
                ),
            },
        );
    }
    Ok(())
}
