//! `enqueue_in` through sqlx, one job per transaction, as a ratio to a raw
//! insert of a comparable row through sqlx in the same run (issue 24's
//! target: at least 80 %). Rounds alternate the two, so both see the same
//! machine; the median of the per-round ratios is reported.
//!
//! ```text
//! BACKLOG_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1/bench \
//! BACKLOG_TEST_MYSQL_URL=mysql://root@127.0.0.1/bench \
//!     cargo bench -p backlog-example-service --bench sqlx_enqueue
//! ```
//!
//! `-- --smoke` runs one short round each (correctness only: CI). A server
//! whose URL is unset is skipped with a message.

use std::time::{Duration, Instant};

use backlog::{NewJob, Queue, QueueOptions};
use serde_json::json;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A payload of a typical size.
fn payload(i: usize) -> serde_json::Value {
    json!({"order": i, "customer": "c-1042", "cents": 1250, "currency": "EUR"})
}

struct Plan {
    rounds: usize,
    per_round: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let plan = if smoke {
        Plan {
            rounds: 1,
            per_round: 20,
        }
    } else {
        Plan {
            rounds: 7,
            per_round: 200,
        }
    };
    match std::env::var("BACKLOG_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => postgres(&url, &plan).await?,
        _ => println!("SKIPPED: set BACKLOG_TEST_POSTGRES_URL to bench PostgreSQL"),
    }
    match std::env::var("BACKLOG_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => mysql(&url, &plan).await?,
        _ => println!("SKIPPED: set BACKLOG_TEST_MYSQL_URL to bench MySQL"),
    }
    Ok(())
}

async fn postgres(url: &str, plan: &Plan) -> Result<(), BoxError> {
    let schema = format!("bench_sqlx_{}", std::process::id());
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.raw (id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL,
             kind TEXT NOT NULL, payload JSONB NOT NULL,
             created_at BIGINT NOT NULL DEFAULT (extract(epoch from now()) * 1000000)::int8)"
    )))
    .execute(&pool)
    .await?;
    let result = async {
        let queue = {
            let (url, schema) = (url.to_owned(), schema.clone());
            tokio::task::spawn_blocking(move || QueueOptions::new().schema(&schema).connect(&url))
                .await??
        };
        let raw = format!(
            "INSERT INTO {schema}.raw (queue, kind, payload) VALUES ($1, $2, $3::text::jsonb) RETURNING id"
        );
        let ratios = measure(plan, "postgres", |round_raw, i| {
            let (pool, queue, raw) = (pool.clone(), queue.clone(), raw.clone());
            async move {
                if round_raw {
                    pg_raw(&pool, &raw, i).await
                } else {
                    pg_enqueue(&pool, &queue, i).await
                }
            }
        })
        .await?;
        let jobs: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {schema}.backlog_jobs"
        )))
        .fetch_one(&pool)
        .await?;
        let expected = (plan.rounds * plan.per_round) as i64;
        if jobs != expected {
            return Err(format!("postgres: {jobs} jobs, expected {expected}").into());
        }
        Ok::<_, BoxError>(ratios)
    }
    .await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await?;
    report("postgres", result?);
    Ok(())
}

async fn pg_raw(pool: &PgPool, sql: &str, i: usize) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    let _: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind("default")
        .bind("charge")
        .bind(payload(i).to_string())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn pg_enqueue(pool: &PgPool, queue: &Queue, i: usize) -> Result<(), BoxError> {
    use backlog::sqlx::postgres::QueueExt;
    let mut tx = pool.begin().await?;
    queue
        .enqueue_in(&mut tx, NewJob::new("charge", payload(i)))
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn mysql(url: &str, plan: &Plan) -> Result<(), BoxError> {
    let name = format!("bench_sqlx_{}", std::process::id());
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await?;
    let base = url.split('?').next().unwrap_or(url);
    let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
    let db_url = format!("{root}/{name}");
    let result = async {
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&db_url)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(
            "CREATE TABLE raw (id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(200) NOT NULL,
                 kind VARCHAR(200) NOT NULL, payload JSON NOT NULL,
                 created_at BIGINT NOT NULL)",
        ))
        .execute(&pool)
        .await?;
        let queue = {
            let db_url = db_url.clone();
            tokio::task::spawn_blocking(move || Queue::connect(&db_url)).await??
        };
        let ratios = measure(plan, "mysql", |round_raw, i| {
            let (pool, queue) = (pool.clone(), queue.clone());
            async move {
                if round_raw {
                    my_raw(&pool, i).await
                } else {
                    my_enqueue(&pool, &queue, i).await
                }
            }
        })
        .await?;
        let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM backlog_jobs")
            .fetch_one(&pool)
            .await?;
        let expected = (plan.rounds * plan.per_round) as i64;
        if jobs != expected {
            return Err(format!("mysql: {jobs} jobs, expected {expected}").into());
        }
        Ok::<_, BoxError>(ratios)
    }
    .await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(&admin)
        .await?;
    report("mysql (MariaDB)", result?);
    Ok(())
}

async fn my_raw(pool: &MySqlPool, i: usize) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO raw (queue, kind, payload, created_at) VALUES (?, ?, ?, \
         TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)))",
    )
    .bind("default")
    .bind("charge")
    .bind(payload(i).to_string())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn my_enqueue(pool: &MySqlPool, queue: &Queue, i: usize) -> Result<(), BoxError> {
    use backlog::sqlx::mysql::QueueExt;
    let mut tx = pool.begin().await?;
    queue
        .enqueue_in(&mut tx, NewJob::new("charge", payload(i)))
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Per round: the raw inserts, then the enqueues (the order alternating by
/// round), each `per_round` one-row transactions; the ratio of enqueue
/// throughput to raw throughput.
async fn measure<F, Fut>(plan: &Plan, name: &str, op: F) -> Result<Vec<f64>, BoxError>
where
    F: Fn(bool, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    // Warm up: connections, prepared statements.
    for i in 0..20 {
        op(true, i).await?;
    }
    // The warm-up's raw rows are not jobs; enqueue warm-ups would be.
    let mut ratios = Vec::new();
    for round in 0..plan.rounds {
        let mut times = [Duration::ZERO; 2];
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for raw in order {
            let start = Instant::now();
            for i in 0..plan.per_round {
                op(raw, i).await?;
            }
            times[usize::from(raw)] = start.elapsed();
        }
        let (enqueue, raw) = (times[0], times[1]);
        let ratio = raw.as_secs_f64() / enqueue.as_secs_f64();
        println!(
            "{name} round {round}: raw {:.0} tx/s, enqueue_in {:.0} tx/s, ratio {ratio:.3}",
            plan.per_round as f64 / raw.as_secs_f64(),
            plan.per_round as f64 / enqueue.as_secs_f64()
        );
        ratios.push(ratio);
    }
    Ok(ratios)
}

fn report(name: &str, mut ratios: Vec<f64>) {
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "sqlx enqueue_in ({name}): median_ratio={median:.3} rounds={} target>=0.80 {}",
        ratios.len(),
        if median >= 0.8 { "met" } else { "MISSED" }
    );
}
