//! Bad input that only SQLite can be given: in-memory databases, URIs,
//! options refused before the file is created, and a payload cap checked
//! while another connection holds the file's write lock. Every other bad
//! input is in the conformance suite (`tests/conformance/bad_input.rs`).

mod common;

use std::time::Duration;

use backlog::{Error, NewJob, Queue, QueueOptions};
use common::{count, Harness, TestDb, TestResult};
use rusqlite::TransactionBehavior;
use serde_json::json;

/// No row was written to any of the queue's tables.
fn assert_nothing_written(h: &Harness) -> TestResult {
    let conn = h.raw()?;
    for table in ["backlog_jobs", "backlog_history", "backlog_queues"] {
        let rows = count(&conn, &format!("SELECT count(*) FROM {table}"))?;
        assert_eq!(rows, 0, "{table} has {rows} rows");
    }
    assert!(h.queue.counts()?.is_empty());
    Ok(())
}

fn enqueue_err(h: &Harness, job: NewJob) -> Error {
    match h.queue.enqueue(job) {
        Ok(e) => panic!("enqueue should have been refused, got {e:?}"),
        Err(e) => e,
    }
}

#[test]
fn payload_over_the_cap_is_rejected_before_any_database_call() -> TestResult {
    let h = Harness::with(
        QueueOptions::new()
            .max_payload_bytes(64)
            .busy_timeout(Duration::from_millis(20))
            .write_deadline(Duration::from_millis(200)),
    )?;
    // Another connection of this thread, opted in to the shim VFS, holds the
    // write lock: any write the queue attempted would be refused
    // (InsideTransaction, at its write gate).
    let mut blocker = backlog::sqlite::open_connection(h.path())?;
    let lock = blocker.transaction_with_behavior(TransactionBehavior::Immediate)?;

    let oversize = NewJob::new("k", json!("z".repeat(1000)));
    let err = enqueue_err(&h, oversize.clone());
    assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err:?}");
    let err = h
        .queue
        .enqueue_many([NewJob::new("k", json!(1)), oversize])
        .unwrap_err();
    assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err:?}");
    // The control: a valid job does get past validation to the write path,
    // which refuses it for the lock this thread holds.
    let err = enqueue_err(&h, NewJob::new("k", json!(1)));
    assert!(matches!(err, Error::InsideTransaction), "{err:?}");

    lock.rollback()?;
    assert_nothing_written(&h)
}

#[test]
fn in_memory_database_is_refused() -> TestResult {
    for path in [
        ":memory:",
        "file::memory:?cache=shared",
        "file:x?mode=memory",
    ] {
        let err = Queue::open(path).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{path}: {err:?}");
        assert!(
            !std::path::Path::new(path).exists(),
            "created a file {path:?}"
        );
    }
    Ok(())
}

#[test]
fn a_uri_instead_of_a_path_is_refused_before_any_file_is_created() -> TestResult {
    let db = TestDb::new()?;
    let uri = format!("file:{}?mode=rwc", db.path.display());
    let err = Queue::open(&uri).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(!db.path.exists());
    assert!(!std::path::Path::new(&uri).exists());
    Ok(())
}

#[test]
fn a_zero_pool_size_is_refused_before_the_file_is_created() -> TestResult {
    let db = TestDb::new()?;
    let err = QueueOptions::new().pool_size(0).open(&db.path).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(!db.path.exists(), "a refused open created {:?}", db.path);
    Ok(())
}
