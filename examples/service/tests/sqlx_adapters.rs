//! The sqlx adapters (`backlog::sqlx::postgres`, `backlog::sqlx::mysql`):
//! each scenario is written once and runs on PostgreSQL and on MariaDB
//! (`postgres::NAME`, `mysql::NAME`), the conformance suite's rule for a
//! driver adapter. They live here, not in the library's
//! `tests/conformance`, because they need sqlx and tokio, which the
//! library's own `cargo test` must not compile; SQLite has no sqlx adapter
//! (see `backlog::sqlx`). Run with
//! `cargo test -p backlog-example-service --test sqlx_adapters`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::group::Group;
use backlog::{Error, FinalStatus, JobState, LeaseRequest, NewJob, Queue, Worker};
use common::{Fixture, TestResult};
use serde_json::{json, Value};
use sqlx::postgres::PgListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

on_servers!(
    rollback_leaves_no_job_and_wakes_no_worker,
    commit_makes_one_job_that_another_queue_runs_on_time,
    unique_key_under_concurrent_transactions,
    bad_job_is_refused_and_the_transaction_goes_on,
    many_jobs_in_one_transaction,
    queue_on_another_database_is_refused,
    unique_for_a_period_holds_through_sqlx,
);

/// How long a committed job may take to start on another queue's worker:
/// PostgreSQL wakes it by notification, MySQL by its 25 ms poll; the rest is
/// slack for a loaded CI machine.
const ON_TIME: Duration = Duration::from_secs(2);

/// A worker on its own queue handle (its own connections) that reports each
/// job id it runs; started off the runtime's threads.
async fn start_worker(queue: Queue) -> TestResult<(Worker, UnboundedReceiver<i64>)> {
    let (ran, runs) = unbounded_channel();
    let worker = tokio::task::spawn_blocking(move || {
        Worker::builder(queue)
            .concurrency(2)
            .handle_raw("charge", move |_: Value, ctx| {
                let _ = ran.send(ctx.id());
                Ok(())
            })
            .start()
    })
    .await??;
    Ok((worker, runs))
}

async fn stop(worker: Worker) -> TestResult {
    tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(5))).await??;
    Ok(())
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

async fn rollback_leaves_no_job_and_wakes_no_worker(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let (worker, mut runs) = start_worker(f.queue().await?).await?;
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
    let ran = tokio::time::timeout(Duration::from_millis(500), runs.recv()).await;
    assert!(ran.is_err(), "a rolled-back job ran: {ran:?}");
    assert_eq!(f.all_jobs().await?, 0);
    assert_eq!(f.orders().await?, 0);
    stop(worker).await
}

async fn commit_makes_one_job_that_another_queue_runs_on_time(f: Fixture) -> TestResult {
    let queue = f.queue().await?;
    let (worker, mut runs) = start_worker(f.queue().await?).await?;
    let mut listener = listen(&f).await?;
    // The worker is idle and waiting before the commit.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut tx = f.begin().await?;
    tx.insert_order(&f, 7).await?;
    let job = tx
        .enqueue(&queue, NewJob::new("charge", json!({"order": 7})))
        .await?;
    // Not before the commit.
    let early = tokio::time::timeout(Duration::from_millis(300), runs.recv()).await;
    assert!(early.is_err(), "the job ran before its commit: {early:?}");
    let committed = Instant::now();
    tx.commit().await?;

    if let Some(listener) = &mut listener {
        let note = tokio::time::timeout(ON_TIME, listener.recv()).await??;
        assert_eq!(note.channel(), f.channel());
    }
    let ran = tokio::time::timeout(ON_TIME, runs.recv()).await?;
    let latency = committed.elapsed();
    assert_eq!(ran, Some(job.id));
    println!("{:?}: committed job started after {latency:?}", f.server);

    let id = job.id;
    let record = tokio::task::spawn_blocking(move || queue.wait(id, ON_TIME)).await??;
    assert_eq!(record.state, JobState::COMPLETED);
    let again = tokio::time::timeout(Duration::from_millis(300), runs.recv()).await;
    assert!(again.is_err(), "the job ran twice: {again:?}");
    assert_eq!(f.all_jobs().await?, 1);
    assert_eq!(f.orders().await?, 1);
    stop(worker).await
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
