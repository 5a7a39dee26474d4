//! A queue call made on a thread that holds the application's own write
//! transaction on the queue's file, through a plain `rusqlite` connection,
//! answers `Error::InsideTransaction` at once instead of waiting for its own
//! thread until the write deadline (30 s), and writes nothing.
//!
//! SQLite only, by nature: the wait being avoided is for SQLite's WAL write
//! lock, one per database file, which an application's connection and the
//! queue's writer share. On PostgreSQL and MySQL the queue writes through
//! its own pooled connections and row locks; "the queue's own transaction"
//! case, which every backend has, is in the conformance suite. Unix only:
//! the lock's holder is known through the shim VFS (`src/backend/sqlite/write_path/vfs.rs`).
//!
//! The shim is the application's to ask for: its connections here are
//! opened with `backlog::sqlite::open_connection`. A plain `rusqlite`
//! connection keeps SQLite's default VFS and is waited for, bounded (the
//! last tests here). `make_default_vfs`, which changes the whole process,
//! has a test binary of its own (`tests/sqlite_default_vfs.rs`).

#![cfg(unix)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use backlog::sqlite::QueueExt;
use backlog::{
    Error, JobFilter, JobState, JobUpdate, LeaseRequest, NewJob, Outcome, Queue, QueueLimits,
    QueueOptions, Retention,
};
use common::{default_vfs, raw, Harness, TestResult};
use rusqlite::{Connection, TransactionBehavior};
use serde_json::json;

/// "At once": far below the 30 s write deadline the call would otherwise
/// wait for.
const AT_ONCE: Duration = Duration::from_secs(5);

/// Every row of every backlog table, as text, sorted: what "nothing was
/// written" compares.
fn snapshot(path: &std::path::Path) -> TestResult<Vec<String>> {
    let conn = raw(path)?;
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'backlog%' \
             ORDER BY name",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for table in tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\""))?;
        let columns = stmt.column_count();
        let mut found = stmt.query([])?;
        while let Some(row) = found.next()? {
            let mut text = format!("{table}:");
            for i in 0..columns {
                let value: rusqlite::types::Value = row.get(i)?;
                text.push_str(&format!(" {value:?}"));
            }
            rows.push(text);
        }
    }
    rows.sort();
    Ok(rows)
}

/// An application connection on `path`, opted in to the shim.
fn app(path: &std::path::Path) -> TestResult<Connection> {
    let conn = backlog::sqlite::open_connection(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")?;
    Ok(conn)
}

fn assert_refused<T: std::fmt::Debug>(what: &str, result: backlog::Result<T>) {
    match result {
        Err(Error::InsideTransaction) => {}
        other => panic!("{what}: expected InsideTransaction, got {other:?}"),
    }
}

/// A queue call on this thread goes through at once (no lock of this
/// thread's is noted any more).
fn assert_writes_at_once(queue: &Queue) -> TestResult {
    let start = Instant::now();
    queue.enqueue(NewJob::new("k", json!("after")))?;
    assert!(start.elapsed() < AT_ONCE, "{:?}", start.elapsed());
    Ok(())
}

/// Every public call that writes, made on the thread holding an
/// application's `BEGIN IMMEDIATE` on the queue's file: `InsideTransaction`
/// at once, nothing written (checked after the application rolls back, and
/// after it commits); reads work meanwhile, and writes work again after.
#[test]
fn every_queue_call_that_writes_inside_an_application_write_transaction_answers_at_once(
) -> TestResult {
    let h = Harness::new()?;
    let q = &h.queue;
    let waiting = q.enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(60)))?;
    let discarded = q.enqueue(NewJob::new("k", json!("discarded")))?;
    q.discard_job(discarded.id, "setup")?;
    q.enqueue(NewJob::new("k", json!("runs")))?;
    let job = h.lease_one("w")?;
    let other_file = Harness::new()?;
    other_file
        .queue
        .enqueue(NewJob::new("k", json!("copied")))?;

    for commit in [false, true] {
        let app = app(h.path())?;
        let before = snapshot(h.path())?;
        app.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
        let start = Instant::now();

        assert_refused("migrate", q.migrate());
        assert_refused("Queue::open (it migrates)", Queue::open(h.path()));
        assert_refused("enqueue", q.enqueue(NewJob::new("k", json!(2))));
        assert_refused("enqueue_many", q.enqueue_many([NewJob::new("k", json!(3))]));
        assert_refused("lease", q.lease(&LeaseRequest::new("w", 1)));
        assert_refused("complete", q.complete(&job, None));
        assert_refused("fail", q.fail(&job, "x"));
        assert_refused("snooze", q.snooze(&job, Duration::from_secs(1)));
        assert_refused("discard", q.discard(&job, "x"));
        assert_refused("release", q.release(&job));
        assert_refused("settle", q.settle(&job, Outcome::Complete(None)));
        assert_refused(
            "settle_many",
            q.settle_many([(&job, Outcome::Complete(None))]),
        );
        assert_refused("complete_many", q.complete_many([&job]));
        assert_refused(
            "heartbeat",
            q.heartbeat(&[job.lease()], Duration::from_secs(5)),
        );
        assert_refused("rescue", q.rescue(10));
        assert_refused("retry", q.retry(discarded.id));
        assert_refused("run_now", q.run_now(waiting.id));
        assert_refused("cancel", q.cancel(job.id));
        assert_refused("delete", q.delete(waiting.id));
        assert_refused("pause", q.pause("default"));
        assert_refused("resume", q.resume("default"));
        assert_refused(
            "set_limits",
            q.set_limits(
                "default",
                QueueLimits {
                    concurrency: Some(2),
                    rate: None,
                },
            ),
        );
        assert_refused("prune_history", q.prune_history(&Retention::default(), 10));
        assert_refused(
            "update",
            q.update(waiting.id, &JobUpdate::default().priority(3)),
        );
        assert_refused("aggregate", q.aggregate(10));
        assert_refused("discard_job", q.discard_job(waiting.id, "x"));
        assert_refused(
            "discard_matching",
            q.discard_matching(&JobFilter::new(JobState::Scheduled), "x"),
        );
        assert_refused(
            "retry_matching",
            q.retry_matching(&JobFilter::new(JobState::DISCARDED)),
        );
        assert_refused(
            "cancel_matching",
            q.cancel_matching(&JobFilter::new(JobState::Scheduled)),
        );
        assert_refused(
            "delete_matching",
            q.delete_matching(&JobFilter::new(JobState::Scheduled)),
        );
        assert_refused("remove_schedule", q.remove_schedule("nightly"));
        assert_refused(
            "QueueExt::transaction",
            q.transaction(|_| Ok::<(), Error>(())),
        );
        assert_refused("copy", backlog::copy(&other_file.queue, q));

        // Reads use the read pool: no write lock needed.
        assert_eq!(q.get(job.id)?.state, JobState::Running);
        q.list(&JobFilter::new(JobState::Running))?;
        q.counts()?;
        q.stats()?;
        q.paused_queues()?;
        q.schedules()?;
        assert!(start.elapsed() < AT_ONCE, "{:?}", start.elapsed());

        app.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })?;
        assert_eq!(
            snapshot(h.path())?,
            before,
            "a refused call wrote (the app {})",
            if commit { "committed" } else { "rolled back" }
        );
        let orders: i64 = app.query_row("SELECT count(*) FROM orders", [], |r| r.get(0))?;
        assert_eq!(orders, i64::from(commit));
    }
    assert_writes_at_once(q)
}

/// `enqueue_in` on the application's transaction joins it (the `_in` forms
/// are the answer the error points to); the plain form is refused.
#[test]
fn enqueue_in_joins_the_application_transaction() -> TestResult {
    let h = Harness::new()?;
    let mut app = app(h.path())?;
    let tx = app.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("INSERT INTO orders (id) VALUES (7)", [])?;
    let joined = h.queue.enqueue_in(&tx, NewJob::new("charge", json!(7)))?;
    assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!("alone"))));
    tx.commit()?;
    assert_eq!(h.live_rows()?, 1);
    assert_eq!(h.state(joined.id)?, JobState::Available);
    assert_writes_at_once(&h.queue)
}

/// The same call from another thread is not refused: it waits for the
/// application's transaction (bounded by the write deadline) and succeeds
/// once it commits.
#[test]
fn a_call_from_another_thread_waits_for_the_application_transaction() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    let (sent, results) = mpsc::channel();
    let queue = h.queue.clone();
    let caller = thread::spawn(move || {
        let _ = sent.send(queue.enqueue(NewJob::new("k", json!("waited"))));
    });
    // Still waiting for the lock this thread holds.
    assert!(matches!(
        results.recv_timeout(Duration::from_millis(500)),
        Err(mpsc::RecvTimeoutError::Timeout)
    ));
    app.execute_batch("COMMIT")?;
    let enqueued = results.recv_timeout(Duration::from_secs(10))??;
    caller.join().map_err(|_| "caller panicked")?;
    assert_eq!(h.state(enqueued.id)?, JobState::Available);
    Ok(())
}

/// A write transaction on another database file (in WAL mode, as the
/// queue's, so that its lock is taken the same way) is no reason to refuse.
#[test]
fn an_application_transaction_on_another_file_does_not_count() -> TestResult {
    let h = Harness::new()?;
    let elsewhere = common::TestDb::new()?;
    let other = app(&elsewhere.path)?;
    let mode: String = other.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    other.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    assert_writes_at_once(&h.queue)?;
    other.execute_batch("COMMIT")?;
    Ok(())
}

/// A deferred transaction holds no write lock until it writes: while it has
/// only read, the queue writes; once it has written, the queue refuses.
#[test]
fn a_deferred_transaction_counts_only_once_it_has_written() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch("BEGIN")?;
    let jobs: i64 = app.query_row("SELECT count(*) FROM backlog_jobs", [], |r| r.get(0))?;
    assert_eq!(jobs, 0);
    assert_writes_at_once(&h.queue)?;
    app.execute_batch("COMMIT; BEGIN; INSERT INTO orders DEFAULT VALUES;")?;
    assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(1))));
    app.execute_batch("COMMIT")?;
    assert_writes_at_once(&h.queue)
}

/// A commit that fails (a deferred foreign key violated) leaves the
/// transaction, and its lock, open: still refused. Its rollback frees it.
#[test]
fn a_failed_commit_keeps_the_lock_until_the_rollback() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch(
        "CREATE TABLE lines (order_id INTEGER NOT NULL REFERENCES orders (id) \
         DEFERRABLE INITIALLY DEFERRED);
         PRAGMA foreign_keys = ON;
         BEGIN IMMEDIATE;
         INSERT INTO lines VALUES (404);",
    )?;
    assert!(app.execute_batch("COMMIT").is_err(), "the commit must fail");
    assert!(!app.is_autocommit());
    assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(1))));
    app.execute_batch("ROLLBACK")?;
    assert_writes_at_once(&h.queue)
}

/// A statement failing with SQLITE_FULL (the application's own page limit)
/// may end the transaction or not: the queue refuses exactly while it is
/// open.
#[test]
fn a_full_database_error_in_the_application_transaction_leaves_no_stale_lock() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch("CREATE TABLE blobs (b BLOB)")?;
    let pages: i64 = app.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    app.execute_batch(&format!(
        "PRAGMA max_page_count = {pages}; BEGIN IMMEDIATE;"
    ))?;
    let full = match app.execute("INSERT INTO blobs VALUES (zeroblob(1000000))", []) {
        Err(rusqlite::Error::SqliteFailure(e, _)) => e.code,
        other => return Err(format!("expected SQLITE_FULL, got {other:?}").into()),
    };
    assert_eq!(full, rusqlite::ErrorCode::DiskFull);
    // SQLite 3.53 rolls the whole transaction back on SQLITE_FULL here.
    if app.is_autocommit() {
        assert_writes_at_once(&h.queue)?;
    } else {
        assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(1))));
        app.execute_batch("ROLLBACK")?;
        assert_writes_at_once(&h.queue)?;
    }
    Ok(())
}

/// A connection closed inside its transaction (rolled back by SQLite)
/// leaves nothing noted.
#[test]
fn closing_a_connection_inside_its_transaction_frees_the_queue() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(1))));
    drop(app);
    assert_writes_at_once(&h.queue)?;
    let orders: i64 = raw(h.path())?.query_row("SELECT count(*) FROM orders", [], |r| r.get(0))?;
    assert_eq!(orders, 0);
    Ok(())
}

/// A lock is the thread's that took it, and a connection moved to another
/// thread that commits there leaves nothing behind on the first.
#[test]
fn a_lock_released_on_another_thread_leaves_nothing_behind() -> TestResult {
    let h = Harness::new()?;
    let app = app(h.path())?;
    app.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    assert_refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(1))));
    let app = thread::spawn(move || -> rusqlite::Result<Connection> {
        app.execute_batch("COMMIT")?;
        Ok(app)
    })
    .join()
    .map_err(|_| "committer panicked")??;
    assert_writes_at_once(&h.queue)?;
    drop(app);
    Ok(())
}

/// Several files and connections at once: each queue refuses exactly while
/// this thread holds its own file's lock.
#[test]
fn each_file_is_told_apart_with_several_held_at_once() -> TestResult {
    let (a, b) = (Harness::new()?, Harness::new()?);
    let (app_a, app_b) = (app(a.path())?, app(b.path())?);
    app_a.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    app_b.execute_batch("BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;")?;
    assert_refused("enqueue on a", a.queue.enqueue(NewJob::new("k", json!(1))));
    assert_refused("enqueue on b", b.queue.enqueue(NewJob::new("k", json!(1))));
    app_a.execute_batch("COMMIT")?;
    assert_writes_at_once(&a.queue)?;
    assert_refused("enqueue on b", b.queue.enqueue(NewJob::new("k", json!(2))));
    app_b.execute_batch("ROLLBACK")?;
    assert_writes_at_once(&b.queue)?;
    Ok(())
}

/// Another queue's own transaction on the same file holds the same lock:
/// a second queue handle refuses at once too.
#[test]
fn another_queue_on_the_same_file_refuses_inside_the_first_ones_transaction() -> TestResult {
    let h = Harness::new()?;
    let second = h.second_handle()?;
    let start = Instant::now();
    h.queue.transaction(|_| -> backlog::Result<()> {
        assert_refused("enqueue", second.enqueue(NewJob::new("k", json!(1))));
        Ok(())
    })?;
    assert!(start.elapsed() < AT_ONCE, "{:?}", start.elapsed());
    assert_writes_at_once(&second)?;
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

/// The name of the VFS `conn` opened its main database with (asked of
/// SQLite itself, not of the VFS).
fn vfs_of(conn: &Connection) -> TestResult<String> {
    let mut vfs: *mut rusqlite::ffi::sqlite3_vfs = std::ptr::null_mut();
    // SAFETY: an open connection, used by this thread alone for the call;
    // SQLITE_FCNTL_VFS_POINTER writes a pointer to the connection's VFS,
    // registered for the life of the process.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_VFS_POINTER,
            (&mut vfs as *mut *mut rusqlite::ffi::sqlite3_vfs).cast(),
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK || vfs.is_null() {
        return Err(format!("no VFS pointer: rc {rc}").into());
    }
    // SAFETY: a registered VFS's name is a NUL-terminated static string.
    Ok(unsafe { std::ffi::CStr::from_ptr((*vfs).zName) }
        .to_string_lossy()
        .into_owned())
}

/// Opening a queue changes nothing in the process outside its own
/// connections (DESIGN.md §2, promise 10): SQLite's default VFS stays the
/// default, and a plain connection the application opens afterwards uses
/// it. The opted-in connection and the queue's own go through the shim.
#[test]
fn a_plain_connection_opened_after_queue_open_uses_sqlites_default_vfs() -> TestResult {
    let h = Harness::new()?;
    let _second = Queue::open(h.path())?;
    assert_eq!(default_vfs()?, "unix");
    let plain = Connection::open(h.path())?;
    assert_eq!(vfs_of(&plain)?, "unix");
    assert_eq!(vfs_of(&raw(h.path())?)?, "unix");
    assert_eq!(vfs_of(&app(h.path())?)?, "backlog");
    Ok(())
}

/// Without the opt-in, the application's write transaction is waited for
/// like another process's: a queue call on the same thread gives up with
/// `Busy` at the write deadline, having written nothing.
#[test]
fn a_plain_connections_write_transaction_is_waited_for_up_to_the_write_deadline() -> TestResult {
    let deadline = Duration::from_millis(300);
    let h = Harness::with(
        QueueOptions::new()
            .busy_timeout(Duration::from_millis(50))
            .write_deadline(deadline),
    )?;
    let plain = raw(h.path())?;
    plain.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY);
         BEGIN IMMEDIATE; INSERT INTO orders DEFAULT VALUES;",
    )?;
    let before = snapshot(h.path())?;
    let start = Instant::now();
    let waited = h.queue.enqueue(NewJob::new("k", json!("waits")));
    let took = start.elapsed();
    assert!(matches!(waited, Err(Error::Busy)), "{waited:?}");
    assert!(
        took >= deadline,
        "gave up after {took:?}, before the deadline"
    );
    assert!(took < AT_ONCE, "{took:?}");
    plain.execute_batch("COMMIT")?;
    assert_eq!(snapshot(h.path())?, before);
    assert_writes_at_once(&h.queue)
}
