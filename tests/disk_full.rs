//! Disk full: the database on a small tmpfs, enqueued into until it fails.
//!
//! The failure must be the typed `Error::StorageFull` (no panic), every job
//! whose enqueue returned `Ok` must be there, the file must pass
//! `PRAGMA integrity_check`, and once the filesystem grows the same `Queue`
//! works again without a restart.
//!
//! Needs root to mount a tmpfs; ignored by default and run by `.ci/run`
//! (`cargo test --test disk_full -- --ignored`). Outside CI, a machine that
//! cannot mount prints SKIPPED.

use std::path::{Path, PathBuf};
use std::process::Command;

use backlog::{Error, NewJob, Queue};
use rusqlite::Connection;
use serde_json::json;

struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then_some(Tmpfs { dir })
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "remount failed");
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn count_ids(path: &Path, ids: &[i64]) -> usize {
    let conn = Connection::open(path).expect("raw connection");
    let mut stmt = conn
        .prepare("SELECT count(*) FROM backlog_jobs WHERE id = ?1")
        .expect("prepare");
    ids.iter()
        .map(|id| stmt.query_row([id], |r| r.get::<_, i64>(0)).expect("count") as usize)
        .sum()
}

/// A tmpfs of `size`, or `None` after saying the test was skipped (it needs
/// root; CI has it, and must).
fn tmpfs_or_skip(size: &str) -> Option<Tmpfs> {
    let fs = Tmpfs::mount(size);
    if fs.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs"
        );
        println!("SKIPPED: cannot mount a tmpfs here (needs root)");
    }
    fs
}

fn integrity(path: &Path) -> String {
    let conn = Connection::open(path).expect("raw connection");
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check")
}

#[test]
#[ignore = "needs root to mount a tmpfs; run by .ci/run"]
fn disk_full_is_a_typed_error_and_the_same_queue_recovers_when_space_returns() {
    let Some(fs) = tmpfs_or_skip("2M") else {
        return;
    };
    let path = fs.path().join("full.db");
    let queue = Queue::open(&path).expect("open on tmpfs");

    let filler = "x".repeat(4000);
    let mut acknowledged = Vec::new();
    let failure = loop {
        match queue.enqueue(NewJob::new("fill", json!({ "pad": filler }))) {
            Ok(e) => acknowledged.push(e.id),
            Err(e) => break e,
        }
        assert!(acknowledged.len() < 100_000, "the tmpfs never filled up");
    };
    assert!(
        matches!(failure, Error::StorageFull),
        "expected StorageFull, got {failure:?}"
    );
    assert_eq!(count_ids(&path, &acknowledged), acknowledged.len());
    assert_eq!(integrity(&path), "ok");

    fs.resize("16M");
    let after = queue
        .enqueue(NewJob::new("fill", json!({ "pad": "after" })))
        .expect("the same queue enqueues once space returns");
    assert_eq!(count_ids(&path, &[after.id]), 1);
    assert_eq!(integrity(&path), "ok");
    println!(
        "disk full: acknowledged={} lost=0 error=StorageFull recovered=yes integrity=ok",
        acknowledged.len()
    );
}

/// An application's own commit that fails on the full disk ends (or keeps)
/// its transaction and its hold of the write lock; a queue call on the
/// same thread then neither waits for a lock nobody holds nor is refused
/// for one (`tests/sqlite_foreign_transactions.rs` has the other ways a
/// lock is let go). The transaction stays under SQLite's page cache, so the
/// first write to disk, and the failure, is the commit's.
#[test]
#[ignore = "needs root to mount a tmpfs; run by .ci/run"]
fn an_application_commit_failing_on_a_full_disk_leaves_no_lock_noted_for_its_thread() {
    let Some(fs) = tmpfs_or_skip("4M") else {
        return;
    };
    let path = fs.path().join("full.db");
    let queue = Queue::open(&path).expect("open on tmpfs");
    // Opted in to the shim VFS: its locks are seen (src/backend/sqlite/write_path/vfs.rs).
    let app = backlog::sqlite::open_connection(&path).expect("application connection");
    app.execute_batch("CREATE TABLE blobs (b BLOB NOT NULL)")
        .expect("create table");

    // Fill the filesystem with a ballast file, then free 64 KiB of it.
    let ballast = fs.path().join("ballast");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&ballast).expect("ballast");
        let chunk = vec![1u8; 64 * 1024];
        while file.write_all(&chunk).is_ok() {}
        let len = file.metadata().expect("ballast size").len();
        file.set_len(len.saturating_sub(64 * 1024))
            .expect("free 64 KiB");
    }

    app.execute_batch("BEGIN IMMEDIATE").expect("begin");
    app.execute("INSERT INTO blobs VALUES (randomblob(500000))", [])
        .expect("the insert stays in the page cache");
    assert!(matches!(
        queue.enqueue(NewJob::new("k", json!(1))),
        Err(Error::InsideTransaction)
    ));
    let commit = app.execute_batch("COMMIT");
    assert!(
        matches!(
            &commit,
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DiskFull
        ),
        "expected the commit to fail with SQLITE_FULL, got {commit:?}"
    );
    let still_open = !app.is_autocommit();
    std::fs::remove_file(&ballast).expect("remove the ballast");
    if still_open {
        assert!(matches!(
            queue.enqueue(NewJob::new("k", json!(2))),
            Err(Error::InsideTransaction)
        ));
        app.execute_batch("ROLLBACK").expect("rollback");
    }
    let start = std::time::Instant::now();
    let after = queue
        .enqueue(NewJob::new("k", json!("after")))
        .expect("the queue writes on the application's thread once its transaction ended");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(count_ids(&path, &[after.id]), 1);
    assert_eq!(integrity(&path), "ok");
    println!(
        "disk full, application commit: error=SQLITE_FULL transaction_still_open={still_open} \
         queue_after=ok integrity=ok"
    );
}
