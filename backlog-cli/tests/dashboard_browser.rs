//! The dashboard in a real browser: Debian's chromium, headless, driven over
//! WebDriver (chromedriver) with a few JSON requests, no client crate.
//!
//! Ignored by default because it needs chromium and chromedriver
//! (`apt-get install -y chromium chromium-driver`); `.ci/run` installs them
//! and runs it, and there it fails, never skips, when they are missing.
//! With `BACKLOG_DASHBOARD_SCREENSHOTS=../docs` (relative to `backlog-cli/`,
//! where cargo runs it) it writes the README's screenshots there.

#![cfg(feature = "dashboard")]

mod dashboard_common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backlog::NewJob;
use dashboard_common::{seed, seed_week, Backend, Dashboard, Database, TestResult, SCRIPT_PAYLOAD};
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

#[test]
#[ignore = "needs chromium and chromedriver; .ci/run installs them and runs it"]
fn operator_retries_a_dead_job_and_pauses_a_queue_in_chromium() -> TestResult {
    browser_installed()?;
    let db = Database::new(Backend::Sqlite)?.ok_or("no SQLite database")?;
    let seeded = seed(&db, true)?;
    let queue = db.open()?;
    let dashboard = Dashboard::start(&db.target, &[])?;
    let browser = Browser::start()?;
    let shots = std::env::var_os("BACKLOG_DASHBOARD_SCREENSHOTS").map(PathBuf::from);

    // The overview: every seeded queue with its counts and paused flag.
    browser.open(&format!("{}/", dashboard.url()))?;
    let emails = browser.wait_text("tr[data-queue=\"emails\"]", |t| t.contains("emails"))?;
    let cells: Vec<&str> = emails.split_whitespace().collect();
    // Queue, available, running, scheduled, retrying, pending, dead.
    assert_eq!(
        &cells[..7],
        ["emails", "12", "2", "0", "0", "0", "3"],
        "{emails}"
    );
    let reports = browser.wait_text("tr[data-queue=\"reports\"]", |t| t.contains("paused"))?;
    assert!(reports.starts_with("reports 4 0 0 0 0 0"), "{reports}");
    let billing = browser.text("tr[data-queue=\"billing\"]")?;
    assert!(billing.starts_with("billing 0 0 5 2 0 1"), "{billing}");
    browser.text("tr[data-queue=\"webhooks\"]")?;
    let flow = browser.wait_text("#flow-control", |t| t.contains("nightly-report"))?;
    assert!(
        flow.contains("sweep-carts") && flow.contains("at most 5 running") && flow.contains("600/"),
        "{flow}"
    );
    if let Some(dir) = &shots {
        browser.resize(1360, 1400)?;
        browser.screenshot(&dir.join("dashboard-overview.png"))?;
        browser.resize(1360, 1000)?;
    }

    // The dead letter, then a dead job: its payload shows the <script> as text.
    browser.click("nav a[data-nav=\"dead\"]")?;
    browser.wait_text("h1", |t| t.starts_with("Dead letter"))?;
    browser.wait_text(&format!("tr[data-id=\"{}\"]", seeded.dead_billing), |t| {
        t.contains("payment gateway timeout")
    })?;
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("dashboard-dead-letter.png"))?;
    }
    browser.click(&format!("tr[data-id=\"{}\"] a", seeded.dead_billing))?;
    browser.wait_text("h1", |t| t == format!("Job #{}", seeded.dead_billing))?;
    browser.wait_text("table.errors", |t| t.contains("attempt 3"))?;
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("dashboard-job.png"))?;
    }
    browser.open(&format!("{}/jobs/{}", dashboard.url(), seeded.dead_script))?;
    let payload = browser.wait_text("#payload", |t| t.contains("mallory"))?;
    assert!(payload.contains(SCRIPT_PAYLOAD), "{payload}");
    assert_eq!(
        browser.script("return window.pwned === undefined")?,
        json!(true)
    );
    assert_eq!(
        browser.script("return document.querySelectorAll('main script').length")?,
        json!(0)
    );

    // Retry it: confirmed in the dialog, reported, and the job is available.
    browser.wait_text(".job-head .badge", |t| t == "dead")?;
    browser.click_button("Retry")?;
    browser.wait_text("#confirm-ok", |t| t == "Retry")?;
    browser.click("#confirm-ok")?;
    browser.wait_text("#flash", |t| t.contains("retried"))?;
    browser.wait_text(".job-head .badge", |t| t == "available")?;
    assert_eq!(
        queue.get(seeded.dead_script)?.state,
        backlog::JobState::Available
    );

    // Find a job by its unique key from the search box.
    browser.type_into("#search input", "invoice:INV-2041\u{E007}")?;
    browser.wait_text("h1", |t| t.starts_with("Jobs with unique key"))?;
    browser.wait_text(&format!("tr[data-id=\"{}\"]", seeded.dead_billing), |t| {
        t.contains("charge_invoice")
    })?;
    browser.open(&format!(
        "{}/jobs?state=available&queue=emails",
        dashboard.url()
    ))?;
    browser.wait_text("table.jobs", |t| t.contains("send_digest"))?;

    // Pause a queue from the overview and see the flag.
    browser.click("nav a[data-nav=\"overview\"]")?;
    browser.wait_text("tr[data-queue=\"webhooks\"]", |t| t.contains("active"))?;
    browser.click("tr[data-queue=\"webhooks\"] button")?;
    browser.wait_text("#confirm-ok", |t| t == "Pause")?;
    browser.click("#confirm-ok")?;
    browser.wait_text("#flash", |t| t.contains("webhooks paused"))?;
    browser.wait_text("tr[data-queue=\"webhooks\"]", |t| t.contains("paused"))?;
    assert!(queue.paused_queues()?.contains(&"webhooks".to_owned()));

    // Changes made elsewhere show up without a reload (the page polls).
    queue.resume("webhooks")?;
    browser.wait_text("tr[data-queue=\"webhooks\"]", |t| t.contains("active"))?;
    Ok(())
}

#[test]
#[ignore = "needs chromium and chromedriver; .ci/run installs them and runs it"]
fn operator_sees_live_workers_and_unhandled_kinds_in_chromium() -> TestResult {
    browser_installed()?;
    let db = Database::new(Backend::Sqlite)?.ok_or("no SQLite database")?;
    seed(&db, true)?;
    let queue = db.open()?;
    // A worker serving emails and billing, running two invoices until it
    // is shut down, and one serving webhooks and reports. The seed's two
    // running digests were leased under a worker id no live worker has (a
    // worker gone without a goodbye): the page lists neither that id nor
    // its jobs, and flags the due digests, which no live worker handles.
    let release = Arc::new(AtomicBool::new(false));
    let web = backlog::Worker::builder(queue.clone())
        .worker_id("web-3.prod:5120")
        .queues(["emails", "billing"])
        .concurrency(8)
        .handle_raw("send_welcome_email", |_, _| Ok(()))
        .handle_raw("charge_invoice", {
            let release = release.clone();
            move |_, ctx| {
                while !release.load(Ordering::Relaxed) && !ctx.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            }
        })
        .start()?;
    for invoice in [7001, 7002] {
        queue.enqueue(
            NewJob::new("charge_invoice", json!({ "invoice": invoice })).queue("billing"),
        )?;
    }
    let hooks = backlog::Worker::builder(queue.clone())
        .worker_id("hooks-2.prod:977")
        .queues(["webhooks", "reports"])
        .concurrency(4)
        .handle_raw("deliver_webhook", |_, _| Ok(()))
        .start()?;
    let dashboard = Dashboard::start(&db.target, &[])?;
    let browser = Browser::start()?;
    browser.open(&format!("{}/", dashboard.url()))?;
    browser.wait_text("tr[data-queue=\"emails\"]", |t| {
        t.contains("no worker: send_digest")
    })?;
    browser.click("nav a[data-nav=\"workers\"]")?;
    browser.wait_text("h1", |t| t == "Workers")?;
    let web_row = browser.wait_text("tr[data-worker=\"web-3.prod:5120\"]", |t| {
        t.contains("send_welcome_email") && t.matches("charge_invoice").count() >= 3
    })?;
    assert!(!web_row.contains("send_digest"), "{web_row}");
    assert!(
        web_row.contains("emails, billing") || web_row.contains("billing, emails"),
        "{web_row}"
    );
    browser.text("tr[data-worker=\"hooks-2.prod:977\"]")?;
    let unhandled = browser.wait_text("#unhandled", |t| t.contains("send_digest"))?;
    // reports is paused: its due jobs wait for a resume, not a worker.
    assert!(!unhandled.contains("build_report"), "{unhandled}");
    if let Some(dir) = std::env::var_os("BACKLOG_DASHBOARD_SCREENSHOTS").map(PathBuf::from) {
        browser.resize(1360, 800)?;
        browser.screenshot(&dir.join("dashboard-workers.png"))?;
    }
    // A worker that shuts down leaves the page at the next refresh.
    hooks.shutdown(Duration::from_secs(10))?;
    browser.wait_text("#workers", |t| !t.contains("hooks-2.prod:977"))?;
    release.store(true, Ordering::Relaxed);
    web.shutdown(Duration::from_secs(10))?;
    Ok(())
}

#[test]
#[ignore = "needs chromium and chromedriver; .ci/run installs them and runs it"]
fn operator_charts_a_week_per_queue_and_kind_in_chromium() -> TestResult {
    browser_installed()?;
    let db = Database::new(Backend::Sqlite)?.ok_or("no SQLite database")?;
    seed_week(&db)?;
    seed(&db, true)?;
    let dashboard = Dashboard::start(&db.target, &[])?;
    let browser = Browser::start()?;
    let bars = || -> TestResult<u64> {
        browser
            .script("return document.querySelectorAll('#throughput svg g').length")?
            .as_u64()
            .ok_or_else(|| "no count".into())
    };
    // What the API says, to check the page against.
    let api = |query: &str| -> TestResult<(u64, u64)> {
        let chart = dashboard.get(&format!("/api/chart?{query}"))?.expect(200)?;
        let sum = |key: &str| {
            chart[key]
                .as_array()
                .map_or(0, |v| v.iter().filter_map(Value::as_u64).sum())
        };
        Ok((sum("completed"), sum("failed")))
    };

    // A week, per hour: every hour of it had finished jobs.
    browser.open(&format!("{}/?window=7d", dashboard.url()))?;
    browser.wait_text("#throughput h2", |t| t == "Finished per hour, last 7 days")?;
    let (done, failed) = api("window=7d")?;
    let legend = browser.text("#throughput .legend")?;
    assert!(
        legend.contains(&format!("{} completed", fmt(done)))
            && legend.contains(&format!("{} failed", fmt(failed))),
        "{legend} vs {done} {failed}"
    );
    assert!(bars()? >= 167, "{} bars", bars()?);
    if let Some(dir) = std::env::var_os("BACKLOG_DASHBOARD_SCREENSHOTS").map(PathBuf::from) {
        browser.resize(1360, 860)?;
        browser.screenshot(&dir.join("dashboard-charts.png"))?;
    }
    // One queue, then one kind of it: the choosers narrow the chart.
    browser.click("[data-choose=\"queue\"] a[href*=\"queue=billing\"]")?;
    browser.wait_text("[data-choose=\"queue\"] .active", |t| t == "billing")?;
    let (done, failed) = api("window=7d&queue=billing")?;
    browser.wait_text("#throughput .legend", |t| {
        t.contains(&format!("{} completed", fmt(done)))
            && t.contains(&format!("{} failed", fmt(failed)))
    })?;
    assert!(failed >= 18, "the outage's dead invoices: {failed}");
    browser.click("[data-choose=\"kind\"] a[href*=\"kind=charge_invoice\"]")?;
    browser.wait_text("[data-choose=\"kind\"] .active", |t| t == "charge_invoice")?;
    // A day, per hour, keeping the queue and kind chosen.
    browser.click("[data-choose=\"window\"] a[href*=\"window=24h\"]")?;
    browser.wait_text("#throughput h2", |t| {
        t == "Finished per hour, last 24 hours"
    })?;
    browser.wait_text("[data-choose=\"kind\"] .active", |t| t == "charge_invoice")?;
    assert!(bars()? <= 24, "{} bars", bars()?);
    // The hour, per minute, every queue again.
    browser.click("[data-choose=\"window\"] a[href*=\"window=1h\"]")?;
    browser.wait_text("#throughput h2", |t| t == "Finished per minute, last hour")?;
    browser.click("[data-choose=\"queue\"] a:first-of-type")?;
    browser.wait_text("[data-choose=\"queue\"] .active", |t| t == "all")?;
    Ok(())
}

#[test]
#[ignore = "needs chromium and chromedriver; .ci/run installs them and runs it"]
fn operator_follows_a_workflow_step_by_step_and_cancels_it_in_chromium() -> TestResult {
    browser_installed()?;
    let db = Database::new(Backend::Sqlite)?.ok_or("no SQLite database")?;
    let queue = db.open()?;
    // A nightly close: three extracts, reconciled, rendered, mailed; the
    // archive runs after the reconcile however it ends.
    let job = |kind: &str| NewJob::new(kind, json!({"day": "2026-11-26"})).queue("finance");
    let flow = queue.enqueue_workflow(
        backlog::Workflow::new("nightly-close")
            .step("extract-orders", job("extract"))
            .step("extract-refunds", job("extract"))
            .step("extract-payouts", job("extract"))
            .step_after(
                "reconcile",
                job("reconcile"),
                &["extract-orders", "extract-refunds", "extract-payouts"],
            )
            .step_after("render-pdf", job("render_pdf"), &["reconcile"])
            .step_after("email-finance", job("send_email"), &["render-pdf"])
            .step_after_anyway("archive", job("archive"), &["reconcile"]),
    )?;
    let step = |name: &str| flow.step(name).ok_or(format!("no step {name}"));
    // Orders and refunds extracted; payouts running on a worker.
    let leased = queue.lease(
        &backlog::LeaseRequest::new("etl-1.prod:4410", 3)
            .queues(["finance"])
            .kinds(["extract"]),
    )?;
    assert_eq!(leased.len(), 3);
    for j in &leased {
        if j.id != step("extract-payouts")? {
            queue.complete(j, Some(json!({"rows": 1200 + j.id})))?;
        }
    }
    let dashboard = Dashboard::start(&db.target, &[])?;
    let browser = Browser::start()?;

    browser.open(&format!("{}/workflows/nightly-close", dashboard.url()))?;
    browser.wait_text("h1", |t| t == "Workflow nightly-close")?;
    let layers = browser.wait_text("#layers", |t| t.contains("email-finance"))?;
    assert!(layers.contains("waiting on extract-payouts"), "{layers}");
    let reconcile = browser.text("#steps tr[data-step=\"reconcile\"]")?;
    assert!(reconcile.contains("pending"), "{reconcile}");
    let payouts = browser.text("#layers [data-step=\"extract-payouts\"]")?;
    assert!(payouts.contains("running"), "{payouts}");
    assert_eq!(
        browser.script("return document.querySelectorAll('#layers .layer').length")?,
        json!(4),
        "extracts, reconcile, render and archive, email"
    );
    if let Some(dir) = std::env::var_os("BACKLOG_DASHBOARD_SCREENSHOTS").map(PathBuf::from) {
        browser.resize(1360, 900)?;
        browser.screenshot(&dir.join("dashboard-workflow.png"))?;
    }

    // A step's job page links back to its workflow, its dependencies and
    // its dependents.
    browser.click("#layers [data-step=\"reconcile\"] a")?;
    browser.wait_text("h1", |t| {
        t == format!("Job #{}", step("reconcile").unwrap_or(0))
    })?;
    let links = browser.wait_text("#links", |t| t.contains("nightly-close"))?;
    assert!(
        links.contains("step reconcile") && links.contains("extract-payouts"),
        "{links}"
    );
    browser.click("#links a[href^=\"/workflows/\"]")?;
    browser.wait_text("h1", |t| t == "Workflow nightly-close")?;

    // Cancel it: confirmed in the dialog, every step not finished cancelled
    // (the running extract asked to stop).
    browser.click_button("Cancel workflow")?;
    browser.wait_text("#confirm-ok", |t| t == "Cancel workflow")?;
    browser.click("#confirm-ok")?;
    browser.wait_text("#flash", |t| t.contains("step(s) cancelled"))?;
    browser.wait_text("#steps tr[data-step=\"render-pdf\"]", |t| {
        t.contains("cancelled")
    })?;
    assert_eq!(
        queue.get(step("email-finance")?)?.state,
        backlog::JobState::CANCELLED
    );
    assert!(queue.get(step("extract-payouts")?)?.cancel_requested);
    Ok(())
}

/// Fails (never skips) when chromium or chromedriver is missing.
fn browser_installed() -> TestResult {
    for binary in [CHROMIUM, CHROMEDRIVER] {
        if !std::path::Path::new(binary).exists() {
            return Err(format!(
                "{binary} is missing: apt-get install -y chromium chromium-driver"
            )
            .into());
        }
    }
    Ok(())
}

/// A count as the page writes it (`Intl.NumberFormat("en")`).
fn fmt(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A headless chromium session through chromedriver; both end on drop.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    fn start() -> TestResult<Browser> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        // chromedriver prints a line once it listens.
        let stdout = driver.stdout.take().ok_or("no stdout")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 && !line.contains("started successfully") {
            line.clear();
        }
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
        };
        let created = browser.call(
            "POST",
            "/session",
            json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1360,1000",
                             "--force-device-scale-factor=1", "--hide-scrollbars"],
                },
            }}}),
        )?;
        browser.session = created["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {created}"))?
            .to_owned();
        Ok(browser)
    }

    fn call(&self, method: &str, path: &str, body: Value) -> TestResult<Value> {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.write_all(raw.as_bytes())?;
        // chromedriver keeps the connection open: read the head, then
        // exactly Content-Length bytes.
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse()?;
                }
            }
            head.push_str(&line);
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let json = String::from_utf8_lossy(&body);
        let value: Value = serde_json::from_str(&json)?;
        if !head.contains(" 200 ") {
            return Err(format!("{method} {path}: {value}").into());
        }
        Ok(value["value"].clone())
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    fn open(&self, url: &str) -> TestResult {
        self.call("POST", &self.session_path("/url"), json!({"url": url}))?;
        Ok(())
    }

    fn find(&self, css: &str) -> TestResult<String> {
        let found = self.call(
            "POST",
            &self.session_path("/element"),
            json!({"using": "css selector", "value": css}),
        )?;
        Ok(found[ELEMENT]
            .as_str()
            .ok_or_else(|| format!("no element for {css}: {found}"))?
            .to_owned())
    }

    fn text(&self, css: &str) -> TestResult<String> {
        let element = self.find(css)?;
        let text = self.call(
            "GET",
            &self.session_path(&format!("/element/{element}/text")),
            Value::Null,
        )?;
        Ok(text.as_str().unwrap_or_default().to_owned())
    }

    /// Waits (10 s at most) for `css` to exist with text satisfying `ok`.
    fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> TestResult<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Elements are replaced by each refresh: a vanished one is retried.
            let last = match self.text(css) {
                Ok(text) if ok(&text) => return Ok(text),
                Ok(text) => text,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(format!("{css}: never as expected; last {last:?}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn click(&self, css: &str) -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let clicked = self.find(css).and_then(|element| {
                self.call(
                    "POST",
                    &self.session_path(&format!("/element/{element}/click")),
                    json!({}),
                )
            });
            match clicked {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Types `text` into the element (`\u{E007}` is Enter).
    fn type_into(&self, css: &str, text: &str) -> TestResult {
        let element = self.find(css)?;
        self.call(
            "POST",
            &self.session_path(&format!("/element/{element}/value")),
            json!({"text": text}),
        )?;
        Ok(())
    }

    /// Clicks the button labelled `label` in the page's main part.
    fn click_button(&self, label: &str) -> TestResult {
        let clicked = self.script(&format!(
            "const b = [...document.querySelectorAll('main button')].find(b => b.textContent === {});
             if (b) b.click(); return !!b;",
            json!(label)
        ))?;
        if clicked != json!(true) {
            return Err(format!("no {label:?} button").into());
        }
        Ok(())
    }

    fn script(&self, body: &str) -> TestResult<Value> {
        self.call(
            "POST",
            &self.session_path("/execute/sync"),
            json!({"script": body, "args": []}),
        )
    }

    /// Sets the window's outer size (the overview's screenshot shows the
    /// whole page).
    fn resize(&self, width: u32, height: u32) -> TestResult {
        self.call(
            "POST",
            &self.session_path("/window/rect"),
            json!({"width": width, "height": height}),
        )?;
        Ok(())
    }

    fn screenshot(&self, path: &std::path::Path) -> TestResult {
        let data = self.call("GET", &self.session_path("/screenshot"), Value::Null)?;
        let png = base64_decode(data.as_str().ok_or("no screenshot")?)?;
        std::fs::write(path, png)?;
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &self.session_path(""), Value::Null);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(text: &str) -> TestResult<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        acc = acc << 6 | value(c).ok_or("not base64")?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}
