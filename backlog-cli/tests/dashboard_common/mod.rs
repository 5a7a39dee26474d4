//! What the dashboard's tests share: a seeded database on each backend, the
//! `backlog dashboard` process on an ephemeral port, and a raw HTTP client
//! (raw, so tests can send what no well-behaved client would).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use backlog::{
    LeaseRequest, ManualClock, NewJob, Queue, QueueLimits, QueueOptions, Rate, RetryPolicy,
    Schedule, Scheduler,
};
use serde_json::{json, Value};
use tempfile::TempDir;

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// A database to serve: a SQLite file, or a fresh database on a server
/// (dropped with the fixture).
pub struct Database {
    pub target: String,
    _dir: Option<TempDir>,
    drop_sql: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

impl Database {
    /// A fresh database on `backend`; `None` (printing SKIPPED) when the
    /// server's URL is not set.
    pub fn new(backend: Backend) -> TestResult<Option<Database>> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let target = dir.path().join("shop.db").display().to_string();
                Ok(Some(Database {
                    target,
                    _dir: Some(dir),
                    drop_sql: None,
                }))
            }
            Backend::Postgres => server("BACKLOG_TEST_POSTGRES_URL", backend),
            Backend::Mysql => server("BACKLOG_TEST_MYSQL_URL", backend),
        }
    }

    pub fn open(&self) -> TestResult<Queue> {
        self.open_with(QueueOptions::new())
    }

    pub fn open_with(&self, options: QueueOptions) -> TestResult<Queue> {
        // Retries wait an hour: a failed job stays retrying however slow the test.
        let options = options.retry_policy(RetryPolicy {
            base: Duration::from_secs(3600),
            ..RetryPolicy::default()
        });
        Ok(if self.drop_sql.is_some() {
            options.connect(&self.target)?
        } else {
            options.open(&self.target)?
        })
    }
}

#[allow(unreachable_code)] // without the server features every arm returns
fn server(variable: &str, backend: Backend) -> TestResult<Option<Database>> {
    let Ok(url) = std::env::var(variable) else {
        println!("SKIPPED: set {variable} to run this test on {backend:?}");
        return Ok(None);
    };
    let name = format!("backlog_dash_{:x}", rand_suffix());
    let (base, _) = url
        .rsplit_once('/')
        .ok_or_else(|| format!("{variable} has no database name: {url}"))?;
    let target = format!("{base}/{name}");
    match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
            client.batch_execute(&format!("CREATE DATABASE {name}"))?;
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            use mysql::prelude::Queryable;
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(&url)?)?;
            conn.query_drop(format!("CREATE DATABASE {name}"))?;
        }
        #[allow(unreachable_patterns)]
        _ => {
            let _ = target;
            println!("SKIPPED: build with --features postgres,mysql to run on {backend:?}");
            return Ok(None);
        }
    }
    Ok(Some(Database {
        target,
        _dir: None,
        drop_sql: Some((url, name)),
    }))
}

impl Drop for Database {
    fn drop(&mut self) {
        let Some((url, name)) = &self.drop_sql else {
            return;
        };
        #[cfg(feature = "postgres")]
        if url.starts_with("postgres") {
            if let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) {
                let _ =
                    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
        #[cfg(feature = "mysql")]
        if url.starts_with("mysql") {
            use mysql::prelude::Queryable;
            if let Ok(mut conn) = mysql::Opts::from_url(url)
                .map_err(mysql::Error::from)
                .and_then(mysql::Conn::new)
            {
                let _ = conn.query_drop(format!("DROP DATABASE IF EXISTS {name}"));
            }
        }
        let _ = (url, name);
    }
}

fn rand_suffix() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    (std::process::id() as u64) << 32 | nanos
}

/// The jobs a seeded database holds, by role.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// Dead in `emails`, payload with a `<script>` element in it.
    pub dead_script: i64,
    /// Dead in `billing` after three failed attempts.
    pub dead_billing: i64,
    /// Scheduled an hour from now in `billing`.
    pub scheduled: i64,
    /// Retrying in `billing`.
    pub retrying: i64,
    /// Available in `emails`.
    pub available: i64,
    /// Running in `emails`.
    pub running: i64,
    /// Completed in `webhooks`.
    pub completed: i64,
}

pub const SCRIPT_PAYLOAD: &str = "<script>window.pwned = true</script>";

/// Four queues as an operator would meet them, seeded through a queue of
/// its own (closed on return):
///
/// | queue    | available | running | scheduled | retrying | dead | paused |
/// |----------|-----------|---------|-----------|----------|------|--------|
/// | emails   | 12        | 2       |           |          | 3    |        |
/// | billing  |           |         | 5         | 2        | 1    |        |
/// | reports  | 4         |         |           |          |      | yes    |
/// | webhooks | 8         |         |           |          | 1    |        |
///
/// With `history`, an hour of finished jobs first: completions in `emails`
/// and `webhooks` every minute of the last hour, and a few discarded
/// webhooks (written on a manual clock walked through that hour).
pub fn seed(db: &Database, history: bool) -> TestResult<Seeded> {
    let real_now = || -> TestResult<i64> {
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as i64)
    };
    let clock = ManualClock::at(at(real_now()?));
    let queue = db.open_with(QueueOptions::new().clock(clock.clone()))?;
    if history {
        seed_history(&queue, &clock, real_now()?)?;
    }
    clock.set(at(real_now()?));
    let worker = |n: usize| LeaseRequest::new("web-1.prod:4121", n);
    // emails: 3 dead, one with a <script> payload.
    let dead_script = queue
        .enqueue(
            NewJob::new(
                "send_welcome_email",
                json!({"to": "mallory@example.com", "name": SCRIPT_PAYLOAD}),
            )
            .queue("emails")
            .max_attempts(1),
        )?
        .id;
    for to in ["bounce@example.com", "nobody@invalid"] {
        queue.enqueue(
            NewJob::new("send_welcome_email", json!({"to": to}))
                .queue("emails")
                .max_attempts(1),
        )?;
    }
    for job in queue.lease(&worker(3).queues(["emails"]))? {
        let message = if job.id == dead_script {
            format!("template error: unexpected {SCRIPT_PAYLOAD} in name")
        } else {
            "smtp: 550 mailbox unavailable".to_owned()
        };
        queue.fail(&job, message)?;
    }
    // billing: one job dead after three attempts (a minute apart, in the
    // minutes before now), two retrying, five scheduled.
    clock.set(at(real_now()? - 4 * 60_000_000));
    let dead_billing = queue
        .enqueue(
            NewJob::new(
                "charge_invoice",
                json!({"invoice": "INV-2041", "customer": 1042, "amount_cents": 129900}),
            )
            .queue("billing")
            .unique_key("invoice:INV-2041")
            .max_attempts(3),
        )?
        .id;
    for attempt in 1..=3 {
        clock.advance(Duration::from_secs(60));
        let jobs = queue.lease(&worker(1).queues(["billing"]))?;
        let job = jobs.first().ok_or("billing job not leased")?;
        queue.fail(
            job,
            format!(
                "payment gateway timeout after 30s (attempt {attempt})\n  \
                 at charge_invoice (billing/charge.rs:88)"
            ),
        )?;
        if attempt < 3 {
            queue.run_now(dead_billing)?;
        }
    }
    clock.set(at(real_now()?));
    let mut retrying = 0;
    for invoice in ["INV-2042", "INV-2043"] {
        retrying = queue
            .enqueue(NewJob::new("charge_invoice", json!({"invoice": invoice})).queue("billing"))?
            .id;
        let jobs = queue.lease(&worker(1).queues(["billing"]))?;
        queue.fail(&jobs[0], "card declined: insufficient funds")?;
    }
    let mut scheduled = 0;
    for day in 1..=5 {
        scheduled = queue
            .enqueue(
                NewJob::new("monthly_statement", json!({"customer": 1000 + day}))
                    .queue("billing")
                    .delay(Duration::from_secs(3600 * day)),
            )?
            .id;
    }
    // reports: paused with work waiting.
    for n in 0..4 {
        queue.enqueue(
            NewJob::new("build_report", json!({"report": format!("weekly-{n}")})).queue("reports"),
        )?;
    }
    queue.pause("reports")?;
    // Flow control: two periodic schedules (registered, no tick claimed, so
    // no job of theirs in the counts) and limits on emails.
    let scheduler = Scheduler::new(queue.clone());
    scheduler.add(Schedule::cron(
        "nightly-report",
        "30 2 * * *",
        NewJob::new("build_report", json!({"report": "nightly"})).queue("reports"),
    )?)?;
    scheduler.add(Schedule::every(
        "sweep-carts",
        Duration::from_secs(300),
        NewJob::new("sweep_carts", json!({})).queue("maintenance"),
    )?)?;
    queue.set_limits(
        "emails",
        QueueLimits {
            concurrency: Some(5),
            rate: Some(Rate::per_minute(600)),
        },
    )?;
    // webhooks: 1 delivered, 1 dead, 8 waiting.
    let mut completed = 0;
    for n in 0..2 {
        queue.enqueue(
            NewJob::new(
                "deliver_webhook",
                json!({"url": format!("https://hooks.example.com/{n}")}),
            )
            .queue("webhooks")
            .max_attempts(1),
        )?;
    }
    let delivered = queue.lease(&worker(2).queues(["webhooks"]))?;
    queue.complete(&delivered[0], Some(json!({"status": 200})))?;
    completed = completed.max(delivered[0].id);
    queue.fail(&delivered[1], "HTTP 502 Bad Gateway from hooks.example.com")?;
    for n in 0..8 {
        queue.enqueue(
            NewJob::new(
                "deliver_webhook",
                json!({"url": format!("https://hooks.example.com/{n}")}),
            )
            .queue("webhooks"),
        )?;
    }
    // emails: 12 waiting, 2 running.
    let mut available = 0;
    for i in 0..14 {
        available = queue
            .enqueue(
                NewJob::new(
                    "send_digest",
                    json!({"to": format!("reader{i}@example.com")}),
                )
                .queue("emails"),
            )?
            .id;
    }
    let running = queue.lease(&worker(2).queues(["emails"]).ttl(Duration::from_secs(3600)))?;
    Ok(Seeded {
        dead_script,
        dead_billing,
        scheduled,
        retrying,
        available,
        running: running[0].id,
        completed,
    })
}

/// Completions every minute of the hour before `now`, in a daily-traffic
/// shape, and a burst of discarded webhooks 20 minutes ago.
fn seed_history(queue: &Queue, clock: &ManualClock, now: i64) -> TestResult {
    let worker = LeaseRequest::new("web-2.prod:4188", 100).queues(["emails", "webhooks"]);
    for ago in (1..=59).rev() {
        clock.set(at(now - ago * 60_000_000 + 5_000_000));
        let wave = (ago as f64 / 9.0).sin() * 0.5 + 0.5;
        let emails = 14 + (wave * 22.0) as usize + (ago as usize * 7 % 5);
        let webhooks = 4 + (ago as usize * 3 % 6);
        let jobs = (0..emails)
            .map(|i| {
                NewJob::new(
                    "send_digest",
                    json!({"to": format!("reader{i}@example.com")}),
                )
                .queue("emails")
            })
            .chain((0..webhooks).map(|n| {
                NewJob::new(
                    "deliver_webhook",
                    json!({"url": format!("https://hooks.example.com/{n}")}),
                )
                .queue("webhooks")
            }));
        queue.enqueue_many(jobs)?;
        let leased = queue.lease(&worker)?;
        let failing = if (18..=21).contains(&ago) {
            3
        } else {
            usize::from(ago % 13 == 0)
        };
        for job in leased
            .iter()
            .filter(|j| j.kind == "deliver_webhook")
            .take(failing)
        {
            queue.discard(job, "HTTP 410 Gone: endpoint removed")?;
        }
        let rest: Vec<_> = leased
            .iter()
            .filter(|j| j.kind != "deliver_webhook")
            .chain(
                leased
                    .iter()
                    .filter(|j| j.kind == "deliver_webhook")
                    .skip(failing),
            )
            .collect();
        queue.complete_many(rest)?;
    }
    Ok(())
}

/// A week of finished jobs before the last hour, hour by hour in a
/// daily-traffic shape: digests and webhooks completed, some webhooks
/// discarded, a nightly report at 02:00, and an outage (dead invoices) two
/// days ago. For the longer charts (`/?window=7d`).
#[allow(dead_code)]
pub fn seed_week(db: &Database) -> TestResult {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as i64;
    let clock = ManualClock::at(at(now));
    let queue = db.open_with(QueueOptions::new().clock(clock.clone()))?;
    let hour = 3_600_000_000_i64;
    for ago in (2..=168_i64).rev() {
        clock.set(at(now - ago * hour + 60_000_000));
        let of_day = (now / hour - ago).rem_euclid(24) as f64;
        let shape = (std::f64::consts::TAU * (of_day - 9.0) / 24.0).cos() * 0.5 + 0.5;
        // As many as the last hour's seed (about 1,900) at the daily peak.
        let digests = 150 + (shape * 1100.0) as usize + (ago as usize * 37 % 60);
        let hooks = 40 + (shape * 300.0) as usize + (ago as usize * 13 % 25);
        let nightly = usize::from(of_day as i64 == 2);
        let outage = (45..=47).contains(&ago);
        let jobs = (0..digests)
            .map(|i| NewJob::new("send_digest", json!({"n": i})).queue("emails"))
            .chain(
                (0..hooks)
                    .map(|n| NewJob::new("deliver_webhook", json!({"n": n})).queue("webhooks")),
            )
            .chain((0..nightly).map(|_| {
                NewJob::new("build_report", json!({"report": "nightly"})).queue("reports")
            }))
            .chain((0..if outage { 6 } else { 1 }).map(|n| {
                NewJob::new("charge_invoice", json!({"n": n}))
                    .queue("billing")
                    .max_attempts(1)
            }));
        queue.enqueue_many(jobs)?;
        let mut gone = 0;
        loop {
            let leased = queue.lease(
                &LeaseRequest::new("web-3.prod:5120", 1000)
                    .queues(["emails", "webhooks", "reports", "billing"]),
            )?;
            if leased.is_empty() {
                break;
            }
            let mut done = Vec::new();
            for job in &leased {
                if job.kind == "charge_invoice" && outage {
                    queue.fail(job, "payment gateway: 503 Service Unavailable")?;
                } else if job.kind == "deliver_webhook" && gone < (ago as usize % 5) * 3 {
                    queue.discard(job, "HTTP 410 Gone: endpoint removed")?;
                    gone += 1;
                } else {
                    done.push(job);
                }
            }
            queue.complete_many(done)?;
        }
    }
    Ok(())
}

/// `backlog dashboard` running as a process; killed on drop.
pub struct Dashboard {
    child: Child,
    pub port: u16,
    pub csrf: String,
    /// The line it printed at start (`dashboard for DB on URL`).
    pub banner: String,
}

impl Dashboard {
    /// Starts `backlog dashboard --db TARGET --port 0 ARGS..` and waits for
    /// the line with its URL.
    pub fn start(target: &str, args: &[&str]) -> TestResult<Dashboard> {
        // A SQLite file is named from its folder, as people run it (and as
        // the screenshots show it).
        let path = std::path::Path::new(target);
        let (dir, db) = match (path.parent(), path.file_name()) {
            (Some(dir), Some(name)) if path.is_absolute() => (dir, name),
            _ => (std::path::Path::new("."), std::ffi::OsStr::new(target)),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_backlog"))
            .current_dir(dir)
            .arg("dashboard")
            .arg("--db")
            .arg(db)
            .args(["--port", "0"])
            .args(args)
            .env_remove("BACKLOG_DASHBOARD_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let port = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.rsplit(':').next())
            .and_then(|p| p.parse().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the dashboard printed no URL: {line:?}").into());
        };
        let mut dashboard = Dashboard {
            child,
            port,
            csrf: String::new(),
            banner: line,
        };
        let token = args
            .iter()
            .position(|a| *a == "--token")
            .map(|i| args[i + 1].to_owned());
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![];
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth.as_str()));
        }
        let shell = dashboard.request("GET", "/", &headers, b"")?;
        dashboard.csrf = shell
            .body
            .split("name=\"csrf-token\" content=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .ok_or_else(|| format!("no CSRF token in the page: {}", shell.body))?
            .to_owned();
        Ok(dashboard)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One request on its own connection; `Host` defaults to 127.0.0.1.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TestResult<Reply> {
        let mut raw = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("Host")) {
            raw.push_str(&format!("Host: 127.0.0.1:{}\r\n", self.port));
        }
        for (name, value) in headers {
            raw.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        raw.push_str("Connection: close\r\n\r\n");
        let mut bytes = raw.into_bytes();
        bytes.extend_from_slice(body);
        self.raw(&bytes)
    }

    /// Sends `bytes` as they are and reads the response.
    pub fn raw(&self, bytes: &[u8]) -> TestResult<Reply> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.write_all(bytes)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Reply::parse(&response)
    }

    pub fn get(&self, path: &str) -> TestResult<Reply> {
        self.request("GET", path, &[], b"")
    }

    /// A POST as the page sends it: CSRF token, JSON body.
    pub fn post(&self, path: &str, body: Value) -> TestResult<Reply> {
        let csrf = self.csrf.clone();
        self.request(
            "POST",
            path,
            &[
                ("X-CSRF-Token", &csrf),
                ("Content-Type", "application/json"),
            ],
            body.to_string().as_bytes(),
        )
    }

    /// The server process's id (its memory is read from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's exit status, if it has ended.
    pub fn exited(&mut self) -> TestResult<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    fn parse(bytes: &[u8]) -> TestResult<Reply> {
        let text = String::from_utf8_lossy(bytes);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status line: {head:?}"))?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Ok(Reply {
            status,
            headers,
            body: body.to_owned(),
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> TestResult<Value> {
        Ok(serde_json::from_str(&self.body)
            .map_err(|e| format!("{e}: not JSON ({}): {}", self.status, self.body))?)
    }

    /// Fails unless the status is `status`; returns the JSON body.
    pub fn expect(&self, status: u16) -> TestResult<Value> {
        if self.status != status {
            return Err(format!("expected {status}, got {}: {}", self.status, self.body).into());
        }
        self.json()
    }

    /// Fails unless the status is `status` and the error message says `says`.
    pub fn fails(&self, status: u16, says: &str) -> TestResult {
        let body = self.expect(status)?;
        let message = body["error"].as_str().unwrap_or_default();
        if !message.contains(says) {
            return Err(format!("error {message:?} does not say {says:?}").into());
        }
        Ok(())
    }
}

/// Unix µs as a point in time.
fn at(micros: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_micros(micros as u64)
}
