//! Write-lock hog: an application transaction (`BEGIN IMMEDIATE` on its own
//! connection) holds the write lock for twice the queue's `busy_timeout`,
//! again and again, while a worker runs jobs and the application enqueues.
//!
//! Every write the queue makes meanwhile (lease, heartbeat, the handlers'
//! `ctx.transaction`, enqueue) sees SQLITE_BUSY from SQLite after 500 ms and
//! must retry until the hog lets go. Pass: no false rescue (no `Rescued` or
//! `LeaseLost` event, each job started once, attempts = 1, its effect exactly
//! once), no error surfaced to a handler or to an enqueue, and every job
//! completes after the hog releases.
//!
//! Ignored by default (it takes several seconds); run by `.ci/run`.

use std::collections::HashMap;
use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::sqlite::JobContextExt;
use backlog::{Event, NewJob, QueueOptions, Worker};
use rusqlite::{Connection, TransactionBehavior};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn Error>>;

const BUSY_TIMEOUT: Duration = Duration::from_millis(500);
const HOLD: Duration = Duration::from_millis(1000); // 2 × busy_timeout
const HOGS: usize = 4;
/// Well above the hold: a lease only expires here if heartbeats fail.
const LEASE_TTL: Duration = Duration::from_secs(5);
const PATIENCE: Duration = Duration::from_secs(60);
/// Jobs waiting when the worker starts; each handler takes about 200 ms, so
/// with 4 threads they are still running when the hog comes and goes.
const JOBS: usize = 40;

#[test]
#[ignore = "holds the write lock for seconds; run by .ci/run"]
fn an_application_hogging_the_write_lock_causes_no_false_rescue_and_no_handler_error() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("hog.db");
    let queue = QueueOptions::new().busy_timeout(BUSY_TIMEOUT).open(&path)?;
    let app = Connection::open(&path)?;
    app.execute_batch("CREATE TABLE effects (job_id INTEGER NOT NULL)")?;
    let events = queue.subscribe();
    let mut ids: Vec<i64> = queue
        .enqueue_many((0..JOBS).map(|n| NewJob::new("hogged", json!({ "n": n }))))?
        .into_iter()
        .map(|e| e.id)
        .collect();

    let handler_errors = Arc::new(AtomicU64::new(0));
    let waited = Arc::new(AtomicU64::new(0));
    let (errors, waits) = (handler_errors.clone(), waited.clone());
    let worker = Worker::builder(queue.clone())
        .concurrency(4)
        .lease_ttl(LEASE_TTL)
        .heartbeat_interval(Duration::from_millis(250))
        .rescue_interval(Duration::from_millis(100))
        .handle_raw("hogged", move |_args, ctx| {
            std::thread::sleep(Duration::from_millis(200));
            let began = Instant::now();
            let beat = ctx.heartbeat();
            let done = ctx.transaction(|tx| {
                tx.execute("INSERT INTO effects (job_id) VALUES (?1)", [ctx.id()])?;
                Ok(())
            });
            if began.elapsed() > BUSY_TIMEOUT {
                waits.fetch_add(1, Ordering::Relaxed);
            }
            if beat.is_err() || done.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("handler saw: heartbeat {beat:?}, transaction {done:?}");
            }
            beat?;
            done
        })
        .start()?;

    // The hog: an application transaction holding the write lock, released
    // and taken again a little later, while jobs flow.
    let hogging = Arc::new(AtomicBool::new(true));
    let hog = {
        let (path, hogging) = (path.clone(), hogging.clone());
        std::thread::spawn(move || -> rusqlite::Result<Duration> {
            let mut conn = Connection::open(&path)?;
            conn.busy_timeout(Duration::from_secs(10))?;
            let mut held = Duration::ZERO;
            for _ in 0..HOGS {
                std::thread::sleep(Duration::from_millis(150));
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let since = Instant::now();
                tx.execute("INSERT INTO effects (job_id) VALUES (0)", [])?;
                std::thread::sleep(HOLD);
                held = held.max(since.elapsed());
                tx.commit()?;
            }
            hogging.store(false, Ordering::SeqCst);
            Ok(held)
        })
    };

    // The application enqueues meanwhile, one job every 50 ms.
    let (mut enqueue_errors, mut max_enqueue) = (0, Duration::ZERO);
    while hogging.load(Ordering::SeqCst) {
        let began = Instant::now();
        match queue.enqueue(NewJob::new("hogged", json!({ "n": ids.len() }))) {
            Ok(e) => ids.push(e.id),
            Err(e) => {
                enqueue_errors += 1;
                eprintln!("enqueue failed: {e}");
            }
        }
        max_enqueue = max_enqueue.max(began.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = hog.join().map_err(|_| "hog thread panicked")??;
    let hogs_done = Instant::now();

    // Every job completes; count what happened on the way.
    let deadline = Instant::now() + PATIENCE;
    let mut completed: HashMap<i64, usize> = HashMap::new();
    let mut started: HashMap<i64, usize> = HashMap::new();
    let (mut rescued, mut lease_lost, mut retried) = (0, 0, 0);
    while completed.len() < ids.len() {
        let event = events
            .recv_deadline(deadline)
            .map_err(|_| format!("{} of {} jobs completed", completed.len(), ids.len()))?;
        match event {
            Event::Completed { job_id } => *completed.entry(job_id).or_default() += 1,
            Event::Started { job_id, .. } => *started.entry(job_id).or_default() += 1,
            Event::Rescued { .. } => rescued += 1,
            Event::LeaseLost { .. } => lease_lost += 1,
            Event::Retried { .. } | Event::Dead { .. } => retried += 1,
            _ => {}
        }
    }
    let drain = hogs_done.elapsed();
    worker.shutdown(Duration::from_secs(10))?;
    while let Ok(event) = events.try_recv() {
        match event {
            Event::Rescued { .. } => rescued += 1,
            Event::LeaseLost { .. } => lease_lost += 1,
            Event::Retried { .. } | Event::Dead { .. } => retried += 1,
            _ => {}
        }
    }

    let max_attempt: i64 = app.query_row(
        "SELECT max(attempts) FROM backlog_history WHERE status = 'completed'",
        [],
        |r| r.get(0),
    )?;
    let history: i64 = app.query_row(
        "SELECT count(*) FROM backlog_history WHERE status = 'completed'",
        [],
        |r| r.get(0),
    )?;
    let dup: i64 = app.query_row(
        "SELECT count(*) FROM (SELECT job_id FROM effects WHERE job_id > 0
                               GROUP BY job_id HAVING count(*) > 1)",
        [],
        |r| r.get(0),
    )?;
    let effects: i64 = app.query_row(
        "SELECT count(DISTINCT job_id) FROM effects WHERE job_id > 0",
        [],
        |r| r.get(0),
    )?;
    let restarted = started.values().filter(|&&n| n > 1).count();
    let integrity: String = app.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    println!(
        "write-lock hog: hogs={HOGS} hold_ms={} busy_timeout_ms={} jobs={} completed={history} \
         rescued={rescued} lease_lost={lease_lost} retried={retried} restarted={restarted} \
         max_attempt={max_attempt} dup={dup} handler_errors={} enqueue_errors={enqueue_errors} \
         handlers_waited={} busy_retries={} max_enqueue_ms={} drain_ms={} integrity={integrity}",
        held.as_millis(),
        BUSY_TIMEOUT.as_millis(),
        ids.len(),
        handler_errors.load(Ordering::Relaxed),
        waited.load(Ordering::Relaxed),
        queue.busy_retries(),
        max_enqueue.as_millis(),
        drain.as_millis(),
    );
    assert!(held >= HOLD, "the hog held the lock for {held:?}");
    assert!(
        queue.busy_retries() > 0 && waited.load(Ordering::Relaxed) > 0,
        "the queue's handlers never ran into the hog"
    );
    assert_eq!(
        (rescued, lease_lost, retried, restarted),
        (0, 0, 0, 0),
        "false rescues"
    );
    assert_eq!(
        (handler_errors.load(Ordering::Relaxed), enqueue_errors),
        (0, 0),
        "errors surfaced"
    );
    assert_eq!((history, effects), (ids.len() as i64, ids.len() as i64));
    assert_eq!((max_attempt, dup), (1, 0));
    assert_eq!(integrity, "ok");
    Ok(())
}
