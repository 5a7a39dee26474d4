//! Database fixtures shared by every mode: fresh files on the queue's schema,
//! fast prefills, pragma read-back and the exactly-once gate.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use backlog::sqlite::QueueExt;
use backlog::{Durability, LeaseRequest, Queue, QueueOptions};
use rusqlite::{params, Connection};

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Unix microseconds, the unit backlog stores.
pub fn now_micros() -> i64 {
    micros(SystemTime::now())
}

/// A point in time as unix µs.
pub fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The payload of job `n`, as the raw loops write it: what
/// `json!({"n": n})` encodes to.
pub fn payload(n: usize) -> String {
    format!("{{\"n\":{n}}}")
}

pub fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Full => "Full",
        Durability::Fast => "Fast",
    }
}

/// A new, migrated queue file under `dir`.
pub fn fresh_db(dir: &Path, name: &str) -> BoxResult<PathBuf> {
    let path = dir.join(format!("{name}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    drop(Queue::open(&path)?);
    Ok(path)
}

pub fn open_queue(path: &Path, durability: Durability) -> BoxResult<Queue> {
    Ok(QueueOptions::new().durability(durability).open(path)?)
}

/// Inserts `count` available jobs in one raw transaction with
/// `synchronous=OFF`: setup only, never timed.
pub fn prefill(path: &Path, count: usize) -> BoxResult<()> {
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(crate::raw::INSERT)?;
        // Times in the past, in insertion order, so every job is available.
        let base = now_micros() - 3_600_000_000;
        for n in 0..count {
            insert.execute(params![payload(n), base + n as i64])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The pragmas in force on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pragmas {
    pub journal_mode: String,
    pub synchronous: i64,
}

impl Pragmas {
    pub fn read(conn: &Connection) -> rusqlite::Result<Pragmas> {
        Ok(Pragmas {
            journal_mode: conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?,
            synchronous: conn.pragma_query_value(None, "synchronous", |r| r.get(0))?,
        })
    }

    /// The pragmas of a queue: `journal_mode` is a property of the file (read
    /// from any connection), `synchronous` of the queue's own write connection.
    pub fn of_queue(queue: &Queue) -> BoxResult<Pragmas> {
        let conn = Connection::open(queue.path().ok_or("a SQLite queue")?)?;
        Ok(Pragmas {
            journal_mode: conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?,
            synchronous: queue.synchronous()?,
        })
    }

    pub fn synchronous_name(&self) -> &'static str {
        match self.synchronous {
            0 => "OFF",
            1 => "NORMAL",
            2 => "FULL",
            3 => "EXTRA",
            _ => "?",
        }
    }
}

/// The result of the exactly-once check on one database.
#[derive(Debug, Clone)]
pub struct Gate {
    pub ok: bool,
    pub detail: String,
}

/// Every one of the `expected` jobs completed exactly once: `expected`
/// completed history rows with distinct ids, each claimed once, and nothing
/// left live.
pub fn exactly_once(path: &Path, expected: usize) -> BoxResult<Gate> {
    let conn = Connection::open(path)?;
    let (completed, distinct, reclaimed): (i64, i64, i64) = conn.query_row(
        "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempts <> 1)
         FROM backlog_history WHERE status = 'completed'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let other: i64 = conn.query_row(
        "SELECT count(*) FROM backlog_history WHERE status <> 'completed'",
        [],
        |r| r.get(0),
    )?;
    let live: i64 = conn.query_row("SELECT count(*) FROM backlog_jobs", [], |r| r.get(0))?;
    let expected = expected as i64;
    let ok = completed == expected && distinct == expected && live == 0 && other == 0;
    Ok(Gate {
        ok,
        detail: format!(
            "expected {expected}: completed {completed}, distinct ids {distinct}, \
             claimed more than once {reclaimed}, other statuses {other}, still live {live}"
        ),
    })
}

/// Leases and completes everything left, through the public API (untimed: it
/// exists to feed the gate).
pub fn drain_queue(queue: &Queue) -> BoxResult<usize> {
    let request = LeaseRequest::new("drain", 1000);
    let mut done = 0;
    loop {
        let jobs = queue.lease(&request)?;
        if jobs.is_empty() {
            return Ok(done);
        }
        for result in queue.complete_many(&jobs)? {
            result?;
        }
        done += jobs.len();
    }
}
