//! Fixtures for the worker tests: a fresh database file each, waiting on
//! events with a timeout, and re-running this test binary as a child process.

#![allow(dead_code)]

use std::collections::HashMap;
use std::error::Error;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use backlog::{Event, JobRecord, JobState, Queue, QueueOptions};
use crossbeam_channel::Receiver;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

/// What every test returns.
pub type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// How long any wait in these tests may take before it is a failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The environment variable that tells a re-executed test binary which role
/// to play, and the one carrying the database path.
pub const ROLE_VAR: &str = "BACKLOG_WORKER_TEST_ROLE";
pub const DB_VAR: &str = "BACKLOG_WORKER_TEST_DB";

/// A fresh directory and a database path in it.
pub struct Db {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl Db {
    pub fn new() -> TestResult<Db> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("worker.db");
        Ok(Db { dir, path })
    }

    pub fn queue(&self) -> TestResult<Queue> {
        Ok(Queue::open(&self.path)?)
    }

    pub fn queue_with(&self, options: QueueOptions) -> TestResult<Queue> {
        Ok(options.open(&self.path)?)
    }

    /// A plain connection for the test's own tables and checks.
    pub fn connect(&self) -> TestResult<Connection> {
        let conn = Connection::open(&self.path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        Ok(conn)
    }
}

/// Reads events until one matches, or fails after `within`.
pub fn wait_for(
    events: &Receiver<Event>,
    within: Duration,
    what: &str,
    mut matches: impl FnMut(&Event) -> bool,
) -> TestResult<Event> {
    let deadline = Instant::now() + within;
    loop {
        match events.recv_deadline(deadline) {
            Ok(event) if matches(&event) => return Ok(event),
            Ok(_) => {}
            Err(_) => return Err(format!("timed out after {within:?} waiting for {what}").into()),
        }
    }
}

/// Reads events until `n` have matched; returns how many times each job id
/// matched.
pub fn wait_count(
    events: &Receiver<Event>,
    n: usize,
    within: Duration,
    what: &str,
    mut job_of: impl FnMut(&Event) -> Option<i64>,
) -> TestResult<HashMap<i64, usize>> {
    let deadline = Instant::now() + within;
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut total = 0;
    while total < n {
        match events.recv_deadline(deadline) {
            Ok(event) => {
                if let Some(id) = job_of(&event) {
                    *seen.entry(id).or_default() += 1;
                    total += 1;
                }
            }
            Err(_) => {
                return Err(format!("timed out after {within:?}: {total} of {n} {what}").into())
            }
        }
    }
    Ok(seen)
}

pub fn completed(event: &Event) -> Option<i64> {
    match event {
        Event::Completed { job_id } => Some(*job_id),
        _ => None,
    }
}

pub fn started(event: &Event) -> Option<i64> {
    match event {
        Event::Started { job_id, .. } => Some(*job_id),
        _ => None,
    }
}

/// Asserts a job's state and returns its record.
pub fn expect_state(queue: &Queue, id: i64, state: &str) -> TestResult<JobRecord> {
    let record = queue.get(id)?;
    if record.state != JobState::parse(state).ok_or("bad state name")? {
        return Err(format!(
            "job {id} is {}, expected {state}: {record:?}",
            record.state.as_str()
        )
        .into());
    }
    Ok(record)
}

/// The arguments most tests enqueue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Work {
    pub n: u32,
}

impl backlog::JobArgs for Work {
    const KIND: &'static str = "work";
}

/// This test binary, re-run as a child playing `role` in test `test_name`.
pub fn spawn_child(test_name: &str, role: &str, db: &Db) -> TestResult<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .args(["--exact", test_name, "--nocapture", "--test-threads", "1"])
        .env(ROLE_VAR, role)
        .env(DB_VAR, &db.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?)
}

/// The role this process plays, when it is a re-executed child.
pub fn child_role() -> Option<(String, PathBuf)> {
    let role = std::env::var(ROLE_VAR).ok()?;
    let path = std::env::var_os(DB_VAR)?;
    Some((role, PathBuf::from(path)))
}
