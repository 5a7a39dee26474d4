//! Grouped jobs across processes, on every backend: several processes
//! enqueue into the same groups while running workers with a group handler,
//! so every process combines groups at once. Every member must end in
//! exactly one combined job (none lost, none in two), and every combined
//! job must complete.
//!
//! With the `failpoints` feature, a second scenario (SQLite) aborts a
//! process inside the combination's transaction, between its writes and its
//! commit, and checks that the others lose and duplicate nothing.
//!
//! A child is this test binary re-run as `group_child` with
//! `BACKLOG_GROUPS_ROLE` set and the database in the environment
//! ([`harness::Harness::child_env`]). Size knob: `BACKLOG_GROUPS_MEMBERS`
//! per process (default 300).

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{
    FinalStatus, Group, JobArgs, JobFilter, JobRecord, JobState, NewJob, Queue, QueueOptions,
    Worker,
};
use serde::{Deserialize, Serialize};

use harness::{child_queue, Backend, Children, Harness, TestResult};

const ROLE: &str = "BACKLOG_GROUPS_ROLE";
const MEMBERS: &str = "BACKLOG_GROUPS_MEMBERS";
const FIRST: &str = "BACKLOG_GROUPS_FIRST";
const GROUPS: usize = 7;

#[derive(Debug, Serialize, Deserialize)]
struct Member {
    n: usize,
}

impl JobArgs for Member {
    const KIND: &'static str = "member";
}

fn policy(key: String) -> Group {
    Group::new(key)
        .max_size(5)
        .grace(Duration::from_millis(150))
        .max_delay(Duration::from_millis(600))
}

/// The children's entry point; without a role (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the group suites"]
fn group_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    let _worker = Worker::builder(queue.clone())
        .concurrency(2)
        .lease_ttl(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(200))
        .handle_group(|members: Vec<Member>, _ctx| {
            if members.is_empty() || members.len() > 5 {
                return Err(format!("a group of {} members", members.len()).into());
            }
            Ok(())
        })
        .start()?;
    if role == "producer" {
        let first: usize = std::env::var(FIRST)?.parse()?;
        let count: usize = std::env::var(MEMBERS)?.parse()?;
        for n in first..first + count {
            let job = NewJob::from_args(&Member { n })?.group(policy(format!("g{}", n % GROUPS)));
            queue.enqueue(job)?;
            if n % 10 == 0 {
                thread::sleep(Duration::from_millis(5));
            }
        }
    }
    // Until the parent kills this process.
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

fn spawn(h: &Harness, extra: &[(&str, String)]) -> TestResult<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["--exact", "group_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in h.child_env().into_iter().chain(extra.iter().cloned()) {
        command.env(k, v);
    }
    Ok(command.spawn()?)
}

fn all(queue: &Queue, state: JobState) -> TestResult<Vec<JobRecord>> {
    let mut out = Vec::new();
    let mut filter = JobFilter::new(state).limit(500);
    loop {
        let page = queue.list(&filter)?;
        out.extend(page.jobs);
        match page.next_after {
            Some(after) => filter = filter.after(after),
            None => return Ok(out),
        }
    }
}

/// Waits until `total` members are aggregated and nothing is live or
/// waiting; fails after `limit`.
fn wait_settled(h: &Harness, total: usize, limit: Duration) -> TestResult {
    let start = Instant::now();
    loop {
        let aggregated = all(&h.queue, JobState::AGGREGATED)?.len();
        let waiting = all(&h.queue, JobState::Grouped)?.len();
        if aggregated >= total && waiting == 0 && h.live_rows()? == 0 {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "after {limit:?}: {aggregated} of {total} aggregated, {waiting} waiting, {} live",
                h.live_rows()?
            )
            .into());
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Checks that every member went into exactly one completed job that holds
/// its arguments; returns (members, combined jobs, largest combination).
fn check_exactly_once(h: &Harness, total: usize) -> TestResult<(usize, usize, usize)> {
    let members = all(&h.queue, JobState::AGGREGATED)?;
    assert_eq!(members.len(), total, "aggregated members");
    let combined = all(&h.queue, JobState::Finished(FinalStatus::Completed))?;
    // n -> the jobs whose payload holds it.
    let mut holders: HashMap<usize, Vec<i64>> = HashMap::new();
    let mut largest = 0;
    for job in &combined {
        let args: Vec<Member> = job.args()?;
        largest = largest.max(args.len());
        for m in args {
            holders.entry(m.n).or_default().push(job.id);
        }
    }
    for member in &members {
        let n = member.args::<Member>()?.n;
        let into = member.aggregated_into.ok_or("aggregated without a job")?;
        assert_eq!(
            holders.get(&n).map(Vec::as_slice),
            Some(&[into][..]),
            "member {} (n = {n}) must be in exactly the job it points to",
            member.id
        );
    }
    assert_eq!(
        holders.len(),
        total,
        "every n in exactly one job, none extra"
    );
    Ok((members.len(), combined.len(), largest))
}

fn processes_enqueueing_and_combining_at_once_put_every_member_in_exactly_one_job(
    b: &Backend,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let per = std::env::var(MEMBERS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let start = Instant::now();
    let mut children = Children(Vec::new());
    for p in 0..3 {
        children.0.push(spawn(
            &h,
            &[
                (ROLE, "producer".into()),
                (FIRST, (p * per).to_string()),
                (MEMBERS, per.to_string()),
            ],
        )?);
    }
    let total = 3 * per;
    wait_settled(&h, total, Duration::from_secs(300))?;
    let secs = start.elapsed().as_secs_f64();
    drop(children);
    let (members, jobs, largest) = check_exactly_once(&h, total)?;
    println!(
        "groups multi-process ({b:?}): processes=3 members={members} groups={GROUPS} \
         combined_jobs={jobs} largest={largest} lost=0 dup=0 secs={secs:.1}"
    );
    Ok(())
}

conformance!(processes_enqueueing_and_combining_at_once_put_every_member_in_exactly_one_job);

/// SQLite only: the failpoint sits in SQLite's combination transaction (the
/// servers' transactions are the database's own; a killed connection rolls
/// back there too, which `tests/cluster.rs` covers for settles).
#[cfg(feature = "failpoints")]
#[test]
fn a_process_aborted_mid_combination_loses_and_duplicates_no_member() -> TestResult {
    use std::os::unix::process::ExitStatusExt;

    let h = Backend::Sqlite.harness_on_real_time(QueueOptions::new())?;
    let total = 200;
    for n in 0..total {
        h.queue
            .enqueue(NewJob::from_args(&Member { n })?.group(policy(format!("g{}", n % GROUPS))))?;
    }
    let mut aborts = 0;
    for nth in 1..=3 {
        // A worker that aborts at its nth combination, after the writes and
        // before the commit.
        let mut child = spawn(
            &h,
            &[
                (ROLE, "worker".into()),
                (
                    "BACKLOG_FAILPOINT",
                    format!("aggregate-before-commit:{nth}"),
                ),
            ],
        )?;
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                return Err("the armed worker never reached its failpoint".into());
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            status.signal(),
            Some(libc::SIGABRT),
            "aborted at the failpoint"
        );
        aborts += 1;
    }
    let integrity: String = rusqlite_integrity(&h)?;
    assert_eq!(integrity, "ok");
    let clean = Children(vec![
        spawn(&h, &[(ROLE, "worker".into())])?,
        spawn(&h, &[(ROLE, "worker".into())])?,
    ]);
    wait_settled(&h, total, Duration::from_secs(120))?;
    drop(clean);
    let (members, jobs, largest) = check_exactly_once(&h, total)?;
    println!(
        "groups abort mid-combination (Sqlite): aborts={aborts} members={members} \
         combined_jobs={jobs} largest={largest} lost=0 dup=0 integrity={integrity}"
    );
    Ok(())
}

/// `PRAGMA integrity_check` of the scenario's SQLite file.
#[cfg(feature = "failpoints")]
fn rusqlite_integrity(h: &Harness) -> TestResult<String> {
    let target = h
        .child_env()
        .into_iter()
        .find(|(k, _)| k.ends_with("TARGET"))
        .map(|(_, v)| v)
        .ok_or("no target")?;
    let path = target.trim_start_matches("sqlite:");
    let conn = backlog::sqlite::rusqlite::Connection::open(path)?;
    Ok(conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
}
