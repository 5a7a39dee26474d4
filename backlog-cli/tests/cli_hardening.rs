//! The `backlog` binary and its dashboard against hostile input, run as
//! processes: passwords in database addresses never shown, hostile text
//! never reaching the terminal raw, out-of-range numbers and odd files
//! refused with a typed exit code instead of a panic or a hang.
//!
//! The dashboard checks run on SQLite, the password checks also on a
//! PostgreSQL server when `BACKLOG_TEST_POSTGRES_URL` is set (the
//! redaction is the binary's own, the same for every backend; PostgreSQL is
//! the server here that lets a URL carry any password: trust auth).

#![cfg(feature = "dashboard")]

mod dashboard_common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use backlog::{LeaseRequest, NewJob, Queue, QueueOptions};
use dashboard_common::{seed, Backend, Dashboard, Database, TestResult};
use serde_json::{json, Value};

/// The exit codes `backlog --help` documents.
mod exit {
    pub const USAGE: i32 = 2;
    pub const INVALID_INPUT: i32 = 4;
    pub const UNREACHABLE: i32 = 7;
    pub const NOT_BACKLOG: i32 = 8;
}

/// One run of the binary, its output as bytes.
struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Run {
    fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.stdout),
            String::from_utf8_lossy(&self.stderr)
        )
    }
}

/// Runs `backlog ARGS` with no terminal, and gives up after a minute (a
/// hang is a failure, not a stuck test run).
fn backlog(args: &[&str]) -> TestResult<Run> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_backlog"))
        .args(args)
        .env_remove("BACKLOG_DATABASE")
        .env_remove("BACKLOG_DASHBOARD_TOKEN")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Drained on threads of their own: a full pipe must not look like a hang.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("backlog {args:?} still running after 60 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Run {
        code: status.code().ok_or("killed by a signal")?,
        stdout: stdout.join().map_err(|_| "stdout reader")?,
        stderr: stderr.join().map_err(|_| "stderr reader")?,
    })
}

fn on(db: &str, args: &[&str]) -> TestResult<Run> {
    let mut all = vec!["--db", db];
    all.extend_from_slice(args);
    backlog(&all)
}

fn new_queue(dir: &Path) -> TestResult<(String, Queue)> {
    let db = dir.join("q.db");
    let queue = Queue::open(&db)?;
    Ok((db.display().to_string(), queue))
}

// ---- passwords ----------------------------------------------------------

/// Database addresses with the password each holds: userinfo with `@`, `:`,
/// `/`, `?`, `#` and `%`, query parameters, a key=value string; PostgreSQL
/// and MySQL. Every server is one that refuses connections (port 1).
const ADDRESSES: [(&str, &str); 12] = [
    ("postgres://app:p@ss@127.0.0.1:1/x", "p@ss"),
    ("postgres://app:s3cr:et:pw@127.0.0.1:1/x", "s3cr:et:pw"),
    ("postgresql://app:pa/ssw0rd@127.0.0.1:1/x", "pa/ssw0rd"),
    ("postgres://app:hunter%402@127.0.0.1:1/x", "hunter%402"),
    (
        "postgres://127.0.0.1:1/x?user=postgres&password=s3cr3tpw",
        "s3cr3tpw",
    ),
    ("mysql://root:my@secret@127.0.0.1:1/x", "my@secret"),
    ("mysql://root:my:secret/pw@127.0.0.1:1/x", "my:secret/pw"),
    ("mariadb://root:hunter%2F2@127.0.0.1:1/x", "hunter%2F2"),
    (
        "mysql://127.0.0.1:1/x?user=root&password=s3cr3tpw",
        "s3cr3tpw",
    ),
    ("mysql://root:pa?ss#w0rd@127.0.0.1:1/x", "pa?ss#w0rd"),
    (
        "host=127.0.0.1 port=1 user=app password=s3cr3tpw dbname=x",
        "s3cr3tpw",
    ),
    ("postgres://app:Pa55%3Aw0rd@127.0.0.1:1/x", "Pa55%3Aw0rd"),
];

#[test]
fn passwords_appear_in_no_message_or_json_of_any_command() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (sqlite, queue) = new_queue(dir.path())?;
    drop(queue);
    let fresh = dir.path().join("fresh.db").display().to_string();
    for (url, secret) in ADDRESSES {
        let runs: [&[&str]; 9] = [
            &["--db", url, "stats"],
            &["--db", url, "--json", "stats"],
            &["--db", url, "migrate"],
            &["--db", url, "--json", "migrate"],
            &["--db", url, "jobs"],
            &["--db", url, "dashboard", "--port", "0"],
            &["copy", url, &fresh],
            &["copy", &sqlite, url],
            &["--json", "copy", &sqlite, url],
        ];
        for args in runs {
            let run = backlog(args)?;
            let text = run.text();
            assert_ne!(run.code, 0, "{args:?}: {text}");
            assert!(!text.contains(secret), "{args:?} shows {secret:?}: {text}");
            assert!(!text.contains("panicked"), "{args:?}: {text}");
        }
    }
    Ok(())
}

/// The same on a server that answers: `migrate --json`, `copy`'s success
/// line, the dashboard's start-up line, its page and `/api/overview`.
#[test]
fn passwords_appear_in_no_output_or_page_of_a_reachable_server() -> TestResult {
    let Some(db) = Database::new(Backend::Postgres)? else {
        return Ok(());
    };
    let (scheme, rest) = db.target.split_once("://").ok_or("no scheme")?;
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let host_part = base.rsplit_once('@').map_or(base, |(_, host)| host);
    let user = base.rsplit_once('@').map_or("postgres", |(user, _)| user);
    let user = user.split_once(':').map_or(user, |(u, _)| u);
    let with = |extra: &str| {
        let parts: Vec<&str> = [query, extra]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect();
        parts.join("&")
    };
    let forms = [
        (
            // The driver wants '@' and '/' percent-encoded here.
            format!("{scheme}://{user}:p%40ss%2Fw0rd@{host_part}?{}", with("")),
            "ss%2Fw0rd",
        ),
        (
            format!(
                "{scheme}://{host_part}?{}",
                with(&format!("user={user}&password=s3cr3tpw"))
            ),
            "s3cr3tpw",
        ),
    ];
    seed(&db, false)?;
    for (url, secret) in &forms {
        if let Err(e) = QueueOptions::new().migrate(false).connect(url) {
            if e.to_string().contains("28P01") {
                println!("SKIPPED: the server checks passwords; this test needs trust auth");
                return Ok(());
            }
            return Err(e.into());
        }
        let dir = tempfile::tempdir()?;
        let copy_to = dir.path().join("copy.db").display().to_string();
        for args in [
            &["--db", url.as_str(), "--json", "migrate"][..],
            &["--db", url, "migrate"],
            &["--db", url, "stats"],
            &["copy", url, &copy_to],
        ] {
            let run = backlog(args)?;
            let text = run.text();
            assert_eq!(run.code, 0, "{args:?}: {text}");
            assert!(!text.contains(secret), "{args:?} shows {secret:?}: {text}");
        }
        let dashboard = Dashboard::start(url, &[])?;
        assert!(dashboard.banner.contains("***"), "{:?}", dashboard.banner);
        for (what, text) in [
            ("start-up line", dashboard.banner.clone()),
            ("page", dashboard.get("/")?.body),
            ("overview", dashboard.get("/api/overview")?.body),
        ] {
            assert!(
                !text.contains(secret),
                "the {what} shows {secret:?}: {text}"
            );
        }
    }
    Ok(())
}

// ---- hostile text -----------------------------------------------------------

/// Text that would act on a terminal printed raw: escape sequences (title,
/// clear screen, colours, hyperlinks, cursor moves), C1 controls, carriage
/// returns and backspaces, bidi overrides, zero-width and tag characters.
const HOSTILE: [&str; 20] = [
    "\x1b]0;PWNED\x07\x1b[2J",
    "\x1b[31mred\x1b[0m",
    "\x1bP+q\x1b\\dcs",
    "over\rwrite",
    "back\x08\x08\x08space",
    "\x07bell",
    "\u{9b}2Jc1-csi",
    "\u{9d}0;PWNED\u{9c}",
    "\u{85}next-line",
    "k\u{202e}gnp.exe",
    "\u{2066}isolate\u{2069}",
    "\u{200b}zero\u{200d}width\u{feff}",
    "\u{200f}rtl\u{200e}mark",
    "nul\0byte",
    "del\x7f",
    "tab\there",
    "line1\nline2\x1b[A\x1b[Kfake",
    "\u{2028}sep\u{2029}",
    "\u{e0041}tag",
    "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\",
];

/// A character that must not reach a terminal raw (a newline may, as a
/// line break of the output itself).
fn dangerous(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c,
            '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}'
            | '\u{e0000}'..='\u{e007f}')
}

fn assert_terminal_safe(args: &[&str], run: &Run) {
    for (stream, bytes) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        let bad: Vec<char> = text.chars().filter(|&c| dangerous(c)).collect();
        assert!(
            bad.is_empty(),
            "{args:?} wrote {bad:?} raw to {stream}: {text:?}"
        );
    }
}

/// Per hostile string: an available job whose kind, queue, unique key and
/// payload hold it (kind and queue written with SQL, as the library refuses
/// control characters in names), a dead job whose error is it, a discarded
/// job whose reason is it, a completed job whose result holds it.
fn hostile_database(dir: &Path) -> TestResult<(String, Vec<i64>)> {
    let (db, queue) = new_queue(dir)?;
    let mut ids = Vec::new();
    for text in HOSTILE {
        let mut job = NewJob::new("k", json!({"text": text, text: 1})).queue("q");
        if !text.contains('\0') {
            job = job.unique_key(text);
        }
        let live = queue.enqueue(job)?.id;
        let dead = queue
            .enqueue(NewJob::new("lease", json!({})).max_attempts(1))?
            .id;
        let leased = queue.lease(&LeaseRequest::new("w", 1).kinds(["lease"]))?;
        queue.fail(&leased[0], text)?;
        let discarded = queue.enqueue(NewJob::new("k", json!({})))?.id;
        queue.discard_job(discarded, text)?;
        let done = queue.enqueue(NewJob::new("lease", json!({})))?.id;
        let leased = queue.lease(&LeaseRequest::new("w", 1).kinds(["lease"]))?;
        queue.complete(&leased[0], Some(json!({ "result": text })))?;
        let conn = rusqlite::Connection::open(&db)?;
        conn.execute(
            "UPDATE backlog_jobs SET kind = ?1, queue = ?1 WHERE id = ?2",
            rusqlite::params![text, live],
        )?;
        ids.extend([live, dead, discarded, done]);
    }
    Ok((db, ids))
}

#[test]
fn hostile_text_in_any_field_reaches_no_terminal_raw() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, ids) = hostile_database(dir.path())?;
    let mut commands: Vec<Vec<String>> = vec![
        vec!["jobs".into(), "--limit".into(), "500".into()],
        vec!["jobs".into(), "--state".into(), "dead".into()],
        vec!["stats".into()],
        vec!["watch".into(), "--count".into(), "1".into()],
    ];
    for id in &ids {
        commands.push(vec!["show".into(), id.to_string()]);
    }
    // Messages that quote what they were given (no process argument can
    // hold a NUL).
    for text in HOSTILE.iter().filter(|t| !t.contains('\0')) {
        let text = text.to_string();
        commands.push(vec!["stats".into(), "--queue".into(), text.clone()]);
        commands.push(vec!["pause".into(), text.clone()]);
        commands.push(vec!["enqueue".into(), text.clone(), "{}".into()]);
        commands.push(vec![
            "enqueue".into(),
            "k".into(),
            "{}".into(),
            "--run-at".into(),
            text,
        ]);
    }
    for command in &commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let run = on(&db, &args)?;
        assert_ne!(run.code, 101, "{args:?} panicked: {}", run.text());
        assert_terminal_safe(&args, &run);
    }
    Ok(())
}

/// A workflow's id, and its first and second steps' jobs.
type HostileFlow = (i64, i64, i64);

/// Per hostile string: a workflow whose name, first step's name and that
/// step's kind are it (written with SQL: the library refuses control
/// characters in names), its second step after the first. Returns each
/// workflow's id and its two jobs.
fn hostile_workflows(dir: &Path) -> TestResult<(String, Vec<HostileFlow>)> {
    let (db, queue) = new_queue(dir)?;
    let conn = rusqlite::Connection::open(&db)?;
    let mut out = Vec::new();
    for text in HOSTILE {
        let flow = queue.enqueue_workflow(
            backlog::Workflow::new("wf")
                .step("a", NewJob::new("k", json!({})))
                .step_after("b", NewJob::new("k", json!({})), &["a"]),
        )?;
        let (a, b) = (flow.step("a").ok_or("a")?, flow.step("b").ok_or("b")?);
        conn.execute(
            "UPDATE backlog_workflows SET name = ?1 WHERE id = ?2",
            rusqlite::params![text, flow.id],
        )?;
        conn.execute(
            "UPDATE backlog_workflow_steps SET step = ?1 WHERE job_id = ?2",
            rusqlite::params![text, a],
        )?;
        conn.execute(
            "UPDATE backlog_jobs SET kind = ?1 WHERE id = ?2",
            rusqlite::params![text, a],
        )?;
        out.push((flow.id, a, b));
    }
    Ok((db, out))
}

#[test]
fn hostile_workflow_and_step_names_reach_no_terminal_raw() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, flows) = hostile_workflows(dir.path())?;
    let mut commands: Vec<Vec<String>> = Vec::new();
    for (id, a, b) in &flows {
        let id = id.to_string();
        commands.push(vec!["workflow".into(), id.clone()]);
        commands.push(vec!["show".into(), a.to_string()]);
        commands.push(vec!["show".into(), b.to_string()]);
        // Not confirmed (no terminal): the question quotes the name.
        commands.push(vec!["workflow".into(), "cancel".into(), id.clone()]);
        commands.push(vec!["workflow".into(), "cancel".into(), id, "--yes".into()]);
    }
    for text in HOSTILE.iter().filter(|t| !t.contains('\0')) {
        commands.push(vec!["workflow".into(), text.to_string()]);
    }
    for command in &commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let run = on(&db, &args)?;
        assert_ne!(run.code, 101, "{args:?} panicked: {}", run.text());
        assert_terminal_safe(&args, &run);
    }
    // Shown escaped, not dropped: the workflow's name is still there.
    let (id, _, _) = flows[9];
    let run = on(&db, &["workflow", &id.to_string()])?;
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("k\\u{202e}gnp.exe"),
        "{}",
        run.text()
    );
    // JSON keeps the names exact.
    for (text, (id, _, _)) in HOSTILE.iter().zip(&flows) {
        let run = on(&db, &["--json", "workflow", &id.to_string()])?;
        let value: Value = serde_json::from_slice(&run.stdout)?;
        assert_eq!(value["name"], *text);
        assert_eq!(value["steps"][0]["step"], *text);
        assert_eq!(value["steps"][1]["after"][0]["step"], *text);
    }
    Ok(())
}

#[test]
fn json_output_keeps_hostile_text_exact() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, ids) = hostile_database(dir.path())?;
    for (text, id) in HOSTILE.iter().zip(ids.chunks(4)) {
        let run = on(&db, &["--json", "show", &id[0].to_string()])?;
        let live: Value = serde_json::from_slice(&run.stdout)?;
        assert_eq!(live["kind"], *text);
        assert_eq!(live["queue"], *text);
        assert_eq!(live["payload"]["text"], *text);
        let run = on(&db, &["--json", "show", &id[1].to_string()])?;
        let dead: Value = serde_json::from_slice(&run.stdout)?;
        assert_eq!(dead["errors"][0]["message"], *text);
    }
    Ok(())
}

// ---- out-of-range input and odd files ---------------------------------------

#[test]
fn out_of_range_times_and_numbers_are_typed_errors_not_panics() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, queue) = new_queue(dir.path())?;
    let id = queue.enqueue(NewJob::new("k", json!({})))?.id.to_string();
    drop(queue);
    let invalid: [&[&str]; 12] = [
        &["enqueue", "k", "{}", "--run-at", "18446744073709551615"],
        &["enqueue", "k", "{}", "--run-at", "+10000000000000000000s"],
        &["enqueue", "k", "{}", "--run-at", "9999999999999"],
        &["enqueue", "k", "{}", "--run-at", "+584942417355y"],
        &["enqueue", "k", "{}", "--delay", "10000000000000000000s"],
        &["update", &id, "--run-at", "18446744073709551615"],
        &["update", &id, "--run-at", "+10000000000000000000s"],
        &["purge", "--older-than", "18446744073709551615s"],
        &["watch", "--interval", "584942417355y", "--count", "1"],
        &["limits", "q", "--concurrency", "99999999999"],
        &["limits", "q", "--rate", "18446744073709551615/1s"],
        &["limits", "q", "--rate", "1/584942417355y"],
    ];
    for args in invalid {
        let run = on(&db, args)?;
        assert_eq!(run.code, exit::INVALID_INPUT, "{args:?}: {}", run.text());
    }
    // Refused by the parser (a usage error), never a panic.
    for args in [
        &["enqueue", "k", "{}", "--max-attempts", "4294967296"][..],
        &["enqueue", "k", "{}", "--priority", "2147483648"],
        &["show", "9223372036854775808"],
        &["jobs", "--limit", "18446744073709551616"],
    ] {
        let run = on(&db, args)?;
        assert_eq!(run.code, exit::USAGE, "{args:?}: {}", run.text());
    }
    Ok(())
}

#[cfg(unix)]
#[test]
fn a_fifo_or_a_folder_as_the_database_is_refused_at_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let fifo = dir.path().join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().ok_or("path")?)?;
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let folder = dir.path().display().to_string();
    for db in [fifo.to_str().ok_or("path")?, &folder] {
        for command in ["stats", "migrate"] {
            let run = on(db, &[command])?;
            assert_eq!(
                run.code,
                exit::NOT_BACKLOG,
                "{db} {command}: {}",
                run.text()
            );
        }
    }
    Ok(())
}

#[test]
fn a_corrupted_sqlite_file_is_not_a_backlog_database() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, queue) = new_queue(dir.path())?;
    for _ in 0..50 {
        queue.enqueue(NewJob::new("k", json!({"pad": "x".repeat(500)})))?;
    }
    drop(queue);
    // Keep SQLite's header, overwrite every page after the first.
    let mut bytes = std::fs::read(&db)?;
    let page = usize::from(u16::from_be_bytes([bytes[16], bytes[17]]));
    for b in &mut bytes[page..] {
        *b = 0x41;
    }
    std::fs::write(&db, &bytes)?;
    let run = on(&db, &["stats"])?;
    assert_eq!(run.code, exit::NOT_BACKLOG, "{}", run.text());
    Ok(())
}

// ---- the dashboard ----------------------------------------------------------

#[test]
fn dashboard_actions_answer_400_for_out_of_range_values() -> TestResult {
    let db = Database::new(Backend::Sqlite)?.ok_or("sqlite")?;
    let seeded = seed(&db, false)?;
    let d = Dashboard::start(&db.target, &[])?;
    let job = format!("/api/jobs/{}/update", seeded.scheduled);
    for body in [
        json!({"run_at": "18446744073709551615"}),
        json!({"run_at": "+10000000000000000000s"}),
        json!({"run_at": "9999999999999"}),
        json!({"run_at": "+584942417355y"}),
        json!({"priority": 2147483648_i64}),
        json!({"priority": 1e300}),
        json!({"priority": "high"}),
    ] {
        let reply = d.post(&job, body.clone())?;
        assert_eq!(reply.status, 400, "{body}: {}", reply.body);
    }
    for path in [
        "/api/jobs?after=99999999999999999999",
        "/api/jobs?limit=18446744073709551616",
        "/api/jobs?limit=0",
    ] {
        let reply = d.get(path)?;
        assert_eq!(reply.status, 400, "{path}: {}", reply.body);
    }
    let reply = d.get("/api/jobs/99999999999999999999")?;
    assert_eq!(reply.status, 404, "{}", reply.body);
    Ok(())
}

#[test]
fn a_dashboard_token_shorter_than_16_characters_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, queue) = new_queue(dir.path())?;
    drop(queue);
    for token in [
        "short",
        "fifteen-chars-x",
        "sixteen chars ok",
        "has;semicolon-xx",
    ] {
        let run = on(&db, &["dashboard", "--port", "0", "--token", token])?;
        assert_eq!(run.code, exit::USAGE, "{token:?}: {}", run.text());
        assert!(
            !run.text().contains(token),
            "the token is echoed: {}",
            run.text()
        );
    }
    Ok(())
}

// ---- operator gaps --------------------------------------------------------------

#[test]
fn enqueue_reads_a_payload_over_the_argument_limit_from_stdin_or_a_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, queue) = new_queue(dir.path())?;
    // Over Linux's 128 KiB limit on one argument, under the 1 MiB cap.
    let payload = json!({"blob": "x".repeat(200 * 1024)}).to_string();
    let file = dir.path().join("payload.json");
    std::fs::write(&file, &payload)?;
    let at_file = format!("@{}", file.display());
    let run = on(&db, &["--json", "enqueue", "k", &at_file])?;
    assert_eq!(run.code, 0, "{}", run.text());
    let from_file: Value = serde_json::from_slice(&run.stdout)?;

    let mut child = Command::new(env!("CARGO_BIN_EXE_backlog"))
        .args(["--db", &db, "--json", "enqueue", "k", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin.write_all(payload.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let from_stdin: Value = serde_json::from_slice(&output.stdout)?;
    for enqueued in [from_file, from_stdin] {
        let id = enqueued["id"].as_i64().ok_or("no id")?;
        assert_eq!(queue.get(id)?.payload, payload);
    }
    let missing = format!("@{}", dir.path().join("nothing.json").display());
    let run = on(&db, &["enqueue", "k", &missing])?;
    assert_eq!(run.code, exit::INVALID_INPUT, "{}", run.text());
    Ok(())
}

#[test]
fn jobs_lists_every_state_stats_counts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (db, queue) = new_queue(dir.path())?;
    drop(queue);
    for state in ["grouped", "aggregated"] {
        let run = on(&db, &["jobs", "--state", state])?;
        assert_eq!(run.code, 0, "{state}: {}", run.text());
    }
    Ok(())
}

#[test]
fn every_option_of_every_command_has_a_help_text() -> TestResult {
    let top = String::from_utf8(backlog(&["--help"])?.stdout)?;
    // The names listed under `Commands:`, up to the next heading.
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(commands.contains(&"enqueue"), "no commands in: {top}");
    for command in commands {
        let run = backlog(&[command, "--help"])?;
        let help = String::from_utf8(run.stdout)?;
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("--") {
                continue;
            }
            // `--name <VALUE>  text`, or the text indented on the next line.
            let same_line = line
                .trim()
                .split("  ")
                .filter(|part| !part.trim().is_empty())
                .count()
                > 1;
            let next_line = lines.get(i + 1).is_some_and(|next| {
                next.starts_with("          ") && !next.trim_start().starts_with('-')
            });
            assert!(
                same_line || next_line,
                "`backlog {command}`: no help text: {line:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn messages_name_the_command_or_button_not_the_library_call() -> TestResult {
    let db = Database::new(Backend::Sqlite)?.ok_or("sqlite")?;
    let seeded = seed(&db, false)?;
    let run = on(&db.target, &["retry", &seeded.available.to_string()])?;
    assert!(
        run.text().contains("`backlog run-now` makes it due"),
        "{}",
        run.text()
    );
    let d = Dashboard::start(&db.target, &[])?;
    let reply = d.post(&format!("/api/jobs/{}/retry", seeded.available), json!({}))?;
    assert_eq!(reply.status, 409, "{}", reply.body);
    assert!(
        reply.body.contains("Run now makes it due"),
        "{}",
        reply.body
    );
    assert!(!reply.body.contains("run_now"), "{}", reply.body);
    Ok(())
}

#[test]
fn the_page_without_javascript_says_where_the_data_is() -> TestResult {
    let db = Database::new(Backend::Sqlite)?.ok_or("sqlite")?;
    seed(&db, false)?;
    let d = Dashboard::start(&db.target, &[])?;
    let page = d.get("/")?.body;
    let noscript = page.split("<noscript>").nth(1).ok_or("no <noscript>")?;
    assert!(noscript.contains("/api/overview"), "{noscript}");
    Ok(())
}

#[test]
fn a_missing_database_is_unreachable() -> TestResult {
    let dir = tempfile::tempdir()?;
    let run = on(
        &dir.path().join("nothing.db").display().to_string(),
        &["stats"],
    )?;
    assert_eq!(run.code, exit::UNREACHABLE, "{}", run.text());
    Ok(())
}
