//! A worker process killed with SIGKILL mid-job: once its leases expire,
//! another worker completes its jobs, and since every job commits its effect
//! with `ctx.transaction`, each effect is in the table exactly once.

mod worker_common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backlog::sqlite::JobContextExt;
use backlog::{NewJob, Worker};
use crossbeam_channel::unbounded;
use serde_json::json;
use worker_common::*;

const TEST: &str = "a_worker_killed_mid_job_leaves_each_effect_exactly_once";
const JOBS: u32 = 6;

/// Child side: how many of the blocking jobs (3, 4, 5) have started.
static BLOCKING_STARTED: AtomicUsize = AtomicUsize::new(0);

/// Commits the job's effect and completion together. Jobs 3 and up never get
/// there in the child: it is killed holding their transaction (or waiting).
fn charge(
    who: &'static str,
    block: bool,
) -> impl Fn(Work, &backlog::JobContext) -> Result<u32, backlog::JobError> {
    move |args: Work, ctx| {
        println!("[job] started {}", ctx.id());
        if block && args.n >= 3 {
            // Hold back until all three blocking jobs run: the first to take
            // the write gate keeps it until the kill, and a job not yet
            // leased then could never be.
            BLOCKING_STARTED.fetch_add(1, Ordering::SeqCst);
            while BLOCKING_STARTED.load(Ordering::SeqCst) < 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        ctx.transaction(|tx| {
            tx.execute(
                "INSERT INTO effects (job_id, worker) VALUES (?1, ?2)",
                (ctx.id(), who),
            )?;
            if block && args.n >= 3 {
                println!("[job] in-transaction {}", ctx.id());
                std::thread::sleep(Duration::from_secs(60)); // killed here
            }
            Ok(args.n)
        })
    }
}

#[test]
fn a_worker_killed_mid_job_leaves_each_effect_exactly_once() -> TestResult {
    if let Some((_, path)) = child_role() {
        // The child: a worker with a short lease that is killed mid-job.
        let worker = Worker::builder(backlog::Queue::open(path)?)
            .concurrency(3)
            .lease_ttl(Duration::from_secs(1))
            .handle(charge("child", true))
            .start()?;
        std::thread::sleep(PATIENCE); // the parent kills us long before this
        drop(worker);
        return Ok(());
    }

    let db = Db::new()?;
    let queue = db.queue()?;
    db.connect()?
        .execute_batch("CREATE TABLE effects (job_id INTEGER NOT NULL, worker TEXT NOT NULL)")?;
    let ids: Vec<i64> = queue
        .enqueue_many((0..JOBS).map(|n| NewJob::new("work", json!({"n": n}))))?
        .into_iter()
        .map(|e| e.id)
        .collect();

    let mut child = spawn_child(TEST, "worker", &db)?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let (lines_tx, lines) = unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut started = HashSet::new();
    let mut in_transaction = false;
    while started.len() < JOBS as usize || !in_transaction {
        let line = lines
            .recv_timeout(PATIENCE)
            .map_err(|_| "the child stopped reporting")?;
        // The harness may print on the same line: look for the markers anywhere.
        for report in line.split("[job] ").skip(1) {
            if let Some(id) = report.trim().strip_prefix("started ") {
                started.insert(id.parse::<i64>()?);
            }
            in_transaction |= report.starts_with("in-transaction ");
        }
    }
    child.kill()?; // SIGKILL on unix
    child.wait()?;

    let unfinished: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| {
            queue
                .get(*id)
                .map(|r| r.state.as_str() != "completed")
                .unwrap_or(true)
        })
        .collect();
    println!(
        "killed the child with {} of {JOBS} jobs unfinished",
        unfinished.len()
    );
    assert!(!unfinished.is_empty(), "the child was killed mid-job");

    let events = queue.subscribe();
    let worker = Worker::builder(queue.clone())
        .rescue_interval(Duration::from_millis(100))
        .handle(charge("parent", false))
        .start()?;
    let done = wait_count(
        &events,
        unfinished.len(),
        PATIENCE,
        "rescued completions",
        completed,
    )?;
    worker.shutdown(PATIENCE)?;

    for id in &unfinished {
        assert_eq!(
            done.get(id),
            Some(&1),
            "job {id} completed once by the parent"
        );
    }
    let conn = db.connect()?;
    for id in &ids {
        expect_state(&queue, *id, "completed")?;
        let effects: i64 = conn.query_row(
            "SELECT count(*) FROM effects WHERE job_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        assert_eq!(effects, 1, "job {id}'s effect is there exactly once");
    }
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    assert_eq!(integrity, "ok");
    Ok(())
}
