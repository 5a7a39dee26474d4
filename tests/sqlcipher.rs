//! An encrypted queue file (`QueueOptions::sqlite_key`): with the `sqlcipher`
//! feature it opens only with its key and holds no plaintext; without it a
//! key is refused, lest a file the application thinks encrypted be written
//! in the clear.

use backlog::{Error, QueueOptions};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn the_key_never_shows_in_debug_output() {
    let options = QueueOptions::new().sqlite_key("correct horse battery staple");
    let shown = format!("{options:?}");
    assert!(!shown.contains("horse"), "{shown}");
    assert!(shown.contains("sqlite_key: Some(***)"), "{shown}");
}

#[test]
fn an_empty_key_is_refused_before_the_file_is_created() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    let error = QueueOptions::new()
        .sqlite_key("")
        .open(&path)
        .expect_err("an empty key means no encryption");
    assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
    assert!(!path.exists());
    Ok(())
}

#[cfg(not(feature = "sqlcipher"))]
#[test]
fn a_key_is_refused_where_sqlite_is_not_sqlcipher() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("q.db");
    let error = QueueOptions::new()
        .sqlite_key("s3cret")
        .open(&path)
        .expect_err("plain SQLite would write the file unencrypted");
    assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
    assert!(error.to_string().contains("`sqlcipher` feature"), "{error}");
    assert!(!path.exists(), "a refused open created the file");
    Ok(())
}

#[cfg(feature = "sqlcipher")]
mod encrypted {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use backlog::{JobState, NewJob, Queue, QueueOptions, Worker};
    use serde_json::json;

    use super::TestResult;

    const KEY: &str = "correct horse battery staple";
    /// In every payload, to look for in the file's bytes.
    const MARKER: &str = "plaintext-marker-7f3a9c";

    fn keyed(key: &str) -> QueueOptions {
        QueueOptions::new().sqlite_key(key)
    }

    /// Every file in `dir`, by name, with its bytes.
    fn files(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
        std::fs::read_dir(dir)?
            .map(|entry| {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                Ok((name, std::fs::read(entry.path())?))
            })
            .collect()
    }

    /// Waits until the last connection to `path` has closed: it checkpoints
    /// the WAL into the file and deletes it (a queue's threads may let go of
    /// their connections a little after the queue is dropped).
    fn closed(path: &Path) -> std::io::Result<()> {
        let wal = path.with_extension("db-wal");
        let deadline = Instant::now() + Duration::from_secs(10);
        while wal.exists() {
            if Instant::now() > deadline {
                return Err(std::io::Error::other("the queue's connections stayed open"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The names of the files that differ between two listings.
    fn changed(
        before: &BTreeMap<String, Vec<u8>>,
        after: &BTreeMap<String, Vec<u8>>,
    ) -> Vec<String> {
        let names: std::collections::BTreeSet<_> = before.keys().chain(after.keys()).collect();
        names
            .into_iter()
            .filter(|name| before.get(*name) != after.get(*name))
            .cloned()
            .collect()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// A keyed queue file with one job worked to completion and one waiting.
    fn worked_queue(path: &Path) -> Result<(i64, i64), Box<dyn std::error::Error>> {
        let queue = keyed(KEY).open(path)?;
        let done = queue
            .enqueue(NewJob::new("echo", json!({ "note": MARKER })))?
            .id;
        let worker = Worker::builder(queue.clone())
            .handle_raw("echo", |payload, _ctx| Ok(payload))
            .start()?;
        let record = queue.wait(done, Duration::from_secs(10))?;
        worker.shutdown(Duration::from_secs(5))?;
        assert_eq!(record.state, JobState::COMPLETED);
        let waiting = queue
            .enqueue(NewJob::new("later", json!({ "note": MARKER })))?
            .id;
        Ok((done, waiting))
    }

    #[test]
    fn a_keyed_queue_works_a_job_and_keeps_its_jobs_across_a_reopen() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.db");
        let (done, waiting) = worked_queue(&path)?;

        let queue = keyed(KEY).open(&path)?;
        assert_eq!(queue.get(done)?.state, JobState::COMPLETED);
        let job = queue.get(waiting)?;
        assert_eq!(job.state, JobState::Available);
        assert!(job.payload.contains(MARKER), "{}", job.payload);
        Ok(())
    }

    /// No file in `dir` holds a payload in plaintext, and the main one has
    /// no SQLite header.
    fn assert_no_plaintext(dir: &Path, stage: &str) -> TestResult {
        let on_disk = files(dir)?;
        assert!(
            !on_disk["q.db"].starts_with(b"SQLite format 3"),
            "{stage}: a plain SQLite header"
        );
        for (name, bytes) in &on_disk {
            assert!(
                !contains(bytes, MARKER.as_bytes()),
                "{stage}: {name} holds a payload in plaintext"
            );
        }
        Ok(())
    }

    #[test]
    fn the_files_hold_no_plaintext_while_open_and_after_close() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.db");
        worked_queue(&path)?;
        // Open, the last payloads sit in the WAL; closed, in the main file.
        let queue = keyed(KEY).open(&path)?;
        queue.enqueue(NewJob::new("later", json!({ "note": MARKER })))?;
        assert_no_plaintext(dir.path(), "open")?;
        drop(queue);
        closed(&path)?;
        assert_no_plaintext(dir.path(), "closed")
    }

    #[test]
    fn a_missing_or_wrong_key_is_refused_and_writes_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.db");
        worked_queue(&path)?;
        closed(&path)?;
        let before = files(dir.path())?;
        let error = Queue::open(&path).expect_err("no key");
        assert!(error.is_corrupt(), "{error:?}");
        assert!(error.to_string().contains("sqlite_key"), "{error}");

        let error = keyed("not the key").open(&path).expect_err("a wrong key");
        assert!(error.is_corrupt(), "{error:?}");
        assert!(error.to_string().contains("key is wrong"), "{error}");

        let after = files(dir.path())?;
        assert!(
            changed(&before, &after).is_empty(),
            "a refused open changed {:?}",
            changed(&before, &after)
        );
        // And the right key still opens it.
        keyed(KEY).open(&path)?;
        Ok(())
    }

    /// The README's word: the application's own connection to the file
    /// needs the same key, as its first statement, and then joins the queue.
    #[test]
    fn an_application_connection_with_the_key_enqueues_in_its_transaction() -> TestResult {
        use backlog::sqlite::QueueExt;

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.db");
        let queue = keyed(KEY).open(&path)?;
        let mut conn = backlog::sqlite::open_connection(&path)?;
        conn.pragma_update(None, "key", KEY)?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let id = queue
            .enqueue_in(&tx, NewJob::new("k", json!({ "note": MARKER })))?
            .id;
        tx.commit()?;
        assert_eq!(queue.get(id)?.state, JobState::Available);
        Ok(())
    }

    #[test]
    fn a_key_does_not_open_a_plaintext_queue_file() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("q.db");
        drop(Queue::open(&path)?);
        closed(&path)?;
        let before = files(dir.path())?;

        let error = keyed(KEY)
            .open(&path)
            .expect_err("the file is not encrypted");
        assert!(error.is_corrupt(), "{error:?}");
        let after = files(dir.path())?;
        assert!(
            changed(&before, &after).is_empty(),
            "a refused open changed {:?}",
            changed(&before, &after)
        );
        Ok(())
    }
}
