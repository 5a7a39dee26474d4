//! Benchmarks of the diesel adapter and the async face, each a ratio to its
//! baseline measured in the same run, rounds interleaved. See BENCHMARKS.md.
//!
//! ```text
//! export BACKLOG_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/backlog_bench
//! cargo run --release --features diesel-postgres,async --example adapters_bench -- enqueue-in
//! cargo run --release --features diesel-postgres,async --example adapters_bench -- async-wait
//! cargo run --features diesel-postgres,async --example adapters_bench -- --smoke   # correctness only
//! ```
//!
//! - `enqueue-in`: one job per diesel transaction with `enqueue_in`, against
//!   a raw `INSERT .. RETURNING id` of the same columns through diesel, one
//!   row per transaction (target: enqueue_in at 80 % of the raw rate or
//!   more). PostgreSQL; needs the URL.
//! - `async-wait`: the time from a job's enqueue to its `wait` returning,
//!   the job run by a worker on another handle (its own connections),
//!   alternating the blocking `Queue::wait` and `AsyncQueue::wait` (target:
//!   async p99 within 1 ms of sync p99). On the PostgreSQL URL when set,
//!   else on a SQLite file.
//!
//! Figures go to stdout as JSON lines; a failed correctness check (a job
//! missing, a wait that timed out) exits with status 1.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use backlog::async_queue::AsyncQueue;
use backlog::diesel::postgres::QueueExt;
use backlog::{NewJob, Queue, QueueOptions, Worker};
use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use serde_json::json;

type BoxResult<T = ()> = Result<T, Box<dyn Error>>;

const URL_VAR: &str = "BACKLOG_BENCH_POSTGRES_URL";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let modes: Vec<&str> = match args.iter().find(|a| !a.starts_with("--")) {
        Some(m) => vec![m.as_str()],
        None => vec!["enqueue-in", "async-wait"],
    };
    for mode in modes {
        let result = match mode {
            "enqueue-in" => enqueue_in(smoke),
            "async-wait" => async_wait(smoke),
            other => Err(format!("unknown mode {other}: enqueue-in or async-wait").into()),
        };
        if let Err(e) = result {
            eprintln!("FAILED {mode}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The server URL: the bench's own variable, else the tests' one (CI).
fn postgres_url() -> Option<String> {
    [URL_VAR, "BACKLOG_TEST_POSTGRES_URL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let at = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[at.min(v.len() - 1)]
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// A fresh schema on the server for this run, dropped at the end.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn create(url: &str) -> BoxResult<Schema> {
        let name = format!("bench_{}", std::process::id());
        let mut conn = PgConnection::establish(url)?;
        conn.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))?;
        Ok(Schema {
            url: url.to_owned(),
            name,
        })
    }

    fn queue(&self) -> BoxResult<Queue> {
        Ok(QueueOptions::new().schema(&self.name).connect(&self.url)?)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut conn) = PgConnection::establish(&self.url) {
            let _ = diesel::sql_query(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name))
                .execute(&mut conn);
        }
    }
}

/// enqueue_in through diesel against a raw diesel insert, one row per
/// transaction each, in interleaved rounds.
fn enqueue_in(smoke: bool) -> BoxResult {
    let Some(url) = postgres_url() else {
        println!(r#"{{"mode":"enqueue-in","skipped":"set {URL_VAR}"}}"#);
        return Ok(());
    };
    let schema = Schema::create(&url)?;
    let queue = schema.queue()?;
    let mut conn = PgConnection::establish(&url)?;
    let raw_table = format!("{}.raw_jobs", schema.name);
    diesel::sql_query(format!(
        "CREATE TABLE {raw_table} (id bigserial PRIMARY KEY, queue text NOT NULL, \
         kind text NOT NULL, payload jsonb NOT NULL)"
    ))
    .execute(&mut conn)?;
    let raw_insert =
        format!("INSERT INTO {raw_table} (queue, kind, payload) VALUES ($1, $2, $3::text::jsonb) RETURNING id");
    let (rounds, per_round) = if smoke { (2, 20) } else { (11, 400) };
    let payload = json!({"order": 7, "customer": "c-1234", "amount_cents": 4200});
    let payload_text = payload.to_string();
    let mut ratios = Vec::new();
    let (mut raw_rates, mut in_rates) = (Vec::new(), Vec::new());
    let mut enqueued = 0usize;
    for round in 0..rounds {
        let time_raw = |conn: &mut PgConnection| -> BoxResult<f64> {
            let start = Instant::now();
            for _ in 0..per_round {
                conn.transaction::<_, Box<dyn Error>, _>(|c| {
                    let row: Id = diesel::sql_query(&raw_insert)
                        .bind::<Text, _>("default")
                        .bind::<Text, _>("charge")
                        .bind::<Text, _>(&payload_text)
                        .get_result(c)?;
                    if row.id < 1 {
                        return Err("the raw insert returned no id".into());
                    }
                    Ok(())
                })?;
            }
            Ok(per_round as f64 / start.elapsed().as_secs_f64())
        };
        let raw_first = round % 2 == 0;
        let raw = if raw_first { time_raw(&mut conn)? } else { 0.0 };
        let start = Instant::now();
        for _ in 0..per_round {
            conn.transaction::<_, Box<dyn Error>, _>(|c| {
                queue.enqueue_in(c, NewJob::new("charge", payload.clone()))?;
                Ok(())
            })?;
        }
        let with = per_round as f64 / start.elapsed().as_secs_f64();
        enqueued += per_round;
        let raw = if raw_first { raw } else { time_raw(&mut conn)? };
        println!(
            r#"{{"mode":"enqueue-in","round":{round},"raw_per_s":{raw:.0},"enqueue_in_per_s":{with:.0},"ratio":{:.3}}}"#,
            with / raw
        );
        ratios.push(with / raw);
        raw_rates.push(raw);
        in_rates.push(with);
    }
    let live = queue.counts()?.iter().map(|c| c.count).sum::<u64>();
    if live != enqueued as u64 {
        return Err(format!("{enqueued} jobs enqueued, {live} in the queue").into());
    }
    println!(
        r#"{{"mode":"enqueue-in","median_raw_per_s":{:.0},"median_enqueue_in_per_s":{:.0},"median_ratio":{:.3},"target":0.8,"rounds":{rounds},"per_round":{per_round}}}"#,
        median(&mut raw_rates),
        median(&mut in_rates),
        median(&mut ratios)
    );
    Ok(())
}

/// Enqueue-to-wait-returned latency, blocking and async alternating, the
/// jobs run by a worker on another handle.
fn async_wait(smoke: bool) -> BoxResult {
    let dir = tempfile::tempdir()?;
    let schema = postgres_url().map(|u| Schema::create(&u)).transpose()?;
    let open = || -> BoxResult<Queue> {
        match &schema {
            Some(s) => s.queue(),
            None => Ok(Queue::open(dir.path().join("bench.db"))?),
        }
    };
    let backend = if schema.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let queue = open()?;
    let worker = Worker::builder(open()?)
        .handle_raw("echo", |payload, _| Ok(payload))
        .start()?;
    let async_queue = AsyncQueue::new(queue.clone())?;
    let samples = if smoke { 20 } else { 1000 };
    let (mut sync_ms, mut async_ms) = (Vec::new(), Vec::new());
    // Warm both paths (connections, prepared statements).
    for i in 0..10 {
        let id = queue.enqueue(NewJob::new("echo", json!(i)))?.id;
        queue.wait(id, Duration::from_secs(10))?;
    }
    for i in 0..samples * 2 {
        let start = Instant::now();
        let id = queue.enqueue(NewJob::new("echo", json!(i)))?.id;
        if i % 2 == 0 {
            queue.wait(id, Duration::from_secs(10))?;
            sync_ms.push(start.elapsed().as_secs_f64() * 1e3);
        } else {
            block_on(async_queue.wait(id, Duration::from_secs(10)))?;
            async_ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    worker.shutdown(Duration::from_secs(10))?;
    let (sync_p50, async_p50) = (median(&mut sync_ms), median(&mut async_ms));
    let (sync_p99, async_p99) = (
        percentile(&mut sync_ms, 0.99),
        percentile(&mut async_ms, 0.99),
    );
    println!(
        r#"{{"mode":"async-wait","backend":"{backend}","samples_each":{samples},"sync_median_ms":{sync_p50:.3},"async_median_ms":{async_p50:.3},"sync_p99_ms":{sync_p99:.3},"async_p99_ms":{async_p99:.3},"p99_difference_ms":{:.3},"target_ms":1.0}}"#,
        async_p99 - sync_p99
    );
    Ok(())
}

/// A minimal executor: polls on this thread, parking between wakes.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
