//! The `backlog` binary on an encrypted (SQLCipher) queue file: the key
//! comes from `--sqlite-key-file` or `BACKLOG_SQLITE_KEY`, never the command
//! line, and shows in no output. With the `sqlcipher` feature (CI:
//! `cargo test -p backlog-cli --no-default-features --features sqlcipher
//! --test cli_sqlcipher`) the file opens only with its key; without it a key
//! is refused as a usage error, lest the CLI write plaintext.

use std::path::Path;
use std::process::{Command, Stdio};

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const KEY: &str = "correct horse battery staple";

/// One run: exit code, and stdout and stderr together.
struct Run {
    code: i32,
    text: String,
}

/// Runs `backlog --db DB ARGS` with `key_var` as BACKLOG_SQLITE_KEY (or
/// none) and no terminal.
fn backlog(db: &Path, key_var: Option<&str>, args: &[&str]) -> TestResult<Run> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_backlog"));
    command
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("BACKLOG_DATABASE")
        .env_remove("BACKLOG_SQLITE_KEY")
        .stdin(Stdio::null());
    if let Some(key) = key_var {
        command.env("BACKLOG_SQLITE_KEY", key);
    }
    let out = command.output()?;
    Ok(Run {
        code: out.status.code().ok_or("killed by a signal")?,
        text: format!(
            "{}{}",
            String::from_utf8(out.stdout)?,
            String::from_utf8(out.stderr)?
        ),
    })
}

#[cfg(not(feature = "sqlcipher"))]
#[test]
fn a_key_is_a_usage_error_where_sqlite_is_not_sqlcipher() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("q.db");
    backlog::Queue::open(&db)?;
    let run = backlog(&db, Some(KEY), &["stats"])?;
    assert_eq!(run.code, 2, "{}", run.text);
    assert!(run.text.contains("`sqlcipher` feature"), "{}", run.text);
    assert!(!run.text.contains(KEY), "{}", run.text);
    Ok(())
}

#[cfg(feature = "sqlcipher")]
mod encrypted {
    use backlog::{NewJob, QueueOptions};
    use serde_json::json;

    use super::{backlog, TestResult, KEY};

    /// An encrypted queue with one job, made by the library.
    fn encrypted(dir: &std::path::Path) -> TestResult<std::path::PathBuf> {
        let db = dir.join("secret.db");
        let queue = QueueOptions::new().sqlite_key(KEY).open(&db)?;
        queue.enqueue(NewJob::new("email", json!({"to": "a@example.com"})))?;
        drop(queue);
        let header = std::fs::read(&db)?;
        assert!(!header.starts_with(b"SQLite format 3\0"), "not encrypted");
        Ok(db)
    }

    #[test]
    fn an_encrypted_file_opens_with_its_key_from_a_file_or_the_environment() -> TestResult {
        let dir = tempfile::tempdir()?;
        let db = encrypted(dir.path())?;
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, format!("{KEY}\n"))?;
        let key_arg = key_file.to_str().ok_or("path")?;

        let run = backlog(&db, None, &["--sqlite-key-file", key_arg, "show", "1"])?;
        assert_eq!(run.code, 0, "{}", run.text);
        assert!(run.text.contains("a@example.com"), "{}", run.text);
        let run = backlog(&db, Some(KEY), &["--json", "stats"])?;
        assert_eq!(run.code, 0, "{}", run.text);
        assert!(run.text.contains("\"available\": 1"), "{}", run.text);
        let run = backlog(&db, Some(KEY), &["enqueue", "email", "{}"])?;
        assert_eq!(run.code, 0, "{}", run.text);
        assert!(!run.text.contains(KEY), "{}", run.text);
        Ok(())
    }

    #[test]
    fn without_its_key_or_with_a_wrong_one_an_encrypted_file_is_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        let db = encrypted(dir.path())?;
        let before = std::fs::read(&db)?;
        let run = backlog(&db, None, &["stats"])?;
        assert_eq!(run.code, 8, "not a backlog database: {}", run.text);
        let wrong = "tr0ub4dor&3-wrong-key";
        let run = backlog(&db, Some(wrong), &["stats"])?;
        assert_eq!(run.code, 8, "{}", run.text);
        assert!(
            run.text.contains("does not open with the key given"),
            "{}",
            run.text
        );
        assert!(!run.text.contains(wrong), "the key shows: {}", run.text);
        assert_eq!(
            std::fs::read(&db)?,
            before,
            "a refused open changed the file"
        );

        // The key in two places is a guess: refused.
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, KEY)?;
        let key_arg = key_file.to_str().ok_or("path")?;
        let run = backlog(&db, Some(KEY), &["--sqlite-key-file", key_arg, "stats"])?;
        assert_eq!(run.code, 2, "{}", run.text);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n")?;
        let run = backlog(
            &db,
            None,
            &["--sqlite-key-file", empty.to_str().ok_or("path")?, "stats"],
        )?;
        assert_eq!(run.code, 4, "{}", run.text);
        Ok(())
    }

    #[test]
    fn migrate_with_a_key_creates_an_encrypted_queue() -> TestResult {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("new.db");
        let run = backlog(&db, Some(KEY), &["migrate"])?;
        assert_eq!(run.code, 0, "{}", run.text);
        let header = std::fs::read(&db)?;
        assert!(
            !header.starts_with(b"SQLite format 3\0"),
            "written in the clear"
        );
        let run = backlog(&db, Some(KEY), &["stats"])?;
        assert_eq!(run.code, 0, "{}", run.text);
        let run = backlog(&db, None, &["stats"])?;
        assert_eq!(run.code, 8, "{}", run.text);
        Ok(())
    }
}
