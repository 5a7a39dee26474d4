//! Benchmarks of the diesel adapter and the async face, each a ratio to its
//! baseline measured in the same run, rounds interleaved. See BENCHMARKS.md.
//!
//! ```text
//! export BACKLOG_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/backlog_bench
//! cargo run --release --features diesel-postgres,diesel-mysql,async --example adapters_bench -- enqueue-in
//! cargo run --release --features diesel-postgres,diesel-mysql,async --example adapters_bench -- enqueue-in-prepared
//! cargo run --release --features diesel-postgres,diesel-mysql,async --example adapters_bench -- enqueue-in-mysql
//! cargo run --release --features diesel-postgres,diesel-mysql,async --example adapters_bench -- async-wait
//! cargo run --release --features diesel-postgres,diesel-mysql,async --example adapters_bench -- async-wait-process
//! cargo run --features diesel-postgres,diesel-mysql,async --example adapters_bench -- --smoke   # correctness only
//! ```
//!
//! - `enqueue-in`: one job per diesel transaction with `enqueue_in`, against
//!   a raw `INSERT .. RETURNING id` of the same columns through diesel, one
//!   row per transaction (target: enqueue_in at 80 % of the raw rate or
//!   more). PostgreSQL; needs the URL.
//! - `enqueue-in-prepared`: as `enqueue-in`, but the raw insert is
//!   prepared once per connection by diesel's statement cache (as diesel's
//!   query builder and `enqueue_in`'s own statements are), where
//!   `sql_query` in `enqueue-in` parses and plans it on every call: the
//!   stricter baseline. PostgreSQL; needs the URL.
//! - `enqueue-in-mysql`: the same on MariaDB through diesel's
//!   `MysqlConnection`, against a raw insert and `LAST_INSERT_ID()`; needs
//!   `BACKLOG_BENCH_MYSQL_URL` (or `BACKLOG_TEST_MYSQL_URL`).
//! - `async-wait`: the time from a job's enqueue to its `wait` returning,
//!   the job run by a worker on another handle (its own connections),
//!   alternating the blocking `Queue::wait` and `AsyncQueue::wait` (target:
//!   async p99 within 1 ms of sync p99). On the PostgreSQL URL when set,
//!   else on a SQLite file.
//! - `async-wait-process`: the same with the worker in another process
//!   (this binary re-run as `worker-child`), as issue 24's target reads.
//!
//! Figures go to stdout as JSON lines; a failed correctness check (a job
//! missing, a wait that timed out) exits with status 1.

use std::error::Error;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use backlog::async_queue::AsyncQueue;
use backlog::diesel::QueueExt;
use backlog::{NewJob, Queue, QueueOptions, Worker};
use diesel::connection::SimpleConnection;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Text, Untyped};
use diesel::{
    Connection, MysqlConnection, PgConnection, QueryResult, QueryableByName, RunQueryDsl,
};
use serde_json::json;

type BoxResult<T = ()> = Result<T, Box<dyn Error>>;

const URL_VAR: &str = "BACKLOG_BENCH_POSTGRES_URL";
const MYSQL_URL_VAR: &str = "BACKLOG_BENCH_MYSQL_URL";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let modes: Vec<&str> = match args.iter().find(|a| !a.starts_with("--")) {
        Some(m) => vec![m.as_str()],
        None => vec![
            "enqueue-in",
            "enqueue-in-prepared",
            "enqueue-in-mysql",
            "async-wait",
            "async-wait-process",
        ],
    };
    for mode in modes {
        let result = match mode {
            "enqueue-in" => enqueue_in(smoke, false),
            "enqueue-in-prepared" => enqueue_in(smoke, true),
            "enqueue-in-mysql" => enqueue_in_mysql(smoke),
            "async-wait" => async_wait(smoke, false),
            "async-wait-process" => async_wait(smoke, true),
            "worker-child" => worker_child(),
            other => Err(format!(
                "unknown mode {other}: enqueue-in, enqueue-in-prepared, enqueue-in-mysql, \
                 async-wait or async-wait-process"
            )
            .into()),
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

/// `LAST_INSERT_ID()`, which MySQL types unsigned.
#[derive(QueryableByName)]
struct InsertId {
    #[diesel(sql_type = diesel::sql_types::Unsigned<BigInt>)]
    id: u64,
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
/// transaction each, in interleaved rounds; the raw insert through
/// `sql_query` (planned per call) or, `prepared`, through diesel's
/// statement cache.
fn enqueue_in(smoke: bool, prepared: bool) -> BoxResult {
    let mode = if prepared {
        "enqueue-in-prepared"
    } else {
        "enqueue-in"
    };
    let Some(url) = postgres_url() else {
        println!(r#"{{"mode":"{mode}","skipped":"set {URL_VAR}"}}"#);
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
    let payload = json!({"order": 7, "customer": "c-1234", "amount_cents": 4200});
    let payload_text = payload.to_string();
    let raw = |c: &mut PgConnection| -> BoxResult {
        let row: Id = if prepared {
            CachedInsert {
                sql: &raw_insert,
                binds: ["default", "charge", &payload_text],
            }
            .get_result(c)?
        } else {
            diesel::sql_query(&raw_insert)
                .bind::<Text, _>("default")
                .bind::<Text, _>("charge")
                .bind::<Text, _>(&payload_text)
                .get_result(c)?
        };
        if row.id < 1 {
            return Err("the raw insert returned no id".into());
        }
        Ok(())
    };
    let ours = |c: &mut PgConnection| -> BoxResult {
        queue.enqueue_in(c, NewJob::new("charge", payload.clone()))?;
        Ok(())
    };
    compare(mode, &queue, &mut conn, smoke, raw, ours)
}

/// The raw insert as a statement diesel's cache prepares once per
/// connection, keyed by its text: `$1`..`$3` in `sql`, bound in order.
struct CachedInsert<'a> {
    sql: &'a str,
    binds: [&'a str; 3],
}

impl QueryFragment<Pg> for CachedInsert<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let mut rest = self.sql;
        for (n, bind) in self.binds.iter().enumerate() {
            let marker = format!("${}", n + 1);
            let Some((before, after)) = rest.split_once(&marker) else {
                return Err(diesel::result::Error::QueryBuilderError(
                    format!("no {marker} in the raw insert").into(),
                ));
            };
            out.push_sql(before);
            out.push_bind_param::<Text, _>(bind)?;
            rest = after;
        }
        out.push_sql(rest);
        Ok(())
    }
}

impl QueryId for CachedInsert<'_> {
    type QueryId = ();
    // Not a static id: the cache keys it by its text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for CachedInsert<'_> {
    type SqlType = Untyped;
}

impl RunQueryDsl<PgConnection> for CachedInsert<'_> {}

/// The same on MySQL/MariaDB: `enqueue_in` through diesel's
/// `MysqlConnection` against a raw insert of the same columns and its id
/// read back with `SELECT LAST_INSERT_ID()`, as a diesel application does
/// on MySQL (diesel's MySQL connection reads no `RETURNING` rows: "No
/// metadata exists"), one row per transaction each.
fn enqueue_in_mysql(smoke: bool) -> BoxResult {
    let Some(url) = [MYSQL_URL_VAR, "BACKLOG_TEST_MYSQL_URL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
    else {
        println!(r#"{{"mode":"enqueue-in-mysql","skipped":"set {MYSQL_URL_VAR}"}}"#);
        return Ok(());
    };
    let database = MysqlDatabase::create(&url)?;
    let queue = Queue::connect(&database.url)?;
    let mut conn = MysqlConnection::establish(&database.url)?;
    diesel::sql_query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut conn)?;
    diesel::sql_query(
        "CREATE TABLE raw_jobs (id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(255) NOT NULL, \
         kind VARCHAR(255) NOT NULL, payload JSON NOT NULL)",
    )
    .execute(&mut conn)?;
    let payload = json!({"order": 7, "customer": "c-1234", "amount_cents": 4200});
    let payload_text = payload.to_string();
    let raw = |c: &mut MysqlConnection| -> BoxResult {
        diesel::sql_query("INSERT INTO raw_jobs (queue, kind, payload) VALUES (?, ?, ?)")
            .bind::<Text, _>("default")
            .bind::<Text, _>("charge")
            .bind::<Text, _>(&payload_text)
            .execute(c)?;
        let row: InsertId = diesel::sql_query("SELECT LAST_INSERT_ID() AS id").get_result(c)?;
        if row.id < 1 {
            return Err("the raw insert returned no id".into());
        }
        Ok(())
    };
    let ours = |c: &mut MysqlConnection| -> BoxResult {
        queue.enqueue_in(c, NewJob::new("charge", payload.clone()))?;
        Ok(())
    };
    compare("enqueue-in-mysql", &queue, &mut conn, smoke, raw, ours)
}

/// A database of its own on the MySQL server for this run, dropped at the
/// end.
struct MysqlDatabase {
    admin: String,
    url: String,
    name: String,
}

impl MysqlDatabase {
    fn create(url: &str) -> BoxResult<MysqlDatabase> {
        let name = format!("bench_{}", std::process::id());
        let mut conn = MysqlConnection::establish(url)?;
        diesel::sql_query(format!("DROP DATABASE IF EXISTS {name}")).execute(&mut conn)?;
        diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut conn)?;
        let base = url.split('?').next().unwrap_or(url);
        let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
        Ok(MysqlDatabase {
            admin: url.to_owned(),
            url: format!("{root}/{name}"),
            name,
        })
    }
}

impl Drop for MysqlDatabase {
    fn drop(&mut self) {
        if let Ok(mut conn) = MysqlConnection::establish(&self.admin) {
            let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {}", self.name))
                .execute(&mut conn);
        }
    }
}

/// `ours` against `raw`, one call per diesel transaction each, in rounds
/// taking turns in alternating order; checks every job `ours` enqueued is
/// in `queue`, and prints the figures.
fn compare<C: Connection>(
    mode: &str,
    queue: &Queue,
    conn: &mut C,
    smoke: bool,
    mut raw: impl FnMut(&mut C) -> BoxResult,
    mut ours: impl FnMut(&mut C) -> BoxResult,
) -> BoxResult {
    let (rounds, per_round) = if smoke { (2, 20) } else { (11, 400) };
    let mut ratios = Vec::new();
    let (mut raw_rates, mut in_rates) = (Vec::new(), Vec::new());
    let mut enqueued = 0usize;
    let time = |conn: &mut C, f: &mut dyn FnMut(&mut C) -> BoxResult| -> BoxResult<f64> {
        let start = Instant::now();
        for _ in 0..per_round {
            conn.transaction::<_, Box<dyn Error>, _>(|c| f(c))?;
        }
        Ok(per_round as f64 / start.elapsed().as_secs_f64())
    };
    for round in 0..rounds {
        let raw_first = round % 2 == 0;
        let first = if raw_first {
            time(conn, &mut raw)?
        } else {
            time(conn, &mut ours)?
        };
        let second = if raw_first {
            time(conn, &mut ours)?
        } else {
            time(conn, &mut raw)?
        };
        let (raw_rate, with) = if raw_first {
            (first, second)
        } else {
            (second, first)
        };
        enqueued += per_round;
        println!(
            r#"{{"mode":"{mode}","round":{round},"raw_per_s":{raw_rate:.0},"enqueue_in_per_s":{with:.0},"ratio":{:.3}}}"#,
            with / raw_rate
        );
        ratios.push(with / raw_rate);
        raw_rates.push(raw_rate);
        in_rates.push(with);
    }
    let live = queue.counts()?.iter().map(|c| c.count).sum::<u64>();
    if live != enqueued as u64 {
        return Err(format!("{enqueued} jobs enqueued, {live} in the queue").into());
    }
    println!(
        r#"{{"mode":"{mode}","median_raw_per_s":{:.0},"median_enqueue_in_per_s":{:.0},"median_ratio":{:.3},"target":0.8,"rounds":{rounds},"per_round":{per_round}}}"#,
        median(&mut raw_rates),
        median(&mut in_rates),
        median(&mut ratios)
    );
    Ok(())
}

/// The worker process of `async-wait-process`'s parent: on the queue
/// [`CHILD_TARGET`] names (a PostgreSQL URL with [`CHILD_SCHEMA`], else a
/// SQLite file), runs `echo` jobs; prints `ready` once started, and stops
/// when its standard input closes (the parent gone) or it is killed.
fn worker_child() -> BoxResult {
    let target = std::env::var(CHILD_TARGET)?;
    let queue = match std::env::var(CHILD_SCHEMA) {
        Ok(schema) => QueueOptions::new().schema(&schema).connect(&target)?,
        Err(_) => Queue::open(&target)?,
    };
    let worker = Worker::builder(queue)
        .handle_raw("echo", |payload, _| Ok(payload))
        .start()?;
    println!("ready");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    worker.shutdown(Duration::from_secs(10))?;
    Ok(())
}

const CHILD_TARGET: &str = "BACKLOG_BENCH_CHILD_TARGET";
const CHILD_SCHEMA: &str = "BACKLOG_BENCH_CHILD_SCHEMA";

/// A child process, killed and reaped when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts [`worker_child`] on `target` (and `schema`) and returns once it
/// is ready.
fn spawn_worker_process(target: &str, schema: Option<&str>) -> BoxResult<ChildGuard> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("worker-child")
        .env(CHILD_TARGET, target)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(schema) = schema {
        command.env(CHILD_SCHEMA, schema);
    }
    let mut child = ChildGuard(command.spawn()?);
    let out = child
        .0
        .stdout
        .take()
        .ok_or("the worker process has no stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if line.trim() != "ready" {
        return Err(format!("the worker process said {line:?}, not ready").into());
    }
    Ok(child)
}

/// Enqueue-to-wait-returned latency, blocking and async alternating, the
/// jobs run by a worker on another handle, or (`process`) in another
/// process.
fn async_wait(smoke: bool, process: bool) -> BoxResult {
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
    let (worker, child) = if process {
        let path = dir.path().join("bench.db");
        let child = match &schema {
            Some(s) => spawn_worker_process(&s.url, Some(&s.name))?,
            None => spawn_worker_process(&path.to_string_lossy(), None)?,
        };
        (None, Some(child))
    } else {
        let worker = Worker::builder(open()?)
            .handle_raw("echo", |payload, _| Ok(payload))
            .start()?;
        (Some(worker), None)
    };
    let (mode, worker_in) = if process {
        ("async-wait-process", "process")
    } else {
        ("async-wait", "handle")
    };
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
    if let Some(worker) = worker {
        worker.shutdown(Duration::from_secs(10))?;
    }
    drop(child);
    let (sync_p50, async_p50) = (median(&mut sync_ms), median(&mut async_ms));
    let (sync_p99, async_p99) = (
        percentile(&mut sync_ms, 0.99),
        percentile(&mut async_ms, 0.99),
    );
    println!(
        r#"{{"mode":"{mode}","backend":"{backend}","worker":"{worker_in}","samples_each":{samples},"sync_median_ms":{sync_p50:.3},"async_median_ms":{async_p50:.3},"sync_p99_ms":{sync_p99:.3},"async_p99_ms":{async_p99:.3},"p99_difference_ms":{:.3},"target_ms":1.0}}"#,
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
