//! An axum service on sqlx and PostgreSQL that hands its slow work to
//! backlog: `POST /orders` inserts the order and enqueues its `charge_card`
//! job in the request's own transaction, and answers 202 Accepted; a worker
//! started in the same process (its handlers are blocking closures on
//! backlog's own threads, never on the runtime's) charges the order;
//! `GET /orders/{id}` shows whether it is paid.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/shop \
//!     cargo run -p backlog-example-service -- --bind 127.0.0.1:3000
//! curl -i -X POST localhost:3000/orders -H 'content-type: application/json' -d '{"cents": 1250}'
//! ```
//!
//! The URL comes from `DATABASE_URL`, else `BACKLOG_TEST_POSTGRES_URL`;
//! without either it says so and exits 0. `--bind 127.0.0.1:0` takes any
//! free port; the first line printed is `listening on http://ADDR`. It
//! works in the schema `--schema NAME` (default `shop`, created if missing)
//! and stops cleanly on Ctrl-C or SIGTERM: the server drains, then the
//! worker finishes its running jobs (within 10 s) off the runtime's
//! threads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use backlog::postgres::JobContextExt;
use backlog::sqlx::postgres::QueueExt;
use backlog::{JobArgs, Queue, QueueOptions, Worker};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Row};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The job: charge one order.
#[derive(Serialize, Deserialize)]
struct ChargeCard {
    order: i64,
    cents: i64,
}

impl JobArgs for ChargeCard {
    const KIND: &'static str = "charge_card";
}

/// What the handlers share.
struct App {
    queue: Queue,
    pool: PgPool,
    /// The schema-qualified statements.
    insert_order: String,
    select_order: String,
}

#[derive(Deserialize)]
struct NewOrder {
    cents: i64,
}

struct Args {
    bind: SocketAddr,
    schema: String,
}

fn args() -> Result<Args, BoxError> {
    let mut args = Args {
        bind: "127.0.0.1:3000".parse()?,
        schema: "shop".to_owned(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--bind" => args.bind = value.parse()?,
            "--schema" => {
                if value.is_empty()
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    return Err("--schema takes lowercase letters, digits and _".into());
                }
                args.schema = value;
            }
            other => {
                return Err(format!("unknown flag {other}; expected --bind or --schema").into())
            }
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args()?;
    let url = match std::env::var("DATABASE_URL")
        .or_else(|_| std::env::var("BACKLOG_TEST_POSTGRES_URL"))
    {
        Ok(url) if !url.is_empty() => url,
        _ => {
            println!("SKIPPED: set DATABASE_URL (or BACKLOG_TEST_POSTGRES_URL) to a PostgreSQL database to run this example");
            return Ok(());
        }
    };
    let schema = args.schema;

    // The application's pool, and its table.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.orders (
             id BIGSERIAL PRIMARY KEY, cents BIGINT NOT NULL,
             paid BOOLEAN NOT NULL DEFAULT false)"
    )))
    .execute(&pool)
    .await?;

    // Opening the queue connects and migrates with backlog's synchronous
    // driver: off the runtime's threads.
    let queue = {
        let (url, schema) = (url.clone(), schema.clone());
        tokio::task::spawn_blocking(move || QueueOptions::new().schema(&schema).connect(&url))
            .await??
    };

    // The worker runs on its own threads; its handler blocks, which is
    // fine there. It commits the charge and the job's completion together.
    // `start` connects with backlog's synchronous driver, whose `postgres`
    // crate panics on a runtime thread: started off them too.
    let mark_paid = format!("UPDATE {schema}.orders SET paid = true WHERE id = $1");
    let builder =
        Worker::builder(queue.clone())
            .concurrency(4)
            .handle(move |job: ChargeCard, ctx| {
                ctx.transaction(|tx| {
                    tx.execute(mark_paid.as_str(), &[&job.order])?;
                    Ok(json!({ "charged_cents": job.cents }))
                })
            });
    let worker = tokio::task::spawn_blocking(move || builder.start()).await??;

    let app = Arc::new(App {
        queue,
        pool,
        insert_order: format!("INSERT INTO {schema}.orders (cents) VALUES ($1) RETURNING id"),
        select_order: format!("SELECT cents, paid FROM {schema}.orders WHERE id = $1"),
    });
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(show_order))
        .with_state(app);

    let listener = tokio::net::TcpListener::bind(args.bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(stop_signal())
        .await?;

    // `Worker::shutdown` blocks until running jobs finish (bounded by the
    // grace): hand it to the blocking pool, never the runtime's threads.
    let report =
        tokio::task::spawn_blocking(move || worker.shutdown(Duration::from_secs(10))).await??;
    println!("stopped: {report:?}");
    Ok(())
}

/// Inserts the order and enqueues its charge in one transaction: both or
/// neither. 202: the charge happens later.
async fn create_order(
    State(app): State<Arc<App>>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    if order.cents <= 0 {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "cents must be positive".into(),
        ));
    }
    let mut tx = app.pool.begin().await.map_err(internal)?;
    let id: i64 = sqlx::query(AssertSqlSafe(app.insert_order.as_str()))
        .bind(order.cents)
        .fetch_one(&mut *tx)
        .await
        .map_err(internal)?
        .try_get(0)
        .map_err(internal)?;
    let job = app
        .queue
        .enqueue_in(
            &mut tx,
            ChargeCard {
                order: id,
                cents: order.cents,
            },
        )
        .await
        .map_err(internal)?;
    tx.commit().await.map_err(internal)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "order": id, "job": job.id })),
    ))
}

async fn show_order(
    State(app): State<Arc<App>>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, (StatusCode, String)> {
    let row = sqlx::query(AssertSqlSafe(app.select_order.as_str()))
        .bind(id)
        .fetch_optional(&app.pool)
        .await
        .map_err(internal)?
        .ok_or((StatusCode::NOT_FOUND, format!("no order {id}")))?;
    let cents: i64 = row.try_get(0).map_err(internal)?;
    let paid: bool = row.try_get(1).map_err(internal)?;
    Ok(Json(json!({ "order": id, "cents": cents, "paid": paid })))
}

fn internal(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
