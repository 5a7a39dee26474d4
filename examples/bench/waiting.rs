//! `wait`: how soon `Queue::wait(id, timeout)` returns once a worker in
//! another process finished the job.
//!
//! A child process (`serve`) runs a worker whose handler sleeps
//! `handler_ms`, and prints, for each `Completed` event (sent after the
//! completion committed), the job id and the time it saw the event. This
//! process enqueues one job at a time and waits for it. Two figures per job:
//! the return of `wait` after the child saw the commit (the target: p99 ≤
//! 5 ms), and after the job's `finished_at` (stamped inside the completion's
//! transaction, before its commit: an upper bound that also counts the
//! commit, fsync included at Full).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use backlog::{Durability, Event, FinalStatus, JobError, JobState, NewJob, Worker};
use serde_json::json;

use crate::db::{
    durability_name, exactly_once, fresh_db, micros, now_micros, open_queue, BoxResult, Gate,
};
use crate::report::{percentile, Report, Target};

#[derive(clap::Args, Debug, Clone)]
pub struct WaitArgs {
    /// Jobs, each enqueued and waited for in turn.
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// How long the handler in the other process sleeps, ms.
    #[arg(long, default_value_t = 5.0)]
    pub handler_ms: f64,
}

impl Default for WaitArgs {
    fn default() -> Self {
        WaitArgs {
            jobs: 200,
            handler_ms: 5.0,
        }
    }
}

/// The arguments of the serving child process.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub handler_ms: f64,
}

/// The child: a worker, and a line `id unix_µs` on stdout per `Completed`
/// event, until stdin closes.
pub fn serve(a: &ServeArgs, d: Durability) -> BoxResult<()> {
    let queue = open_queue(&a.db, d)?;
    let events = queue.subscribe();
    let sleep = Duration::from_secs_f64(a.handler_ms / 1000.0);
    let worker = Worker::builder(queue.clone())
        .concurrency(2)
        .handle_raw("waited", move |_payload, _ctx| {
            thread::sleep(sleep);
            Ok::<_, JobError>(json!({"ok": true}))
        })
        .start()?;
    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(1);
    thread::spawn(move || {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        let _ = stop_tx.send(());
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    loop {
        crossbeam_channel::select! {
            recv(events) -> e => {
                if let Ok(Event::Completed { job_id }) = e {
                    let at = now_micros();
                    writeln!(out, "{job_id} {at}")?;
                    out.flush()?;
                }
            }
            recv(stop) -> _ => break,
        }
    }
    worker.shutdown(Duration::from_secs(10))?;
    Ok(())
}

pub fn wait(report: &mut Report, dir: &Path, d: Durability, a: &WaitArgs) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    let path = fresh_db(dir, "wait")?;
    let queue = open_queue(&path, d)?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("serve")
        .arg("--db")
        .arg(&path)
        .arg("--handler-ms")
        .arg(a.handler_ms.to_string())
        .arg("--durability")
        .arg(dn.to_ascii_lowercase())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    match lines.next() {
        Some(Ok(l)) if l == "ready" => {}
        other => {
            let _ = child.kill();
            return Err(format!("serve child said {other:?}").into());
        }
    }
    // The child's commit times, by job id, as they come.
    let seen: Arc<Mutex<HashMap<i64, i64>>> = Arc::default();
    let reader = {
        let seen = seen.clone();
        thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut parts = line.split_whitespace().map(|p| p.parse::<i64>());
                if let (Some(Ok(id)), Some(Ok(at))) = (parts.next(), parts.next()) {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, at);
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(50));
    // (id, wait returned at, finished_at)
    let mut returns: Vec<(i64, i64, i64)> = Vec::with_capacity(a.jobs);
    let mut not_completed = 0;
    for n in 0..a.jobs {
        let id = queue.enqueue(NewJob::new("waited", json!({ "n": n })))?.id;
        let record = queue.wait(id, Duration::from_secs(30))?;
        let at = now_micros();
        if record.state != JobState::Finished(FinalStatus::Completed) {
            not_completed += 1;
        }
        returns.push((id, at, record.finished_at.map_or(at, micros)));
    }
    drop(child.stdin.take());
    let status = child.wait()?;
    let _ = reader.join();
    if !status.success() {
        return Err(format!("serve child failed: {status}").into());
    }
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut after_commit: Vec<f64> = returns
        .iter()
        .filter_map(|(id, at, _)| seen.get(id).map(|c| (at - c) as f64 / 1000.0))
        .collect();
    let mut after_finished: Vec<f64> = returns
        .iter()
        .map(|(_, at, fin)| (at - fin) as f64 / 1000.0)
        .collect();
    after_commit.sort_by(f64::total_cmp);
    after_finished.sort_by(f64::total_cmp);
    for (label, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0)] {
        let name = format!("wait returns after the other process's commit: {label}");
        let value = percentile(&after_commit, p);
        if label == "p99" {
            report.target("wait", dn, &name, "ms", value, Target::AtMost(5.0));
        } else {
            report.value("wait", dn, &name, "ms", value);
        }
        report.value(
            "wait",
            dn,
            &format!("wait returns after finished_at (before the commit): {label}"),
            "ms",
            percentile(&after_finished, p),
        );
    }
    report.gate(
        "wait",
        dn,
        "every wait returned the completed record",
        Gate {
            ok: not_completed == 0 && after_commit.len() == a.jobs,
            detail: format!(
                "{} waits, {not_completed} not completed, {} commits seen by the child",
                returns.len(),
                seen.len()
            ),
        },
    );
    report.gate("wait", dn, "jobs", exactly_once(&path, a.jobs)?);
    Ok(())
}
