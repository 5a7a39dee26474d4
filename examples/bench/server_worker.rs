//! The server modes that run other processes: `burn-down` (1 or 3 worker
//! processes draining a prefilled queue, against the raw batched drain) and
//! `latency` (an open-loop producer process, a worker here, and the
//! enqueue→handler-start delay, against a raw producer and consumer).
//!
//! A child is this program re-run as `server-child` (its role in the
//! arguments, the URL in `BACKLOG_BENCH_CHILD_URL`, never in the process
//! list). It talks over its stdin and stdout, one word per line: it prints
//! `ready` once connected and waits for `go`, so no connection or migration
//! check is timed; a worker then prints `completed N` as its count grows and
//! `handled N` after `stop`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{Event, JobError, NewJob, QueueLimits, Worker};
use crossbeam_channel::{Receiver, Sender};
use serde_json::json;

use crate::db::{now_micros, BoxResult, Gate};
use crate::report::{percentile, Report, Target};
use crate::server::{fresh, gate, open_queue};
use crate::server_db::{open_raw, Dialect, Server, Target as Where};

/// Where a child finds its database's URL.
const URL_VAR: &str = "BACKLOG_BENCH_CHILD_URL";

/// What a child process does.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A backlog worker with a no-op handler.
    Worker,
    /// backlog's `enqueue`, open loop.
    Produce,
    /// The raw insert (and NOTIFY), open loop.
    RawProduce,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ChildArgs {
    #[arg(long, value_enum)]
    role: Role,
    /// The PostgreSQL schema of the namespace.
    #[arg(long)]
    schema: Option<String>,
    #[arg(long, default_value_t = 4)]
    threads: usize,
    #[arg(long, default_value_t = 0)]
    prefetch: usize,
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// How long each job's handler sleeps, in µs (the worker role).
    #[arg(long, default_value_t = 0)]
    job_us: u64,
    /// How much each job's sleep varies, in percent (see [`JobTime`]).
    #[arg(long, default_value_t = 0)]
    job_spread: u32,
}

// ---- the parent's side -------------------------------------------------------

/// A running child and the lines it prints, tagged with its index.
struct Children {
    procs: Vec<(Child, ChildStdin)>,
    lines: Receiver<(usize, String)>,
}

impl Children {
    /// Starts `count` children with `args`, and waits until each is ready.
    fn start(count: usize, target: &Where, args: &[String]) -> BoxResult<Children> {
        let (tx, lines) = crossbeam_channel::unbounded();
        let mut procs = Vec::with_capacity(count);
        for index in 0..count {
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("server-child").args(args).env(URL_VAR, &target.url);
            if let Some(schema) = &target.schema {
                cmd.arg("--schema").arg(schema);
            }
            let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
            let stdin = child.stdin.take().ok_or("child stdin")?;
            let stdout = child.stdout.take().ok_or("child stdout")?;
            forward(index, stdout, tx.clone());
            procs.push((child, stdin));
        }
        let children = Children { procs, lines };
        for _ in 0..count {
            children.expect("ready", Duration::from_secs(60))?;
        }
        Ok(children)
    }

    /// Writes `word` to every child.
    fn say(&mut self, word: &str) -> BoxResult<()> {
        for (_, stdin) in &mut self.procs {
            writeln!(stdin, "{word}")?;
            stdin.flush()?;
        }
        Ok(())
    }

    /// The next line that starts with `word`, with the number after it.
    fn expect(&self, word: &str, within: Duration) -> BoxResult<(usize, f64)> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (index, line) = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("no `{word}` from a child within {within:?}"))?;
            if let Some(rest) = line.strip_prefix(word) {
                return Ok((index, rest.trim().parse().unwrap_or(0.0)));
            }
        }
    }

    /// Waits for every child to exit successfully.
    fn wait(mut self) -> BoxResult<()> {
        for (mut child, stdin) in std::mem::take(&mut self.procs) {
            drop(stdin);
            let status = child.wait()?;
            if !status.success() {
                return Err(format!("a child failed: {status}").into());
            }
        }
        Ok(())
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        // Only on an error path: `wait` consumed them otherwise.
        for (child, _) in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends each line a child prints to `tx`.
fn forward(index: usize, stdout: std::process::ChildStdout, tx: Sender<(usize, String)>) {
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((index, line)).is_err() {
                break;
            }
        }
    });
}

/// What one burn-down measures.
pub struct BurnDown {
    pub jobs: usize,
    pub processes: usize,
    pub threads: usize,
    pub prefetch: usize,
    /// Set on the queue before the workers start.
    pub limits: QueueLimits,
    pub job: JobTime,
}

/// How long each job's handler sleeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobTime {
    /// In µs (0: no-op jobs).
    pub us: u64,
    /// Each job's time is drawn evenly from `us` ± this percent (0: all
    /// alike).
    pub spread_percent: u32,
}

impl JobTime {
    /// "10000 µs", or "10000 µs ± 50 %".
    pub fn describe(&self) -> String {
        match self.spread_percent {
            0 => format!("{} µs", self.us),
            p => format!("{} µs ± {p} %", self.us),
        }
    }

    /// One job's time.
    fn draw(&self) -> Duration {
        let base = Duration::from_micros(self.us);
        if self.spread_percent == 0 {
            return base;
        }
        let spread = f64::from(self.spread_percent) / 100.0;
        base.mul_f64(rand::random_range(1.0 - spread..=1.0 + spread))
    }
}

impl BurnDown {
    pub fn name(&self) -> String {
        let p = if self.processes == 1 {
            "process"
        } else {
            "processes"
        };
        let mut name = format!("{} {p} × {} threads", self.processes, self.threads);
        if self.prefetch > 0 {
            name.push_str(&format!(", prefetch {}", self.prefetch));
        }
        name.push_str(&format!(", {}k jobs", self.jobs / 1000));
        if self.job.us > 0 {
            name.push_str(&format!(" of {}", self.job.describe()));
        }
        if let Some(n) = self.limits.concurrency {
            name.push_str(&format!(", concurrency limit {n}"));
        }
        if let Some(rate) = self.limits.rate {
            name.push_str(&format!(", rate limit {rate}"));
        }
        name
    }
}

/// Drains `b.jobs` prefilled no-op jobs with `b.processes` worker processes;
/// the clock runs from `go` until the children's `Completed` events (sent
/// after each completion committed) add up to every job. Returns jobs/s.
pub fn burn_down(
    report: &mut Report,
    server: &Server,
    label: &str,
    b: &BurnDown,
) -> BoxResult<f64> {
    let ns = fresh(server, "burn")?;
    let mut raw = ns.raw()?;
    raw.prefill(b.jobs)?;
    raw.analyze()?;
    if !b.limits.is_unlimited() {
        open_queue(&ns.target()?)?.set_limits("default", b.limits)?;
    }
    let args = [
        "--role",
        "worker",
        "--threads",
        &b.threads.to_string(),
        "--prefetch",
        &b.prefetch.to_string(),
        "--job-us",
        &b.job.us.to_string(),
        "--job-spread",
        &b.job.spread_percent.to_string(),
    ]
    .map(String::from);
    let mut children = Children::start(b.processes, &ns.target()?, &args)?;
    let start = Instant::now();
    children.say("go")?;
    let mut completed = vec![0usize; b.processes];
    while completed.iter().sum::<usize>() < b.jobs {
        let (index, n) = children.expect("completed", Duration::from_secs(300))?;
        completed[index] = n as usize;
    }
    let took = start.elapsed();
    children.say("stop")?;
    let mut handled = 0.0;
    for _ in 0..b.processes {
        handled += children.expect("handled", Duration::from_secs(60))?.1;
    }
    children.wait()?;
    let rate = b.jobs as f64 / took.as_secs_f64();
    let name = b.name();
    report.value(
        "burn-down",
        label,
        &format!("backlog, {name}"),
        "jobs/s",
        rate,
    );
    report.gate(
        "burn-down",
        label,
        &format!("backlog, {name}: handlers"),
        Gate {
            ok: handled as usize == b.jobs,
            detail: format!("handlers ran {handled} times for {} jobs", b.jobs),
        },
    );
    report.gate(
        "burn-down",
        label,
        &format!("backlog, {name}: history"),
        gate(raw.counts()?.exactly_once(b.jobs)),
    );
    Ok(rate)
}

/// The raw batched drain on `connections` connections at once (threads of
/// this process: the driver's share of the work is small): claim `batch`,
/// move them to history, commit, until none is left. Returns jobs/s.
pub fn raw_drain(
    report: &mut Report,
    server: &Server,
    label: &str,
    jobs: usize,
    batch: usize,
    connections: usize,
) -> BoxResult<f64> {
    let ns = fresh(server, "drain")?;
    let mut raw = ns.raw()?;
    raw.prefill(jobs)?;
    raw.analyze()?;
    let target = ns.target()?;
    let mut drainers = Vec::with_capacity(connections);
    for _ in 0..connections {
        drainers.push(open_raw(server.dialect, &target)?);
    }
    let start = Instant::now();
    let threads: Vec<_> = drainers
        .into_iter()
        .map(|mut r| {
            thread::spawn(move || -> BoxResult<(usize, u64)> {
                let (_, done) = crate::server_db::drain(r.as_mut(), batch)?;
                Ok((done, r.retries()))
            })
        })
        .collect();
    let (mut done, mut retries) = (0, 0);
    for t in threads {
        let (n, r) = t.join().map_err(|_| "a drain thread panicked")??;
        done += n;
        retries += r;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    let conns = if connections == 1 {
        "1 connection".to_owned()
    } else {
        format!("{connections} connections")
    };
    let name = format!("raw drain, batch {batch}, {conns}");
    report.value("burn-down", label, &name, "jobs/s", rate);
    if server.dialect == Dialect::Mysql {
        let retried = format!("{name}: deadlocks retried");
        report.value("burn-down", label, &retried, "", retries as f64);
    }
    report.gate(
        "burn-down",
        label,
        &name,
        gate(raw.counts()?.exactly_once(jobs)),
    );
    Ok(rate)
}

/// The open loop of the latency mode.
pub struct Latency {
    pub rate: f64,
    pub secs: f64,
    /// Handler threads of the worker.
    pub threads: usize,
    /// Producer threads, each enqueueing every n-th job, so that one slow
    /// commit (an fsync) does not hold back the jobs due after it.
    pub producers: usize,
    /// The worker's prefetch (0: the default worker).
    pub prefetch: usize,
}

impl Latency {
    fn count(&self) -> usize {
        (self.rate * self.secs).round() as usize
    }

    fn child_args(&self, role: &str) -> Vec<String> {
        [
            "--role",
            role,
            "--rate",
            &self.rate.to_string(),
            "--secs",
            &self.secs.to_string(),
            "--threads",
            &self.producers.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }
}

/// One job's delays, ms: from the time it was due (the open loop's clock,
/// so time spent waiting for the producer counts) and from the moment its
/// enqueue was called.
type Delay = (f64, f64);

/// The payload of a latency job: when it was due and when its enqueue was
/// called, unix µs.
fn latency_payload(due: i64, called: i64) -> serde_json::Value {
    json!({ "t": due, "s": called })
}

fn delay_of(payload: &serde_json::Value, started: i64) -> Delay {
    let due = payload["t"].as_i64().unwrap_or(started);
    let called = payload["s"].as_i64().unwrap_or(started);
    (
        (started - due) as f64 / 1000.0,
        (started - called) as f64 / 1000.0,
    )
}

/// The raw consumer's poll interval on MySQL, which has no notifications:
/// the plain poll a user would write, the yardstick of backlog's adaptive
/// probe.
const RAW_POLL: Duration = Duration::from_millis(10);

/// backlog: a worker here, the producer in another process.
pub fn latency(report: &mut Report, server: &Server, label: &str, l: &Latency) -> BoxResult<()> {
    let count = l.count();
    let ns = fresh(server, "latency")?;
    let queue = open_queue(&ns.target()?)?;
    let delays: Arc<Mutex<Vec<Delay>>> = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let mut children = Children::start(1, &ns.target()?, &l.child_args("produce"))?;
    let worker = {
        let delays = delays.clone();
        crate::worker::tuned(Worker::builder(queue.clone()), l.prefetch)
            .concurrency(l.threads)
            .handle_raw("noop", move |payload, _ctx| {
                let delay = delay_of(&payload, now_micros());
                delays.lock().unwrap_or_else(|p| p.into_inner()).push(delay);
                Ok::<(), JobError>(())
            })
            .start()?
    };
    children.say("go")?;
    let produced_in = children
        .expect("produced", Duration::from_secs_f64(l.secs + 120.0))?
        .1;
    children.wait()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while delays.lock().unwrap_or_else(|p| p.into_inner()).len() < count
        && Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(10));
    }
    worker.shutdown(Duration::from_secs(10))?;
    drop(queue);
    let delays = delays.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let side = match l.prefetch {
        0 => "backlog".to_owned(),
        n => format!("backlog, prefetch {n}"),
    };
    record_delays(report, server, label, &side, l, &delays, produced_in);
    let counts = ns.raw()?.counts()?;
    report.gate("latency", label, &side, gate(counts.exactly_once(count)));
    Ok(())
}

/// The ceiling: a raw producer process and a raw consumer here
/// (PostgreSQL: `LISTEN`, woken by the producer's `NOTIFY`; MySQL: a 10 ms
/// poll, [`RAW_POLL`]) that claims and finishes up to 100 jobs per commit.
pub fn latency_raw(
    report: &mut Report,
    server: &Server,
    label: &str,
    l: &Latency,
) -> BoxResult<()> {
    let count = l.count();
    let ns = fresh(server, "latency_raw")?;
    let mut consumer = ns.raw()?;
    consumer.listen()?;
    let mut children = Children::start(1, &ns.target()?, &l.child_args("raw-produce"))?;
    children.say("go")?;
    let mut delays = Vec::with_capacity(count);
    let give_up = Instant::now() + Duration::from_secs_f64(l.secs + 60.0);
    while delays.len() < count && Instant::now() < give_up {
        consumer.wait(match server.dialect {
            Dialect::Postgres => Duration::from_millis(100),
            Dialect::Mysql => RAW_POLL,
        })?;
        loop {
            let jobs = consumer.claim_and_finish(100)?;
            if jobs.is_empty() {
                break;
            }
            let started = now_micros();
            for (_, payload) in &jobs {
                let value = serde_json::from_str(payload).unwrap_or_default();
                delays.push(delay_of(&value, started));
            }
        }
    }
    let produced_in = children.expect("produced", Duration::from_secs(60))?.1;
    children.wait()?;
    record_delays(report, server, label, "raw", l, &delays, produced_in);
    let counts = consumer.counts()?;
    report.gate("latency", label, "raw", gate(counts.exactly_once(count)));
    report.value(
        "latency",
        label,
        "load average (1 min) after the run",
        "",
        crate::worker::load_average(),
    );
    Ok(())
}

fn record_delays(
    report: &mut Report,
    server: &Server,
    label: &str,
    side: &str,
    l: &Latency,
    delays: &[Delay],
    produced_in: f64,
) {
    let wake = match (side, server.dialect) {
        ("raw", Dialect::Postgres) => ", LISTEN",
        ("raw", Dialect::Mysql) => ", 10 ms poll",
        _ => "",
    };
    report.value(
        "latency",
        label,
        &format!("{side}, {} jobs/s: producer's achieved rate", l.rate),
        "jobs/s",
        delays.len().max(l.count()) as f64 / produced_in.max(1e-9),
    );
    for (from, pick) in [("from due time", 0usize), ("from the enqueue call", 1usize)] {
        let mut sorted: Vec<f64> = delays
            .iter()
            .map(|d| if pick == 0 { d.0 } else { d.1 })
            .collect();
        sorted.sort_by(f64::total_cmp);
        for (p_name, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0)] {
            let name = format!("{side}{wake}, {} jobs/s, {from}: {p_name}", l.rate);
            let value = percentile(&sorted, p);
            // The targets (issue 20): p99 pickup at 500 jobs/s as a user
            // sees it (from the enqueue call), 5 ms with LISTEN/NOTIFY, 15 ms
            // with MySQL's probe (a raw 10 ms poll gives about 10.5 ms).
            let bound = match server.dialect {
                Dialect::Postgres => 5.0,
                Dialect::Mysql => 15.0,
            };
            if side.starts_with("backlog") && l.rate >= 500.0 && pick == 1 && p_name == "p99" {
                report.target("latency", label, &name, "ms", value, Target::AtMost(bound));
            } else {
                report.value("latency", label, &name, "ms", value);
            }
        }
    }
}

// ---- the child's side --------------------------------------------------------

/// A child's entry point: see the module doc.
pub fn child(args: &ChildArgs) -> BoxResult<()> {
    let target = Where {
        url: std::env::var(URL_VAR)?,
        schema: args.schema.clone(),
    };
    let words = stdin_words();
    match args.role {
        Role::Worker => child_worker(&target, args, &words),
        Role::Produce => {
            let queue = open_queue(&target)?;
            println!("ready");
            wait_for(&words, "go")?;
            let took = open_loop(args, move |_| {
                let queue = queue.clone();
                Ok(move |due, called| -> BoxResult<()> {
                    queue.enqueue(NewJob::new("noop", latency_payload(due, called)))?;
                    Ok(())
                })
            })?;
            println!("produced {}", took.as_secs_f64());
            Ok(())
        }
        Role::RawProduce => {
            let dialect = Dialect::of_url(&target.url)?;
            let mut conns = Vec::with_capacity(args.threads);
            for _ in 0..args.threads {
                conns.push(Mutex::new(Some(open_raw(dialect, &target)?)));
            }
            println!("ready");
            wait_for(&words, "go")?;
            let took = open_loop(args, move |k| {
                let mut raw = conns[k]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .ok_or("a connection per thread")?;
                Ok(move |due, called| -> BoxResult<()> {
                    raw.produce(&latency_payload(due, called).to_string())
                })
            })?;
            println!("produced {}", took.as_secs_f64());
            Ok(())
        }
    }
}

/// The open loop: job `i` is due at `start + i / rate` by the wall clock and
/// is enqueued by thread `i % threads`, which catches up instead of slowing
/// down when it is late. `make(k)` builds thread `k`'s enqueue. Returns how
/// long producing took.
fn open_loop<M, F>(args: &ChildArgs, make: M) -> BoxResult<Duration>
where
    M: Fn(usize) -> BoxResult<F> + Send + Sync + 'static,
    F: FnMut(i64, i64) -> BoxResult<()> + Send + 'static,
{
    let count = (args.rate * args.secs).round() as usize;
    let threads = args.threads.max(1);
    let rate = args.rate;
    let start = Instant::now();
    let start_us = now_micros();
    let make = Arc::new(make);
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let make = make.clone();
            thread::spawn(move || -> BoxResult<()> {
                let mut enqueue = make(k)?;
                for i in (k..count).step_by(threads) {
                    let due = Duration::from_secs_f64(i as f64 / rate);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        thread::sleep(wait);
                    }
                    enqueue(start_us + due.as_micros() as i64, now_micros())?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "a producer thread panicked")??;
    }
    Ok(start.elapsed())
}

fn child_worker(target: &Where, args: &ChildArgs, words: &Receiver<String>) -> BoxResult<()> {
    let queue = open_queue(target)?;
    let events = queue.subscribe();
    println!("ready");
    wait_for(words, "go")?;
    let handled = Arc::new(AtomicU64::new(0));
    let work = JobTime {
        us: args.job_us,
        spread_percent: args.job_spread,
    };
    let worker = {
        let handled = handled.clone();
        crate::worker::tuned(Worker::builder(queue.clone()), args.prefetch)
            .concurrency(args.threads)
            .handle_raw("noop", move |_payload, _ctx| {
                if work.us > 0 {
                    thread::sleep(work.draw());
                }
                handled.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            })
            .start()?
    };
    let mut completed = 0u64;
    let mut told = 0u64;
    loop {
        // Taken every 2 ms rather than received one at a time: a receive
        // parks this thread between events, and every event (three a job:
        // leased, started, completed) then paid a wake-up of it, on the same
        // two cores as the worker it measures (a fifth of a worker process's
        // CPU in a profile). 2 ms of events fit the subscription's 4,096.
        thread::sleep(Duration::from_millis(2));
        completed += events
            .try_iter()
            .filter(|e| matches!(e, Event::Completed { .. }))
            .count() as u64;
        if completed != told {
            println!("completed {completed}");
            told = completed;
        }
        if words.try_recv().is_ok_and(|w| w == "stop") {
            break;
        }
    }
    drop(events);
    worker.shutdown(Duration::from_secs(10))?;
    println!("handled {}", handled.load(Ordering::Relaxed));
    Ok(())
}

/// The words the parent writes to this child's stdin, one per line.
fn stdin_words() -> Receiver<String> {
    let (tx, rx) = crossbeam_channel::unbounded();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_owned()).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for(words: &Receiver<String>, word: &str) -> BoxResult<()> {
    loop {
        let got = words
            .recv()
            .map_err(|_| format!("the parent closed stdin before `{word}`"))?;
        if got == word {
            return Ok(());
        }
    }
}
