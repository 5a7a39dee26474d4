//! The fan-in and dependency figures of issue 23, on SQLite (default FULL
//! durability) and on PostgreSQL and MariaDB/MySQL when their URLs are set
//! (`BACKLOG_TEST_POSTGRES_URL`, `BACKLOG_TEST_MYSQL_URL`, with the
//! `postgres` / `mysql` features; each run in a schema or database of its
//! own, dropped at the end).
//!
//! Each run, on a fresh queue:
//!
//! - **fan-in**: completes N plain jobs, then N members of one sealed batch,
//!   the same way (leases of `CHUNK` jobs, each settled with one
//!   `complete_many` transaction, as a worker's completer does). Reports the
//!   completion cost per job, plain and as a member, and their ratio (the
//!   cost of counting a member); the duration of the last member's commit
//!   (the callback is inserted in it); and the time from that commit's
//!   return to the callback being leased.
//! - **edges**: `enqueue_many` of N plain jobs, then of N jobs that each
//!   depend on one live job, per job (N, at most `EDGES`); then the
//!   completion of that job,
//!   which releases them all in its transaction, per edge. In a queue of their
//!   own, as the probes' dependencies are, so that the probe worker's
//!   leases do not walk past them.
//! - **start latency**: a worker (in this process, then in another one, this
//!   binary re-run with `--worker`) runs probe jobs that return the time
//!   they started; from the start of an `enqueue` call to the start of its
//!   job, against from the start of the `complete` call that finishes a
//!   probe's only dependency to the start of the probe. `LATENCY_ROUNDS`
//!   of each, alternating.
//!
//! `--latency ROUNDS` runs only the start latencies, `ROUNDS` probes of
//! each kind per worker, and prints percentiles timed from the call and
//! from its return (the commit that makes the probe runnable lies between).
//!
//! Medians over the runs. `cargo run --release --features postgres,mysql
//! --example batch_fanin -- 10000 3` (N, runs; `--db sqlite,postgres,mysql`
//! picks backends); the defaults are 1,000 and 1 run, small enough for CI.
//!
//! With `--cascade` first (`-- --cascade 2000 3 --db postgres`), only the
//! **cascade** figures instead ([`cascade`]): a fan-out of N dependents
//! (at most `EDGES`) of one job released by its completion (the baseline),
//! then another's cancelled by its discard, in µs per dependent.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backlog::{LeaseRequest, NewJob, Outcome, Queue, QueueOptions, Worker};
use serde_json::json;

type BoxResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Jobs per lease and per completing transaction.
const CHUNK: usize = 100;

/// Jobs per `enqueue_many`.
const BATCH: usize = 500;

/// The most jobs of the edge figures.
const EDGES: usize = 2_000;

/// Probes of each kind per run and worker.
const LATENCY_ROUNDS: usize = 15;

fn main() -> BoxResult {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return worker(args.get(1).ok_or("no target")?, args.get(2));
    }
    let cascade_only = args.first().map(String::as_str) == Some("--cascade");
    let args: Vec<String> = args.into_iter().skip(usize::from(cascade_only)).collect();
    let flag = |name: &str| args.iter().position(|a| a == name);
    let (db, latency_at) = (flag("--db"), flag("--latency"));
    let chosen = db.and_then(|at| args.get(at + 1));
    let latency_rounds = latency_at
        .map(|at| -> BoxResult<usize> { Ok(args.get(at + 1).ok_or("--latency ROUNDS")?.parse()?) })
        .transpose()?;
    let flagged = |i: usize| {
        [db, latency_at]
            .into_iter()
            .flatten()
            .any(|at| i == at || i == at + 1)
    };
    let mut positional = args
        .iter()
        .enumerate()
        .filter(|&(i, _)| !flagged(i))
        .map(|(_, a)| a);
    let members: usize = positional.next().map_or(Ok(1_000), |a| a.parse())?;
    let runs: usize = positional.next().map_or(Ok(1), |a| a.parse())?;
    let backends: Vec<&str> = match chosen {
        Some(list) => list.split(',').collect(),
        None => ["sqlite", "postgres", "mysql"]
            .into_iter()
            .filter(|b| Place::url_of(b).is_some())
            .collect(),
    };
    for backend in backends {
        if let Some(rounds) = latency_rounds {
            latency_only(backend, rounds)?;
            continue;
        }
        let mut figures = Figures::default();
        for run in 0..runs {
            let Some(place) = Place::new(backend)? else {
                println!("SKIPPED {backend}: no URL set, or not built with its feature");
                break;
            };
            if cascade_only {
                let (released, cancelled) = cascade(&place.open()?, members)?;
                println!(
                    "{backend} run {run}: fan-out of {}: release {released:.1} µs/dependent, \
                     cancel {cancelled:.1} µs/dependent (ratio {:.2})",
                    members.min(EDGES),
                    cancelled / released
                );
                figures.release.push(released);
                figures.cascade.push(cancelled);
                continue;
            }
            let queue = place.open()?;
            fan_in(&queue, members, &mut figures)?;
            let queue = place.open()?; // a fresh handle: its caches cold as the first's
            edges(&queue, members, &mut figures)?;
            latency(&place, &mut figures)?;
            println!("{backend} run {run}: {}", figures.last());
        }
        if !figures.cascade.is_empty() {
            let (r, c) = (median(&figures.release), median(&figures.cascade));
            println!(
                "cascade on {backend}, fan-out of {}, median of {}: release {r:.1} µs/dependent, \
                 cancel {c:.1} µs/dependent (ratio {:.2})",
                members.min(EDGES),
                figures.cascade.len(),
                c / r
            );
        }
        if !figures.plain.is_empty() {
            println!(
                "fan-in and dependencies on {backend}, N={members}, median of {}: {}",
                figures.plain.len(),
                figures.medians()
            );
        }
    }
    Ok(())
}

/// Each run's figures, in µs (costs) or ms (times).
#[derive(Default)]
struct Figures {
    plain: Vec<f64>,
    member: Vec<f64>,
    last_commit: Vec<f64>,
    callback: Vec<f64>,
    enqueue_plain: Vec<f64>,
    enqueue_edge: Vec<f64>,
    release: Vec<f64>,
    fresh_here: Vec<f64>,
    released_here: Vec<f64>,
    fresh_other: Vec<f64>,
    released_other: Vec<f64>,
    cascade: Vec<f64>,
}

impl Figures {
    fn line(&self, pick: impl Fn(&[f64]) -> f64) -> String {
        let (p, m) = (pick(&self.plain), pick(&self.member));
        let (e, d, r) = (
            pick(&self.enqueue_plain),
            pick(&self.enqueue_edge),
            pick(&self.release),
        );
        format!(
            "complete {p:.1} µs/job plain, {m:.1} µs/job member (ratio {:.2}); last member's \
             commit {:.2} ms, callback leased {:.2} ms after it; enqueue {e:.1} µs/job plain, \
             {d:.1} µs/job with an edge (ratio {:.2}), release {r:.1} µs/edge (ratio to plain \
             enqueue {:.2}, to plain complete {:.2}); start latency ms, fresh / released: this \
             process {:.2} / {:.2}, another process {:.2} / {:.2}",
            m / p,
            pick(&self.last_commit),
            pick(&self.callback),
            d / e,
            r / e,
            r / p,
            pick(&self.fresh_here),
            pick(&self.released_here),
            pick(&self.fresh_other),
            pick(&self.released_other),
        )
    }

    fn last(&self) -> String {
        self.line(|v| v.last().copied().unwrap_or(f64::NAN))
    }

    fn medians(&self) -> String {
        self.line(median)
    }
}

/// Completes N plain jobs, then N members of one sealed batch.
fn fan_in(queue: &Queue, members: usize, figures: &mut Figures) -> BoxResult {
    let jobs = (0..members).map(|n| NewJob::new("plain", json!({ "n": n })));
    queue.enqueue_many(jobs)?;
    let (took, _) = complete_all(queue, "plain", members)?;
    figures.plain.push(per_job(took, members));

    let batch = queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue("callbacks"))
        .create()?;
    for chunk in (0..members).collect::<Vec<_>>().chunks(1_000) {
        let jobs = chunk
            .iter()
            .map(|n| NewJob::new("member", json!({ "n": n })).batch(batch.id));
        queue.enqueue_many(jobs)?;
    }
    queue.seal_batch(batch.id)?;
    let (took, last) = complete_all(queue, "member", members)?;
    figures.member.push(per_job(took, members));
    figures.last_commit.push(ms(last));

    // The last commit has returned: the callback must be there already.
    let returned = Instant::now();
    let fired = queue.lease(&LeaseRequest::new("cb", 10).queues(["callbacks"]))?;
    figures.callback.push(ms(returned.elapsed()));
    if fired.len() != 1 {
        return Err(format!("expected one callback, found {}", fired.len()).into());
    }
    let status = queue.batch_status(batch.id)?;
    if status.completed != members as i64 || status.complete_job_id != Some(fired[0].id) {
        return Err(format!("unexpected batch status {status:?}").into());
    }
    Ok(())
}

/// The cost of a dependency edge at enqueue and at release, over N jobs
/// but at most `EDGES` (a cost per job: more add time, not precision).
fn edges(queue: &Queue, n: usize, figures: &mut Figures) -> BoxResult {
    let batches = n.min(EDGES).div_ceil(BATCH);
    let start = Instant::now();
    for _ in 0..batches {
        queue.enqueue_many((0..BATCH).map(|i| NewJob::new("k", json!(i)).queue("edges")))?;
    }
    figures
        .enqueue_plain
        .push(per_job(start.elapsed(), batches * BATCH));
    let root = queue
        .enqueue(NewJob::new("root", json!({})).queue("edges"))?
        .id;
    let start = Instant::now();
    for _ in 0..batches {
        queue.enqueue_many((0..BATCH).map(|i| {
            NewJob::new("dep", json!(i))
                .queue("edges")
                .depends_on([root])
        }))?;
    }
    figures
        .enqueue_edge
        .push(per_job(start.elapsed(), batches * BATCH));
    let job = queue
        .lease(
            &LeaseRequest::new("bench", 1)
                .queues(["edges"])
                .kinds(["root"]),
        )?
        .pop()
        .ok_or("the root was not leased")?;
    let start = Instant::now();
    queue.complete(&job, None)?;
    figures
        .release
        .push(per_job(start.elapsed(), batches * BATCH));
    let released = queue.lease(
        &LeaseRequest::new("bench", batches * BATCH)
            .queues(["edges"])
            .kinds(["dep"]),
    )?;
    if released.len() != batches * BATCH {
        return Err(format!(
            "{} of {} dependents released",
            released.len(),
            batches * BATCH
        )
        .into());
    }
    Ok(())
}

/// A fan-out of N dependents (at most `EDGES`) of one job, released by its
/// completion; then another of one job, cancelled by its discard (a
/// dependency that did not complete cancels what waits on it). The cost of
/// each settle per dependent, in µs: `(released, cancelled)`.
fn cascade(queue: &Queue, n: usize) -> BoxResult<(f64, f64)> {
    let n = n.min(EDGES);
    let mut costs = Vec::new();
    for (root_kind, outcome) in [
        ("released", Outcome::Complete(None)),
        ("cancelled", Outcome::Discard("bench".into())),
    ] {
        let root = queue
            .enqueue(NewJob::new(root_kind, json!({})).queue("cascade"))?
            .id;
        for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
            queue.enqueue_many(chunk.iter().map(|i| {
                NewJob::new("dependent", json!(i))
                    .queue("cascade")
                    .depends_on([root])
            }))?;
        }
        let job = queue
            .lease(
                &LeaseRequest::new("bench", 1)
                    .queues(["cascade"])
                    .kinds([root_kind]),
            )?
            .pop()
            .ok_or("the root was not leased")?;
        let start = Instant::now();
        queue.settle(&job, outcome)?;
        costs.push(per_job(start.elapsed(), n));
        let ready = queue.lease(&LeaseRequest::new("bench", n + 1).queues(["cascade"]))?;
        let expected = if root_kind == "released" { n } else { 0 };
        if ready.len() != expected {
            return Err(format!("{} dependents ready, not {expected}", ready.len()).into());
        }
        for result in queue.complete_many(&ready)? {
            result?;
        }
        let pending: u64 = queue.stats()?.iter().map(|s| s.pending).sum();
        if pending != 0 {
            return Err(format!("{pending} dependents still pending").into());
        }
    }
    Ok((costs[0], costs[1]))
}

/// Start latencies of probes, fresh and released, with a worker in this
/// process and then in another.
fn latency(place: &Place, figures: &mut Figures) -> BoxResult {
    let queue = place.open()?;
    let worker = probe_worker(queue.clone())?;
    let (fresh, released) = probes(&queue)?;
    figures.fresh_here.push(fresh);
    figures.released_here.push(released);
    worker.shutdown(Duration::from_secs(5))?;

    let (target, schema) = place.target();
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["--worker", &target]).args(schema);
    let mut child = KillOnDrop(command.stdout(Stdio::null()).spawn()?);
    let (fresh, released) = probes(&queue)?;
    figures.fresh_other.push(fresh);
    figures.released_other.push(released);
    child.0.kill()?;
    Ok(())
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn probe_worker(queue: Queue) -> backlog::Result<Worker> {
    Worker::builder(queue)
        .concurrency(2)
        .handle_raw("probe", |_, _| Ok(micros(SystemTime::now())))
        .start()
}

/// `--worker TARGET [SCHEMA]`: a probe worker until killed.
fn worker(target: &str, schema: Option<&String>) -> BoxResult {
    let mut options = QueueOptions::new();
    if let Some(schema) = schema {
        options = options.schema(schema.clone());
    }
    let _worker = probe_worker(options.connect(target)?)?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Median ms from the call to the probe's start: `(fresh, released)`.
fn probes(queue: &Queue) -> BoxResult<(f64, f64)> {
    let starts = probe_starts(queue, LATENCY_ROUNDS)?;
    Ok((
        median(&starts.fresh.from_call),
        median(&starts.released.from_call),
    ))
}

/// Ms from a call to the start of the probe it made runnable, timed from
/// the call's start and from its return. The commit that makes the probe
/// runnable happens between the two, so they bound the time from that
/// commit to the start: `from_return` below it, `from_call` above it.
#[derive(Default)]
struct Starts {
    from_call: Vec<f64>,
    from_return: Vec<f64>,
}

/// `rounds` fresh probes (from an `enqueue`) and as many released ones
/// (from the `complete` of their only dependency), alternating.
struct ProbeStarts {
    fresh: Starts,
    released: Starts,
}

fn probe_starts(queue: &Queue, rounds: usize) -> BoxResult<ProbeStarts> {
    let wait = Duration::from_secs(30);
    // A first probe warms the worker up (and waits for the child to start).
    let warm = queue.enqueue(NewJob::new("probe", json!({})))?;
    queue.wait(warm.id, Duration::from_secs(60))?;
    let (mut fresh, mut released) = (Starts::default(), Starts::default());
    for _ in 0..rounds {
        let called = SystemTime::now();
        let id = queue.enqueue(NewJob::new("probe", json!({})))?.id;
        let returned = SystemTime::now();
        fresh.push(started(queue, id, wait)?, called, returned);

        let gate = queue
            .enqueue(NewJob::new("gate", json!({})).queue("gates"))?
            .id;
        let id = queue
            .enqueue(NewJob::new("probe", json!({})).depends_on([gate]))?
            .id;
        let job = queue
            .lease(&LeaseRequest::new("gatekeeper", 1).queues(["gates"]))?
            .pop()
            .ok_or("the gate was not leased")?;
        let called = SystemTime::now();
        queue.complete(&job, None)?;
        let returned = SystemTime::now();
        released.push(started(queue, id, wait)?, called, returned);
    }
    Ok(ProbeStarts { fresh, released })
}

impl Starts {
    fn push(&mut self, started: i64, called: SystemTime, returned: SystemTime) {
        self.from_call.push((started - micros(called)) as f64 / 1e3);
        self.from_return
            .push((started - micros(returned)) as f64 / 1e3);
    }

    fn summary(&self) -> String {
        let pick = |v: &[f64]| {
            format!(
                "p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}",
                percentile(v, 0.50),
                percentile(v, 0.90),
                percentile(v, 0.99),
                percentile(v, 1.0)
            )
        };
        format!(
            "from the call: {}; from its return: {}",
            pick(&self.from_call),
            pick(&self.from_return)
        )
    }
}

/// `--latency ROUNDS [--db ...]`: only the start latencies, `ROUNDS` probes
/// of each kind per worker, with percentiles.
fn latency_only(backend: &str, rounds: usize) -> BoxResult {
    let Some(place) = Place::new(backend)? else {
        println!("SKIPPED {backend}: no URL set, or not built with its feature");
        return Ok(());
    };
    let queue = place.open()?;
    let worker = probe_worker(queue.clone())?;
    let here = probe_starts(&queue, rounds)?;
    worker.shutdown(Duration::from_secs(5))?;

    let (target, schema) = place.target();
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["--worker", &target]).args(schema);
    let mut child = KillOnDrop(command.stdout(Stdio::null()).spawn()?);
    let other = probe_starts(&queue, rounds)?;
    child.0.kill()?;
    for (worker, starts) in [("this process", here), ("another process", other)] {
        println!("{backend}, worker in {worker}, {rounds} probes of each, ms:");
        println!("  fresh    {}", starts.fresh.summary());
        println!("  released {}", starts.released.summary());
    }
    Ok(())
}

/// The nearest-rank percentile `q` (0 to 1) of `values`.
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// When probe `id` started (µs since the epoch, the probe's result).
fn started(queue: &Queue, id: i64, wait: Duration) -> BoxResult<i64> {
    let record = queue.wait(id, wait)?;
    Ok(serde_json::from_str(
        record.result.as_deref().ok_or("no result")?,
    )?)
}

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Where one run's queue lives; dropped with the run.
enum Place {
    Sqlite(tempfile::TempDir),
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        schema: String,
    },
    #[cfg(feature = "mysql")]
    Mysql {
        admin: String,
        url: String,
        database: String,
    },
}

impl Place {
    fn url_of(backend: &str) -> Option<String> {
        match backend {
            "sqlite" => Some(String::new()),
            #[cfg(feature = "postgres")]
            "postgres" => std::env::var("BACKLOG_TEST_POSTGRES_URL").ok(),
            #[cfg(feature = "mysql")]
            "mysql" => std::env::var("BACKLOG_TEST_MYSQL_URL").ok(),
            _ => None,
        }
    }

    /// A fresh place on `backend`; `None` when it cannot be reached.
    // Without a server feature only SQLite's arm is left, which needs neither.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql")),
        allow(unused_variables)
    )]
    fn new(backend: &str) -> BoxResult<Option<Place>> {
        let Some(url) = Place::url_of(backend) else {
            return Ok(None);
        };
        // Short: a PostgreSQL schema name is at most 32 characters here.
        let name = format!(
            "fanin_{}_{}",
            std::process::id(),
            micros(SystemTime::now()) % 1_000_000_000
        );
        Ok(Some(match backend {
            #[cfg(feature = "postgres")]
            "postgres" => Place::Postgres { url, schema: name },
            #[cfg(feature = "mysql")]
            "mysql" => {
                use backlog::mysql::mysql::prelude::Queryable;
                let opts = backlog::mysql::mysql::Opts::from_url(&url)?;
                backlog::mysql::mysql::Conn::new(opts)?
                    .query_drop(format!("CREATE DATABASE {name}"))?;
                let (base, query) = url.split_once('?').unwrap_or((&url, ""));
                let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
                let query = if query.is_empty() {
                    String::new()
                } else {
                    format!("?{query}")
                };
                Place::Mysql {
                    url: format!("{root}/{name}{query}"),
                    admin: url.clone(),
                    database: name,
                }
            }
            _ => Place::Sqlite(tempfile::tempdir()?),
        }))
    }

    /// What `QueueOptions::connect` takes, and the schema.
    fn target(&self) -> (String, Option<String>) {
        match self {
            Place::Sqlite(dir) => (
                format!("sqlite:{}", dir.path().join("fanin.db").display()),
                None,
            ),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => (url.clone(), Some(schema.clone())),
            #[cfg(feature = "mysql")]
            Place::Mysql { url, .. } => (url.clone(), None),
        }
    }

    fn open(&self) -> backlog::Result<Queue> {
        let (target, schema) = self.target();
        let options = match schema {
            Some(schema) => QueueOptions::new().schema(schema),
            None => QueueOptions::new(),
        };
        options.connect(&target)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        match self {
            Place::Sqlite(_) => {}
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => {
                use backlog::postgres::postgres::{Client, NoTls};
                if let Ok(mut admin) = Client::connect(url, NoTls) {
                    let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
                }
            }
            #[cfg(feature = "mysql")]
            Place::Mysql {
                admin, database, ..
            } => {
                use backlog::mysql::mysql::prelude::Queryable;
                if let Ok(mut admin) = backlog::mysql::mysql::Opts::from_url(admin)
                    .map_err(backlog::mysql::mysql::Error::from)
                    .and_then(backlog::mysql::mysql::Conn::new)
                {
                    let _ = admin.query_drop(format!("DROP DATABASE IF EXISTS {database}"));
                }
            }
        }
    }
}

/// Leases and completes `n` jobs of `kind`, `CHUNK` per transaction; the
/// time it all took, and the duration of the last transaction.
fn complete_all(queue: &Queue, kind: &str, n: usize) -> backlog::Result<(Duration, Duration)> {
    let start = Instant::now();
    let mut done = 0;
    let mut last = Duration::ZERO;
    while done < n {
        let jobs = queue.lease(&LeaseRequest::new("w", CHUNK).kinds([kind]))?;
        if jobs.is_empty() {
            return Err(backlog::Error::InvalidArgument(format!(
                "only {done} of {n} jobs were leased"
            )));
        }
        let commit = Instant::now();
        for result in queue.complete_many(&jobs)? {
            result?;
        }
        last = commit.elapsed();
        done += jobs.len();
    }
    Ok((start.elapsed(), last))
}

fn per_job(took: Duration, n: usize) -> f64 {
    took.as_secs_f64() * 1e6 / n as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}
