//! Fixtures for the process-level reliability suites (worker chaos, zombie
//! worker, poison jobs, graceful shutdown): re-running this test binary as a
//! child worker, side files the children write their observations to, and
//! signals.
//!
//! A child is the same ignored test run with `--exact NAME --ignored`, with
//! [`ROLE_VAR`] naming its part and [`DB_VAR`] the database. Children report
//! through append-only text files next to the database: one `write` per line
//! on an `O_APPEND` file, so lines from many processes never interleave, and
//! a SIGKILL loses nothing already written (the page cache survives the
//! process).

#![allow(dead_code)]

use std::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;

/// What every test returns.
pub type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// The part a re-executed test binary plays, and its database.
pub const ROLE_VAR: &str = "BACKLOG_CHAOS_ROLE";
pub const DB_VAR: &str = "BACKLOG_CHAOS_DB";

/// The role this process plays, when it is a re-executed child.
pub fn child_role() -> Option<(String, PathBuf)> {
    let role = std::env::var(ROLE_VAR).ok()?;
    let db = std::env::var_os(DB_VAR)?;
    Some((role, PathBuf::from(db)))
}

/// This test binary, re-run as a child playing `role` in the ignored test
/// `test`. Its stdout (the harness's chatter) is dropped; its stderr is
/// inherited, so a child's panic shows in the parent's output.
pub fn spawn_child(test: &str, role: &str, db: &Path) -> TestResult<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .args(["--exact", test, "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE_VAR, role)
        .env(DB_VAR, db)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?)
}

/// Wall-clock unix microseconds: comparable across the processes of a test.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A plain connection for the tests' own tables and checks.
pub fn connect(db: &Path) -> TestResult<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// `PRAGMA integrity_check`'s verdict: `"ok"` for a sound file.
pub fn integrity(db: &Path) -> TestResult<String> {
    Ok(connect(db)?.query_row("PRAGMA integrity_check", [], |r| r.get(0))?)
}

/// A count from a one-value query.
pub fn count(conn: &Connection, sql: &str) -> TestResult<i64> {
    Ok(conn.query_row(sql, [], |r| r.get(0))?)
}

/// A scale knob: the environment variable's value, or `default`.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An append-only side file shared by the processes of a test.
#[derive(Debug)]
pub struct SideFile {
    file: File,
}

impl SideFile {
    pub fn open(path: &Path) -> TestResult<SideFile> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(SideFile { file })
    }

    /// Appends one line in one `write`.
    pub fn line(&self, text: impl AsRef<str>) -> std::io::Result<()> {
        let mut line = text.as_ref().to_owned();
        line.push('\n');
        (&self.file).write_all(line.as_bytes())
    }
}

/// The lines of a side file, each split on spaces; missing file, none.
pub fn read_side_file(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

/// Sends `signal` to the process `pid`.
pub fn send_signal(pid: u32, signal: libc::c_int) -> TestResult {
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// No core file when a child aborts on purpose.
pub fn disable_core_dumps() {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &none);
    }
}

/// Polls `done` every 20 ms until it is true, or fails after `within`.
pub fn wait_until(
    within: Duration,
    what: &str,
    mut done: impl FnMut() -> TestResult<bool>,
) -> TestResult {
    let deadline = Instant::now() + within;
    while !done()? {
        if Instant::now() > deadline {
            return Err(format!("timed out after {within:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Kills (SIGKILL) and reaps a child unless it has already exited.
pub fn kill_child(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Children killed when the test ends, whichever way it ends.
#[derive(Debug, Default)]
pub struct Reaper(pub Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                // A SIGKILLed stopped process dies too; continuing it first
                // just lets it go at once.
                let _ = send_signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
