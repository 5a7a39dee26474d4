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

fn integrity(path: &Path) -> String {
    let conn = Connection::open(path).expect("raw connection");
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check")
}

#[test]
#[ignore = "needs root to mount a tmpfs; run by .ci/run"]
fn disk_full_is_a_typed_error_and_the_same_queue_recovers_when_space_returns() {
    let Some(fs) = Tmpfs::mount("2M") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs"
        );
        println!("SKIPPED: cannot mount a tmpfs here (needs root)");
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
