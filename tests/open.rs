//! Opening a queue: the file's mode, the pragmas in force, migrations, and
//! jobs surviving a reopen.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use backlog::sqlite::QueueExt;
use backlog::{Durability, NewJob, Queue, QueueOptions};
use common::{count, raw, Harness, TestDb, TestResult};
use serde_json::json;

#[cfg(unix)]
#[test]
fn database_file_and_its_wal_and_shm_are_created_with_mode_0600() -> TestResult {
    use std::os::unix::fs::PermissionsExt;

    let h = Harness::new()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", h.path().display());
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path} has mode {mode:o}");
    }
    Ok(())
}

#[test]
fn default_queue_runs_wal_with_synchronous_full() -> TestResult {
    let h = Harness::new()?;
    let mode: String = h
        .raw()?
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    assert_eq!(h.queue.synchronous()?, 2);
    assert_eq!(Durability::default(), Durability::Full);
    Ok(())
}

#[test]
fn fast_durability_runs_wal_with_synchronous_normal() -> TestResult {
    let h = Harness::with(QueueOptions::new().durability(Durability::Fast))?;
    let mode: String = h
        .raw()?
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    assert_eq!(h.queue.synchronous()?, 1);
    // And it works as a queue.
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    assert_eq!(job.id, enqueued.id);
    h.queue.complete(&job, None)?;
    assert_eq!(h.history_rows()?, 1);
    Ok(())
}

#[test]
fn jobs_survive_closing_and_reopening_the_queue() -> TestResult {
    let db = TestDb::new()?;
    let id = {
        let queue = Queue::open(&db.path)?;
        queue.enqueue(NewJob::new("k", json!({"keep": true})))?.id
    };
    let queue = Queue::open(&db.path)?;
    let job = queue
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("the job did not survive the reopen")?;
    assert_eq!(job.id, id);
    assert_eq!(job.payload_value()?, json!({"keep": true}));
    Ok(())
}

#[test]
fn opening_without_migrating_leaves_the_schema_to_migrate() -> TestResult {
    let db = TestDb::new()?;
    let queue = QueueOptions::new().migrate(false).open(&db.path)?;
    let tables = |conn: &rusqlite::Connection| {
        count(
            conn,
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'backlog%'",
        )
    };
    assert_eq!(tables(&raw(&db.path)?)?, 0);
    queue.migrate()?;
    // jobs, history, queues, groups, group members, schedules, workers,
    // pending, dependencies, workflows, workflow steps, batches, batch
    // members, finished counts, sequences, sequenced jobs' keys, and the
    // migrations' own backlog_schema_history.
    assert_eq!(tables(&raw(&db.path)?)?, 17);
    queue.enqueue(NewJob::new("k", json!(1)))?;
    // Migrating again is a no-op.
    queue.migrate()?;
    assert_eq!(
        count(&raw(&db.path)?, "SELECT count(*) FROM backlog_jobs")?,
        1
    );
    Ok(())
}

#[test]
fn several_handles_opening_a_fresh_file_at_once_all_succeed() -> TestResult {
    let db = TestDb::new()?;
    const HANDLES: usize = 4;
    let barrier = Arc::new(Barrier::new(HANDLES));
    let threads: Vec<_> = (0..HANDLES)
        .map(|i| {
            let path = db.path.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || -> backlog::Result<i64> {
                barrier.wait();
                let queue = Queue::open(&path)?;
                Ok(queue.enqueue(NewJob::new("k", json!(i)))?.id)
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "open thread panicked")??;
    }
    assert_eq!(
        count(&raw(&db.path)?, "SELECT count(*) FROM backlog_jobs")?,
        HANDLES as i64
    );
    Ok(())
}
