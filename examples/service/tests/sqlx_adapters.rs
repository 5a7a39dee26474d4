//! The sqlx adapters (`backlog::sqlx::postgres`, `backlog::sqlx::mysql`):
//! each scenario is written once and runs on PostgreSQL and on MariaDB
//! (`postgres::NAME`, `mysql::NAME`), the conformance suite's rule for a
//! driver adapter. They live here, not in the library's
//! `tests/conformance`, because they need sqlx and tokio, which the
//! library's own `cargo test` must not compile; SQLite has no sqlx adapter
//! (see `backlog::sqlx`). Run with
//! `cargo test -p backlog-example-service --test sqlx_adapters`.
//!
//! The commit and rollback scenarios run their worker in another process
//! ([`sqlx_worker_child`]: this binary re-run), as the issue asks: what
//! wakes it is the server's, not a handle's in this process.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::group::Group;
use backlog::{Error, FinalStatus, JobState, LeaseRequest, NewJob, Queue, QueueOptions, Worker};
use common::{Fixture, TestResult};
use serde_json::{json, Value};
use sqlx::postgres::PgListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

on_servers!(
    rollback_leaves_no_job_and_a_worker_process_runs_nothing,
    commit_makes_one_job_that_a_worker_process_starts_within_a_second,
    unique_key_under_concurrent_transactions,
    bad_job_is_refused_and_the_transaction_goes_on,
    many_jobs_in_one_transaction,
    queue_on_another_database_is_refused,
    unique_for_a_period_holds_through_sqlx,
);

/// How long a job may take to finish on a worker in these scenarios:
/// slack for a loaded CI machine.
const ON_TIME: Duration = Duration::from_secs(2);

/// How soon after the commit the worker process must start the job:
/// PostgreSQL wakes it by the commit's notification, MySQL by its new-job
/// probe (every 25 ms when idle).
const STARTS_WITHIN: Duration = Duration::from_secs(1);

/// The idle poll of the worker process: far past any scenario, so only a
/// wake-up explains a job that starts on time.
const IDLE_POLL: Duration = Duration::from_secs(3600);

const ROLE: &str = "BACKLOG_SQLX_CHILD_ROLE";
const CHILD_SERVER: &str = "BACKLOG_SQLX_CHILD_SERVER";
const CHILD_URL: &str = "BACKLOG_SQLX_CHILD_URL";
const CHILD_SCHEMA: &str = "BACKLOG_SQLX_CHILD_SCHEMA";

/// A worker in a process of its own: this test binary re-run with [`ROLE`]
/// set and the scenario's database in the environment. It prints `ready`
/// once its worker started, `job-started <id>` as each `charge` begins and
/// `warmed-up <id>` for each `warm_up`; it ends when its standard input closes (the parent gone) or when the
/// parent kills it. Without a role (a plain `--ignored` run) it returns at
/// once.
#[test]
#[ignore = "a child process of the sqlx adapter scenarios"]
fn sqlx_worker_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    if role != "worker" {
        return Err(format!("unknown role {role}").into());
    }
    let url = std::env::var(CHILD_URL)?;
    let queue = match std::env::var(CHILD_SERVER)?.as_str() {
        "Postgres" => QueueOptions::new()
            .schema(std::env::var(CHILD_SCHEMA)?)
            .connect(&url)?,
        "Mysql" => QueueOptions::new().connect(&url)?,
        other => return Err(format!("unknown server {other}").into()),
    };
    let worker = Worker::builder(queue)
        .poll_interval(IDLE_POLL)
        .handle_raw("charge", |_: Value, ctx| {
            println!("job-started {}", ctx.id());
            Ok(())
        })
        .handle_raw("warm_up", |_: Value, ctx| {
            println!("warmed-up {}", ctx.id());
            Ok(())
        })
        .start()?;
    println!("ready");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// A running [`sqlx_worker_child`], killed and reaped when dropped (a failed
/// assertion included).
struct WorkerProcess {
    process: Child,
    /// Each `charge` job the process started, and when the parent read its
    /// line.
    started: UnboundedReceiver<(i64, Instant)>,
    /// The `warm_up` jobs [`WorkerProcess::spawn`] committed (all finished).
    warm_ups: i64,
}

impl WorkerProcess {
    /// Starts the process on `f`'s database and returns once its worker is
    /// idle and waiting and has been woken by a commit: a `warm_up` job
    /// committed (through `queue`) after it reported ready has run there
    /// (its LISTEN on PostgreSQL, its probe's first reading on MySQL, are
    /// in place). A warm-up committed before the probe's first reading
    /// would wait for the idle poll, so another is committed each second
    /// until one runs; all have finished on return.
    async fn spawn(f: &Fixture, queue: &Queue) -> TestResult<WorkerProcess> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "sqlx_worker_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, "worker")
            .env(CHILD_SERVER, format!("{:?}", f.server))
            .env(CHILD_URL, &f.url)
            .env(CHILD_SCHEMA, &f.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut process = command.spawn()?;
        let out = process.stdout.take();
        let (signal_tx, mut signals) = unbounded_channel();
        let (started_tx, started) = unbounded_channel();
        // Killed and reaped on drop from here on, an early return included.
        let mut this = WorkerProcess {
            process,
            started,
            warm_ups: 0,
        };
        let out = out.ok_or("the worker process has no stdout")?;
        std::thread::spawn(move || {
            // libtest may print its "test ... " prefix on the same line.
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let at = Instant::now();
                if let Some((_, id)) = line.split_once("job-started ") {
                    if let Ok(id) = id.trim().parse::<i64>() {
                        let _ = started_tx.send((id, at));
                    }
                } else if line.contains("warmed-up ") {
                    let _ = signal_tx.send("warmed-up");
                } else if line.contains("ready") {
                    let _ = signal_tx.send("ready");
                }
            }
        });
        let ready = tokio::time::timeout(Duration::from_secs(30), signals.recv()).await;
        if !matches!(ready, Ok(Some("ready"))) {
            return Err("the worker process did not become ready".into());
        }
        let mut warm_ups = Vec::new();
        loop {
            if warm_ups.len() == 10 {
                return Err("the worker process ran none of 10 committed warm-up jobs".into());
            }
            let q = queue.clone();
            let id = tokio::task::spawn_blocking(move || {
                q.enqueue(NewJob::new("warm_up", json!({}))).map(|e| e.id)
            })
            .await??;
            warm_ups.push(id);
            let woke = tokio::time::timeout(Duration::from_secs(1), signals.recv()).await;
            if matches!(woke, Ok(Some("warmed-up"))) {
                break;
            }
        }
        this.warm_ups = warm_ups.len() as i64;
        let q = queue.clone();
        tokio::task::spawn_blocking(move || -> backlog::Result<()> {
            for id in warm_ups {
                q.wait(id, Duration::from_secs(10))?;
            }
            Ok(())
        })
        .await??;
        Ok(this)
    }

    /// The next job started within `wait`, if any.
    async fn next_start(&mut self, wait: Duration) -> Option<(i64, Instant)> {
        tokio::time::timeout(wait, self.started.recv())
            .await
            .ok()
            .flatten()
    }

    fn stop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A listener on the queue's PostgreSQL channel, to see the notification
/// itself; `None` on MySQL, which has none.
async fn listen(f: &Fixture) -> TestResult<Option<PgListener>> {
    let common::AppPool::Pg(pool) = &f.app else {
        return Ok(None);
    };
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(&f.channel()).await?;
    Ok(Some(listener))
}

/// Rolled back: no job, no order, no notification (PostgreSQL), and a
/// worker in another process, whose idle poll is an hour, runs nothing. It
/// was awake: a job committed next starts there within a second.
async fn rollback_leaves_no_job_and_a_worker_process_runs_nothing(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let mut worker = WorkerProcess::spawn(&f, &queue).await?;
    let mut listener = listen(&f).await?;

    let mut tx = f.begin().await?;
    tx.insert_order(&f, 1).await?;
    let job = tx
        .enqueue(&queue, NewJob::new("charge", json!({"order": 1})))
        .await?;
    assert!(!job.existed);
    tx.rollback().await?;

    if let Some(listener) = &mut listener {
        let woke = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await;
        assert!(woke.is_err(), "a rolled-back enqueue notified: {woke:?}");
    }
    // Time for MySQL's probe to look, had the job shown.
    let ran = worker.next_start(Duration::from_millis(500)).await;
    assert_eq!(ran, None, "the worker process ran a rolled-back job");
    assert_eq!(f.all_jobs().await?, worker.warm_ups, "only the warm-ups");
    assert_eq!(f.orders().await?, 0);

    let mut tx = f.begin().await?;
    let next = tx
        .enqueue(&queue, NewJob::new("charge", json!({"order": 2})))
        .await?;
    let committing = Instant::now();
    tx.commit().await?;
    let (ran, at) = worker
        .next_start(Duration::from_secs(5))
        .await
        .ok_or("the worker process never ran the committed job")?;
    assert_eq!(ran, next.id);
    let latency = at.saturating_duration_since(committing);
    assert!(
        latency < STARTS_WITHIN,
        "started {latency:?} after the commit"
    );
    Ok(())
}

/// Committed: exactly one job with the order, nothing started before the
/// commit, and a worker in another process, whose idle poll is an hour,
/// starts it within a second of the commit (woken by the commit's NOTIFY on
/// PostgreSQL, by its new-job probe on MySQL), once.
async fn commit_makes_one_job_that_a_worker_process_starts_within_a_second(
    f: Fixture,
) -> TestResult {
    let queue = f.queue().await?;
    let mut worker = WorkerProcess::spawn(&f, &queue).await?;
    let mut listener = listen(&f).await?;

    let mut tx = f.begin().await?;
    tx.insert_order(&f, 7).await?;
    let job = tx
        .enqueue(&queue, NewJob::new("charge", json!({"order": 7})))
        .await?;
    // Not before the commit (time for MySQL's probe to look, had it shown).
    let early = worker.next_start(Duration::from_millis(300)).await;
    assert_eq!(early, None, "the job ran before its commit");
    let committing = Instant::now();
    tx.commit().await?;

    let (ran, at) = worker
        .next_start(Duration::from_secs(5))
        .await
        .ok_or("the worker process never ran the job")?;
    let latency = at.saturating_duration_since(committing);
    println!(
        "{:?}: committed job started in another process after {latency:?} ({} warm-up)",
        f.server, worker.warm_ups
    );
    assert_eq!(ran, job.id);
    assert!(
        latency < STARTS_WITHIN,
        "started {latency:?} after the commit"
    );
    if let Some(listener) = &mut listener {
        let note = tokio::time::timeout(ON_TIME, listener.recv()).await??;
        assert_eq!(note.channel(), f.channel());
    }

    let id = job.id;
    let record = tokio::task::spawn_blocking(move || queue.wait(id, ON_TIME)).await??;
    assert_eq!(record.state, JobState::COMPLETED);
    assert_eq!(record.attempts, 1, "started once");
    let again = worker.next_start(Duration::from_millis(300)).await;
    assert_eq!(again, None, "the job started twice");
    assert_eq!(
        f.all_jobs().await?,
        1 + worker.warm_ups,
        "exactly one job besides the warm-ups"
    );
    assert_eq!(f.orders().await?, 1);
    Ok(())
}

async fn unique_key_under_concurrent_transactions(f: Fixture) -> TestResult {
    let f = Arc::new(f);
    let queue = f.queue().await?;
    let keyed = |key: &str| NewJob::new("charge", json!({})).unique_key(key);

    // A second transaction with the key waits for the first, then gets its
    // job, not a second one.
    let mut first = f.begin().await?;
    let a = first.enqueue(&queue, keyed("order-1")).await?;
    assert!(!a.existed);
    let second = tokio::spawn({
        let (f, queue) = (f.clone(), queue.clone());
        async move {
            let mut tx = f.begin().await?;
            let b = tx.enqueue(&queue, keyed("order-1")).await?;
            tx.commit().await?;
            TestResult::Ok(b)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second enqueue did not wait for the first transaction"
    );
    first.commit().await?;
    let b = second.await??;
    assert!(b.existed);
    assert_eq!(b.id, a.id);

    // When the first rolls back, the second inserts its own.
    let mut first = f.begin().await?;
    let c = first.enqueue(&queue, keyed("order-2")).await?;
    let second = tokio::spawn({
        let (f, queue) = (f.clone(), queue.clone());
        async move {
            let mut tx = f.begin().await?;
            let d = tx.enqueue(&queue, keyed("order-2")).await?;
            tx.commit().await?;
            TestResult::Ok(d)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.rollback().await?;
    let d = second.await??;
    assert!(!d.existed);
    assert_ne!(d.id, c.id);

    // Many at once: exactly one job. A deadlock among the waiters comes
    // back as Busy, and the application retries its transaction.
    let busy = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for order in 0..8_i64 {
        let (f, queue, busy) = (f.clone(), queue.clone(), busy.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut tx = f.begin().await?;
                tx.insert_order(&f, 100 + order).await?;
                match tx.enqueue(&queue, keyed("order-3")).await {
                    Ok(e) => {
                        tx.commit().await?;
                        return TestResult::Ok(e);
                    }
                    Err(Error::Busy) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                        tx.rollback().await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err("busy ten times".into())
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await??);
    }
    let inserted: Vec<_> = ids.iter().filter(|e| !e.existed).collect();
    assert_eq!(inserted.len(), 1, "{ids:?}");
    assert!(ids.iter().all(|e| e.id == inserted[0].id), "{ids:?}");
    println!(
        "{:?}: 8 concurrent transactions, one job, {} busy retries",
        f.server,
        busy.load(Ordering::Relaxed)
    );
    assert_eq!(f.all_jobs().await?, 3);
    assert_eq!(f.orders().await?, 8);
    Ok(())
}

async fn bad_job_is_refused_and_the_transaction_goes_on(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let mut tx = f.begin().await?;
    tx.insert_order(&f, 1).await?;
    let bad = tx.enqueue(&queue, NewJob::new("a\nkind", json!({}))).await;
    assert!(matches!(bad, Err(Error::InvalidName { .. })), "{bad:?}");
    let grouped = tx
        .enqueue(
            &queue,
            NewJob::new("charge", json!({})).group(Group::new("g")),
        )
        .await;
    assert!(
        matches!(&grouped, Err(Error::InvalidArgument(why)) if why.contains("group")),
        "{grouped:?}"
    );
    // A dependency's edge is written only by backlog's own drivers: refused,
    // not inserted as a job that would run at once.
    let dependent = tx
        .enqueue(&queue, NewJob::new("charge", json!({})).depends_on([1]))
        .await;
    assert!(
        matches!(&dependent, Err(Error::InvalidArgument(why)) if why.contains("dependencies")),
        "{dependent:?}"
    );
    let many = tx
        .enqueue_many(
            &queue,
            vec![
                NewJob::new("charge", json!({})),
                NewJob::new("bad\0kind", json!({})),
            ],
        )
        .await;
    assert!(matches!(many, Err(Error::InvalidName { .. })), "{many:?}");
    // Nothing was sent: the transaction is intact and commits its own write.
    tx.commit().await?;
    assert_eq!(f.orders().await?, 1);
    assert_eq!(f.all_jobs().await?, 0);
    Ok(())
}

async fn many_jobs_in_one_transaction(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let mut tx = f.begin().await?;
    let plain = tx
        .enqueue_many(
            &queue,
            (0..3)
                .map(|i| NewJob::new("charge", json!({ "i": i })))
                .collect(),
        )
        .await?;
    assert_eq!(plain.len(), 3);
    assert!(plain.iter().all(|e| !e.existed));
    assert!(plain.windows(2).all(|w| w[0].id < w[1].id), "{plain:?}");
    let keyed = tx
        .enqueue_many(
            &queue,
            ["a", "b", "a"]
                .into_iter()
                .map(|k| NewJob::new("charge", json!({})).unique_key(k))
                .collect(),
        )
        .await?;
    assert!(!keyed[0].existed && !keyed[1].existed && keyed[2].existed);
    assert_eq!(keyed[2].id, keyed[0].id);
    tx.commit().await?;
    assert_eq!(f.all_jobs().await?, 5);
    let first = plain[0].id;
    let record = tokio::task::spawn_blocking(move || queue.get(first)).await??;
    assert_eq!(
        serde_json::from_str::<Value>(&record.payload)?,
        json!({"i": 0})
    );
    assert_eq!(record.state, JobState::Available);
    Ok(())
}

async fn queue_on_another_database_is_refused(f: Fixture) -> TestResult {
    let _tables = f.queue().await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    let sqlite = tokio::task::spawn_blocking(move || Queue::open(path)).await??;
    let mut tx = f.begin().await?;
    tx.insert_order(&f, 1).await?;
    let wrong = tx.enqueue(&sqlite, NewJob::new("charge", json!({}))).await;
    assert!(matches!(wrong, Err(Error::InvalidArgument(_))), "{wrong:?}");
    tx.commit().await?;
    assert_eq!(f.orders().await?, 1);
    assert_eq!(f.all_jobs().await?, 0);
    Ok(())
}

/// A key unique for a period is held by a finished job inside the period,
/// of the statuses asked for, through sqlx as through backlog's own driver.
async fn unique_for_a_period_holds_through_sqlx(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let first = {
        let queue = queue.clone();
        tokio::task::spawn_blocking(move || -> backlog::Result<i64> {
            let id = queue
                .enqueue(NewJob::new("digest", json!({})).unique_key("d-7"))?
                .id;
            for job in queue.lease(&LeaseRequest::new("w", 1).kinds(["digest"]))? {
                queue.complete(&job, None)?;
            }
            Ok(id)
        })
        .await??
    };
    let hour = Duration::from_secs(3600);
    let mut tx = f.begin().await?;
    let held = tx
        .enqueue(
            &queue,
            NewJob::new("digest", json!({}))
                .unique_key("d-7")
                .unique_for(hour),
        )
        .await?;
    assert!(held.existed && held.id == first, "{held:?}");
    // Only a dead job holds it now: the completed one does not.
    let again = tx
        .enqueue(
            &queue,
            NewJob::new("digest", json!({}))
                .unique_key("d-7")
                .unique_for(hour)
                .unique_states([FinalStatus::Dead]),
        )
        .await?;
    assert!(!again.existed && again.id != first, "{again:?}");
    tx.commit().await?;
    assert_eq!(f.all_jobs().await?, 2);
    Ok(())
}
