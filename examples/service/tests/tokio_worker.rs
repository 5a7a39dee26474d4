//! A worker started from a tokio application: it runs its handlers on its
//! own threads, a handler may call async code through the application's
//! runtime handle, and `shutdown` from async code goes through
//! `spawn_blocking` so the runtime keeps running while running jobs finish.
//! On SQLite: no server needed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backlog::{JobState, NewJob, Queue, Worker};
use serde_json::{json, Value};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test(flavor = "current_thread")]
async fn shutdown_from_async_code_leaves_the_runtime_running() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    let queue = tokio::task::spawn_blocking(move || Queue::open(path)).await??;

    let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(queue.clone())
        .handle_raw("slow", move |_: Value, ctx| {
            let _ = started.send(ctx.id());
            // A blocking handler, on backlog's thread: fine there.
            std::thread::sleep(Duration::from_millis(400));
            Ok(json!("done"))
        })
        .start()?;
    let id = {
        let queue = queue.clone();
        tokio::task::spawn_blocking(move || queue.enqueue(NewJob::new("slow", json!({})))).await??
    }
    .id;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), running.recv()).await?,
        Some(id)
    );

    // The runtime has this one thread: a ticker counts whether it runs
    // while the shutdown waits for the running job.
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let report =
        tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(5))).await??;
    let during = ticks.load(Ordering::Relaxed);
    ticker.abort();
    assert!(
        during >= 10,
        "the runtime ran only {during} ticks of 10 ms while shutdown waited ~400 ms"
    );
    assert_eq!(report.unsettled, 0, "{report:?}");
    let record = tokio::task::spawn_blocking(move || queue.get(id)).await??;
    assert_eq!(record.state, JobState::COMPLETED);
    assert_eq!(record.result.as_deref(), Some(r#""done""#));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_runs_async_code_on_the_applications_runtime() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    let queue = tokio::task::spawn_blocking(move || Queue::open(path)).await??;

    // Handlers are not on the runtime's threads, so they may block on a
    // future through the runtime's handle.
    let runtime = tokio::runtime::Handle::current();
    let worker = Worker::builder(queue.clone())
        .handle_raw("async", move |payload: Value, _ctx| {
            let n = payload["n"].as_i64().unwrap_or(0);
            let doubled = runtime.block_on(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                n * 2
            });
            Ok(json!(doubled))
        })
        .start()?;
    let waited = tokio::task::spawn_blocking(move || {
        let id = queue.enqueue(NewJob::new("async", json!({"n": 21})))?.id;
        queue.wait(id, Duration::from_secs(10))
    })
    .await??;
    assert_eq!(waited.state, JobState::COMPLETED);
    assert_eq!(waited.result.as_deref(), Some("42"));
    tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(5))).await??;
    Ok(())
}

/// On PostgreSQL backlog's driver (the `postgres` crate) blocks on a
/// runtime of its own: its calls must go through `spawn_blocking`, and the
/// last handle of a queue, dropped wherever the application drops it, must
/// not panic on a runtime thread.
#[tokio::test(flavor = "current_thread")]
async fn on_postgres_a_worker_starts_and_the_queue_drops_in_async_code() -> TestResult {
    let url = match std::env::var("BACKLOG_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            println!("SKIPPED: set BACKLOG_TEST_POSTGRES_URL to run this test");
            return Ok(());
        }
    };
    let schema = format!("tokio_{}", std::process::id());
    let queue = {
        let (url, schema) = (url.clone(), schema.clone());
        tokio::task::spawn_blocking(move || {
            backlog::QueueOptions::new().schema(&schema).connect(&url)
        })
        .await??
    };
    let builder = Worker::builder(queue.clone()).handle_raw("echo", |v: Value, _ctx| Ok(v));
    let worker = tokio::task::spawn_blocking(move || builder.start()).await??;
    let record = {
        let queue = queue.clone();
        tokio::task::spawn_blocking(move || {
            let id = queue.enqueue(NewJob::new("echo", json!({"n": 1})))?.id;
            queue.wait(id, Duration::from_secs(10))
        })
        .await??
    };
    assert_eq!(record.state, JobState::COMPLETED);
    tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(5))).await??;
    // The last handle, with its idle connections, dropped on the runtime's
    // thread.
    drop(queue);

    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await?;
    Ok(())
}
