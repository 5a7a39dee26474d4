//! Sequences across processes, through SIGKILLs, on every backend: three
//! worker processes run many sequences at once while the test kills one of
//! them (SIGKILL) every few hundred milliseconds and starts a new one.
//! Each handler appends `(key, n, start, end)` to its process's file before
//! it returns. At the end, within each sequence, no run may start before
//! the run before it ended, and the runs follow the order of enqueue (a
//! job whose process was killed after its line was written runs again: the
//! same `n` twice in a row, never out of order).
//!
//! A child is this test binary re-run as `sequence_child` with
//! `BACKLOG_SEQUENCE_LOG` set and the database in the environment
//! ([`harness::Harness::child_env`]). Size knobs: `BACKLOG_SEQUENCE_KEYS`
//! sequences (default 30) of `BACKLOG_SEQUENCE_JOBS` jobs (default 50),
//! `BACKLOG_SEQUENCE_KILLS` kills (default 6).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backlog::{NewJob, QueueOptions, Worker};
use serde_json::{json, Value};

use harness::{child_queue, Backend, Children, Harness, TestResult};

const LOG: &str = "BACKLOG_SEQUENCE_LOG";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The children's entry point; without a log (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the sequence suite"]
fn sequence_child() -> TestResult {
    let Ok(log) = std::env::var(LOG) else {
        return Ok(());
    };
    let file = Mutex::new(OpenOptions::new().create(true).append(true).open(log)?);
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    let _worker = Worker::builder(queue)
        .concurrency(4)
        .lease_ttl(Duration::from_secs(5))
        .rescue_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(100))
        .handle_raw("step", move |args: Value, _ctx| {
            let start = unix_micros();
            thread::sleep(Duration::from_millis(1 + (start % 3) as u64));
            let line = format!("{} {} {start} {}\n", args["key"], args["n"], unix_micros());
            // One write per line, on an append-only file: whole lines.
            if let Ok(mut file) = file.lock() {
                file.write_all(line.as_bytes())
                    .map_err(|e| backlog::JobError::retry(e.to_string()))?;
            }
            Ok(())
        })
        .start()?;
    loop {
        thread::sleep(Duration::from_secs(3600)); // until SIGKILL
    }
}

fn spawn(h: &Harness, log: &Path) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "sequence_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(LOG, log)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env() {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

/// One run as a child wrote it: key, n, start, end (unix µs).
type Run = (u64, usize, u128, u128);

fn read_runs(dir: &Path) -> TestResult<Vec<Run>> {
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if let [key, n, start, end] = f[..] {
                runs.push((key.parse()?, n.parse()?, start.parse()?, end.parse()?));
            }
        }
    }
    Ok(runs)
}

fn sequences_run_one_at_a_time_in_order_across_processes_through_sigkills(
    b: &Backend,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (keys, per_key, kills) = (
        knob("BACKLOG_SEQUENCE_KEYS", 30),
        knob("BACKLOG_SEQUENCE_JOBS", 50),
        knob("BACKLOG_SEQUENCE_KILLS", 6),
    );
    // Interleaved, 100 jobs per enqueue_many.
    let jobs: Vec<NewJob> = (0..per_key)
        .flat_map(|n| {
            (0..keys).map(move |k| {
                NewJob::new("step", json!({ "key": k, "n": n })).sequence(format!("s{k}"))
            })
        })
        .collect();
    for chunk in jobs.chunks(100) {
        h.queue.enqueue_many(chunk.to_vec())?;
    }
    let total = keys * per_key;
    let dir = tempfile::tempdir()?;
    let logs = (0..).map(|i| dir.path().join(format!("child-{i}.log")));
    let mut logs = logs.into_iter();
    let mut next_log = move || logs.next().ok_or("no log name");
    let start = Instant::now();
    let mut children = Children(
        (0..3)
            .map(|_| spawn(&h, &next_log()?))
            .collect::<TestResult<_>>()?,
    );
    let mut killed = 0;
    let limit = Duration::from_secs(300);
    loop {
        let done = h.count("SELECT count(*) FROM backlog_history WHERE status = 'completed'")?;
        if done == total as i64 {
            break;
        }
        if start.elapsed() > limit {
            return Err(format!("after {limit:?}: {done} of {total} jobs completed").into());
        }
        if killed < kills {
            thread::sleep(Duration::from_millis(150 + 50 * (killed as u64 % 5)));
            let victim = killed % children.0.len();
            let child = &mut children.0[victim];
            child.kill()?; // SIGKILL
            let status = child.wait()?;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "the kill landed");
            children.0[victim] = spawn(&h, &next_log()?)?;
            killed += 1;
        } else {
            thread::sleep(Duration::from_millis(100));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(children);

    let runs = read_runs(dir.path())?;
    let mut by_key: HashMap<u64, Vec<Run>> = HashMap::new();
    for run in &runs {
        by_key.entry(run.0).or_default().push(*run);
    }
    assert_eq!(by_key.len(), keys, "every sequence ran");
    let mut overlaps = 0;
    let mut reruns = 0;
    for (key, mut mine) in by_key {
        mine.sort_by_key(|r| r.2);
        let mut order: Vec<usize> = mine.iter().map(|r| r.1).collect();
        let before = order.len();
        order.dedup();
        reruns += before - order.len();
        assert_eq!(
            order,
            (0..per_key).collect::<Vec<_>>(),
            "sequence s{key} ran out of order"
        );
        overlaps += mine.windows(2).filter(|p| p[1].2 < p[0].3).count();
    }
    assert_eq!(overlaps, 0, "two jobs of one sequence ran at once");
    println!(
        "sequences multi-process ({b:?}): processes=3 keys={keys} jobs={total} kills={killed} \
         runs={} reruns={reruns} overlaps=0 out_of_order=0 secs={secs:.1}",
        runs.len()
    );
    Ok(())
}

conformance!(sequences_run_one_at_a_time_in_order_across_processes_through_sigkills);
