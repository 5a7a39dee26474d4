//! Many nodes on one database, on every backend: worker processes and a
//! producer process share a queue, and each job's effect is committed with
//! its completion (`ctx.transaction`) exactly once, through SIGKILLs of
//! workers mid-transaction and a SIGSTOPped zombie whose late commit is
//! refused.
//!
//! The suites are long, so `#[ignore]`d: `.ci/run` runs them with the
//! servers' URLs set (`cargo test --all-features --test cluster --
//! --ignored`). Each prints one summary line (`cluster ...: lost=0 dup=0`).
//! Scale knobs: `BACKLOG_CLUSTER_JOBS` (default 10,000) and
//! `BACKLOG_CLUSTER_KILLS` (default 15).
//!
//! A child is this test binary re-run as `cluster_child` with
//! `BACKLOG_CLUSTER_ROLE` set and the database in the environment
//! ([`harness::Harness::child_env`]).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{NewJob, QueueOptions, Worker};
use serde_json::{json, Value};

use harness::{child_queue, Backend, Harness, TestResult};

const ROLE: &str = "BACKLOG_CLUSTER_ROLE";
const JOBS: &str = "BACKLOG_CLUSTER_PRODUCE";
const SLEEP_MS: &str = "BACKLOG_CLUSTER_SLEEP_MS";

/// Every lease of the suites: short, so rescues happen within seconds.
const LEASE_TTL: Duration = Duration::from_secs(2);

/// The children's entry point; without a role (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the cluster suites"]
fn cluster_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    let (queue, effects) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    match role.as_str() {
        "producer" => {
            let total: usize = std::env::var(JOBS)?.parse()?;
            let mut made = 0;
            while made < total {
                let n = (total - made).min(100);
                queue.enqueue_many((made..made + n).map(|i| NewJob::new("effect", json!(i))))?;
                made += n;
            }
            Ok(())
        }
        "worker" => {
            let sleep = Duration::from_millis(
                std::env::var(SLEEP_MS)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            );
            let slow_effects = effects.clone();
            let _worker = Worker::builder(queue)
                .concurrency(4)
                .lease_ttl(LEASE_TTL)
                .heartbeat_interval(Duration::from_millis(400))
                .rescue_interval(Duration::from_millis(500))
                .poll_interval(Duration::from_millis(200))
                .handle_raw("effect", move |_: Value, ctx| effects.write(ctx))
                .handle_raw("slow", move |_: Value, ctx| {
                    thread::sleep(sleep);
                    slow_effects.write(ctx)
                })
                .start()?;
            // Until the parent kills this process.
            loop {
                thread::sleep(Duration::from_secs(1));
            }
        }
        other => Err(format!("unknown role {other}").into()),
    }
}

/// Children of one scenario, SIGKILLed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(h: &Harness, role: &str, extra: &[(&str, String)]) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "cluster_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE, role)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env().into_iter().chain(extra.iter().cloned()) {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

fn signal(pid: u32, signal: libc::c_int) -> TestResult {
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn completed(h: &Harness) -> TestResult<i64> {
    h.count("SELECT count(*) FROM backlog_history WHERE status = 'completed'")
}

/// Waits until `n` jobs completed, or fails after `limit`.
fn wait_completed(h: &Harness, n: i64, limit: Duration) -> TestResult {
    let start = Instant::now();
    loop {
        let done = completed(h)?;
        if done >= n {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!("only {done} of {n} jobs completed in {limit:?}").into());
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// `(lost, dup)`: jobs without an effect, and effects beyond one per job.
fn lost_and_dup(h: &Harness, jobs: i64) -> TestResult<(i64, i64)> {
    let effects = h.count("SELECT count(*) FROM effects")?;
    let distinct = h.count("SELECT count(DISTINCT job_id) FROM effects")?;
    Ok((jobs - distinct, effects - distinct))
}

fn multi_node_work_commits_every_effect_exactly_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let jobs = knob("BACKLOG_CLUSTER_JOBS", 10_000);
    let start = Instant::now();
    let mut children = Children(Vec::new());
    for _ in 0..3 {
        children.0.push(spawn(&h, "worker", &[])?);
    }
    let mut producer = spawn(&h, "producer", &[(JOBS, jobs.to_string())])?;
    if !producer.wait()?.success() {
        return Err("the producer failed".into());
    }
    let jobs = i64::try_from(jobs)?;
    wait_completed(&h, jobs, Duration::from_secs(600))?;
    let secs = start.elapsed().as_secs_f64();
    drop(children);

    let (lost, dup) = lost_and_dup(&h, jobs)?;
    println!(
        "cluster multi-node ({b:?}): jobs={jobs} workers=3x4 secs={secs:.1} jobs_per_s={:.0} lost={lost} dup={dup}",
        jobs as f64 / secs
    );
    assert_eq!((lost, dup), (0, 0));
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(completed(&h)?, jobs);
    Ok(())
}

fn sigkilled_workers_lose_nothing_and_duplicate_no_effect(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let jobs = knob("BACKLOG_CLUSTER_JOBS", 10_000).min(2_000);
    let kills = knob("BACKLOG_CLUSTER_KILLS", 15);
    let mut workers = Children(Vec::new());
    for _ in 0..3 {
        workers.0.push(spawn(&h, "worker", &[])?);
    }
    let mut producer = spawn(&h, "producer", &[(JOBS, jobs.to_string())])?;
    if !producer.wait()?.success() {
        return Err("the producer failed".into());
    }
    let jobs = i64::try_from(jobs)?;
    for kill in 0..kills {
        thread::sleep(Duration::from_millis(300));
        let slot = kill % workers.0.len();
        let child = &mut workers.0[slot];
        child.kill()?; // SIGKILL, wherever it is: often inside a transaction
        child.wait()?;
        workers.0[slot] = spawn(&h, "worker", &[])?;
    }
    // The survivors rescue what the killed ones held, after the lease TTL.
    wait_completed(&h, jobs, Duration::from_secs(600))?;
    drop(workers);
    let (lost, dup) = lost_and_dup(&h, jobs)?;
    println!("cluster sigkill ({b:?}): jobs={jobs} kills={kills} lost={lost} dup={dup}");
    assert_eq!((lost, dup), (0, 0));
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn a_stopped_zombies_late_commit_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    // The zombie runs the job, and sleeps in its handler before committing.
    let zombie = Children(vec![spawn(&h, "worker", &[(SLEEP_MS, "3000".into())])?]);
    h.queue.enqueue(NewJob::new("slow", json!({})))?;
    let start = Instant::now();
    while h.count("SELECT count(*) FROM backlog_jobs WHERE lease_token IS NOT NULL")? == 0 {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("the zombie never leased the job".into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let pid = zombie.0[0].id();
    signal(pid, libc::SIGSTOP)?;
    // Its heartbeats stop; another node rescues the job after the TTL and
    // runs it to completion.
    let _rescuer = Children(vec![spawn(&h, "worker", &[])?]);
    wait_completed(&h, 1, Duration::from_secs(60))?;
    assert_eq!(h.count("SELECT count(*) FROM effects")?, 1);
    // The zombie wakes up, finishes its sleep and tries to commit.
    signal(pid, libc::SIGCONT)?;
    thread::sleep(Duration::from_secs(4));
    let effects = h.count("SELECT count(*) FROM effects")?;
    println!("cluster zombie ({b:?}): effects={effects} (1 expected: the late commit refused)");
    assert_eq!(effects, 1);
    assert_eq!(completed(&h)?, 1);
    Ok(())
}

fn wait_returns_a_job_run_by_another_process(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let _worker = Children(vec![spawn(&h, "worker", &[])?]);
    for i in 0..20 {
        let job = h.queue.enqueue(NewJob::new("effect", json!(i)))?;
        let record = h.queue.wait(job.id, Duration::from_secs(60))?;
        assert_eq!(
            record.state,
            backlog::JobState::Finished(backlog::FinalStatus::Completed)
        );
    }
    assert_eq!(h.count("SELECT count(*) FROM effects")?, 20);
    println!("cluster wait ({b:?}): jobs=20 waited for, each run by another process");
    Ok(())
}

/// The suites, `#[ignore]`d as long, one per backend.
macro_rules! long_suites {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            #[ignore = "long: the cluster suite"]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Sqlite.run(super::$name)
            })*
        }
        mod postgres {
            $(#[test]
            #[ignore = "long: the cluster suite"]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Postgres.run(super::$name)
            })*
        }
        mod mysql {
            $(#[test]
            #[ignore = "long: the cluster suite"]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Mysql.run(super::$name)
            })*
        }
    };
}

long_suites!(
    multi_node_work_commits_every_effect_exactly_once,
    sigkilled_workers_lose_nothing_and_duplicate_no_effect,
    a_stopped_zombies_late_commit_is_refused,
    wait_returns_a_job_run_by_another_process,
);
