//! The ceiling: plain rusqlite loops doing only the minimal SQL per job, on the
//! queue's own schema (the file is created and migrated by `Queue::open`) and
//! with the pragmas backlog sets, read back. Every write is `BEGIN IMMEDIATE`,
//! like backlog's, and every statement is prepared once.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use backlog::Durability;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, TransactionBehavior};

use crate::db::{now_micros, payload, Pragmas};

/// Every raw insert is due at once (`available_at` is now or earlier), so
/// it goes straight into the lease index, `due = 1`, as backlog's enqueue
/// puts it (schema V2). Without it the job would wait in
/// `backlog_jobs_scheduled` for a lease to promote it.
pub const INSERT: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, available_at, due, created_at, updated_at)
VALUES ('default', 'noop', ?1, ?2, 1, ?2, ?2)";

/// The lease, as backlog's minus the promotion of jobs that came due, the
/// paused-queue check and the kind filter: one walk of `backlog_jobs_lease`
/// in claim order (`AND due` lets it use that partial index; without it the
/// planner scans the table and sorts it), one update, the columns a handler
/// needs.
pub const LEASE: &str = "
UPDATE backlog_jobs
SET attempts = attempts + 1, lease_token = random(), lease_until = ?2, locked_by = 'raw'
WHERE id IN (SELECT id FROM backlog_jobs
             WHERE queue = 'default' AND lease_token IS NULL AND due AND available_at <= ?1
             ORDER BY priority DESC, available_at, id LIMIT ?3)
RETURNING id, lease_token, kind, payload";

pub const TO_HISTORY: &str = "
INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, status, processed_by, started_at,
     finished_at)
SELECT id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
       errors, cancel_requested, created_at, ?2, 'completed', locked_by, ?2, ?2
FROM backlog_jobs WHERE id = ?1";

pub const DELETE: &str = "DELETE FROM backlog_jobs WHERE id = ?1";

/// One raw connection with backlog's pragmas.
pub struct Raw {
    conn: Connection,
}

impl Raw {
    /// Opens an existing (migrated) queue file with the pragmas backlog sets
    /// for `durability`.
    pub fn open(path: &Path, durability: Durability) -> rusqlite::Result<Raw> {
        let conn = Connection::open(path)?;
        // As backlog's connections: without it every lease is re-prepared
        // (its `LIMIT ?` is rebound), see src/backend/sqlite/connection.rs.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}; PRAGMA foreign_keys = ON; \
             PRAGMA journal_size_limit = {};",
            durability.synchronous(),
            64 * 1024 * 1024
        ))?;
        Ok(Raw { conn })
    }

    /// The pragmas in force on this connection.
    pub fn pragmas(&self) -> rusqlite::Result<Pragmas> {
        Pragmas::read(&self.conn)
    }

    /// Inserts `count` jobs numbered from `first`, `batch` per transaction.
    pub fn insert(
        &mut self,
        first: usize,
        count: usize,
        batch: usize,
    ) -> rusqlite::Result<Duration> {
        let start = Instant::now();
        let mut n = first;
        let end = first + count;
        while n < end {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut insert = tx.prepare_cached(INSERT)?;
                let now = now_micros();
                for i in n..(n + batch).min(end) {
                    insert.execute(params![payload(i), now])?;
                }
            }
            tx.commit()?;
            n += batch;
        }
        Ok(start.elapsed())
    }

    /// Leases up to `batch` jobs in one transaction; returns `(id, payload)`.
    pub fn lease(&mut self, batch: usize) -> rusqlite::Result<Vec<(i64, String)>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let leased = {
            let mut lease = tx.prepare_cached(LEASE)?;
            let now = now_micros();
            let rows = lease.query_map(params![now, now + 30_000_000, batch as i64], |r| {
                // A handler would need the kind too; fetch it as it would.
                let _kind: String = r.get(2)?;
                Ok((r.get(0)?, r.get(3)?))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        };
        tx.commit()?;
        Ok(leased)
    }

    /// Completes the given jobs in one transaction: history row, then delete.
    pub fn complete(&mut self, jobs: &[(i64, String)]) -> rusqlite::Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut copy = tx.prepare_cached(TO_HISTORY)?;
            let mut delete = tx.prepare_cached(DELETE)?;
            let now = now_micros();
            for (id, _payload) in jobs {
                copy.execute(params![id, now])?;
                delete.execute([id])?;
            }
        }
        tx.commit()
    }

    /// Leases and completes `batch` at a time (two transactions per batch)
    /// until the queue is empty; returns the time taken and the jobs done.
    pub fn drain(&mut self, batch: usize) -> rusqlite::Result<(Duration, usize)> {
        let start = Instant::now();
        let mut done = 0;
        loop {
            let jobs = self.lease(batch)?;
            if jobs.is_empty() {
                return Ok((start.elapsed(), done));
            }
            self.complete(&jobs)?;
            done += jobs.len();
        }
    }
}

/// The latency ceiling in one process: a producer thread inserts one job per
/// commit at `rate` by the wall clock (payload: its due time) and rings a
/// channel; a consumer thread on its own connection wakes, leases up to 100,
/// notes each job's delay from its due time, and completes them. Returns the
/// delays in ms, in completion order.
pub fn open_loop(
    path: &Path,
    durability: Durability,
    rate: f64,
    secs: f64,
) -> Result<Vec<f64>, Box<dyn std::error::Error + Send + Sync>> {
    let count = (rate * secs).round() as usize;
    let (ring, doorbell) = crossbeam_channel::bounded::<()>(1);
    let consumer = {
        let path = path.to_path_buf();
        thread::spawn(move || -> rusqlite::Result<Vec<f64>> {
            let mut raw = Raw::open(&path, durability)?;
            let mut delays = Vec::with_capacity(count);
            let give_up = Instant::now() + Duration::from_secs_f64(secs + 30.0);
            while delays.len() < count && Instant::now() < give_up {
                let _ = doorbell.recv_timeout(Duration::from_millis(100));
                loop {
                    let jobs = raw.lease(100)?;
                    if jobs.is_empty() {
                        break;
                    }
                    let started = now_micros();
                    for (_, payload) in &jobs {
                        let due = serde_json::from_str::<serde_json::Value>(payload)
                            .ok()
                            .and_then(|v| v["t"].as_i64())
                            .unwrap_or(started);
                        delays.push((started - due) as f64 / 1000.0);
                    }
                    raw.complete(&jobs)?;
                }
            }
            Ok(delays)
        })
    };
    let mut raw = Raw::open(path, durability)?;
    let start = Instant::now();
    let start_us = now_micros();
    for i in 0..count {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        let tx = raw
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(INSERT)?.execute(params![
            format!("{{\"t\":{}}}", start_us + due.as_micros() as i64),
            now_micros()
        ])?;
        tx.commit()?;
        let _ = ring.try_send(());
    }
    let delays = consumer
        .join()
        .map_err(|_| "the raw consumer thread panicked")??;
    Ok(delays)
}
