//! `bench server`: backlog on PostgreSQL and MySQL/MariaDB against the raw
//! SQL ceiling on the same tables, measured in the same run. Every
//! measurement gets a fresh namespace (a schema on PostgreSQL, a database on
//! MySQL), made by opening a queue on it (so its tables are backlog's own
//! migrations) and dropped after. See BENCHMARKS.md, "PostgreSQL and
//! MariaDB".
//!
//! ```text
//! cargo run --release --example bench --features postgres,mysql -- server \
//!     --url postgres://postgres@127.0.0.1:5432/test --url mysql://root@127.0.0.1:3306/test
//! cargo run --example bench --features postgres,mysql -- server --smoke   # CI: correctness only
//! ```

use std::time::{Duration, Instant};

use backlog::{LeaseRequest, NewJob, Outcome, Queue, QueueLimits, QueueOptions, Rate};
use serde_json::json;

use crate::db::{BoxResult, Gate};
use crate::report::{median, Report, Target};
use crate::server_db::{Counts, Namespace, Server, Target as Where};
use crate::server_worker::{self, BurnDown, JobTime, Latency};

/// Where the smoke mode (and a run without `--url`) finds the servers: the
/// variables the conformance suite and `.ci/run` use.
const URL_VARS: [&str; 2] = ["BACKLOG_TEST_POSTGRES_URL", "BACKLOG_TEST_MYSQL_URL"];

/// One of the measurements.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Enqueue,
    BurnDown,
    Latency,
    LeaseDepth,
    /// Burn-down with a queue limit that does not bind, against none.
    Limits,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// A database URL, postgres://… or mysql://…; repeat for several.
    /// Defaults to $BACKLOG_TEST_POSTGRES_URL and $BACKLOG_TEST_MYSQL_URL.
    #[arg(long)]
    url: Vec<String>,
    /// Small sizes, one run: seconds per server, correctness gate on, the
    /// figures meaningless. Exits 0 with SKIPPED when no URL is set.
    #[arg(long)]
    smoke: bool,
    /// The measurements to run, comma-separated. Defaults to all.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Jobs enqueued one per commit. Defaults to 2,000.
    #[arg(long)]
    single: Option<usize>,
    /// Jobs enqueued in batches of 1,000. Defaults to 100,000.
    #[arg(long)]
    batched: Option<usize>,
    /// Jobs per burn-down. Defaults to 100,000.
    #[arg(long)]
    jobs: Option<usize>,
    /// Jobs per burn-down of the default worker (prefetch 0): its rate is
    /// flat after the first second, so a smaller run keeps the bench short.
    /// Defaults to 20,000.
    #[arg(long)]
    default_worker_jobs: Option<usize>,
    /// Jobs of the raw drain one at a time (one commit per job). Defaults to 2,000.
    #[arg(long)]
    unbatched: Option<usize>,
    /// Worker processes of the burn-downs, comma-separated. Defaults to 1,3.
    #[arg(long, value_delimiter = ',')]
    processes: Vec<usize>,
    /// Handler threads per worker process. Defaults to 4.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Worker prefetch settings of the burn-downs and the latency mode, comma-separated (0: the
    /// default worker, whose adaptive look-ahead leases short jobs in batches).
    /// Defaults to 0,128.
    #[arg(long, value_delimiter = ',')]
    prefetch: Vec<usize>,
    /// Jobs per second of the latency mode's open loop, comma-separated.
    /// Defaults to 500,20.
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// How long the latency mode's producer runs. Defaults to 10 s.
    #[arg(long)]
    secs: Option<f64>,
    /// Producer threads of the latency mode. Defaults to 4.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Queue depths of the lease-depth mode. Defaults to 1,000 and 1,000,000.
    #[arg(long, value_delimiter = ',')]
    depths: Vec<usize>,
    /// Timed leases per depth and batch size. Defaults to 200.
    #[arg(long)]
    leases: Option<usize>,
    /// How long each job's handler sleeps in the limits mode, in µs: 0 (the
    /// default) drains no-op jobs, where any limit that binds costs the most;
    /// a job that does some work shows what a binding limit costs it.
    #[arg(long, default_value_t = 0)]
    limits_job_us: u64,
    /// How much the limits mode's jobs vary, in percent: each handler sleeps
    /// a time drawn evenly from `--limits-job-us` ± this. 0 (the default):
    /// all alike, so the threads of a worker without a look-ahead finish
    /// together; real jobs vary, and its threads finish one at a time.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    limits_job_spread: u32,
}

/// The sizes of one invocation.
struct Sizes {
    single: usize,
    batched: usize,
    jobs: usize,
    default_worker_jobs: usize,
    unbatched: usize,
    processes: Vec<usize>,
    prefetch: Vec<usize>,
    rates: Vec<f64>,
    secs: f64,
    small: usize,
    large: usize,
    leases: usize,
}

impl Sizes {
    fn of(a: &ServerArgs) -> Sizes {
        let smoke = a.smoke;
        let pick = |v: Option<usize>, full: usize, small: usize| {
            v.unwrap_or(if smoke { small } else { full })
        };
        let (small, large) = match a.depths.as_slice() {
            [s, l] => (*s, *l),
            _ if smoke => (100, 5_000),
            _ => (1_000, 1_000_000),
        };
        Sizes {
            single: pick(a.single, 2_000, 50),
            batched: pick(a.batched, 100_000, 2_000),
            jobs: pick(a.jobs, 100_000, 2_000),
            default_worker_jobs: pick(a.default_worker_jobs, 20_000, 2_000),
            unbatched: pick(a.unbatched, 2_000, 100),
            processes: if a.processes.is_empty() {
                vec![1, 3]
            } else {
                a.processes.clone()
            },
            prefetch: if a.prefetch.is_empty() {
                vec![0, 128]
            } else {
                a.prefetch.clone()
            },
            rates: match (a.rate.is_empty(), smoke) {
                (false, _) => a.rate.clone(),
                (true, true) => vec![200.0],
                (true, false) => vec![500.0, 20.0],
            },
            secs: a.secs.unwrap_or(if smoke { 1.0 } else { 10.0 }),
            small,
            large,
            leases: pick(a.leases, 200, 20),
        }
    }
}

/// Runs the server benchmark; false when a correctness gate failed.
pub fn run(a: &ServerArgs, runs: Option<usize>, out: Option<&std::path::Path>) -> BoxResult<bool> {
    if a.smoke {
        println!(
            "server smoke: small sizes, one run; it checks correctness only \
             (the figures mean nothing)"
        );
    }
    let servers = match servers(a)? {
        Some(s) => s,
        None => return Ok(true),
    };
    let runs = runs.unwrap_or(if a.smoke { 1 } else { 3 }).max(1);
    let sizes = Sizes::of(a);
    let wants = |p: Part| a.only.is_empty() || a.only.contains(&p);
    let mut report = if a.smoke {
        Report::smoke()
    } else {
        Report::new()
    };
    let mut settings = Vec::new();
    let started = Instant::now();
    for server in &servers {
        let label = server.label()?;
        let line = json!({
            "type": "server", "server": label, "url": crate::server_db::redact(&server.url),
            "settings": server.settings()?.into_iter().map(|(k, v)| (k, json!(v)))
                .collect::<serde_json::Map<_, _>>(),
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        });
        println!("{line}");
        settings.push(line);
        if wants(Part::Enqueue) {
            for run in 0..runs {
                enqueue(&mut report, server, label, &sizes, run)?;
            }
        }
        if wants(Part::BurnDown) {
            for run in 0..runs {
                burn_down(&mut report, server, label, &sizes, a.threads, run)?;
            }
        }
        if wants(Part::Latency) {
            for _ in 0..runs {
                for &rate in &sizes.rates {
                    for &prefetch in &sizes.prefetch {
                        let l = Latency {
                            rate,
                            secs: sizes.secs,
                            threads: a.threads,
                            producers: a.producers,
                            prefetch,
                        };
                        server_worker::latency(&mut report, server, label, &l)?;
                    }
                    let l = Latency {
                        rate,
                        secs: sizes.secs,
                        threads: a.threads,
                        producers: a.producers,
                        prefetch: 0,
                    };
                    server_worker::latency_raw(&mut report, server, label, &l)?;
                }
            }
        }
        if wants(Part::LeaseDepth) {
            lease_depth(&mut report, server, label, &sizes, runs)?;
        }
        if wants(Part::Limits) {
            for run in 0..runs {
                limits(
                    &mut report,
                    server,
                    label,
                    &sizes,
                    a.threads,
                    JobTime {
                        us: a.limits_job_us,
                        spread_percent: a.limits_job_spread,
                    },
                    run,
                )?;
            }
        }
        eprintln!(
            "{label}: done after {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    report.finish();
    if let Some(out) = out {
        std::fs::create_dir_all(out)?;
        let mut jsonl: String = settings.iter().map(|l| format!("{l}\n")).collect();
        jsonl.push_str(&report.json_lines());
        std::fs::write(out.join("server-results.jsonl"), jsonl)?;
        let mut md = String::new();
        for line in &settings {
            md.push_str(&format!(
                "- {}: {}\n",
                line["server"].as_str().unwrap_or("?"),
                line["settings"]
            ));
        }
        md.push_str(&report.markdown());
        std::fs::write(out.join("server-summary.md"), md)?;
        eprintln!(
            "wrote {}/{{server-results.jsonl,server-summary.md}}",
            out.display()
        );
    }
    Ok(report.passed())
}

/// The servers to measure, or `None` (after saying why) when the smoke mode
/// has nothing to run against.
fn servers(a: &ServerArgs) -> BoxResult<Option<Vec<Server>>> {
    let urls: Vec<String> = if a.url.is_empty() {
        URL_VARS
            .iter()
            .filter_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
            .collect()
    } else {
        a.url.clone()
    };
    if urls.is_empty() {
        let why = format!(
            "set {} or {} (or pass --url) to benchmark a server",
            URL_VARS[0], URL_VARS[1]
        );
        if a.smoke {
            println!("SKIPPED: {why}");
            return Ok(None);
        }
        return Err(why.into());
    }
    let mut servers = Vec::new();
    for url in &urls {
        let server = Server::new(url)?;
        if !server.dialect.built() {
            let why = format!(
                "{} needs --features {}",
                crate::server_db::redact(url),
                server.dialect.feature()
            );
            if a.smoke {
                println!("SKIPPED: {why}");
                continue;
            }
            return Err(why.into());
        }
        servers.push(server);
    }
    Ok(if servers.is_empty() {
        None
    } else {
        Some(servers)
    })
}

/// A queue on a namespace, with default options.
pub fn open_queue(target: &Where) -> BoxResult<Queue> {
    let mut options = QueueOptions::new();
    if let Some(schema) = &target.schema {
        options = options.schema(schema.clone());
    }
    Ok(options.connect(&target.url)?)
}

/// A fresh namespace with backlog's tables, made by its migrations.
pub fn fresh(server: &Server, tag: &str) -> BoxResult<Namespace> {
    let ns = server.namespace(tag)?;
    drop(open_queue(&ns.target()?)?);
    Ok(ns)
}

pub fn gate((ok, detail): (bool, String)) -> Gate {
    Gate { ok, detail }
}

fn per_sec(jobs: usize, took: Duration) -> f64 {
    jobs as f64 / took.as_secs_f64().max(1e-9)
}

// ---- enqueue -------------------------------------------------------------------

fn job(n: usize) -> NewJob {
    NewJob::new("noop", json!({ "n": n }))
}

/// Every enqueued job is live, once, and nothing else happened.
fn enqueued(c: Counts, expected: usize) -> Gate {
    let e = expected as i64;
    Gate {
        ok: c.live == e && c.leased == 0 && c.completed == 0 && c.other == 0,
        detail: format!(
            "expected {e} live: live {}, leased {}, finished {}",
            c.live,
            c.leased,
            c.completed + c.other
        ),
    }
}

/// Blocks each side of an enqueue comparison is cut into: the sides take
/// turns block by block, so that both meet the same load on a shared
/// machine (a whole run each, seconds apart, saw rates swing twentyfold).
const ENQUEUE_BLOCKS: usize = 20;

/// backlog's `enqueue` and `enqueue_many(1000)` against the raw inserts with
/// the same jobs per commit, on fresh namespaces, block by block in turn
/// (which side goes first alternates).
fn enqueue(
    report: &mut Report,
    server: &Server,
    label: &str,
    sizes: &Sizes,
    run: usize,
) -> BoxResult<()> {
    let cases = [
        ("enqueue, one per commit", sizes.single, 1),
        ("enqueue_many(1000)", sizes.batched, 1000),
    ];
    for (name, count, batch) in cases {
        let (backlog_ns, raw_ns) = (fresh(server, "enqueue")?, fresh(server, "enqueue")?);
        let queue = open_queue(&backlog_ns.target()?)?;
        let mut raw = raw_ns.raw()?;
        let block = (count / ENQUEUE_BLOCKS).div_ceil(batch).max(1) * batch;
        let (mut backlog_took, mut raw_took) = (Duration::ZERO, Duration::ZERO);
        let mut first = 0;
        while first < count {
            let end = (first + block).min(count);
            for side in 0..2 {
                if (side + run + first / block).is_multiple_of(2) {
                    let start = Instant::now();
                    let mut n = first;
                    while n < end {
                        let upto = (n + batch).min(end);
                        if batch == 1 {
                            queue.enqueue(job(n))?;
                        } else {
                            queue.enqueue_many((n..upto).map(job))?;
                        }
                        n = upto;
                    }
                    backlog_took += start.elapsed();
                } else {
                    raw_took += raw.insert(first, end - first, batch)?;
                }
            }
            first = end;
        }
        drop(queue);
        report.gate(
            "enqueue",
            label,
            &format!("backlog {name}"),
            enqueued(backlog_ns.raw()?.counts()?, count),
        );
        report.gate(
            "enqueue",
            label,
            &format!("raw, batch {batch}"),
            enqueued(raw.counts()?, count),
        );
        let (backlog_rate, raw_rate) = (per_sec(count, backlog_took), per_sec(count, raw_took));
        let raw_name = if batch == 1 {
            "raw insert, one per commit".to_owned()
        } else {
            format!("raw insert, {batch} rows in one statement per commit")
        };
        report.value(
            "enqueue",
            label,
            &format!("backlog {name}"),
            "jobs/s",
            backlog_rate,
        );
        report.value("enqueue", label, &raw_name, "jobs/s", raw_rate);
        report.value(
            "enqueue",
            label,
            &format!("backlog {name} / raw"),
            "ratio",
            backlog_rate / raw_rate,
        );
    }
    // For the reader: the batch as 1,000 single-row statements, what a
    // driver without multi-row inserts pays.
    let ns = fresh(server, "enqueue")?;
    let mut raw = ns.raw()?;
    // A fifth of the jobs: one round trip each is slow.
    let count = (sizes.batched / 5).max(1000);
    let took = raw.insert_rows(0, count, 1000)?;
    report.value(
        "enqueue",
        label,
        "raw insert, 1000 single-row statements per commit",
        "jobs/s",
        per_sec(count, took),
    );
    let counts = raw.counts()?;
    report.gate(
        "enqueue",
        label,
        "raw, 1000 statements",
        enqueued(counts, count),
    );
    Ok(())
}

// ---- burn-down -----------------------------------------------------------------

/// The raw drains (the batched ceiling on 1 and on 3 connections, and one
/// job per commit), then backlog's workers in 1 and 3 processes; the ratio
/// of each to the best batched drain of this run.
fn burn_down(
    report: &mut Report,
    server: &Server,
    label: &str,
    sizes: &Sizes,
    threads: usize,
    run: usize,
) -> BoxResult<()> {
    let mut ceiling: f64 = 0.0;
    let mut backlog = Vec::new();
    for side in 0..2 {
        if (side + run).is_multiple_of(2) {
            for connections in [1, 3] {
                let rate =
                    server_worker::raw_drain(report, server, label, sizes.jobs, 100, connections)?;
                ceiling = ceiling.max(rate);
            }
            server_worker::raw_drain(report, server, label, sizes.unbatched, 1, 1)?;
        } else {
            for &prefetch in &sizes.prefetch {
                for &processes in &sizes.processes {
                    let b = BurnDown {
                        jobs: if prefetch == 0 {
                            sizes.default_worker_jobs
                        } else {
                            sizes.jobs
                        },
                        processes,
                        threads,
                        prefetch,
                        limits: QueueLimits::default(),
                        job: JobTime::default(),
                    };
                    let rate = server_worker::burn_down(report, server, label, &b)?;
                    backlog.push((b, rate));
                }
            }
        }
    }
    report.value(
        "burn-down",
        label,
        "raw ceiling: best batched drain",
        "jobs/s",
        ceiling,
    );
    for (b, rate) in backlog {
        let name = format!("backlog, {} / raw ceiling", b.name());
        if b.processes == 3 {
            report.target(
                "burn-down",
                label,
                &name,
                "ratio",
                rate / ceiling,
                Target::AtLeast(0.5),
            );
        } else {
            report.value("burn-down", label, &name, "ratio", rate / ceiling);
        }
    }
    Ok(())
}

// ---- limits --------------------------------------------------------------------

/// The cost of a queue limit on burn-down, as the SQLite `limits` mode
/// measures it: the default worker in the largest number of processes of
/// this invocation drains the same prefill with no limit, with a global
/// concurrency limit equal to all its threads (it never binds), and with
/// that limit plus a rate limit far above the drain's rate; in rotating
/// order. Each limited rate over the unlimited one of the same run.
fn limits(
    report: &mut Report,
    server: &Server,
    label: &str,
    sizes: &Sizes,
    threads: usize,
    job: JobTime,
    run: usize,
) -> BoxResult<()> {
    let processes = sizes.processes.iter().copied().max().unwrap_or(1);
    let all = u32::try_from(processes * threads).unwrap_or(u32::MAX);
    // A limit of all the threads binds after all: the default worker leases
    // ahead of its threads (its look-ahead), and a leased job counts as
    // running, so that limit keeps it from leasing ahead. The high limit
    // never binds: what it costs is the bookkeeping alone.
    let high = Some(NEVER_BINDS);
    let variants = [
        ("no limit", QueueLimits::default()),
        (
            "concurrency limit = threads",
            QueueLimits {
                concurrency: Some(all),
                rate: None,
            },
        ),
        (
            "concurrency + rate limit (not binding)",
            QueueLimits {
                concurrency: Some(all),
                rate: Some(Rate::new(10_000_000, Duration::from_secs(1))),
            },
        ),
        (
            "concurrency limit 1,000,000 (never binds)",
            QueueLimits {
                concurrency: high,
                rate: None,
            },
        ),
        (
            "concurrency 1,000,000 + rate limit (never binds)",
            QueueLimits {
                concurrency: high,
                rate: Some(Rate::new(10_000_000, Duration::from_secs(1))),
            },
        ),
    ];
    let jobs = match job.us {
        0 => String::new(),
        _ => format!(", jobs of {}", job.describe()),
    };
    let mut rates = [0.0f64; 5];
    for k in 0..variants.len() {
        let i = (k + run) % variants.len();
        let b = BurnDown {
            jobs: sizes.default_worker_jobs,
            processes,
            threads,
            prefetch: 0,
            limits: variants[i].1,
            job,
        };
        rates[i] = server_worker::burn_down(report, server, label, &b)?;
    }
    for i in 1..variants.len() {
        report.target(
            "limits",
            label,
            &format!("{} / no limit, {processes} processes{jobs}", variants[i].0),
            "ratio",
            rates[i] / rates[0],
            Target::AtLeast(0.9),
        );
    }
    Ok(())
}

/// A concurrency limit above anything the workers of the limits mode hold.
const NEVER_BINDS: u32 = 1_000_000;

// ---- lease-depth ---------------------------------------------------------------

/// The median time of one lease of `batch` at each depth, the two depths
/// taking turns lease by lease, so a disk stall (every lease commits) lands
/// on both alike. Each lease is released again, untimed, so the depth stays.
fn lease_pair(
    lease: &mut dyn FnMut(usize, usize) -> BoxResult<Duration>,
    batch: usize,
    leases: usize,
) -> BoxResult<(f64, f64)> {
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for i in 0..leases + leases / 10 {
        let s = lease(0, batch)?;
        let l = lease(1, batch)?;
        // The first tenth warms the caches and is not counted.
        if i >= leases / 10 {
            small.push(s.as_secs_f64() * 1e6);
            large.push(l.as_secs_f64() * 1e6);
        }
    }
    Ok((median(&small), median(&large)))
}

fn depth_name(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// backlog's lease and the raw lease at a small and a large depth, batch 1
/// and 100; the namespaces are prefilled once per server.
fn lease_depth(
    report: &mut Report,
    server: &Server,
    label: &str,
    sizes: &Sizes,
    runs: usize,
) -> BoxResult<()> {
    let depths = [sizes.small, sizes.large];
    let mut spaces = Vec::new();
    for depth in depths {
        let ns = fresh(server, "depth")?;
        let mut raw = ns.raw()?;
        raw.prefill(depth)?;
        raw.analyze()?;
        spaces.push(ns);
    }
    let (s, l) = (depth_name(sizes.small), depth_name(sizes.large));
    for _ in 0..runs {
        for batch in [1, 100] {
            let queues = [
                open_queue(&spaces[0].target()?)?,
                open_queue(&spaces[1].target()?)?,
            ];
            let request = LeaseRequest::new("bench", batch);
            let (at_small, at_large) = lease_pair(
                &mut |i, n| {
                    let start = Instant::now();
                    let jobs = queues[i].lease(&request)?;
                    let took = start.elapsed();
                    if jobs.len() != n {
                        return Err(format!("leased {} jobs, expected {n}", jobs.len()).into());
                    }
                    for r in queues[i].settle_many(jobs.iter().map(|j| (j, Outcome::Release)))? {
                        r?;
                    }
                    Ok(took)
                },
                batch,
                sizes.leases,
            )?;
            drop(queues);
            record_depth(
                report,
                label,
                "backlog",
                batch,
                (&s, &l),
                at_small,
                at_large,
                true,
            );
            let mut raws = [spaces[0].raw()?, spaces[1].raw()?];
            let (at_small, at_large) = lease_pair(
                &mut |i, n| {
                    let start = Instant::now();
                    let ids = raws[i].lease(n)?;
                    let took = start.elapsed();
                    if ids.len() != n {
                        return Err(format!("leased {} jobs, expected {n}", ids.len()).into());
                    }
                    raws[i].release(&ids)?;
                    Ok(took)
                },
                batch,
                sizes.leases,
            )?;
            record_depth(
                report,
                label,
                "raw",
                batch,
                (&s, &l),
                at_small,
                at_large,
                false,
            );
        }
    }
    for (ns, depth) in spaces.iter().zip(depths) {
        let c = ns.raw()?.counts()?;
        report.gate(
            "lease-depth",
            label,
            &format!("depth {} intact", depth_name(depth)),
            Gate {
                ok: c.live == depth as i64 && c.leased == 0 && c.completed + c.other == 0,
                detail: format!(
                    "live {}, leased {}, finished {}",
                    c.live,
                    c.leased,
                    c.completed + c.other
                ),
            },
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn record_depth(
    report: &mut Report,
    label: &str,
    side: &str,
    batch: usize,
    (s, l): (&str, &str),
    at_small: f64,
    at_large: f64,
    target: bool,
) {
    let mode = "lease-depth";
    report.value(
        mode,
        label,
        &format!("{side}: lease {batch} at {s} queued (median)"),
        "µs",
        at_small,
    );
    report.value(
        mode,
        label,
        &format!("{side}: lease {batch} at {l} queued (median)"),
        "µs",
        at_large,
    );
    let name = format!("{side}: lease {batch}, cost at {l} / at {s}");
    if target {
        report.target(
            mode,
            label,
            &name,
            "x",
            at_large / at_small,
            Target::AtMost(1.5),
        );
    } else {
        report.value(mode, label, &name, "x", at_large / at_small);
    }
}
