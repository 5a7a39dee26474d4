//! Fixtures shared by the integration tests: a fresh database file per test, a
//! queue on a manual clock, and a separate raw connection to look at rows.

#![allow(dead_code)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use backlog::{Job, JobRecord, JobState, LeaseRequest, ManualClock, Queue, QueueOptions};
use rusqlite::Connection;
use tempfile::TempDir;

/// What every test returns.
pub type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// A fresh, empty directory holding one database file path (not created yet).
pub struct TestDb {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl TestDb {
    pub fn new() -> TestResult<TestDb> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("backlog.db");
        Ok(TestDb { dir, path })
    }
}

/// A queue on a fresh file, driven by a manual clock.
pub struct Harness {
    pub queue: Queue,
    pub clock: ManualClock,
    pub db: TestDb,
}

impl Harness {
    /// A queue with default options and a manual clock.
    pub fn new() -> TestResult<Harness> {
        Self::with(QueueOptions::new())
    }

    /// A queue with `options` (its clock replaced by a manual one).
    pub fn with(options: QueueOptions) -> TestResult<Harness> {
        let db = TestDb::new()?;
        // A round start time makes failing assertions easier to read.
        let clock = ManualClock::at(at(1_700_000_000_000_000));
        let queue = options.clock(clock.clone()).open(&db.path)?;
        Ok(Harness { queue, clock, db })
    }

    pub fn path(&self) -> &Path {
        &self.db.path
    }

    /// A second, independent queue handle on the same file and clock.
    pub fn second_handle(&self) -> TestResult<Queue> {
        Ok(QueueOptions::new()
            .clock(self.clock.clone())
            .open(&self.db.path)?)
    }

    /// A raw connection to the same file, outside the queue.
    pub fn raw(&self) -> TestResult<Connection> {
        raw(&self.db.path)
    }

    /// The clock's time as the database stores it, unix µs.
    pub fn now(&self) -> i64 {
        unix_micros(self.queue.now())
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Leases up to `n` jobs of the default queue as `worker`.
    pub fn lease(&self, worker: &str, n: usize) -> TestResult<Vec<Job>> {
        Ok(self.queue.lease(&LeaseRequest::new(worker, n))?)
    }

    /// Leases exactly one job of the default queue, failing the test otherwise.
    pub fn lease_one(&self, worker: &str) -> TestResult<Job> {
        let mut jobs = self.lease(worker, 1)?;
        match jobs.pop() {
            Some(job) => Ok(job),
            None => Err("expected a job to lease, found none".into()),
        }
    }

    pub fn state(&self, id: i64) -> TestResult<JobState> {
        Ok(self.queue.get(id)?.state)
    }

    pub fn record(&self, id: i64) -> TestResult<JobRecord> {
        Ok(self.queue.get(id)?)
    }

    pub fn live_rows(&self) -> TestResult<i64> {
        count(&self.raw()?, "SELECT count(*) FROM backlog_jobs")
    }

    pub fn history_rows(&self) -> TestResult<i64> {
        count(&self.raw()?, "SELECT count(*) FROM backlog_history")
    }
}

/// A raw connection to `path` that waits for the queue's locks.
pub fn raw(path: &Path) -> TestResult<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// The single integer `sql` returns.
pub fn count(conn: &Connection, sql: &str) -> TestResult<i64> {
    Ok(conn.query_row(sql, [], |r| r.get(0))?)
}

/// Microseconds in `d`.
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).expect("duration fits in i64 µs")
}

/// Creates the `effects` table a test's "handler" writes to.
pub fn create_effects_table(path: &Path) -> TestResult {
    raw(path)?
        .execute_batch("CREATE TABLE effects (job_id INTEGER NOT NULL, note TEXT NOT NULL)")?;
    Ok(())
}

/// How many effect rows a job has.
pub fn effects_of(path: &Path, job_id: i64) -> TestResult<i64> {
    Ok(raw(path)?.query_row(
        "SELECT count(*) FROM effects WHERE job_id = ?1",
        [job_id],
        |r| r.get(0),
    )?)
}

/// Unix µs as a point in time.
pub fn at(micros: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_micros(micros as u64)
}

/// A point in time as unix µs, as the database stores it.
pub fn unix_micros(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The name of the process's default SQLite VFS.
pub fn default_vfs() -> TestResult<String> {
    // SAFETY: thread-safe, and the default VFS (never null in a unix build)
    // has a NUL-terminated static name.
    unsafe {
        let vfs = rusqlite::ffi::sqlite3_vfs_find(std::ptr::null());
        if vfs.is_null() {
            return Err("no default VFS".into());
        }
        Ok(std::ffi::CStr::from_ptr((*vfs).zName)
            .to_string_lossy()
            .into_owned())
    }
}
