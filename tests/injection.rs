//! Names, keys and messages are data, never SQL.
//!
//! Arbitrary Unicode (quotes, `;`, `--`, NUL, control characters, very long
//! strings) fed as queue names, kinds, unique keys and error messages either
//! round-trips byte for byte or is refused with the documented validation
//! error, and the schema is the same afterwards. A static check keeps SQL
//! text out of the engine: `format!` next to SQL keywords only appears under
//! `src/backend/`.

use std::path::Path;
use std::time::Duration;

use backlog::{
    Durability, Error, JobFilter, JobState, LeaseRequest, NewJob, Queue, QueueOptions,
    MAX_NAME_BYTES, MAX_UNIQUE_KEY_BYTES,
};
use proptest::prelude::*;
use rusqlite::Connection;
use serde_json::json;

fn schema(path: &Path) -> Vec<String> {
    let conn = Connection::open(path).expect("raw connection");
    let mut stmt = conn
        .prepare("SELECT type || ' ' || name || ' ' || coalesce(sql, '') FROM sqlite_master ORDER BY name")
        .expect("prepare");
    let rows = stmt.query_map([], |r| r.get(0)).expect("query");
    rows.collect::<Result<_, _>>().expect("rows")
}

/// What validation promises for a queue name or kind.
fn name_is_valid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_BYTES && !s.chars().any(char::is_control)
}

fn unique_key_is_valid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_UNIQUE_KEY_BYTES && !s.contains('\0')
}

/// Strings biased towards what breaks naive SQL and C strings.
fn nasty() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z'\";\\-\\\\%_ ]{0,20}",
        Just("'; DROP TABLE backlog_jobs; --".to_owned()),
        Just("a\0b".to_owned()),
        Just("\"quoted\" 'single' `tick`".to_owned()),
        Just("x".repeat(MAX_NAME_BYTES + 1)),
        Just("é".repeat(MAX_NAME_BYTES / 2)),
        Just("line\nbreak".to_owned()),
        Just(String::new()),
    ]
}

fn open(dir: &Path) -> Queue {
    QueueOptions::new()
        .durability(Durability::Fast)
        .open(dir.join("injection.db"))
        .expect("open")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn names_keys_and_messages_round_trip_or_are_refused(
        queue_name in nasty(),
        kind in nasty(),
        key in nasty(),
        message in nasty(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let queue = open(dir.path());
        let before = schema(queue.path().expect("a SQLite queue"));

        let result = queue.enqueue(
            NewJob::new(kind.clone(), json!({"k": key}))
                .queue(queue_name.clone())
                .unique_key(key.clone()),
        );
        let valid = name_is_valid(&queue_name) && name_is_valid(&kind) && unique_key_is_valid(&key);
        match result {
            Ok(enqueued) => {
                prop_assert!(valid, "accepted invalid input");
                let record = queue.get(enqueued.id).expect("get");
                prop_assert_eq!(&record.queue, &queue_name);
                prop_assert_eq!(&record.kind, &kind);
                prop_assert_eq!(record.unique_key.as_deref(), Some(key.as_str()));

                let listed = queue
                    .list(&JobFilter::new(JobState::Available).queue(queue_name.clone()).kind(kind.clone()))
                    .expect("list");
                prop_assert_eq!(listed.jobs.len(), 1);

                let again = queue
                    .enqueue(NewJob::new(kind.clone(), json!(2)).queue(queue_name.clone()).unique_key(key.clone()))
                    .expect("duplicate");
                prop_assert!(again.existed);
                prop_assert_eq!(again.id, enqueued.id);

                let jobs = queue
                    .lease(&LeaseRequest::new("w", 1).queues([queue_name.clone()]).kinds([kind.clone()]).ttl(Duration::from_secs(30)))
                    .expect("lease");
                prop_assert_eq!(jobs.len(), 1);
                prop_assert_eq!(&jobs[0].queue, &queue_name);
                prop_assert_eq!(&jobs[0].kind, &kind);
                queue.fail(&jobs[0], message.clone()).expect("fail");
                let record = queue.get(enqueued.id).expect("get");
                prop_assert_eq!(record.errors.len(), 1);
                prop_assert_eq!(&record.errors[0].message, &message);
            }
            Err(Error::InvalidName { .. }) => prop_assert!(!valid, "refused valid input"),
            Err(other) => prop_assert!(false, "unexpected error {:?}", other),
        }
        prop_assert_eq!(schema(queue.path().expect("a SQLite queue")), before);
    }
}

/// SQL is written only under `src/backend/`: no file elsewhere in `src/` (or
/// in the CLI's `backlog-cli/src/`) may build a statement with `format!` (or
/// hold SQL keywords in a string).
#[test]
fn sql_is_built_only_inside_backend_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let keywords = [
        "SELECT ", "INSERT ", "UPDATE ", "DELETE ", "PRAGMA ", "BEGIN ",
    ];
    let mut offenders = Vec::new();
    // The operator's binary is held to the same rule: it works through the
    // library's public calls.
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("backlog-cli/src");
    let mut stack = vec![root.clone(), cli];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                if path != root.join("backend") {
                    stack.push(path);
                }
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let sql_in_string = code.contains('"') && keywords.iter().any(|k| code.contains(k));
                if sql_in_string {
                    offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "SQL outside src/backend/:\n{}",
        offenders.join("\n")
    );
}
