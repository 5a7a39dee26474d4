//! `backlog::sqlite::make_default_vfs`: the application asks for backlog's
//! shim VFS for every connection it opens afterwards, whatever opens them
//! (here a plain `rusqlite::Connection::open`), and a queue call inside
//! their write transactions answers `InsideTransaction` at once. Connections
//! opened before the call keep the VFS they were opened with, and are
//! waited for, bounded by the write deadline.
//!
//! A binary of its own: the default VFS is the whole process's, and the
//! other SQLite tests check that a queue leaves it alone. SQLite only and
//! unix only, as the shim (`src/backend/sqlite/write_path/vfs.rs`).

#![cfg(unix)]

mod common;

use std::time::{Duration, Instant};

use backlog::{Error, NewJob, QueueOptions};
use common::{default_vfs, Harness, TestResult};
use rusqlite::Connection;
use serde_json::json;

fn locked(path: &std::path::Path) -> TestResult<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY);
         BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;",
    )?;
    Ok(conn)
}

#[test]
fn after_make_default_vfs_plain_connections_opened_later_answer_inside_transaction() -> TestResult {
    let deadline = Duration::from_millis(300);
    let h = Harness::with(
        QueueOptions::new()
            .busy_timeout(Duration::from_millis(50))
            .write_deadline(deadline),
    )?;
    assert_eq!(default_vfs()?, "unix", "the queue changed the default VFS");
    let before = Connection::open(h.path())?;

    assert!(backlog::sqlite::make_default_vfs());
    assert_eq!(default_vfs()?, "backlog");
    // Idempotent.
    assert!(backlog::sqlite::make_default_vfs());

    // Opened after the call: seen, refused at once.
    let app = locked(h.path())?;
    let start = Instant::now();
    let refused = h.queue.enqueue(NewJob::new("k", json!(1)));
    assert!(
        matches!(refused, Err(Error::InsideTransaction)),
        "{refused:?}"
    );
    assert!(start.elapsed() < deadline, "{:?}", start.elapsed());
    app.execute_batch("ROLLBACK")?;
    drop(app);

    // Opened before it: not seen, waited for up to the write deadline.
    before.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY);
         BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;",
    )?;
    let start = Instant::now();
    let waited = h.queue.enqueue(NewJob::new("k", json!(2)));
    assert!(matches!(waited, Err(Error::Busy)), "{waited:?}");
    assert!(start.elapsed() >= deadline, "{:?}", start.elapsed());
    before.execute_batch("ROLLBACK")?;

    h.queue.enqueue(NewJob::new("k", json!(3)))?;
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}
