//! The end-to-end benchmark: backlog against the raw-SQLite ceiling, in the
//! same run, at both durabilities. See BENCHMARKS.md.
//!
//! ```text
//! cargo run --release --example bench -- all --out benches/results   # BENCHMARKS.md's figures
//! cargo run --release --example bench -- enqueue --runs 5           # one mode
//! cargo run --release --example bench -- fairness                   # processes sharing a file
//! cargo run --example bench                                          # smoke: correctness only
//! cargo run --release --example bench --features postgres,mysql -- server --url URL
//! ```
//!
//! Every value is printed as a JSON line on stdout as it is measured, then the
//! medians (with targets) as JSON lines and a human table on stderr. A failed
//! correctness gate (a job lost, duplicated or left behind, or pragmas that
//! differ from the raw loop's) prints FAILED and exits with status 1.

#[path = "bench/chart.rs"]
mod chart;
#[path = "bench/db.rs"]
mod db;
#[path = "bench/fairness.rs"]
mod fairness;
#[path = "bench/flows.rs"]
mod flows;
#[path = "bench/limits.rs"]
mod limits;
#[path = "bench/modes.rs"]
mod modes;
#[path = "bench/on_time.rs"]
mod on_time;
#[path = "bench/periodic.rs"]
mod periodic;
#[path = "bench/raw.rs"]
mod raw;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/server.rs"]
mod server;
#[path = "bench/server_db.rs"]
mod server_db;
#[cfg(feature = "mysql")]
#[path = "bench/server_mysql.rs"]
mod server_mysql;
#[cfg(feature = "postgres")]
#[path = "bench/server_pg.rs"]
mod server_pg;
#[path = "bench/server_worker.rs"]
mod server_worker;
#[path = "bench/worker.rs"]
mod worker;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use backlog::Durability;
use clap::{Parser, Subcommand, ValueEnum};

use db::BoxResult;
use modes::{Depths, EnqueueSizes, RawSizes};
use report::Report;

#[derive(Parser, Debug)]
#[command(about = "backlog against the raw-SQLite ceiling, in the same run")]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Which durabilities to measure.
    #[arg(long, value_enum, default_value_t = Which::Both, global = true)]
    durability: Which,
    /// Runs per figure; the reports give medians. Defaults to 3 (1 in smoke mode).
    #[arg(long, global = true)]
    runs: Option<usize>,
    /// Where the database files go. Defaults to a fresh temporary directory.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    /// Also write results.jsonl, summary.md and chart.svg into this directory.
    #[arg(long, global = true)]
    out: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Every mode with small sizes, one run: checks correctness only, no
    /// verdict on the figures (the default).
    Smoke,
    /// Every mode with the sizes of BENCHMARKS.md.
    All,
    /// The ceiling: raw rusqlite inserts (1 per commit, batches of 100/1000) and drains.
    Raw(RawArgs),
    /// backlog's enqueue (one at a time, enqueue_many) against raw inserts.
    Enqueue(EnqueueArgs),
    /// The lease at a small and a large queue depth.
    LeaseDepth(DepthArgs),
    /// Drain prefilled no-op jobs with a Worker, against the raw batch-100 drain.
    BurnDown(BurnDownArgs),
    /// The cost of a dependency edge: enqueue and release, against plain
    /// jobs in the same run.
    Dependencies(DependenciesArgs),
    /// Burn-down with a global concurrency limit (and a rate limit) that
    /// does not bind, against no limit, in the same run.
    Limits(LimitsArgs),
    /// A Worker with 8 handler threads draining 1M jobs: RSS sampled every 100 ms.
    Memory(MemoryArgs),
    /// Open-loop producer, same process and another process: enqueue→start delay.
    Latency(LatencyArgs),
    /// Lateness after the due time: delayed, retried and snoozed jobs,
    /// scheduled in this process and in another one.
    Lateness(on_time::LatenessArgs),
    /// CPU of an idle worker (8 handler threads, nothing to do).
    IdleCpu(on_time::IdleCpuArgs),
    /// `Queue::wait` on jobs run by a worker in another process.
    Wait(on_time::WaitArgs),
    /// The lease next to 50k future-scheduled, unhandled-kind or paused-queue jobs vs 1k.
    LeaseUnrunnable(on_time::UnrunnableArgs),
    /// The four on-time modes: lateness, wait, lease-unrunnable, idle-cpu.
    OnTime,
    /// The cost of a periodic scheduler in every process: CPU and wake-ups
    /// of idle and ticking schedulers, enqueue throughput with and without.
    Periodic(periodic::PeriodicArgs),
    /// (internal) A scheduler process of the periodic mode.
    #[command(hide = true)]
    PeriodicChild(periodic::PeriodicChildArgs),
    /// Processes on one file: one writes flat out, others time single
    /// enqueues; their wait, and what the flat-out process loses.
    Fairness(fairness::FairnessArgs),
    /// (internal) One process of the fairness mode.
    #[command(hide = true)]
    FairChild(fairness::FairChildArgs),
    /// (internal) The lateness mode's scheduler in another process.
    #[command(hide = true)]
    Schedule(on_time::ScheduleArgs),
    /// (internal) The wait mode's worker in another process.
    #[command(hide = true)]
    Serve(on_time::ServeArgs),
    /// (internal) The idle-cpu mode's worker, in a process of its own.
    #[command(hide = true)]
    IdleChild(on_time::IdleChildArgs),
    /// (internal) The latency mode's producer in another process.
    #[command(hide = true)]
    Produce(ProduceArgs),
    /// (internal) Prefills a queue file, in a child process so that its
    /// memory never shows in the worker's RSS.
    #[command(hide = true)]
    Prefill(PrefillArgs),
    /// PostgreSQL and MySQL/MariaDB, each against its raw-SQL ceiling
    /// (build with --features postgres,mysql).
    Server(Box<server::ServerArgs>),
    /// (internal) A worker or producer process of the server modes.
    #[command(hide = true)]
    ServerChild(server_worker::ChildArgs),
}

#[derive(clap::Args, Debug, Clone)]
struct BurnDownArgs {
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Handler threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Worker prefetch settings to measure, comma-separated (0 = the default
    /// worker: its adaptive look-ahead).
    #[arg(long, value_delimiter = ',', default_values_t = [0usize, 128])]
    prefetch: Vec<usize>,
}

#[derive(clap::Args, Debug, Clone)]
struct DependenciesArgs {
    /// Jobs per side (rounded up to batches of 500).
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct LimitsArgs {
    #[arg(long, default_value_t = 50_000)]
    jobs: usize,
    /// Handler threads (and the concurrency limit).
    #[arg(long, default_value_t = 4)]
    threads: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct MemoryArgs {
    #[arg(long, default_value_t = 1_000_000)]
    jobs: usize,
    /// Handler threads.
    #[arg(long, default_value_t = 8)]
    threads: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct LatencyArgs {
    /// Jobs per second, by the wall clock.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// How long the producer runs.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Handler threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct ProduceArgs {
    #[arg(long)]
    db: PathBuf,
    #[arg(long)]
    rate: f64,
    #[arg(long)]
    secs: f64,
}

#[derive(clap::Args, Debug, Clone)]
struct PrefillArgs {
    #[arg(long)]
    db: PathBuf,
    #[arg(long)]
    jobs: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct RawArgs {
    /// Jobs for the one-insert-per-commit loop.
    #[arg(long, default_value_t = 2_000)]
    single: usize,
    /// Jobs for the batched loops and drains.
    #[arg(long, default_value_t = 100_000)]
    batched: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct EnqueueArgs {
    /// Jobs enqueued one at a time (each committed).
    #[arg(long, default_value_t = 2_000)]
    single: usize,
    /// Jobs enqueued in batches.
    #[arg(long, default_value_t = 100_000)]
    batched: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct DepthArgs {
    #[arg(long, default_value_t = 1_000)]
    small: usize,
    #[arg(long, default_value_t = 1_000_000)]
    large: usize,
    /// Timed leases per depth and batch size.
    #[arg(long, default_value_t = 200)]
    leases: usize,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum Which {
    Full,
    Fast,
    Both,
}

impl Which {
    fn list(self) -> Vec<Durability> {
        match self {
            Which::Full => vec![Durability::Full],
            Which::Fast => vec![Durability::Fast],
            Which::Both => vec![Durability::Full, Durability::Fast],
        }
    }
}

/// The sizes of one invocation of several modes.
#[derive(Default)]
struct Plan {
    memory: Option<MemoryArgs>,
    raw: Option<RawArgs>,
    enqueue: Option<EnqueueArgs>,
    depth: Option<DepthArgs>,
    burn_down: Option<BurnDownArgs>,
    limits: Option<LimitsArgs>,
    dependencies: Option<DependenciesArgs>,
    latency: Option<LatencyArgs>,
    fairness: Option<fairness::FairnessArgs>,
    on_time: on_time::Plan,
    periodic: Option<periodic::PeriodicArgs>,
}

impl Plan {
    fn smoke() -> Plan {
        Plan {
            raw: Some(RawArgs {
                single: 100,
                batched: 2_000,
            }),
            enqueue: Some(EnqueueArgs {
                single: 100,
                batched: 2_000,
            }),
            depth: Some(DepthArgs {
                small: 1_000,
                large: 20_000,
                leases: 20,
            }),
            burn_down: Some(BurnDownArgs {
                jobs: 2_000,
                threads: 4,
                prefetch: vec![0, 128],
            }),
            limits: Some(LimitsArgs {
                jobs: 2_000,
                threads: 4,
            }),
            dependencies: Some(DependenciesArgs { jobs: 1_000 }),
            latency: Some(LatencyArgs {
                rate: 200.0,
                secs: 1.0,
                threads: 4,
            }),
            memory: None,
            fairness: Some(fairness::FairnessArgs {
                samplers: 1,
                secs: 0.5,
                every_ms: 20,
                flat: vec![fairness::Flat::Enqueue],
                rescue_expired: 2_000,
            }),
            on_time: on_time::Plan::smoke(),
            periodic: Some(periodic::PeriodicArgs {
                processes: 2,
                schedules: 3,
                secs: 1.0,
                jobs: 200,
            }),
        }
    }

    fn all() -> Plan {
        Plan {
            raw: Some(RawArgs {
                single: 2_000,
                batched: 100_000,
            }),
            enqueue: Some(EnqueueArgs {
                single: 2_000,
                batched: 100_000,
            }),
            depth: Some(DepthArgs {
                small: 1_000,
                large: 1_000_000,
                leases: 200,
            }),
            burn_down: Some(BurnDownArgs {
                jobs: 100_000,
                threads: 4,
                prefetch: vec![0, 128],
            }),
            limits: Some(LimitsArgs {
                jobs: 50_000,
                threads: 4,
            }),
            dependencies: Some(DependenciesArgs { jobs: 20_000 }),
            latency: Some(LatencyArgs {
                rate: 500.0,
                secs: 10.0,
                threads: 4,
            }),
            memory: Some(MemoryArgs {
                jobs: 1_000_000,
                threads: 8,
            }),
            fairness: Some(fairness::FairnessArgs {
                samplers: 2,
                secs: 5.0,
                every_ms: 20,
                flat: vec![fairness::Flat::Enqueue, fairness::Flat::Drain],
                rescue_expired: 20_000,
            }),
            on_time: on_time::Plan::all(),
            periodic: Some(periodic::PeriodicArgs {
                processes: 4,
                schedules: 10,
                secs: 10.0,
                jobs: 2_000,
            }),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: a correctness gate failed (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> BoxResult<bool> {
    let mode = cli.mode.unwrap_or(Mode::Smoke);
    let smoke = matches!(mode, Mode::Smoke);
    let runs = cli.runs.unwrap_or(if smoke { 1 } else { 3 }).max(1);
    let plan = match mode {
        Mode::Smoke => Plan::smoke(),
        Mode::All => Plan::all(),
        Mode::Raw(a) => Plan {
            raw: Some(a),
            ..Plan::default()
        },
        Mode::Enqueue(a) => Plan {
            enqueue: Some(a),
            ..Plan::default()
        },
        Mode::LeaseDepth(a) => Plan {
            depth: Some(a),
            ..Plan::default()
        },
        Mode::Dependencies(a) => Plan {
            dependencies: Some(a),
            ..Plan::default()
        },
        Mode::BurnDown(a) => Plan {
            burn_down: Some(a),
            ..Plan::default()
        },
        Mode::Limits(a) => Plan {
            limits: Some(a),
            ..Plan::default()
        },
        Mode::Memory(a) => Plan {
            memory: Some(a),
            ..Plan::default()
        },
        Mode::Latency(a) => Plan {
            latency: Some(a),
            ..Plan::default()
        },
        Mode::Lateness(a) => on_time_plan(on_time::Plan {
            lateness: Some(a),
            ..Default::default()
        }),
        Mode::IdleCpu(a) => on_time_plan(on_time::Plan {
            idle_cpu: Some(a),
            ..Default::default()
        }),
        Mode::Wait(a) => on_time_plan(on_time::Plan {
            wait: Some(a),
            ..Default::default()
        }),
        Mode::LeaseUnrunnable(a) => on_time_plan(on_time::Plan {
            unrunnable: Some(a),
            ..Default::default()
        }),
        Mode::OnTime => on_time_plan(on_time::Plan::all()),
        Mode::Fairness(a) => Plan {
            fairness: Some(a),
            ..Plan::default()
        },
        Mode::FairChild(a) => {
            fairness::child(&a, cli.durability.list()[0])?;
            return Ok(true);
        }
        Mode::Periodic(a) => Plan {
            periodic: Some(a),
            ..Plan::default()
        },
        Mode::PeriodicChild(a) => {
            periodic::child(&a, cli.durability.list()[0])?;
            return Ok(true);
        }
        Mode::Schedule(a) => {
            on_time::schedule(&a, cli.durability.list()[0])?;
            return Ok(true);
        }
        Mode::Serve(a) => {
            on_time::serve(&a, cli.durability.list()[0])?;
            return Ok(true);
        }
        Mode::IdleChild(a) => {
            on_time::idle_child(&a, cli.durability.list()[0])?;
            return Ok(true);
        }
        Mode::Produce(a) => {
            let queue = db::open_queue(&a.db, cli.durability.list()[0])?;
            worker::produce(&queue, a.rate, a.secs)?;
            return Ok(true);
        }
        Mode::Prefill(a) => {
            db::prefill(&a.db, a.jobs)?;
            return Ok(true);
        }
        Mode::Server(a) => return server::run(&a, cli.runs, cli.out.as_deref()),
        Mode::ServerChild(a) => {
            server_worker::child(&a)?;
            return Ok(true);
        }
    };
    let temp = tempfile::tempdir()?;
    let dir = cli.dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let durabilities = cli.durability.list();
    let mut report = if smoke {
        Report::smoke()
    } else {
        Report::new()
    };

    // First, while this process has allocated nearly nothing, so its RSS is
    // the worker's. One run per durability: it drains a million jobs.
    if let Some(a) = &plan.memory {
        let b = worker::BurnDown {
            jobs: a.jobs,
            threads: a.threads,
            prefetch: 0,
            compare_raw: false,
        };
        for &d in &durabilities {
            worker::burn_down(&mut report, &dir, d, &b, 0)?;
        }
    }
    if let Some(a) = &plan.raw {
        let sizes = RawSizes {
            single: a.single,
            batched: a.batched,
        };
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                modes::raw(&mut report, &dir, d, &sizes)?;
            }
        }
    }
    if let Some(a) = &plan.enqueue {
        let sizes = EnqueueSizes {
            single: a.single,
            batched: a.batched,
        };
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                modes::enqueue(&mut report, &dir, d, &sizes, run)?;
            }
        }
    }
    if let Some(a) = &plan.depth {
        let depths = Depths {
            small: a.small,
            large: a.large,
            leases: a.leases,
        };
        let files = modes::prefill_depths(&dir, &depths)?;
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                modes::lease_depth(&mut report, &dir, d, &depths, &files)?;
            }
        }
        modes::lease_depth_gate(&mut report, &depths, &files)?;
    }
    if let Some(a) = &plan.burn_down {
        for &prefetch in &a.prefetch {
            let b = worker::BurnDown {
                jobs: a.jobs,
                threads: a.threads,
                prefetch,
                compare_raw: true,
            };
            for run in 0..runs {
                for &d in &rotate(&durabilities, run) {
                    worker::burn_down(&mut report, &dir, d, &b, run)?;
                }
            }
        }
    }
    if let Some(a) = &plan.limits {
        let l = limits::Limits {
            jobs: a.jobs,
            threads: a.threads,
        };
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                limits::limits(&mut report, &dir, d, &l, run)?;
            }
        }
    }
    if let Some(a) = &plan.dependencies {
        let f = flows::Flows { jobs: a.jobs };
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                flows::dependencies(&mut report, &dir, d, &f)?;
            }
        }
    }
    if let Some(a) = &plan.latency {
        let l = worker::Latency {
            rate: a.rate,
            secs: a.secs,
            threads: a.threads,
        };
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                worker::latency(&mut report, &dir, d, &l)?;
            }
        }
    }

    if let Some(a) = &plan.fairness {
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                fairness::run(&mut report, &dir, d, a)?;
                fairness::rescue(&mut report, &dir, d, a.rescue_expired)?;
            }
        }
    }

    on_time::run(&mut report, &dir, &durabilities, runs, &plan.on_time)?;

    if let Some(a) = &plan.periodic {
        for run in 0..runs {
            for &d in &rotate(&durabilities, run) {
                periodic::periodic(&mut report, &dir, d, a)?;
            }
        }
    }

    report.finish();
    if let Some(out) = &cli.out {
        write_outputs(&report, out, runs)?;
    }
    Ok(report.passed())
}

fn on_time_plan(on_time: on_time::Plan) -> Plan {
    Plan {
        on_time,
        ..Plan::default()
    }
}

/// The durabilities in a different order each run, so neither always goes first.
fn rotate(list: &[Durability], run: usize) -> Vec<Durability> {
    let mut v = list.to_vec();
    if !v.is_empty() {
        let k = run % v.len();
        v.rotate_left(k);
    }
    v
}

fn write_outputs(report: &Report, out: &Path, runs: usize) -> BoxResult<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.jsonl"), report.json_lines())?;
    std::fs::write(out.join("summary.md"), report.markdown())?;
    let subtitle = format!(
        "backlog examples/bench: SQLite {}, {} CPUs, medians of {runs} run(s); \
         blue = backlog, grey = raw rusqlite on the same schema and pragmas",
        rusqlite::version(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if let Some(svg) = chart::svg(report, &subtitle) {
        std::fs::write(out.join("chart.svg"), svg)?;
    }
    eprintln!(
        "wrote {}/{{results.jsonl,summary.md,chart.svg}}",
        out.display()
    );
    Ok(())
}
