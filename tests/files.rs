//! Files: a database the library creates is private (0600, and SQLite gives
//! its `-wal` and `-shm` the same mode), and the library never deletes or
//! renames files — removing a `-wal` loses committed transactions.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use backlog::{NewJob, Queue};
use serde_json::json;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn created_database_and_its_wal_and_shm_are_private() -> backlog::Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("private.db");
    let queue = Queue::open(&path)?;
    queue.enqueue(NewJob::new("k", json!(1)))?;
    for suffix in ["", "-wal", "-shm", "-turnstile"] {
        let file = dir.path().join(format!("private.db{suffix}"));
        assert_eq!(
            mode(&file),
            0o600,
            "{} has mode {:o}",
            file.display(),
            mode(&file)
        );
    }
    Ok(())
}

#[test]
fn an_existing_database_keeps_its_mode() -> backlog::Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shared.db");
    std::fs::write(&path, b"").expect("create");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    Queue::open(&path)?.enqueue(NewJob::new("k", json!(1)))?;
    assert_eq!(mode(&path), 0o640);
    // The file processes take turns with is shared like the database.
    assert_eq!(mode(&dir.path().join("shared.db-turnstile")), 0o640);
    Ok(())
}

/// No code path in the library, or in the `backlog` binary, removes or renames
/// a file.
#[test]
fn the_library_never_deletes_or_renames_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src"), root.join("backlog-cli/src")];
    let mut offenders = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            for (n, line) in text.lines().enumerate() {
                if ["remove_file", "remove_dir", "fs::rename", "unlink("]
                    .iter()
                    .any(|f| line.contains(f))
                {
                    offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "file removal in src/ or backlog-cli/src/:\n{}",
        offenders.join("\n")
    );
}

/// A queue opened through a symbolic link keeps its files beside the real
/// database, as SQLite keeps `-wal` and `-shm`: queues opened by either
/// path take turns at one turnstile file.
#[test]
#[cfg(target_os = "linux")]
fn a_queue_opened_through_a_symlink_keeps_its_turnstile_beside_the_target() -> backlog::Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("data");
    std::fs::create_dir(&real).expect("data dir");
    let target = real.join("real.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let direct = Queue::open(&target)?;
    direct.enqueue(NewJob::new("k", json!(1)))?;
    let through_link = Queue::open(&link)?;
    through_link.enqueue(NewJob::new("k", json!(2)))?;
    for suffix in ["-wal", "-shm", "-turnstile"] {
        assert!(
            real.join(format!("real.db{suffix}")).exists(),
            "no real.db{suffix} beside the target"
        );
        assert!(
            !dir.path().join(format!("link.db{suffix}")).exists(),
            "link.db{suffix} beside the link"
        );
    }
    Ok(())
}

/// Probing a FIFO would wait for a writer forever if it were opened; a
/// folder is no database either. Both answer at once.
#[test]
fn probing_a_fifo_or_a_folder_answers_at_once() -> backlog::Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().expect("path")).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (done, answer) = std::sync::mpsc::channel();
    let folder = dir.path().to_owned();
    std::thread::spawn(move || {
        let _ = done.send((
            backlog::sqlite::probe_sqlite_file(&fifo).map_err(|e| e.to_string()),
            backlog::sqlite::probe_sqlite_file(&folder).map_err(|e| e.to_string()),
        ));
    });
    let (fifo, folder) = answer
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the probe hangs");
    assert_eq!(fifo, Ok(backlog::sqlite::SqliteFile::NotSqlite));
    assert_eq!(folder, Ok(backlog::sqlite::SqliteFile::NotSqlite));
    Ok(())
}
