//! Deterministic crash points: for each failpoint in the engine (see
//! `src/failpoint.rs`), a child process produces jobs and works them with that
//! point armed (`BACKLOG_FAILPOINT=name:N`), and aborts there. The parent then
//! checks `PRAGMA integrity_check`, drains the queue with a clean worker, and
//! checks the invariants, every run: no acknowledged job lost (each one
//! completed, never dead), no transactional effect duplicated, attempts never
//! above max_attempts, every transactionally enqueued job has its application
//! row, and the database intact.
//!
//! Needs the `failpoints` feature; ignored by default:
//! `cargo test --features failpoints --test failpoints -- --ignored --nocapture`.

#![cfg(feature = "failpoints")]

use std::collections::HashMap;
use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use backlog::sqlite::{JobContextExt, QueueExt};
use backlog::{JobContext, JobError, LeaseRequest, NewJob, Queue, Retention, Worker};
use rusqlite::{Connection, TransactionBehavior};
use serde_json::{json, Value};

type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// Set in the child: the database path; the failpoint itself is armed
/// through `BACKLOG_FAILPOINT`, and the point's name comes in `POINT`.
const ROLE: &str = "BACKLOG_TEST_FAILPOINT_DB";
const POINT: &str = "BACKLOG_TEST_FAILPOINT_NAME";
/// Crashes per failpoint.
const RUNS: usize = 3;
/// Jobs each child produces: even ones commit their effect with
/// `ctx.transaction`, odd ones are plain; every third is enqueued inside the
/// application's own transaction.
const JOBS: usize = 6;
const MAX_ATTEMPTS: u32 = 3;
/// The child's lease: short, so a clean worker re-leases orphans quickly.
const CHILD_TTL: Duration = Duration::from_secs(1);
const HANDLER_TIME: Duration = Duration::from_millis(60);
const PATIENCE: Duration = Duration::from_secs(30);

fn connect(db: &Path) -> TestResult<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// A handler that writes its effect and completes the job in one transaction.
fn transactional(value: Value, ctx: &JobContext) -> Result<(), JobError> {
    let _ = value;
    std::thread::sleep(HANDLER_TIME);
    ctx.transaction(|tx| {
        tx.execute("INSERT INTO effects (job_id) VALUES (?1)", [ctx.id()])?;
        Ok(())
    })
}

/// A handler whose effect is its own commit (at-least-once: reruns allowed).
fn plain(db: PathBuf) -> impl Fn(Value, &JobContext) -> Result<(), JobError> {
    move |_value, ctx| {
        std::thread::sleep(HANDLER_TIME);
        connect(&db)
            .map_err(|e| JobError::retry(e.to_string()))?
            .execute("INSERT INTO runs (job_id) VALUES (?1)", [ctx.id()])?;
        Ok(())
    }
}

fn live_jobs(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT count(*) FROM backlog_jobs", [], |r| r.get(0))
}

fn integrity(conn: &Connection) -> rusqlite::Result<String> {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
}

/// The child: produce a run's jobs (recording each acknowledged id, fsynced),
/// then work until the queue is empty. The armed failpoint aborts it first.
fn child(db: &Path, point: &str) -> TestResult {
    let queue = Queue::open(db)?;
    let mut acked = OpenOptions::new()
        .create(true)
        .append(true)
        .open(db.with_extension("acked"))?;
    for i in 0..JOBS {
        let kind = if i % 2 == 0 { "tx" } else { "plain" };
        let in_tx = i % 3 == 2;
        let job = NewJob::new(kind, json!({ "i": i, "in_tx": in_tx })).max_attempts(MAX_ATTEMPTS);
        let id = if in_tx {
            let mut conn = connect(db)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let id = queue.enqueue_in(&tx, job)?.id;
            tx.execute("INSERT INTO orders (job_id) VALUES (?1)", [id])?;
            tx.commit()?;
            id
        } else {
            queue.enqueue(job)?.id
        };
        writeln!(acked, "{id} {kind}")?;
        acked.sync_all()?;
    }
    if point == "rescue" {
        // A lease that has expired by the time the worker's rescuer looks.
        queue.lease(&LeaseRequest::new("ghost", 1).ttl(Duration::from_millis(20)))?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let retention = if point == "prune" {
        Retention {
            completed: Some(Duration::ZERO),
            ..Retention::default()
        }
    } else {
        Retention::default()
    };
    let worker = Worker::builder(queue.clone())
        .concurrency(2)
        .lease_ttl(CHILD_TTL)
        .heartbeat_interval(Duration::from_millis(20))
        .rescue_interval(Duration::from_millis(100))
        .retention(retention)
        .handle_raw("tx", transactional)
        .handle_raw("plain", plain(db.to_path_buf()))
        .start()?;
    let conn = connect(db)?;
    let deadline = Instant::now() + PATIENCE;
    while live_jobs(&conn)? > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// What the checks found after one run.
#[derive(Default)]
struct Tally {
    acked: usize,
    completed: usize,
    lost: usize,
    dup: usize,
    reruns: i64,
    over_max: i64,
    max_attempt: i64,
    tx_enqueue_mismatch: i64,
    /// Jobs in the database that were never acknowledged.
    unacked: usize,
}

/// Checks every invariant over everything enqueued so far.
fn check(db: &Path) -> TestResult<Tally> {
    let conn = connect(db)?;
    let acked: Vec<(i64, String)> = std::fs::read_to_string(db.with_extension("acked"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (id, kind) = l.split_once(' ')?;
            Some((id.parse().ok()?, kind.to_owned()))
        })
        .collect();
    let counts = |table: &str| -> TestResult<HashMap<i64, i64>> {
        let mut stmt = conn.prepare(&format!(
            "SELECT job_id, count(*) FROM {table} GROUP BY job_id"
        ))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    };
    let effects = counts("effects")?;
    let runs = counts("runs")?;
    let mut stmt =
        conn.prepare("SELECT id FROM backlog_jobs UNION SELECT id FROM backlog_history")?;
    let rows: Vec<i64> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut stmt = conn.prepare("SELECT id, status FROM backlog_history")?;
    let history: HashMap<i64, String> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut tally = Tally {
        acked: acked.len(),
        unacked: rows
            .iter()
            .filter(|id| !acked.iter().any(|(a, _)| a == *id))
            .count(),
        ..Tally::default()
    };
    for (id, kind) in &acked {
        let evidence = match kind.as_str() {
            "tx" => effects.get(id).copied().unwrap_or(0),
            _ => runs.get(id).copied().unwrap_or(0),
        };
        let live: bool = conn.query_row(
            "SELECT count(*) > 0 FROM backlog_jobs WHERE id = ?1",
            [id],
            |r| r.get(0),
        )?;
        // Completed, or completed and pruned since (its effect remains).
        let done = match history.get(id).map(String::as_str) {
            Some("completed") => evidence > 0,
            Some(_) => false,
            None => !live && evidence > 0,
        };
        if done {
            tally.completed += 1;
        } else {
            tally.lost += 1;
        }
    }
    tally.dup = effects.values().filter(|&&n| n > 1).count();
    tally.reruns = runs.values().map(|n| n - 1).sum();
    (tally.over_max, tally.max_attempt) = conn.query_row(
        "SELECT count(*) FILTER (WHERE attempts > max_attempts), coalesce(max(attempts), 0)
         FROM backlog_history",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    // A job enqueued in the application's transaction has its order row, and
    // an order row's job exists (or existed, and was pruned after running).
    tally.tx_enqueue_mismatch = conn.query_row(
        "SELECT (SELECT count(*) FROM (SELECT id, payload FROM backlog_jobs
                                        UNION ALL SELECT id, payload FROM backlog_history)
                 WHERE json_extract(payload, '$.in_tx') AND id NOT IN (SELECT job_id FROM orders))
              + (SELECT count(*) FROM orders
                 WHERE job_id NOT IN (SELECT id FROM backlog_jobs)
                   AND job_id NOT IN (SELECT id FROM backlog_history)
                   AND job_id NOT IN (SELECT job_id FROM effects)
                   AND job_id NOT IN (SELECT job_id FROM runs))",
        [],
        |r| r.get(0),
    )?;
    Ok(tally)
}

/// Runs the child `RUNS` times with `point` armed; after each crash, recovers
/// with a clean worker and checks the invariants.
fn crash_at(test: &str, point: &str) -> TestResult {
    if let Some(db) = std::env::var_os(ROLE) {
        let point = std::env::var(POINT)?;
        return child(Path::new(&db), &point);
    }
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("failpoints.db");
    let queue = Queue::open(&db)?;
    connect(&db)?.execute_batch(
        "CREATE TABLE effects (job_id INTEGER NOT NULL);
         CREATE TABLE runs (job_id INTEGER NOT NULL);
         CREATE TABLE orders (job_id INTEGER NOT NULL);",
    )?;
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let (mut fired, mut max_recovery) = (0, Duration::ZERO);
    let mut tally = Tally::default();
    for run in 0..RUNS {
        // A crash at the first hit, and at later ones. Enqueues crash later
        // so that some before them were acknowledged.
        let nth = match point {
            "rescue" | "prune" => 1,
            "enqueue-before-commit" | "enqueue-after-commit" => 2 + run,
            _ => 1 + run % 2,
        };
        let stderr_path = dir.path().join(format!("child-{run}.err"));
        let mut child = Command::new(&exe)
            .args(["--exact", test, "--ignored", "--nocapture"])
            .env(ROLE, &db)
            .env(POINT, point)
            .env("BACKLOG_FAILPOINT", format!("{point}:{nth}"))
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_path)?)
            .spawn()?;
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                child.kill()?;
                child.wait()?;
                return Err(format!("{point}: the child ran past {PATIENCE:?}").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stderr = std::fs::read_to_string(&stderr_path)?;
        if status.signal() == Some(libc::SIGABRT)
            && stderr.contains(&format!("failpoint {point}: abort"))
        {
            fired += 1;
        } else {
            eprintln!("{point} run {run}: the child was not aborted there ({status}):\n{stderr}");
        }
        let crashed_at = Instant::now();
        let conn = connect(&db)?;
        assert_eq!(
            integrity(&conn)?,
            "ok",
            "{point} run {run}: after the crash"
        );

        let worker = Worker::builder(queue.clone())
            .concurrency(2)
            .rescue_interval(Duration::from_millis(100))
            .handle_raw("tx", transactional)
            .handle_raw("plain", plain(db.clone()))
            .start()?;
        while live_jobs(&conn)? > 0 {
            if crashed_at.elapsed() > PATIENCE {
                return Err(
                    format!("{point} run {run}: jobs still live after {PATIENCE:?}").into(),
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        max_recovery = max_recovery.max(crashed_at.elapsed());
        worker.shutdown(Duration::from_secs(5))?;

        tally = check(&db)?;
        assert_eq!(integrity(&conn)?, "ok", "{point} run {run}: after recovery");
        assert_eq!(
            (
                tally.lost,
                tally.dup,
                tally.over_max,
                tally.tx_enqueue_mismatch
            ),
            (0, 0, 0, 0),
            "{point} run {run}: lost, duplicated, over max_attempts, enqueue_in mismatches"
        );
        // Only a crash between an enqueue's commit and its `Ok` leaves a job
        // nobody was told about; it runs like any other.
        let committed_unacked = if point == "enqueue-after-commit" {
            run + 1
        } else {
            0
        };
        assert_eq!(
            tally.unacked, committed_unacked,
            "{point} run {run}: unacknowledged jobs"
        );
    }
    println!(
        "failpoint {point}: runs={RUNS} fired={fired} acked={} completed={} lost={} dup={} \
         unacked={} reruns={} max_attempt={} over_max={} max_recovery_ms={} secs={:.1}",
        tally.acked,
        tally.completed,
        tally.lost,
        tally.dup,
        tally.unacked,
        tally.reruns,
        tally.max_attempt,
        tally.over_max,
        max_recovery.as_millis(),
        start.elapsed().as_secs_f64()
    );
    assert_eq!(fired, RUNS, "{point}: the failpoint did not fire every run");
    assert!(tally.acked > 0, "{point}: nothing was acknowledged");
    Ok(())
}

macro_rules! crash_points {
    ($($test:ident => $point:literal,)*) => {$(
        #[test]
        #[ignore = "multi-process crash points; run by .ci/run with --features failpoints"]
        fn $test() -> TestResult {
            crash_at(stringify!($test), $point)
        }
    )*};
}

crash_points! {
    crash_before_enqueue_commit_keeps_invariants => "enqueue-before-commit",
    crash_after_enqueue_commit_keeps_invariants => "enqueue-after-commit",
    crash_after_lease_commit_keeps_invariants => "lease-after-commit",
    crash_at_handler_start_keeps_invariants => "handler-start",
    crash_before_transactional_fence_keeps_invariants => "transaction-before-fence",
    crash_between_fence_and_commit_keeps_invariants => "transaction-before-commit",
    crash_after_transactional_commit_keeps_invariants => "transaction-after-commit",
    crash_between_settle_and_commit_keeps_invariants => "settle-before-commit",
    crash_after_completer_commit_keeps_invariants => "completer-after-commit",
    crash_after_heartbeat_keeps_invariants => "heartbeat",
    crash_after_rescue_keeps_invariants => "rescue",
    crash_after_prune_keeps_invariants => "prune",
}
