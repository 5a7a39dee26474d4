//! Several processes share one SQLite file: one enqueues while two others
//! lease and complete. Every job is completed exactly once, by a process other
//! than the one that enqueued it.
//!
//! The test binary re-executes itself: the child processes run this same test
//! with `BACKLOG_TEST_ROLE` set, which selects their part.

mod common;

use std::collections::{HashMap, HashSet};
use std::env;
use std::path::Path;
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use backlog::sqlite::QueueExt;
use backlog::{FinalStatus, JobState, LeaseRequest, NewJob, Queue};
use common::{create_effects_table, raw, TestDb, TestResult};
use serde_json::json;

const TEST_NAME: &str = "jobs_enqueued_by_one_process_are_leased_by_another_exactly_once";
const ROLE: &str = "BACKLOG_TEST_ROLE";
const DB: &str = "BACKLOG_TEST_DB";
const JOBS: usize = 300;
/// No child runs longer than this, so the parent never hangs.
const CHILD_DEADLINE: Duration = Duration::from_secs(45);

#[test]
fn jobs_enqueued_by_one_process_are_leased_by_another_exactly_once() -> TestResult {
    if let Ok(role) = env::var(ROLE) {
        let path = env::var(DB)?;
        return match role.as_str() {
            "producer" => produce(Path::new(&path)),
            consumer => consume(Path::new(&path), consumer),
        };
    }

    let db = TestDb::new()?;
    drop(Queue::open(&db.path)?); // migrated once, before the children race
    create_effects_table(&db.path)?;

    let children: Vec<_> = ["consumer-a", "consumer-b", "producer"]
        .into_iter()
        .map(|role| -> TestResult<_> {
            let child = Command::new(env::current_exe()?)
                .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
                .env(ROLE, role)
                .env(DB, &db.path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            Ok((role, thread::spawn(move || child.wait_with_output())))
        })
        .collect::<TestResult<_>>()?;
    for (role, waiter) in children {
        let output: Output = waiter.join().map_err(|_| "waiter panicked")??;
        assert!(
            output.status.success(),
            "{role} failed: {}\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // Every job is in history, completed, once, on its first attempt.
    let conn = raw(&db.path)?;
    let mut stmt = conn.prepare(
        "SELECT id, status, attempts, processed_by, payload ->> '$.producer' FROM backlog_history",
    )?;
    let rows: Vec<(i64, String, i64, String, i64)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    assert_eq!(rows.len(), JOBS);
    let ids: HashSet<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(ids.len(), JOBS, "a job appears twice in history");
    let live: i64 = common::count(&conn, "SELECT count(*) FROM backlog_jobs")?;
    assert_eq!(live, 0);

    let mut by_worker: HashMap<&str, usize> = HashMap::new();
    for (id, status, attempts, worker, producer_pid) in &rows {
        assert_eq!(status, FinalStatus::Completed.as_str(), "job {id}");
        assert_eq!(*attempts, 1, "job {id} was claimed more than once");
        // Worker ids are "<role>-<pid>": a consumer, in another process.
        let (role, pid) = worker.rsplit_once('-').ok_or("malformed worker id")?;
        assert!(
            role.starts_with("consumer-"),
            "job {id} processed by {worker}"
        );
        assert_ne!(pid.parse::<i64>()?, *producer_pid, "job {id}");
        *by_worker.entry(worker.as_str()).or_default() += 1;
    }
    assert!(by_worker.len() <= 2, "{by_worker:?}");
    println!("jobs completed per consumer: {by_worker:?}");

    // The effects, committed with each completion, exist exactly once per job
    // and were written by the worker history names.
    let mut stmt = conn.prepare(
        "SELECT h.id, count(e.job_id), min(e.note) = h.processed_by
         FROM backlog_history h LEFT JOIN effects e ON e.job_id = h.id GROUP BY h.id",
    )?;
    let effects: Vec<(i64, i64, bool)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    assert_eq!(effects.len(), JOBS);
    for (id, n, same_worker) in effects {
        assert_eq!(n, 1, "job {id} has {n} effects");
        assert!(
            same_worker,
            "job {id}'s effect was written by another worker"
        );
    }
    let total_effects: i64 = common::count(&conn, "SELECT count(*) FROM effects")?;
    assert_eq!(total_effects, JOBS as i64);
    Ok(())
}

/// Enqueues the jobs in small batches, tagging each with this process's id.
fn produce(path: &Path) -> TestResult {
    let queue = Queue::open(path)?;
    let pid = std::process::id();
    for batch in 0..JOBS / 10 {
        let ids =
            queue
                .enqueue_many((0..10).map(|i| {
                    NewJob::new("work", json!({ "n": batch * 10 + i, "producer": pid }))
                }))?;
        assert!(ids.iter().all(|e| !e.existed));
    }
    Ok(())
}

/// Leases and completes jobs, each completion committed with an effect row,
/// until every job is completed.
fn consume(path: &Path, role: &str) -> TestResult {
    let queue = Queue::open(path)?;
    let worker = format!("{role}-{}", std::process::id());
    let started = Instant::now();
    loop {
        if started.elapsed() > CHILD_DEADLINE {
            return Err(format!("{worker}: jobs still unfinished after {CHILD_DEADLINE:?}").into());
        }
        let jobs =
            queue.lease(&LeaseRequest::new(worker.as_str(), 8).ttl(Duration::from_secs(120)))?;
        if jobs.is_empty() {
            let completed: u64 = queue
                .counts()?
                .iter()
                .filter(|c| c.state == JobState::Finished(FinalStatus::Completed))
                .map(|c| c.count)
                .sum();
            if completed as usize >= JOBS {
                return Ok(());
            }
            // Another process will enqueue more: poll.
            thread::sleep(Duration::from_millis(2));
            continue;
        }
        for job in &jobs {
            queue.transaction(|tx| -> backlog::Result<()> {
                queue.complete_in(tx, job, Some(json!({ "by": worker })))?;
                tx.execute(
                    "INSERT INTO effects (job_id, note) VALUES (?1, ?2)",
                    (job.id, &worker),
                )?;
                Ok(())
            })?;
        }
    }
}
