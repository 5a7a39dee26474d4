//! Poison jobs (reliability suite 8): a job that kills its worker process
//! every time, a handler that panics every time, and a payload that does not
//! decode. None of them may stall the queue or loop forever.
//!
//! - Abort: the handler calls `std::process::abort()`. Each death leaves the
//!   job's lease to expire; the rescuer counts the expired claim as an
//!   attempt, so after `max_attempts` process deaths the job is `dead`, with
//!   one "lease expired" error per death, and every other job completes.
//! - Panic: each panic is recorded as a failed attempt (in the job's errors
//!   list) and the thread lives on; afterwards all of the pool's threads run
//!   at once (a gate only they together can pass).
//! - Undecodable payload: `dead` on the first attempt, the handler never
//!   called.
//!
//! Ignored by default (a few seconds); run by `.ci/run`.

mod chaos_common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::thread;
use std::time::{Duration, Instant};

use backlog::sqlite::JobContextExt;
use backlog::{
    Event, FinalStatus, JobArgs, JobError, JobState, NewJob, Queue, RetryPolicy, Worker,
};
use chaos_common::*;
use crossbeam_channel::Receiver;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

const ABORT_TEST: &str =
    "a_job_that_aborts_its_worker_process_is_dead_after_max_attempts_deaths_and_the_rest_complete";
const THREADS: usize = 4;
const PATIENCE: Duration = Duration::from_secs(60);

/// The arguments of the panic and decode tests.
#[derive(Debug, Serialize, Deserialize)]
struct Work {
    n: u32,
}

impl JobArgs for Work {
    const KIND: &'static str = "work";
}

/// Keeps the intended panics out of the test output; others print as usual.
fn quiet_poison_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .unwrap_or("");
            if !message.starts_with("poison pill") {
                default(info);
            }
        }));
    });
}

/// Reads events until `n` jobs have finished (completed or dead); returns
/// the finished ids with their final event.
fn wait_finished(events: &Receiver<Event>, n: usize) -> TestResult<Vec<Event>> {
    let deadline = Instant::now() + PATIENCE;
    let mut finished = Vec::new();
    while finished.len() < n {
        match events.recv_deadline(deadline) {
            Ok(e @ (Event::Completed { .. } | Event::Dead { .. })) => finished.push(e),
            Ok(_) => {}
            Err(_) => return Err(format!("{} of {n} jobs finished in time", finished.len()).into()),
        }
    }
    Ok(finished)
}

fn starts_path(db: &Path) -> PathBuf {
    db.with_extension("starts")
}

/// The child of the abort test: a worker whose `abort` handler kills it.
fn aborting_worker(db: &Path) -> TestResult {
    disable_core_dumps();
    let queue = Queue::open(db)?;
    let starts = SideFile::open(&starts_path(db))?;
    let pid = std::process::id();
    let _worker = Worker::builder(queue)
        .worker_id(format!("poison-{pid}"))
        .concurrency(THREADS)
        .lease_ttl(Duration::from_secs(1))
        .heartbeat_interval(Duration::from_millis(250))
        .rescue_interval(Duration::from_millis(200))
        .handle_raw("abort", move |_: Value, ctx| -> Result<(), JobError> {
            starts.line(format!("{} {} {pid}", ctx.id(), ctx.attempt()))?;
            std::process::abort()
        })
        .handle_raw("ok", |_: Value, ctx| -> Result<(), JobError> {
            thread::sleep(Duration::from_millis(20));
            ctx.transaction(|tx| {
                tx.execute("INSERT INTO effects (job_id) VALUES (?1)", [ctx.id()])?;
                Ok(())
            })
        })
        .start()?;
    loop {
        thread::sleep(Duration::from_secs(3600)); // until it aborts or is killed
    }
}

#[test]
#[ignore = "restarts a worker process it kills three times, a few seconds; run by .ci/run"]
fn a_job_that_aborts_its_worker_process_is_dead_after_max_attempts_deaths_and_the_rest_complete(
) -> TestResult {
    if let Some((_, db)) = child_role() {
        return aborting_worker(&db);
    }
    const MAX_ATTEMPTS: u32 = 3;
    const OTHERS: usize = 200;
    let began = Instant::now();
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("abort.db");
    let queue = Queue::open(&db)?;
    let conn = connect(&db)?;
    conn.execute_batch("CREATE TABLE effects (job_id INTEGER NOT NULL)")?;
    let mut others = Vec::with_capacity(OTHERS);
    let ok = |n: usize| NewJob::new("ok", json!(n));
    others.extend(queue.enqueue_many((0..OTHERS / 2).map(ok))?);
    let poison = queue
        .enqueue(NewJob::new("abort", json!({})).max_attempts(MAX_ATTEMPTS))?
        .id;
    others.extend(queue.enqueue_many((OTHERS / 2..OTHERS).map(ok))?);

    // Restart the worker whenever it dies, until nothing is left to run.
    let mut worker = Reaper::default();
    worker.0.push(spawn_child(ABORT_TEST, "worker", &db)?);
    let mut deaths = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = worker.0[0].try_wait()? {
            deaths.push(status.signal());
            assert_eq!(
                integrity(&db)?,
                "ok",
                "integrity after death {}",
                deaths.len()
            );
            worker.0[0] = spawn_child(ABORT_TEST, "worker", &db)?;
        }
        let poison_done = matches!(queue.get(poison)?.state, JobState::Finished(_));
        if poison_done && count(&conn, "SELECT count(*) FROM backlog_jobs")? == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("not done after {PATIENCE:?}; deaths: {deaths:?}").into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    kill_child(&mut worker.0[0]);

    let record = queue.get(poison)?;
    let mut completed = 0;
    for e in &others {
        if queue.get(e.id)?.state == JobState::Finished(FinalStatus::Completed) {
            completed += 1;
        }
    }
    let dup_effects = count(
        &conn,
        "SELECT count(*) - count(DISTINCT job_id) FROM effects",
    )?;
    let poison_runs: Vec<(u32, u32)> = read_side_file(&starts_path(&db))
        .iter()
        .filter(|l| l[0] == poison.to_string())
        .map(|l| Ok((l[1].parse()?, l[2].parse()?)))
        .collect::<TestResult<_>>()?;
    println!(
        "poison abort: max_attempts={MAX_ATTEMPTS} deaths={} runs={} status={} attempts={} \
         errors={} other_jobs={OTHERS} completed={completed} dup_effects={dup_effects} secs={:.1}",
        deaths.len(),
        poison_runs.len(),
        record.state.as_str(),
        record.attempts,
        record.errors.len(),
        began.elapsed().as_secs_f64()
    );

    assert_eq!(
        deaths,
        vec![Some(libc::SIGABRT); MAX_ATTEMPTS as usize],
        "one process death per attempt, each by abort"
    );
    let attempts: Vec<u32> = poison_runs.iter().map(|r| r.0).collect();
    assert_eq!(attempts, (1..=MAX_ATTEMPTS).collect::<Vec<_>>());
    assert_eq!(record.state, JobState::Finished(FinalStatus::Dead));
    assert_eq!(record.attempts, MAX_ATTEMPTS);
    assert_eq!(record.errors.len(), MAX_ATTEMPTS as usize);
    for (n, error) in record.errors.iter().enumerate() {
        assert_eq!(error.attempt as usize, n + 1);
        assert!(error.message.contains("lease expired"), "{error:?}");
    }
    assert_eq!(completed, OTHERS, "every other job completed");
    assert_eq!(dup_effects, 0);
    Ok(())
}

#[test]
#[ignore = "reliability suite, a second or two; run by .ci/run"]
fn a_panicking_handler_is_recorded_per_attempt_and_the_pool_stays_at_full_strength() -> TestResult {
    const JOBS: u32 = 100;
    const MAX_ATTEMPTS: u32 = 3;
    quiet_poison_panics();
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("panic.db"))?;
    let events = queue.subscribe();
    let ids: Vec<i64> = queue
        .enqueue_many(
            (0..JOBS).map(|n| NewJob::new("work", json!({ "n": n })).max_attempts(MAX_ATTEMPTS)),
        )?
        .into_iter()
        .map(|e| e.id)
        .collect();
    let panicking = |n: u32| n.is_multiple_of(10);

    // The gate opens only when every handler thread is inside it at once.
    let arrived = Arc::new(AtomicUsize::new(0));
    let gate = arrived.clone();
    let panics = Arc::new(AtomicUsize::new(0));
    let panicked = panics.clone();
    let worker = Worker::builder(queue.clone())
        .concurrency(THREADS)
        .retry_policy(RetryPolicy {
            base: Duration::from_millis(10),
            jitter: 0.0,
            max: Duration::from_millis(100),
        })
        .handle(move |args: Work, _| {
            if panicking(args.n) {
                panicked.fetch_add(1, Ordering::SeqCst);
                panic!("poison pill {}", args.n);
            }
            thread::sleep(Duration::from_millis(10));
            Ok(args.n)
        })
        .handle_raw("gate", move |_: Value, _| {
            gate.fetch_add(1, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(10);
            while gate.load(Ordering::SeqCst) < THREADS && Instant::now() < until {
                thread::sleep(Duration::from_millis(1));
            }
            Ok(gate.load(Ordering::SeqCst) >= THREADS)
        })
        .start()?;
    wait_finished(&events, JOBS as usize)?;
    let gates: Vec<i64> = queue
        .enqueue_many((0..THREADS).map(|n| NewJob::new("gate", json!(n))))?
        .into_iter()
        .map(|e| e.id)
        .collect();
    wait_finished(&events, THREADS)?;
    worker.shutdown(PATIENCE)?;

    let (mut completed, mut dead, mut errors) = (0, 0, 0);
    for (n, id) in (0..JOBS).zip(&ids) {
        let record = queue.get(*id)?;
        if panicking(n) {
            assert_eq!(
                record.state,
                JobState::Finished(FinalStatus::Dead),
                "job {n}"
            );
            assert_eq!(record.attempts, MAX_ATTEMPTS);
            let recorded: Vec<(u32, String)> = record
                .errors
                .iter()
                .map(|e| (e.attempt, e.message.clone()))
                .collect();
            let expected: Vec<(u32, String)> = (1..=MAX_ATTEMPTS)
                .map(|a| (a, format!("handler panicked: poison pill {n}")))
                .collect();
            assert_eq!(recorded, expected, "one error per attempt");
            dead += 1;
            errors += record.errors.len();
        } else {
            assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
            assert_eq!(record.attempts, 1);
            completed += 1;
        }
    }
    let mut opened = 0;
    for id in &gates {
        let record = queue.get(*id)?;
        if record.result.as_deref() == Some("true") {
            opened += 1;
        }
    }
    println!(
        "poison panic: jobs={JOBS} panicking={dead} panics={} errors_recorded={errors} \
         completed={completed} dead={dead} threads={THREADS} gate_passed={opened}/{THREADS}",
        panics.load(Ordering::SeqCst),
    );
    assert_eq!(dead, 10);
    assert_eq!(
        panics.load(Ordering::SeqCst),
        errors,
        "every panic recorded"
    );
    assert_eq!(completed, 90);
    assert_eq!(
        opened, THREADS,
        "all handler threads ran at once after the panics"
    );
    Ok(())
}

#[test]
#[ignore = "reliability suite, under a second; run by .ci/run"]
fn a_payload_that_does_not_decode_is_dead_on_its_first_attempt() -> TestResult {
    let dir = tempfile::tempdir()?;
    let queue = Queue::open(dir.path().join("decode.db"))?;
    let events = queue.subscribe();
    let bad = queue
        .enqueue(NewJob::new("work", json!({ "n": "seven" })).max_attempts(5))?
        .id;
    let good = queue.enqueue(NewJob::new("work", json!({ "n": 7 })))?.id;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let worker = Worker::builder(queue.clone())
        .handle(move |args: Work, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(args.n)
        })
        .start()?;
    wait_finished(&events, 2)?;
    worker.shutdown(PATIENCE)?;

    let record = queue.get(bad)?;
    println!(
        "poison decode: status={} attempts={} max_attempts={} errors={} handler_calls={}",
        record.state.as_str(),
        record.attempts,
        record.max_attempts,
        record.errors.len(),
        calls.load(Ordering::SeqCst).saturating_sub(1),
    );
    assert_eq!(record.state, JobState::Finished(FinalStatus::Dead));
    assert_eq!(record.attempts, 1);
    assert_eq!(record.errors.len(), 1);
    assert!(
        record.errors[0].message.contains("does not decode"),
        "{:?}",
        record.errors[0]
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "called for the good job only"
    );
    assert_eq!(
        queue.get(good)?.state,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}
