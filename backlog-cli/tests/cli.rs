//! The `backlog` binary end to end: each command run as a process on a fresh
//! file, its table, its `--json` shape, and its exit code on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use backlog::{FinalStatus, JobState, LeaseRequest, NewJob, Queue, QueueOptions, RetryPolicy};
use serde_json::{json, Value};
use tempfile::TempDir;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The exit codes `backlog --help` documents.
mod exit {
    pub const USAGE: i32 = 2;
    pub const NOT_FOUND: i32 = 3;
    pub const INVALID_INPUT: i32 = 4;
    pub const INVALID_STATE: i32 = 5;
    pub const UNKNOWN_QUEUE: i32 = 6;
    pub const UNREACHABLE: i32 = 7;
    pub const NOT_BACKLOG: i32 = 8;
    pub const ABORTED: i32 = 9;
}

/// One run of the binary.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> TestResult<Run> {
        if self.code == 0 {
            Ok(self)
        } else {
            Err(format!("exit {}: {}{}", self.code, self.stdout, self.stderr).into())
        }
    }

    fn json(&self) -> TestResult<Value> {
        Ok(serde_json::from_str(&self.stdout)
            .map_err(|e| format!("{e}: not JSON: {}", self.stdout))?)
    }

    fn fails_with(self, code: i32, says: &str) -> TestResult {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.contains(says),
            "stderr {:?} does not say {says:?}",
            self.stderr
        );
        Ok(())
    }
}

/// Runs `backlog ARGS` with no terminal and no `BACKLOG_DATABASE`.
fn backlog_raw(args: &[&str]) -> TestResult<Run> {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_backlog"))
        .args(args)
        .env_remove("BACKLOG_DATABASE")
        .stdin(Stdio::null())
        .output()?;
    Ok(Run {
        code: status.code().ok_or("killed by a signal")?,
        stdout: String::from_utf8(stdout)?,
        stderr: String::from_utf8(stderr)?,
    })
}

/// Runs `backlog --db DB ARGS`.
fn backlog(db: &Path, args: &[&str]) -> TestResult<Run> {
    let db = db.to_str().ok_or("path")?;
    let mut all = vec!["--db", db];
    all.extend_from_slice(args);
    backlog_raw(&all)
}

/// A fresh database with jobs in every state, through the library:
///
/// | id | queue   | kind   | state                              |
/// |----|---------|--------|------------------------------------|
/// | 1  | default | email  | completed, result `{"sent": true}` |
/// | 2  | default | email  | dead, one error "smtp down"        |
/// | 3  | default | email  | running, progress {"done": 3, ..}  |
/// | 4  | default | resize | retrying, one error "timeout"      |
/// | 5  | default | email  | available                          |
/// | 6  | media   | resize | scheduled in an hour, priority 5   |
/// | 7  | media   | resize | available                          |
struct Fixture {
    _dir: TempDir,
    db: PathBuf,
}

impl Fixture {
    fn new() -> TestResult<Fixture> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("app.db");
        // Retries wait an hour: job 4 stays retrying however slow the test.
        let queue = QueueOptions::new()
            .retry_policy(RetryPolicy {
                base: Duration::from_secs(3600),
                ..RetryPolicy::default()
            })
            .open(&db)?;
        for (payload, attempts) in [(json!({"to": "a@example.com"}), 5), (json!({"to": "b"}), 1)] {
            queue.enqueue(NewJob::new("email", payload).max_attempts(attempts))?;
        }
        let jobs = queue.lease(&LeaseRequest::new("worker-1", 2))?;
        queue.complete(&jobs[0], Some(json!({"sent": true})))?;
        queue.fail(&jobs[1], "smtp down")?;
        queue.enqueue(NewJob::new("email", json!({"to": "c"})))?;
        queue.enqueue(NewJob::new("resize", json!({"id": 4})))?;
        let running = queue.lease(&LeaseRequest::new("worker-1", 2))?;
        queue.fail(&running[1], "timeout")?;
        // Job 3 reported progress, written with a heartbeat.
        let ctx = backlog::JobContext::for_test(queue.clone(), running[0].clone());
        ctx.set_progress(&json!({"done": 3, "of": 10}))?;
        ctx.heartbeat()?;
        queue.enqueue(NewJob::new("email", json!({"to": "e"})))?;
        queue.enqueue(
            NewJob::new("resize", json!({"id": 6}))
                .queue("media")
                .priority(5)
                .delay(Duration::from_secs(3600)),
        )?;
        queue.enqueue(NewJob::new("resize", json!({"id": 7})).queue("media"))?;
        drop(queue);
        Ok(Fixture { _dir: dir, db })
    }

    fn run(&self, args: &[&str]) -> TestResult<Run> {
        backlog(&self.db, args)
    }

    /// The queue, opened by the test itself, to check what a command did.
    fn queue(&self) -> TestResult<Queue> {
        Ok(Queue::open(&self.db)?)
    }
}

// ---- the database: safety ---------------------------------------------------

#[test]
fn stats_on_a_missing_path_fails_and_creates_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("typo.db");
    backlog(&db, &["stats"])?.fails_with(exit::UNREACHABLE, "no database at")?;
    for command in [&["jobs"][..], &["show", "1"], &["metrics"], &["pause", "q"]] {
        assert_eq!(backlog(&db, command)?.code, exit::UNREACHABLE);
    }
    assert_eq!(std::fs::read_dir(dir.path())?.count(), 0, "no file created");
    Ok(())
}

#[test]
fn migrate_creates_a_new_queue_that_stats_then_reads() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("new.db");
    let run = backlog(&db, &["migrate"])?.ok()?;
    assert!(
        run.stdout.contains("applied 14 migration(s): V1__initial")
            && run.stdout.ends_with(
                "V12__open_batches_sequence_keys, V13__finished_batches, V14__running_bound\n"
            ),
        "{}",
        run.stdout
    );
    let again = backlog(&db, &["--json", "migrate"])?.ok()?.json()?;
    assert_eq!(
        again["applied"],
        json!([]),
        "nothing left to apply: {again}"
    );
    let run = backlog(&db, &["migrate"])?.ok()?;
    assert!(run.stdout.contains("schema up to date"), "{}", run.stdout);
    let run = backlog(&db, &["stats"])?.ok()?;
    assert!(run.stdout.contains("no queues yet"), "{}", run.stdout);
    assert_eq!(backlog(&db, &["--json", "stats"])?.ok()?.json()?, json!([]));
    Ok(())
}

#[test]
fn files_that_are_not_backlog_databases_are_refused_and_left_alone() -> TestResult {
    let dir = tempfile::tempdir()?;
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, not a database\n")?;
    backlog(&text, &["stats"])?.fails_with(exit::NOT_BACKLOG, "not a SQLite database")?;

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, "")?;
    backlog(&empty, &["stats"])?.fails_with(exit::NOT_BACKLOG, "empty file")?;

    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)?.execute_batch("CREATE TABLE users (id INTEGER)")?;
    let before = std::fs::read(&other)?;
    backlog(&other, &["stats"])?.fails_with(exit::NOT_BACKLOG, "without backlog's tables")?;
    backlog(&other, &["migrate"])?.fails_with(exit::NOT_BACKLOG, "another application")?;
    assert_eq!(
        std::fs::read(&other)?,
        before,
        "the other database is untouched"
    );
    let mode: String =
        rusqlite::Connection::open(&other)?.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "delete", "not switched to WAL");
    Ok(())
}

#[test]
fn no_database_named_is_a_usage_error() -> TestResult {
    backlog_raw(&["stats"])?.fails_with(exit::USAGE, "BACKLOG_DATABASE")?;
    // The environment variable names it as well as --db does.
    let fixture = Fixture::new()?;
    let run = Command::new(env!("CARGO_BIN_EXE_backlog"))
        .args(["--json", "stats"])
        .env("BACKLOG_DATABASE", &fixture.db)
        .stdin(Stdio::null())
        .output()?;
    assert!(run.status.success());
    Ok(())
}

#[test]
fn server_urls_need_their_feature_or_a_server() -> TestResult {
    let run = backlog_raw(&["--db", "postgres://app:hunter2@127.0.0.1:1/app", "stats"])?;
    let code = if cfg!(feature = "postgres") {
        exit::UNREACHABLE
    } else {
        exit::USAGE
    };
    assert_eq!(run.code, code, "{}", run.stderr);
    assert!(
        !run.stderr.contains("hunter2"),
        "password shown: {}",
        run.stderr
    );
    Ok(())
}

#[test]
fn unknown_commands_and_flags_are_usage_errors() -> TestResult {
    assert_eq!(backlog_raw(&["frobnicate"])?.code, exit::USAGE);
    let fixture = Fixture::new()?;
    assert_eq!(
        fixture.run(&["jobs", "--state", "bogus"])?.code,
        exit::USAGE
    );
    assert_eq!(fixture.run(&["show", "not-a-number"])?.code, exit::USAGE);
    Ok(())
}

// ---- reading ---------------------------------------------------------------

#[test]
fn stats_prints_a_table_and_json_per_queue() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["stats"])?.ok()?;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(lines[0].starts_with("QUEUE"), "{}", lines[0]);
    let default: Vec<&str> = lines[1].split_whitespace().collect();
    // No worker runs: the due jobs are flagged, per kind.
    assert!(lines[0].ends_with("NO WORKER"), "{}", lines[0]);
    assert_eq!(
        default,
        [
            "default", "1", "0", "1", "1", "0", "0", "1", "1", "1", "1", "0", "0", "1", "-",
            "email", "1"
        ]
    );
    let media: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        media,
        [
            "media", "1", "1", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "-",
            "resize", "1"
        ]
    );

    let stats = fixture.run(&["--json", "stats"])?.ok()?.json()?;
    assert_eq!(
        stats[0],
        json!({"queue": "default", "available": 1, "scheduled": 0, "retrying": 1,
               "running": 1, "grouped": 0, "pending": 0, "dead": 1, "completed_last_hour": 1,
               "completed_last_minute": 1,
               "finished": {"completed": 1, "discarded": 0, "cancelled": 0, "dead": 1,
                            "aggregated": 0},
               "paused": false,
               "unhandled": [{"kind": "email", "due": 1}]})
    );
    let only = fixture
        .run(&["--json", "stats", "--queue", "media"])?
        .ok()?
        .json()?;
    assert_eq!(only.as_array().map(Vec::len), Some(1));
    fixture
        .run(&["stats", "--queue", "nosuch"])?
        .fails_with(exit::UNKNOWN_QUEUE, "unknown queue \"nosuch\"")
}

#[test]
fn jobs_lists_with_filters_and_pages_by_id() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["jobs"])?.ok()?;
    assert_eq!(
        run.stdout.lines().count(),
        8,
        "header and 7 jobs:\n{}",
        run.stdout
    );
    assert!(run.stdout.contains("smtp down"), "{}", run.stdout);

    let ids = |v: &Value| -> Vec<i64> {
        v["jobs"]
            .as_array()
            .map(|a| a.iter().filter_map(|j| j["id"].as_i64()).collect())
            .unwrap_or_default()
    };
    let page = fixture
        .run(&["--json", "jobs", "--limit", "3"])?
        .ok()?
        .json()?;
    assert_eq!(ids(&page), [1, 2, 3]);
    assert_eq!(page["next_after"], json!(3));
    let page = fixture
        .run(&["--json", "jobs", "--limit", "3", "--after", "6"])?
        .ok()?
        .json()?;
    assert_eq!(ids(&page), [7]);
    assert_eq!(page["next_after"], Value::Null);
    let text = fixture.run(&["jobs", "--limit", "3"])?.ok()?;
    assert!(text.stdout.contains("more: --after 3"), "{}", text.stdout);

    let email = fixture
        .run(&["--json", "jobs", "--state", "available", "--kind", "email"])?
        .ok()?
        .json()?;
    assert_eq!(ids(&email), [5]);
    let media = fixture
        .run(&["--json", "jobs", "--queue", "media"])?
        .ok()?
        .json()?;
    assert_eq!(ids(&media), [6, 7]);
    let dead = fixture
        .run(&["--json", "jobs", "--state", "dead"])?
        .ok()?
        .json()?;
    assert_eq!(ids(&dead), [2]);
    assert_eq!(dead["jobs"][0]["state"], "dead");
    fixture
        .run(&["jobs", "--queue", "nosuch"])?
        .fails_with(exit::UNKNOWN_QUEUE, "unknown queue")?;
    fixture
        .run(&["jobs", "--limit", "0"])?
        .fails_with(exit::INVALID_INPUT, "--limit")
}

#[test]
fn show_prints_payload_errors_result_and_times() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["show", "1"])?.ok()?;
    for expected in [
        "state         completed",
        "\"sent\": true",
        "worker        worker-1",
        "\"to\": \"a@example.com\"",
    ] {
        assert!(
            run.stdout.contains(expected),
            "{expected:?} in\n{}",
            run.stdout
        );
    }
    let run = fixture.run(&["show", "2"])?.ok()?;
    assert!(run.stdout.contains("attempt 1 at "), "{}", run.stdout);
    assert!(run.stdout.contains(": smtp down"), "{}", run.stdout);

    let job = fixture.run(&["--json", "show", "4"])?.ok()?.json()?;
    assert_eq!(job["id"], 4);
    assert_eq!(job["state"], "retrying");
    assert_eq!(job["payload"], json!({"id": 4}));
    assert_eq!(job["attempts"], 1);
    assert_eq!(job["errors"][0]["message"], "timeout");
    assert_eq!(job["errors"][0]["attempt"], 1);
    for time in ["created_at", "updated_at", "available_at"] {
        let text = job[time].as_str().ok_or(time)?;
        assert!(humantime::parse_rfc3339(text).is_ok(), "{time}: {text}");
    }
    assert_eq!(job["finished_at"], Value::Null);
    let done = fixture.run(&["--json", "show", "1"])?.ok()?.json()?;
    assert_eq!(done["result"], json!({"sent": true}));

    fixture
        .run(&["show", "99"])?
        .fails_with(exit::NOT_FOUND, "job 99 not found")
}

#[test]
fn show_prints_a_running_jobs_progress() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["show", "3"])?.ok()?;
    assert!(run.stdout.contains("progress\n"), "{}", run.stdout);
    assert!(run.stdout.contains("\"done\": 3"), "{}", run.stdout);
    let job = fixture.run(&["--json", "show", "3"])?.ok()?.json()?;
    assert_eq!(job["progress"], json!({"done": 3, "of": 10}));
    let job = fixture.run(&["--json", "show", "5"])?.ok()?.json()?;
    assert_eq!(job["progress"], Value::Null);
    Ok(())
}

#[test]
fn show_prints_a_jobs_sequence_key_made_safe() -> TestResult {
    let fixture = Fixture::new()?;
    let queue = Queue::open(&fixture.db)?;
    let id = queue
        .enqueue(NewJob::new("sync", json!({})).sequence("account-7"))?
        .id;
    drop(queue);
    let run = fixture.run(&["show", &id.to_string()])?.ok()?;
    assert!(
        run.stdout.contains("\nsequence      account-7\n"),
        "{}",
        run.stdout
    );
    let job = fixture
        .run(&["--json", "show", &id.to_string()])?
        .ok()?
        .json()?;
    assert_eq!(job["sequence"], json!("account-7"));
    let job = fixture.run(&["--json", "show", "1"])?.ok()?.json()?;
    assert_eq!(job["sequence"], Value::Null);
    // A key written behind the library's back, with a terminal escape:
    // shown escaped, never as the control character.
    rusqlite::Connection::open(&fixture.db)?.execute(
        "UPDATE backlog_sequence_jobs SET sequence_key = 'a' || char(27) || '[31mb'",
        [],
    )?;
    let run = fixture.run(&["show", &id.to_string()])?.ok()?;
    assert!(!run.stdout.contains('\u{1b}'), "{:?}", run.stdout);
    assert!(run.stdout.contains("\nsequence      a"), "{}", run.stdout);
    Ok(())
}

#[test]
fn metrics_prints_prometheus_text_with_backlog_names() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["metrics"])?.ok()?;
    let text = run.stdout;
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut types = std::collections::HashMap::new();
    let mut samples = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(line.to_owned())?;
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').ok_or(line.to_owned())?;
            samples.insert(series.to_owned(), value.parse::<f64>()?);
        }
    }
    for name in types.keys() {
        assert!(name.starts_with("backlog_"), "{name}");
    }
    assert_eq!(types.get("backlog_jobs").map(String::as_str), Some("gauge"));
    assert_eq!(
        types
            .get("backlog_sqlite_wal_size_bytes")
            .map(String::as_str),
        Some("gauge")
    );
    let sample = |s: &str| samples.get(s).copied();
    assert_eq!(
        sample(r#"backlog_jobs{queue="default",state="available"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(r#"backlog_jobs{queue="default",state="running"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(r#"backlog_jobs{queue="default",state="retrying"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(r#"backlog_jobs{queue="media",state="scheduled"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(r#"backlog_dead_letter_jobs{queue="default"}"#),
        Some(1.0)
    );
    assert_eq!(sample("backlog_database_up"), Some(1.0));
    Ok(())
}

#[test]
fn watch_refreshes_the_stats_until_its_count() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture
        .run(&["watch", "--interval", "100ms", "--count", "2"])?
        .ok()?;
    assert_eq!(
        run.stdout.matches("backlog watch:").count(),
        2,
        "{}",
        run.stdout
    );
    assert_eq!(run.stdout.matches("QUEUE").count(), 2);
    let run = fixture
        .run(&["--json", "watch", "--interval", "100ms", "--count", "2"])?
        .ok()?;
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["queues"][0]["queue"], "default");
    fixture
        .run(&["watch", "--interval", "soon"])?
        .fails_with(exit::INVALID_INPUT, "not a duration")
}

// ---- acting on one job -----------------------------------------------------

#[test]
fn enqueue_adds_a_job_with_every_option() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["enqueue", "email", r#"{"to": "x"}"#])?.ok()?;
    assert!(run.stdout.starts_with("enqueued job 8 "), "{}", run.stdout);
    let out = fixture
        .run(&[
            "--json",
            "enqueue",
            "report",
            r#"{"month": 5}"#,
            "--queue",
            "reports",
            "--priority",
            "-3",
            "--delay",
            "10m",
            "--unique-key",
            "may",
            "--max-attempts",
            "2",
        ])?
        .ok()?
        .json()?;
    assert_eq!(out["existed"], false);
    let job = &out["job"];
    assert_eq!(
        (
            &job["queue"],
            &job["priority"],
            &job["state"],
            &job["unique_key"],
            &job["max_attempts"]
        ),
        (
            &json!("reports"),
            &json!(-3),
            &json!("scheduled"),
            &json!("may"),
            &json!(2)
        )
    );
    let again = fixture
        .run(&[
            "--json",
            "enqueue",
            "report",
            "{}",
            "--queue",
            "reports",
            "--unique-key",
            "may",
        ])?
        .ok()?
        .json()?;
    assert_eq!(
        (again["id"].clone(), again["existed"].clone()),
        (out["id"].clone(), json!(true))
    );
    let at = fixture
        .run(&[
            "--json",
            "enqueue",
            "k",
            "1",
            "--run-at",
            "2999-01-01T00:00:00Z",
        ])?
        .ok()?
        .json()?;
    assert_eq!(at["job"]["available_at"], "2999-01-01T00:00:00.000000Z");
    Ok(())
}

#[test]
fn enqueue_rejects_bad_json_names_and_times() -> TestResult {
    let fixture = Fixture::new()?;
    fixture
        .run(&["enqueue", "email", "{not json"])?
        .fails_with(exit::INVALID_INPUT, "not JSON")?;
    fixture
        .run(&["enqueue", "", "{}"])?
        .fails_with(exit::INVALID_INPUT, "invalid kind")?;
    fixture
        .run(&["enqueue", "k", "{}", "--queue", "a\tb"])?
        .fails_with(exit::INVALID_INPUT, "invalid queue")?;
    fixture
        .run(&["enqueue", "k", "{}", "--max-attempts", "0"])?
        .fails_with(exit::INVALID_INPUT, "max_attempts")?;
    fixture
        .run(&["enqueue", "k", "{}", "--delay", "later"])?
        .fails_with(exit::INVALID_INPUT, "not a duration")?;
    fixture
        .run(&["enqueue", "k", "{}", "--run-at", "tomorrow"])?
        .fails_with(exit::INVALID_INPUT, "not a time")?;
    assert_eq!(fixture.queue()?.get(8).ok(), None, "nothing was added");
    Ok(())
}

#[test]
fn retry_cancel_discard_and_delete_act_on_one_job() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["retry", "2"])?.ok()?;
    assert!(run.stdout.contains("job 2 retried"), "{}", run.stdout);
    assert_eq!(fixture.queue()?.get(2)?.state, JobState::Available);
    let cancelled = fixture.run(&["--json", "cancel", "5"])?.ok()?.json()?;
    assert_eq!(cancelled["state"], "cancelled");
    let run = fixture.run(&["cancel", "3"])?.ok()?;
    assert!(run.stdout.contains("asked to stop"), "{}", run.stdout);
    assert!(fixture.queue()?.get(3)?.cancel_requested);
    let discarded = fixture
        .run(&["--json", "discard", "7", "--reason", "bad image"])?
        .ok()?
        .json()?;
    assert_eq!(discarded["state"], "discarded");
    assert_eq!(discarded["errors"][0]["message"], "bad image");
    let deleted = fixture.run(&["--json", "delete", "1"])?.ok()?.json()?;
    assert_eq!(deleted, json!({"id": 1, "deleted": true}));
    assert!(fixture.queue()?.get(1).is_err());
    Ok(())
}

#[test]
fn actions_on_unknown_ids_and_wrong_states_fail_with_their_codes() -> TestResult {
    let fixture = Fixture::new()?;
    for command in ["retry", "cancel", "discard", "delete", "run-now"] {
        fixture
            .run(&[command, "99"])?
            .fails_with(exit::NOT_FOUND, "job 99 not found")?;
    }
    fixture
        .run(&["retry", "1"])?
        .fails_with(exit::INVALID_STATE, "completed")?;
    fixture
        .run(&["retry", "5"])?
        .fails_with(exit::INVALID_STATE, "`backlog run-now` makes it due")?;
    fixture
        .run(&["cancel", "1"])?
        .fails_with(exit::INVALID_STATE, "already finished")?;
    fixture
        .run(&["discard", "3"])?
        .fails_with(exit::INVALID_STATE, "running")?;
    fixture
        .run(&["run-now", "3"])?
        .fails_with(exit::INVALID_STATE, "running")?;
    fixture
        .run(&["update", "3", "--priority", "1"])?
        .fails_with(exit::INVALID_STATE, "running")?;
    fixture
        .run(&["update", "99", "--priority", "1"])?
        .fails_with(exit::NOT_FOUND, "not found")?;
    assert_eq!(
        fixture.run(&["retry"])?.code,
        exit::USAGE,
        "an id or --state"
    );
    Ok(())
}

#[test]
fn run_now_and_update_change_a_waiting_job() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["run-now", "6"])?.ok()?;
    assert!(run.stdout.contains("job 6 due now"), "{}", run.stdout);
    assert_eq!(fixture.queue()?.get(6)?.state, JobState::Available);

    let updated = fixture
        .run(&[
            "--json",
            "update",
            "6",
            "--priority",
            "-2",
            "--queue",
            "bulk",
            "--run-at",
            "+2h",
        ])?
        .ok()?
        .json()?;
    assert_eq!(
        (&updated["priority"], &updated["queue"], &updated["state"]),
        (&json!(-2), &json!("bulk"), &json!("scheduled"))
    );
    fixture
        .run(&["update", "6"])?
        .fails_with(exit::USAGE, "--priority, --run-at or --queue")?;
    fixture
        .run(&["update", "6", "--queue", ""])?
        .fails_with(exit::INVALID_INPUT, "invalid queue")?;
    fixture
        .run(&["update", "6", "--run-at", "noon"])?
        .fails_with(exit::INVALID_INPUT, "not a time")?;
    assert_eq!(
        fixture.queue()?.get(6)?.queue,
        "bulk",
        "bad updates change nothing"
    );
    Ok(())
}

// ---- acting on many jobs ---------------------------------------------------

#[test]
fn bulk_actions_need_confirmation_or_yes() -> TestResult {
    let fixture = Fixture::new()?;
    fixture
        .run(&["delete", "--state", "available"])?
        .fails_with(exit::ABORTED, "pass --yes")?;
    assert_eq!(
        fixture.queue()?.get(5)?.state,
        JobState::Available,
        "nothing deleted"
    );

    let report = fixture
        .run(&[
            "--json",
            "delete",
            "--state",
            "available",
            "--queue",
            "media",
            "--yes",
        ])?
        .ok()?
        .json()?;
    assert_eq!(
        report,
        json!({"action": "delete", "matched": 1, "done": 1, "skipped": 0})
    );
    assert!(fixture.queue()?.get(7).is_err());

    let retried = fixture
        .run(&["--json", "retry", "--state", "dead", "--yes"])?
        .ok()?
        .json()?;
    assert_eq!(retried["done"], 1);
    let cancelled = fixture
        .run(&["--json", "cancel", "--state", "running", "--yes"])?
        .ok()?
        .json()?;
    assert_eq!(
        (&cancelled["done"], &cancelled["asked_to_stop"]),
        (&json!(1), &json!(1))
    );
    let run = fixture
        .run(&[
            "discard",
            "--state",
            "available",
            "--kind",
            "email",
            "--yes",
        ])?
        .ok()?;
    assert!(run.stdout.starts_with("discard: 2 done"), "{}", run.stdout);
    fixture
        .run(&["delete", "--state", "dead", "--queue", "nosuch", "--yes"])?
        .fails_with(exit::UNKNOWN_QUEUE, "unknown queue")?;
    assert_eq!(
        fixture.run(&["delete", "5", "--state", "dead"])?.code,
        exit::USAGE,
        "an id or a filter, not both"
    );
    Ok(())
}

#[test]
fn pause_and_resume_a_queue() -> TestResult {
    let fixture = Fixture::new()?;
    let paused = fixture.run(&["--json", "pause", "media"])?.ok()?.json()?;
    assert_eq!(paused, json!({"queue": "media", "paused": true}));
    assert_eq!(fixture.queue()?.paused_queues()?, ["media"]);
    let stats = fixture
        .run(&["--json", "stats", "--queue", "media"])?
        .ok()?
        .json()?;
    assert_eq!(stats[0]["paused"], true);
    let run = fixture.run(&["resume", "media"])?.ok()?;
    assert_eq!(run.stdout, "queue media resumed\n");
    assert!(fixture.queue()?.paused_queues()?.is_empty());

    // A queue with no jobs yet can be paused ahead of them, as
    // `Queue::pause` can; the message says it has none.
    fixture
        .run(&["resume", "nosuch"])?
        .fails_with(exit::UNKNOWN_QUEUE, "unknown queue")?;
    let run = fixture.run(&["pause", "nosuch"])?.ok()?;
    assert!(run.stdout.contains("it has no jobs yet"), "{}", run.stdout);
    assert_eq!(fixture.queue()?.paused_queues()?, ["nosuch"]);
    fixture.run(&["pause", "other", "--force"])?.ok()?;
    fixture
        .run(&["pause", "", "--force"])?
        .fails_with(exit::INVALID_INPUT, "invalid queue")
}

#[test]
fn limits_are_shown_set_kept_and_cleared() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["limits", "media"])?.ok()?;
    assert_eq!(run.stdout, "queue media: no limits\n");
    let run = fixture
        .run(&["limits", "media", "--concurrency", "3", "--rate", "100/s"])?
        .ok()?;
    assert_eq!(
        run.stdout,
        "queue media: limits set: concurrency 3, rate 100/s\n"
    );
    let limits = fixture.queue()?.limits("media")?;
    assert_eq!(limits.concurrency, Some(3));
    assert_eq!(limits.rate, Some(backlog::Rate::per_second(100)));

    // Changing one keeps the other.
    let set = fixture
        .run(&["--json", "limits", "media", "--rate", "5/2s"])?
        .ok()?
        .json()?;
    assert_eq!(set["concurrency"], 3);
    assert_eq!(set["rate"]["period_ms"], 2000);
    let stats = fixture
        .run(&["--json", "stats", "--queue", "media"])?
        .ok()?
        .json()?;
    assert_eq!(stats[0]["limits"]["rate"]["text"], "5/2s");
    let table = fixture.run(&["stats"])?.ok()?;
    assert!(table.stdout.contains("LIMITS"), "{}", table.stdout);
    assert!(table.stdout.contains("concurrency 3, rate 5/2s"));

    for bad in [
        &["limits", "media", "--concurrency", "0"][..],
        &["limits", "media", "--concurrency", "-2"],
        &["limits", "media", "--rate", "0/s"],
        &["limits", "media", "--rate", "10/fortnight"],
    ] {
        fixture.run(bad)?.fails_with(exit::INVALID_INPUT, "")?;
    }
    assert_eq!(fixture.queue()?.limits("media")?.concurrency, Some(3));

    let run = fixture.run(&["limits", "media", "--clear"])?.ok()?;
    assert_eq!(run.stdout, "queue media: limits cleared\n");
    assert!(fixture.queue()?.limits("media")?.is_unlimited());
    Ok(())
}

#[test]
fn purge_deletes_history_by_status_and_age() -> TestResult {
    let fixture = Fixture::new()?;
    let run = fixture.run(&["purge", "--older-than", "1h"])?.ok()?;
    assert!(run.stdout.starts_with("purged 0 "), "{}", run.stdout);
    std::thread::sleep(Duration::from_millis(20));
    let dead = fixture
        .run(&[
            "--json",
            "purge",
            "--status",
            "dead",
            "--older-than",
            "10ms",
        ])?
        .ok()?
        .json()?;
    assert_eq!(dead["deleted"], 1);
    assert_eq!(dead["statuses"], json!(["dead"]));
    let queue = fixture.queue()?;
    assert!(queue.get(2).is_err());
    assert_eq!(
        queue.get(1)?.state,
        JobState::Finished(FinalStatus::Completed),
        "other statuses kept"
    );
    fixture
        .run(&["purge", "--older-than", "a while"])?
        .fails_with(exit::INVALID_INPUT, "not a duration")?;
    assert_eq!(
        fixture.run(&["purge"])?.code,
        exit::USAGE,
        "--older-than is required"
    );
    Ok(())
}

#[test]
fn copy_moves_a_queue_into_a_new_file() -> TestResult {
    let fixture = Fixture::new()?;
    let dir = tempfile::tempdir()?;
    let to = dir.path().join("copy.db");
    let from_s = fixture.db.to_str().ok_or("path")?;
    let to_s = to.to_str().ok_or("path")?;
    // A workflow (one step waiting for the other), a batch with a member,
    // and a sequence of two (the second waiting).
    let queue = Queue::open(&fixture.db)?;
    queue.enqueue_workflow(
        backlog::Workflow::new("report")
            .step("fetch", NewJob::new("fetch", json!({})))
            .step_after("send", NewJob::new("send", json!({})), &["fetch"]),
    )?;
    let batch = queue.batch().create()?;
    queue.enqueue(NewJob::new("row", json!(1)).batch(batch.id))?;
    for n in 0..2 {
        queue.enqueue(NewJob::new("sync", json!(n)).sequence("account-7"))?;
    }
    drop(queue);
    let report = backlog_raw(&["--json", "copy", from_s, to_s])?
        .ok()?
        .json()?;
    assert_eq!(
        report,
        json!({"live": 8, "pending": 2, "history": 2, "skipped": 0, "dependencies": 2,
               "workflows": 1, "batches": 1, "sequences": 1, "paused_queues": 0})
    );
    let copied = Queue::open(&to)?;
    assert_eq!(copied.get(4)?.errors[0].message, "timeout");
    let missing = dir.path().join("missing.db");
    backlog_raw(&["copy", missing.to_str().ok_or("path")?, to_s])?
        .fails_with(exit::UNREACHABLE, "no database at")?;
    assert!(!missing.exists());
    // `--db` is the source when only the destination is given.
    let again = dir.path().join("again.db");
    let report = fixture
        .run(&["--json", "copy", again.to_str().ok_or("path")?])?
        .ok()?
        .json()?;
    assert_eq!(report["live"], json!(8));
    assert_eq!(
        Queue::open(&again)?.get(1)?.state,
        JobState::Finished(FinalStatus::Completed)
    );
    let text = dir.path().join("text.db");
    let run = backlog_raw(&["copy", from_s, text.to_str().ok_or("path")?])?.ok()?;
    assert!(
        run.stdout
            .starts_with("copied 8 live, 2 waiting and 2 finished job(s) from ")
            && run.stdout.ends_with(
                "; 0 already there; 2 dependency edge(s), 1 workflow(s), 1 batch(es), \
                 1 sequence(s), 0 paused queue(s)\n"
            ),
        "{}",
        run.stdout
    );
    backlog_raw(&["copy", to_s])?.fails_with(exit::USAGE, "TO with --db FROM")?;
    let help = backlog_raw(&["copy", "--help"])?.ok()?;
    assert!(
        help.stdout
            .contains("the source when only the destination is given"),
        "{}",
        help.stdout
    );
    Ok(())
}

#[test]
fn stats_totals_count_every_finish_and_outlive_history() -> TestResult {
    let fixture = Fixture::new()?;
    let queue = fixture.queue()?;
    // Job 5 (email, available) discarded and job 7 (media) cancelled by an
    // operator; job 6 (media, scheduled) discarded too.
    queue.discard_job(5, "not needed")?;
    queue.discard_job(6, "not needed")?;
    queue.cancel(7)?;
    let totals = |run: Run| -> TestResult<Vec<Vec<String>>> {
        Ok(run
            .stdout
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect())
    };
    let table = fixture.run(&["stats"])?.ok()?;
    let header: Vec<&str> = table
        .stdout
        .lines()
        .next()
        .ok_or("no header")?
        .split_whitespace()
        .collect();
    // QUEUE, 6 live states, DEAD, DONE 1H, PER MIN, then the totals (the
    // header splits DONE 1H and PER MIN in two words each).
    assert_eq!(
        &header[12..17],
        ["COMPLETED", "DISCARDED", "CANCELLED", "DIED", "PAUSED"]
    );
    let rows = totals(table)?;
    assert_eq!(
        &rows[0][10..14],
        ["1", "1", "0", "1"],
        "default: {:?}",
        rows[0]
    );
    assert_eq!(
        &rows[1][10..14],
        ["0", "1", "1", "0"],
        "media: {:?}",
        rows[1]
    );
    // Pruned history: the dead-letter count drops, the totals stay.
    std::thread::sleep(Duration::from_millis(20));
    fixture.run(&["purge", "--older-than", "10ms"])?.ok()?;
    let stats = fixture.run(&["--json", "stats"])?.ok()?.json()?;
    assert_eq!(stats[0]["dead"], json!(0));
    assert_eq!(
        stats[0]["finished"],
        json!({"completed": 1, "discarded": 1, "cancelled": 0, "dead": 1, "aggregated": 0})
    );
    assert_eq!(
        stats[1]["finished"],
        json!({"completed": 0, "discarded": 1, "cancelled": 1, "dead": 0, "aggregated": 0})
    );
    Ok(())
}

#[test]
fn a_database_an_older_backlog_created_needs_migrate_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("old.db");
    backlog(&db, &["migrate"])?.ok()?;
    // Back to the schema of the first release: V1 only.
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "DROP INDEX backlog_jobs_lease; DROP INDEX backlog_jobs_lease_kind;
         DROP INDEX backlog_jobs_scheduled; ALTER TABLE backlog_jobs DROP COLUMN due;
         CREATE INDEX backlog_jobs_lease ON backlog_jobs (queue, priority DESC, available_at, id)
             WHERE lease_token IS NULL;
         ALTER TABLE backlog_jobs DROP COLUMN progress;
         ALTER TABLE backlog_history DROP COLUMN progress;
         DROP TABLE backlog_groups; DROP TABLE backlog_group_members;
         DROP TABLE backlog_schedules;
         DROP TABLE backlog_workers;
         DROP TABLE backlog_pending; DROP TABLE backlog_dependencies;
         DROP TABLE backlog_workflows; DROP TABLE backlog_workflow_steps;
         DROP TABLE backlog_batches; DROP TABLE backlog_batch_jobs;
         DROP TABLE backlog_finished_counts;
         DROP TABLE backlog_sequences;
         DROP TABLE backlog_sequence_jobs;
         DROP INDEX backlog_jobs_running;
         ALTER TABLE backlog_queues DROP COLUMN rate_window_start;
         ALTER TABLE backlog_queues DROP COLUMN rate_window_count;
         DELETE FROM backlog_schema_history WHERE version > 1;",
    )?;
    drop(conn);
    backlog(&db, &["stats"])?.fails_with(10, "its schema lacks V2__due")?;
    backlog(&db, &["migrate"])?.ok()?;
    backlog(&db, &["stats"])?.ok()?;
    Ok(())
}

#[test]
fn schedules_lists_last_and_next_ticks_and_removes_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("app.db");
    backlog(&db, &["schedules"])?.fails_with(exit::UNREACHABLE, "no database at")?;
    let queue = backlog::Queue::open(&db)?;
    let scheduler = backlog::Scheduler::new(queue.clone());
    let job = || backlog::NewJob::new("report", json!({}));
    scheduler.add(backlog::Schedule::cron("nightly", "0 3 * * *", job())?)?;
    scheduler.add(backlog::Schedule::every(
        "fast",
        Duration::from_millis(1),
        job(),
    )?)?;
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(scheduler.run_due()?, 1, "fast ticked");

    let run = backlog(&db, &["schedules"])?.ok()?;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(lines[0].starts_with("NAME"), "{}", lines[0]);
    assert!(
        lines[1].starts_with("fast") && lines[1].contains("every 1ms"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("nightly") && lines[2].contains("0 3 * * * (UTC)  -"),
        "{}",
        lines[2]
    );
    assert!(lines[2].contains("T03:00:00Z (in "), "{}", lines[2]);

    let listed = backlog(&db, &["--json", "schedules"])?.ok()?.json()?;
    assert_eq!(listed[1]["name"], "nightly");
    assert_eq!(listed[1]["last_tick"], Value::Null);
    assert!(listed[0]["last_tick"].is_string(), "{listed}");

    backlog(&db, &["schedules", "--remove", "nightly"])?.ok()?;
    backlog(&db, &["schedules", "--remove", "nightly"])?
        .fails_with(exit::NOT_FOUND, "no schedule named \"nightly\"")?;
    let listed = backlog(&db, &["--json", "schedules"])?.ok()?.json()?;
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    Ok(())
}

#[test]
fn workers_lists_each_live_worker_its_running_jobs_and_the_unhandled_kinds() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("app.db");
    let run = backlog(&db, &["migrate"])?.ok()?;
    drop(run);
    let queue = Queue::open(&db)?;
    let run = backlog(&db, &["workers"])?.ok()?;
    assert_eq!(run.stdout, "no live workers\n");

    let events = queue.subscribe();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let worker = backlog::Worker::builder(queue.clone())
        .worker_id("cli-worker")
        .queues(["default", "mail"])
        .concurrency(2)
        .handle_raw("email", move |_, _| {
            let _ = held
                .lock()
                .map(|rx| rx.recv_timeout(Duration::from_secs(30)));
            Ok(())
        })
        .start()?;
    let id = queue.enqueue(NewJob::new("email", json!({})))?.id;
    queue.enqueue(NewJob::new("resize", json!({})).queue("media"))?;
    while !matches!(
        events.recv_timeout(Duration::from_secs(20))?,
        backlog::Event::Started { job_id, .. } if job_id == id
    ) {}

    let run = backlog(&db, &["workers"])?.ok()?;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("ID "), "{}", run.stdout);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[0], "cli-worker", "{}", run.stdout);
    assert_eq!(row[2], std::process::id().to_string());
    assert_eq!(
        &row[3..8],
        ["default,mail", "email", "2", "1:", &format!("#{id}")]
    );
    assert!(
        run.stdout.contains("due jobs no live worker handles"),
        "{}",
        run.stdout
    );
    let last: Vec<&str> = lines.last().ok_or("no lines")?.split_whitespace().collect();
    assert_eq!(last, ["media", "resize", "1"]);

    let listed = backlog(&db, &["--json", "workers"])?.ok()?.json()?;
    let w = &listed["workers"][0];
    assert_eq!(w["id"], json!("cli-worker"));
    assert_eq!(w["queues"], json!(["default", "mail"]));
    assert_eq!(w["kinds"], json!(["email"]));
    assert_eq!(w["concurrency"], json!(2));
    assert_eq!(w["pid"], json!(std::process::id()));
    assert_eq!(
        w["running"],
        json!([{"id": id, "queue": "default", "kind": "email"}])
    );
    assert!(w["heartbeat_at"].as_str().is_some());
    assert_eq!(
        listed["unhandled"],
        json!([{"queue": "media", "kind": "resize", "due": 1}])
    );

    release.send(())?;
    worker.shutdown(Duration::from_secs(10))?;
    let run = backlog(&db, &["workers"])?.ok()?;
    assert!(
        run.stdout.starts_with("no live workers\n"),
        "{}",
        run.stdout
    );
    Ok(())
}

#[test]
fn workers_prints_what_a_worker_row_carries_without_control_characters() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("app.db");
    backlog(&db, &["migrate"])?.ok()?;
    // A row no worker would write (its names are checked): written by hand.
    let far = 4_000_000_000_000_000_i64;
    rusqlite::Connection::open(&db)?.execute(
        "INSERT INTO backlog_workers
             (id, host, pid, queues, kinds, concurrency, started_at, heartbeat_at, expires_at)
         VALUES (?1, ?2, 1, ?3, ?4, 1, 0, 0, ?5)",
        rusqlite::params![
            "w\x1b]0;PWNED\x07",
            "host\x1b[2J",
            r#"["q\u001b[31m"]"#,
            r#"["k\u009b1m"]"#,
            far
        ],
    )?;
    let run = backlog(&db, &["workers"])?.ok()?;
    assert!(
        !run.stdout.chars().any(|c| c.is_control() && c != '\n'),
        "{:?}",
        run.stdout
    );
    assert!(
        run.stdout.contains("w\\u{1b}]0;PWNED\\u{7}"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("host\\u{1b}[2J"), "{}", run.stdout);
    assert!(run.stdout.contains("q\\u{1b}[31m"), "{}", run.stdout);
    Ok(())
}

// ---- workflows, dependencies, batches ---------------------------------------

/// A queue holding workflow "report" (fetch-a, fetch-b, merge after both;
/// fetch-a completed), a plain job depending on fetch-b, and an open batch
/// with two members (one completed) and both callbacks.
struct Flows {
    _dir: TempDir,
    db: PathBuf,
    workflow: backlog::EnqueuedWorkflow,
    audit: i64,
    batch: i64,
    members: [i64; 2],
}

impl Flows {
    fn new() -> TestResult<Flows> {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("flows.db");
        let queue = Queue::open(&db)?;
        let workflow = queue.enqueue_workflow(
            backlog::Workflow::new("report")
                .step("fetch-a", NewJob::new("fetch", json!({"source": "a"})))
                .step("fetch-b", NewJob::new("fetch", json!({"source": "b"})))
                .step_after(
                    "merge",
                    NewJob::new("merge", json!({})),
                    &["fetch-a", "fetch-b"],
                ),
        )?;
        let fetch_a = workflow.step("fetch-a").ok_or("fetch-a")?;
        let leased = queue.lease(&LeaseRequest::new("w", 10).kinds(["fetch"]))?;
        for job in &leased {
            if job.id == fetch_a {
                queue.complete(job, Some(json!(1)))?;
            } else {
                queue.release(job)?;
            }
        }
        let audit = queue
            .enqueue(
                NewJob::new("audit", json!({}))
                    .depends_on([workflow.step("fetch-b").ok_or("b")?]),
            )?
            .id;
        let batch = queue
            .batch()
            .on_complete(NewJob::new("report", json!({})).queue("callbacks"))
            .on_success(NewJob::new("done", json!({})).queue("callbacks"))
            .create()?
            .id;
        let members = [
            queue
                .enqueue(NewJob::new("row", json!({"n": 1})).batch(batch))?
                .id,
            queue
                .enqueue(NewJob::new("row", json!({"n": 2})).batch(batch))?
                .id,
        ];
        let leased = queue.lease(&LeaseRequest::new("w", 1).kinds(["row"]))?;
        queue.complete(&leased[0], None)?;
        Ok(Flows {
            _dir: dir,
            db,
            workflow,
            audit,
            batch,
            members,
        })
    }

    fn run(&self, args: &[&str]) -> TestResult<Run> {
        backlog(&self.db, args)
    }

    fn step(&self, name: &str) -> TestResult<i64> {
        Ok(self.workflow.step(name).ok_or(name.to_owned())?)
    }
}

#[test]
fn workflow_shows_each_step_its_state_and_what_it_waits_on() -> TestResult {
    let f = Flows::new()?;
    let id = f.workflow.id.to_string();
    for which in ["report", id.as_str()] {
        let run = f.run(&["workflow", which])?.ok()?;
        let text = &run.stdout;
        assert!(
            text.starts_with(&format!("workflow {id} report (running)")),
            "{text}"
        );
        assert!(text.contains("1 of 3 step(s) finished"), "{text}");
        let merge = text
            .lines()
            .find(|l| l.starts_with("merge"))
            .ok_or("no merge row")?;
        let cells: Vec<&str> = merge
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            [
                "merge",
                &f.step("merge")?.to_string(),
                "merge",
                "pending",
                "fetch-a, fetch-b",
                "fetch-b"
            ],
            "{text}"
        );
    }
    let value = f.run(&["--json", "workflow", "report"])?.ok()?.json()?;
    assert_eq!(value["id"], f.workflow.id);
    assert_eq!(value["name"], "report");
    assert_eq!(value["finished"], false);
    let steps = value["steps"].as_array().ok_or("steps")?;
    let merge = steps.iter().find(|s| s["step"] == "merge").ok_or("merge")?;
    assert_eq!(merge["job_id"], f.step("merge")?);
    assert_eq!(merge["kind"], "merge");
    assert_eq!(merge["state"], "pending");
    assert_eq!(merge["waiting_on"], json!(["fetch-b"]));
    assert_eq!(
        merge["after"],
        json!([
            {"job_id": f.step("fetch-a")?, "step": "fetch-a", "status": "completed"},
            {"job_id": f.step("fetch-b")?, "step": "fetch-b", "status": null},
        ])
    );
    f.run(&["workflow", "nosuch"])?
        .fails_with(exit::NOT_FOUND, "no workflow is named \"nosuch\"")?;
    f.run(&["workflow", "999"])?
        .fails_with(exit::NOT_FOUND, "no workflow has id 999")
}

#[test]
fn workflow_cancel_needs_confirmation_or_yes() -> TestResult {
    let f = Flows::new()?;
    f.run(&["workflow", "cancel", "report"])?
        .fails_with(exit::ABORTED, "pass --yes")?;
    let queue = Queue::open(&f.db)?;
    assert_eq!(queue.get(f.step("merge")?)?.state, JobState::Pending);

    let report = f
        .run(&["--json", "workflow", "cancel", "report", "--yes"])?
        .ok()?
        .json()?;
    assert_eq!(report["workflow"], f.workflow.id);
    // fetch-b, and merge with it (cancelled by its dependency's cancel).
    assert_eq!(report["cancelled"], 2, "{report}");
    assert_eq!(report["asked_to_stop"], 0, "{report}");
    for step in ["fetch-b", "merge"] {
        assert_eq!(queue.get(f.step(step)?)?.state, JobState::CANCELLED);
    }
    assert_eq!(queue.get(f.step("fetch-a")?)?.state, JobState::COMPLETED);
    // Nothing left to cancel: nothing asked.
    let run = f.run(&["workflow", "cancel", "report"])?.ok()?;
    assert!(run.stdout.contains("0 step(s) cancelled"), "{}", run.stdout);
    f.run(&["workflow", "cancel", "nosuch", "--yes"])?
        .fails_with(exit::NOT_FOUND, "no workflow")
}

#[test]
fn batch_shows_counts_seal_and_each_callback() -> TestResult {
    let f = Flows::new()?;
    let id = f.batch.to_string();
    let run = f.run(&["batch", &id])?.ok()?;
    let text = &run.stdout;
    assert!(text.starts_with(&format!("batch {id}: open")), "{text}");
    assert!(text.contains("not finished"), "{text}");
    for (name, n) in [("total", 2), ("pending", 1), ("completed", 1), ("dead", 0)] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or(name.to_owned())?;
        assert!(line.ends_with(&format!(" {n}")), "{line}");
    }
    assert!(
        text.contains("on complete   not enqueued yet: the batch has not finished"),
        "{text}"
    );

    let queue = Queue::open(&f.db)?;
    queue.seal_batch(f.batch)?;
    let leased = queue.lease(&LeaseRequest::new("w", 1).kinds(["row"]))?;
    assert_eq!(leased[0].id, f.members[1]);
    queue.fail(&leased[0], "bad row")?;
    queue.discard_job(f.members[1], "given up")?;
    let value = f.run(&["--json", "batch", &id])?.ok()?.json()?;
    assert_eq!(value["sealed"], true);
    assert_eq!(value["finished"], true);
    assert_eq!(
        (&value["total"], &value["completed"], &value["discarded"]),
        (&json!(2), &json!(1), &json!(1))
    );
    let complete = value["on_complete"]["job_id"].as_i64().ok_or("complete")?;
    assert_eq!(value["on_complete"]["enqueued"], true);
    assert_eq!(value["on_complete"]["state"], "available");
    assert_eq!(
        value["on_success"],
        json!({"enqueued": false, "job_id": null, "why": "not every member completed"})
    );
    let run = f.run(&["batch", &id])?.ok()?;
    assert!(
        run.stdout.contains(&format!(
            "on complete   job {complete} enqueued (available now)"
        )),
        "{}",
        run.stdout
    );
    assert!(run
        .stdout
        .contains(&format!("batch {id}: sealed, finished")));
    f.run(&["batch", "999"])?
        .fails_with(exit::NOT_FOUND, "no batch has id 999")
}

#[test]
fn show_prints_a_jobs_workflow_batch_dependencies_and_dependents() -> TestResult {
    let f = Flows::new()?;
    let (a, b, merge) = (f.step("fetch-a")?, f.step("fetch-b")?, f.step("merge")?);
    let run = f.run(&["show", &merge.to_string()])?.ok()?;
    let text = &run.stdout;
    let id = f.workflow.id;
    for expected in [
        format!("workflow      report (id {id}), step merge\n"),
        format!("depends on    {a} (fetch-a) completed, {b} (fetch-b) not finished\n"),
    ] {
        assert!(text.contains(&expected), "{expected:?} in\n{text}");
    }
    assert!(!text.contains("dependents"), "{text}");
    let run = f.run(&["show", &b.to_string()])?.ok()?;
    let dependents = format!(
        "dependents    {}, {}\n",
        merge.min(f.audit),
        merge.max(f.audit)
    );
    assert!(run.stdout.contains(&dependents), "{}", run.stdout);

    let value = f.run(&["--json", "show", &b.to_string()])?.ok()?.json()?;
    assert_eq!(
        value["workflow"],
        json!({"id": id, "name": "report", "step": "fetch-b"})
    );
    assert_eq!(value["batch"], Value::Null);
    assert_eq!(value["dependencies"], json!([]));
    assert_eq!(
        value["dependents"],
        json!([merge.min(f.audit), merge.max(f.audit)])
    );

    let member = f.members[1].to_string();
    let run = f.run(&["show", &member])?.ok()?;
    assert!(
        run.stdout.contains(&format!("batch         {}\n", f.batch)),
        "{}",
        run.stdout
    );
    let value = f.run(&["--json", "show", &member])?.ok()?.json()?;
    assert_eq!(value["batch"], f.batch);
    assert_eq!(value["workflow"], Value::Null);
    // A plain job shows none of it.
    let run = f.run(&["show", &f.audit.to_string()])?.ok()?;
    assert!(!run.stdout.contains("workflow "), "{}", run.stdout);
    assert!(
        run.stdout
            .contains(&format!("depends on    {b} (fetch-b) not finished")),
        "{}",
        run.stdout
    );
    Ok(())
}

#[test]
fn stats_jobs_and_metrics_show_pending_jobs() -> TestResult {
    let f = Flows::new()?;
    let run = f.run(&["stats", "--queue", "default"])?.ok()?;
    let lines: Vec<&str> = run.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    let column = header
        .iter()
        .position(|h| *h == "PENDING")
        .ok_or(run.stdout.clone())?;
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[column], "2", "merge and audit: {}", run.stdout);
    let stats = f
        .run(&["--json", "stats", "--queue", "default"])?
        .ok()?
        .json()?;
    assert_eq!(stats[0]["pending"], 2);

    let listed = f
        .run(&["--json", "jobs", "--state", "pending"])?
        .ok()?
        .json()?;
    let ids: Vec<i64> = listed["jobs"]
        .as_array()
        .ok_or("jobs")?
        .iter()
        .filter_map(|j| j["id"].as_i64())
        .collect();
    assert_eq!(ids, [f.step("merge")?, f.audit]);

    let metrics = f.run(&["metrics"])?.ok()?.stdout;
    assert!(
        metrics.contains("backlog_jobs{queue=\"default\",state=\"pending\"} 2\n"),
        "{metrics}"
    );
    Ok(())
}
