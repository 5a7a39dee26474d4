//! `backlog dashboard` over HTTP: every route, the safety rules (token,
//! Host, CSRF, read-only, headers, escaping), and bad requests answered 4xx
//! with a clear message while the server keeps serving. Each scenario runs
//! on SQLite, and on PostgreSQL and MariaDB when their URLs are set.

#![cfg(feature = "dashboard")]

mod dashboard_common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use backlog::{FinalStatus, JobState, NewJob, Worker};
use dashboard_common::{seed, Backend, Dashboard, Database, Seeded, TestResult, SCRIPT_PAYLOAD};
use serde_json::json;

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() -> super::TestResult {
                super::run(super::Backend::Sqlite, super::$name)
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() -> super::TestResult {
                super::run(super::Backend::Postgres, super::$name)
            })*
        }
        mod mysql {
            $(#[test]
            fn $name() -> super::TestResult {
                super::run(super::Backend::Mysql, super::$name)
            })*
        }
    };
}

on_every_backend!(
    pages_assets_health_and_metrics_are_served,
    every_response_carries_the_security_headers,
    overview_reports_each_queue_with_counts_paused_flag_and_chart,
    jobs_are_listed_by_state_queue_and_kind_and_paged_by_keyset,
    a_job_reads_in_full_and_unknown_ids_are_404,
    actions_change_jobs_and_queues_and_report_back,
    bulk_actions_apply_to_the_filtered_selection,
    posts_without_the_csrf_token_change_nothing,
    bad_requests_get_4xx_with_a_message_and_the_server_keeps_serving,
    read_only_mode_refuses_every_action,
    a_token_guards_every_route_but_healthz,
    the_workers_page_lists_live_workers_their_jobs_and_unhandled_kinds,
    the_chart_api_covers_an_hour_a_day_and_a_week_per_queue_and_kind,
    workflows_and_batches_have_pages_an_api_links_and_a_guarded_cancel,
);

struct Setup {
    db: Database,
    seeded: Seeded,
}

fn run(backend: Backend, scenario: fn(&Setup) -> TestResult) -> TestResult {
    let Some(db) = Database::new(backend)? else {
        return Ok(());
    };
    let seeded = seed(&db, false)?;
    scenario(&Setup { db, seeded })
}

fn pages_assets_health_and_metrics_are_served(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    for page in [
        "/",
        "/jobs",
        "/dead",
        &format!("/jobs/{}", s.seeded.dead_script),
    ] {
        let reply = d.get(page)?;
        assert_eq!(reply.status, 200, "{page}: {}", reply.body);
        assert_eq!(
            reply.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert!(
            reply.body.contains("<script src=\"/assets/app.js\""),
            "{page}"
        );
        assert!(
            reply.body.contains("name=\"read-only\" content=\"0\""),
            "{page}"
        );
    }
    let js = d.get("/assets/app.js")?;
    assert_eq!(js.status, 200);
    assert!(js
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/javascript"));
    assert!(js.body.contains("function route()"));
    let css = d.get("/assets/app.css")?;
    assert_eq!(css.status, 200);
    assert!(css
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/css"));
    // Nothing is loaded from elsewhere: no CDN, no web font.
    for asset in [&js.body, &css.body, &d.get("/")?.body] {
        // (The SVG namespace is a name, not a download.)
        let asset = asset.replace("\"http://www.w3.org/2000/svg\"", "");
        assert!(!asset.contains("http://") && !asset.contains("https://"));
        assert!(!asset.contains("@import") && !asset.contains("@font-face"));
    }
    assert_eq!(d.get("/healthz")?.expect(200)?, json!({"ok": true}));
    let metrics = d.get("/metrics")?;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("backlog_jobs{") && metrics.body.contains("queue=\"emails\""),
        "{}",
        metrics.body
    );
    d.get("/nowhere")?.fails(404, "no page at /nowhere")?;
    d.get("/jobs/abc")?.fails(404, "not a job id")?;
    d.get("/assets/other.js")?.fails(404, "no page")?;
    Ok(())
}

fn every_response_carries_the_security_headers(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let replies = [
        d.get("/")?,
        d.get("/assets/app.js")?,
        d.get("/api/overview")?,
        d.get("/nowhere")?,
        d.request("POST", "/api/bulk", &[], b"{}")?,
        d.get("/healthz")?,
    ];
    for reply in &replies {
        let csp = reply.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(reply.header("x-frame-options"), Some("DENY"));
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    }
    Ok(())
}

fn overview_reports_each_queue_with_counts_paused_flag_and_chart(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let overview = d.get("/api/overview")?.expect(200)?;
    let queues = overview["queues"].as_array().ok_or("no queues")?;
    let names: Vec<&str> = queues.iter().filter_map(|q| q["queue"].as_str()).collect();
    assert_eq!(names, ["billing", "emails", "reports", "webhooks"]);
    let emails = &queues[1];
    assert_eq!(
        (
            &emails["available"],
            &emails["running"],
            &emails["dead"],
            &emails["paused"]
        ),
        (&json!(12), &json!(2), &json!(3), &json!(false))
    );
    assert!(
        emails["oldest_available_secs"].as_i64().is_some(),
        "{emails}"
    );
    assert_eq!(emails["failed_last_hour"], json!(3));
    let billing = &queues[0];
    assert_eq!(
        (
            &billing["scheduled"],
            &billing["retrying"],
            &billing["dead"]
        ),
        (&json!(5), &json!(2), &json!(1))
    );
    assert_eq!(billing["oldest_available_secs"], json!(null));
    assert_eq!(queues[2]["paused"], json!(true));
    let webhooks = &queues[3];
    assert_eq!(
        (
            &webhooks["completed_last_hour"],
            &webhooks["failed_last_hour"]
        ),
        (&json!(1), &json!(1))
    );
    // The chart: 60 minutes, the seeded completions and failures in the last ones.
    let chart = &overview["chart"];
    let completed = chart["completed"].as_array().ok_or("no chart")?;
    let failed = chart["failed"].as_array().ok_or("no chart")?;
    assert_eq!((completed.len(), failed.len()), (60, 60));
    let sum = |v: &Vec<serde_json::Value>| v.iter().filter_map(|n| n.as_u64()).sum::<u64>();
    assert_eq!((sum(completed), sum(failed)), (1, 5));
    // Schedules and limits: the two registered schedules (no tick claimed
    // yet) and the limits set on emails.
    let flow = &overview["flow_control"];
    let names: Vec<&str> = flow["schedules"]
        .as_array()
        .ok_or("no schedules")?
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["nightly-report", "sweep-carts"], "{flow}");
    assert_eq!(flow["schedules"][0]["last_tick"], json!(null));
    assert!(flow["schedules"][0]["next_tick"].as_str().is_some());
    assert_eq!(flow["limits"][0]["queue"], json!("emails"));
    assert_eq!(flow["limits"][0]["concurrency"], json!(5));
    assert_eq!(flow["limits"][0]["rate"]["limit"], json!(600));
    assert_eq!(overview["read_only"], json!(false));
    Ok(())
}

fn jobs_are_listed_by_state_queue_and_kind_and_paged_by_keyset(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let ids = |v: &serde_json::Value| -> Vec<i64> {
        v["jobs"]
            .as_array()
            .map(|jobs| jobs.iter().filter_map(|j| j["id"].as_i64()).collect())
            .unwrap_or_default()
    };
    // Every dead job, three per page, each page after the last id of the one before.
    let first = d.get("/api/jobs?state=dead&limit=3")?.expect(200)?;
    let after = first["next_after"].as_i64().ok_or("no next page")?;
    let second = d
        .get(&format!("/api/jobs?state=dead&limit=3&after={after}"))?
        .expect(200)?;
    assert_eq!(second["next_after"], json!(null));
    let all: Vec<i64> = ids(&first).into_iter().chain(ids(&second)).collect();
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    assert!(all.contains(&s.seeded.dead_script) && all.contains(&s.seeded.dead_billing));
    let dead = &first["jobs"][0];
    assert_eq!(dead["state"], json!("dead"));
    assert!(dead["last_error"].as_str().is_some(), "{dead}");
    assert!(
        dead.get("payload").is_none(),
        "a list row carries no payload"
    );
    // Filters: queue, kind, state; every state at once.
    let billing = d.get("/api/jobs?state=dead&queue=billing")?.expect(200)?;
    assert_eq!(ids(&billing), [s.seeded.dead_billing]);
    let digests = d
        .get("/api/jobs?state=available&queue=emails&kind=send_digest")?
        .expect(200)?;
    assert_eq!(ids(&digests).len(), 12);
    let everything = d.get("/api/jobs?limit=500")?.expect(200)?;
    assert_eq!(ids(&everything).len(), 39);
    let retrying = d.get("/api/jobs?state=retrying")?.expect(200)?;
    assert!(ids(&retrying).contains(&s.seeded.retrying));
    // Search by id.
    let found = d
        .get(&format!("/api/jobs?search=%23{}", s.seeded.scheduled))?
        .expect(200)?;
    assert_eq!(ids(&found), [s.seeded.scheduled]);
    let missing = d.get("/api/jobs?search=999999")?.expect(200)?;
    assert_eq!(ids(&missing), Vec::<i64>::new());
    // Search by unique key: every queue, or the one named.
    let keyed = d.get("/api/jobs?search=invoice%3AINV-2041")?.expect(200)?;
    assert_eq!(ids(&keyed), [s.seeded.dead_billing]);
    assert_eq!(keyed["jobs"][0]["unique_key"], json!("invoice:INV-2041"));
    let elsewhere = d
        .get("/api/jobs?search=invoice%3AINV-2041&queue=emails")?
        .expect(200)?;
    assert_eq!(ids(&elsewhere), Vec::<i64>::new());
    let unknown = d.get("/api/jobs?search=no+such+key")?.expect(200)?;
    assert_eq!(ids(&unknown), Vec::<i64>::new());
    d.get("/api/jobs?state=sleeping")?
        .fails(400, "unknown state \"sleeping\"")?;
    d.get("/api/jobs?limit=0")?
        .fails(400, "limit must be 1 to 500")?;
    d.get("/api/jobs?limit=x")?.fails(400, "limit must be")?;
    d.get("/api/jobs?after=x")?
        .fails(400, "after must be a job id")?;
    Ok(())
}

fn a_job_reads_in_full_and_unknown_ids_are_404(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let read = d
        .get(&format!("/api/jobs/{}", s.seeded.dead_billing))?
        .expect(200)?;
    let job = &read["job"];
    assert_eq!(job["state"], json!("dead"));
    assert_eq!(job["payload"]["invoice"], json!("INV-2041"));
    assert_eq!(job["worker"], json!("web-1.prod:4121"));
    let errors = job["errors"].as_array().ok_or("no errors")?;
    assert_eq!(errors.len(), 3);
    assert!(errors[2]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("attempt 3"));
    assert!(errors[0]["at"].as_str().is_some());
    assert!(job["finished_at"].as_str().is_some());
    assert_eq!(read["progress"], json!(null));
    // A payload holding markup comes back as JSON data, never as a page.
    let script = d.get(&format!("/api/jobs/{}", s.seeded.dead_script))?;
    assert_eq!(script.header("content-type"), Some("application/json"));
    assert_eq!(
        script.json()?["job"]["payload"]["name"],
        json!(SCRIPT_PAYLOAD)
    );
    d.get("/api/jobs/999999")?.fails(404, "999999")?;
    d.get("/api/jobs/abc")?.fails(404, "not a job id")?;

    // The progress a handler reported is on the job's page, kept after it
    // finished.
    let queue = s.db.open()?;
    let worker = Worker::builder(queue.clone())
        .queues(["imports"])
        .handle_raw("import", |_: serde_json::Value, ctx| {
            ctx.set_progress(&json!({"done": 3, "of": 4}))?;
            Ok(())
        })
        .start()?;
    let id = queue
        .enqueue(NewJob::new("import", json!({})).queue("imports"))?
        .id;
    let finished = queue.wait(id, Duration::from_secs(20))?;
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(finished.state, JobState::COMPLETED);
    let read = d.get(&format!("/api/jobs/{id}"))?.expect(200)?;
    assert_eq!(read["progress"], json!({"done": 3, "of": 4}));
    Ok(())
}

fn actions_change_jobs_and_queues_and_report_back(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let queue = s.db.open()?;
    let state = |id| -> TestResult<JobState> { Ok(queue.get(id)?.state) };
    let job = |id: i64, action: &str| format!("/api/jobs/{id}/{action}");

    let retried = d
        .post(&job(s.seeded.dead_script, "retry"), json!({}))?
        .expect(200)?;
    assert!(retried["message"]
        .as_str()
        .unwrap_or_default()
        .contains("retried"));
    assert_eq!(retried["job"]["state"], json!("available"));
    assert_eq!(state(s.seeded.dead_script)?, JobState::Available);
    // Retrying it again is refused: it is not finished.
    d.post(&job(s.seeded.dead_script, "retry"), json!({}))?
        .fails(409, "")?;

    d.post(&job(s.seeded.scheduled, "run-now"), json!({}))?
        .expect(200)?;
    assert_eq!(state(s.seeded.scheduled)?, JobState::Available);

    let updated = d
        .post(
            &job(s.seeded.retrying, "update"),
            json!({"priority": 7, "run_at": "+2h"}),
        )?
        .expect(200)?;
    assert_eq!(updated["job"]["priority"], json!(7));
    assert_eq!(queue.get(s.seeded.retrying)?.priority, 7);
    d.post(&job(s.seeded.retrying, "update"), json!({}))?
        .fails(400, "update needs priority or run_at")?;
    d.post(
        &job(s.seeded.retrying, "update"),
        json!({"priority": "high"}),
    )?
    .fails(400, "priority must be an integer")?;
    d.post(
        &job(s.seeded.retrying, "update"),
        json!({"run_at": "someday"}),
    )?
    .fails(400, "is not a time")?;

    d.post(
        &job(s.seeded.available, "discard"),
        json!({"reason": "spam"}),
    )?
    .expect(200)?;
    let discarded = queue.get(s.seeded.available)?;
    assert_eq!(discarded.state, JobState::DISCARDED);
    assert_eq!(
        discarded.errors.last().map(|e| e.message.as_str()),
        Some("spam")
    );

    let cancelled = d
        .post(&job(s.seeded.running, "cancel"), json!({}))?
        .expect(200)?;
    assert!(cancelled["message"]
        .as_str()
        .unwrap_or_default()
        .contains("asked to stop"));
    assert!(queue.get(s.seeded.running)?.cancel_requested);

    let deleted = d
        .post(&job(s.seeded.completed, "delete"), json!({}))?
        .expect(200)?;
    assert_eq!(deleted["job"], json!(null));
    assert!(matches!(
        queue.get(s.seeded.completed),
        Err(backlog::Error::NotFound { .. })
    ));
    d.post(&job(s.seeded.completed, "delete"), json!({}))?
        .fails(404, "")?;
    d.post(&job(s.seeded.dead_billing, "explode"), json!({}))?
        .fails(404, "no action \"explode\"")?;

    let paused = d.post("/api/queues/emails/pause", json!({}))?.expect(200)?;
    assert_eq!(paused["paused"], json!(true));
    assert!(queue.paused_queues()?.contains(&"emails".to_owned()));
    d.post("/api/queues/reports/resume", json!({}))?
        .expect(200)?;
    assert!(!queue.paused_queues()?.contains(&"reports".to_owned()));
    d.post("/api/queues/nosuch/pause", json!({}))?
        .fails(404, "unknown queue \"nosuch\"")?;
    d.post("/api/queues/emails/drain", json!({}))?
        .fails(404, "no queue action")?;
    Ok(())
}

fn bulk_actions_apply_to_the_filtered_selection(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let queue = s.db.open()?;
    let report = d
        .post(
            "/api/bulk",
            json!({"action": "retry", "state": "dead", "queue": "emails"}),
        )?
        .expect(200)?;
    assert_eq!(
        (&report["done"], &report["skipped"]),
        (&json!(3), &json!(0))
    );
    // Only a cancel reports jobs asked to stop.
    assert_eq!(report.get("requested"), None, "{report}");
    assert_eq!(report.get("asked_to_stop"), None, "{report}");
    let cancel = d
        .post(
            "/api/bulk",
            json!({"action": "cancel", "state": "running", "queue": "emails"}),
        )?
        .expect(200)?;
    assert_eq!(
        (&cancel["done"], &cancel["asked_to_stop"]),
        (&json!(2), &json!(2)),
        "{cancel}"
    );
    assert!(report["message"]
        .as_str()
        .unwrap_or_default()
        .contains("3 job(s) done"));
    // The other queues' dead jobs stayed dead.
    assert_eq!(queue.get(s.seeded.dead_billing)?.state, JobState::DEAD);
    assert_eq!(queue.get(s.seeded.dead_script)?.state, JobState::Available);
    let report = d
        .post(
            "/api/bulk",
            json!({"action": "delete", "state": "dead", "kind": "deliver_webhook"}),
        )?
        .expect(200)?;
    assert_eq!(report["done"], json!(1));
    let report = d
        .post(
            "/api/bulk",
            json!({"action": "discard", "state": "scheduled"}),
        )?
        .expect(200)?;
    assert_eq!(report["done"], json!(5));
    assert_eq!(
        queue.get(s.seeded.scheduled)?.state,
        JobState::Finished(FinalStatus::Discarded)
    );
    d.post("/api/bulk", json!({"action": "retry"}))?
        .fails(400, "bulk needs a state")?;
    d.post("/api/bulk", json!({"state": "dead"}))?
        .fails(400, "bulk needs an action")?;
    d.post("/api/bulk", json!({"action": "melt", "state": "dead"}))?
        .fails(400, "no bulk action \"melt\"")?;
    d.post("/api/bulk", json!({"action": "retry", "state": "undead"}))?
        .fails(400, "unknown state")?;
    d.post(
        "/api/bulk",
        json!({"action": "retry", "state": "dead", "queue": 5}),
    )?
    .fails(400, "queue must be a string")?;
    Ok(())
}

fn posts_without_the_csrf_token_change_nothing(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let queue = s.db.open()?;
    let path = format!("/api/jobs/{}/retry", s.seeded.dead_script);
    let json_type = ("Content-Type", "application/json");
    d.request("POST", &path, &[json_type], b"{}")?
        .fails(403, "missing CSRF token")?;
    d.request(
        "POST",
        &path,
        &[json_type, ("X-CSRF-Token", "guess")],
        b"{}",
    )?
    .fails(403, "wrong CSRF token")?;
    // A form post (what another site could make a browser send) is refused.
    let csrf = d.csrf.clone();
    d.request(
        "POST",
        &path,
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("X-CSRF-Token", &csrf),
        ],
        b"a=b",
    )?
    .fails(415, "JSON body")?;
    d.request("POST", "/api/queues/emails/pause", &[json_type], b"{}")?
        .fails(403, "CSRF")?;
    assert_eq!(queue.get(s.seeded.dead_script)?.state, JobState::DEAD);
    assert!(!queue.paused_queues()?.contains(&"emails".to_owned()));
    // A page served under another host name (DNS rebinding) is refused.
    d.request("GET", "/", &[("Host", "evil.example:80")], b"")?
        .fails(403, "is not this machine")?;
    d.request("GET", "/api/overview", &[("Host", "localhost:1")], b"")?
        .expect(200)?;
    Ok(())
}

fn bad_requests_get_4xx_with_a_message_and_the_server_keeps_serving(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let path = format!("/api/jobs/{}/retry", s.seeded.dead_script);
    let csrf = d.csrf.clone();
    let headers = [
        ("X-CSRF-Token", csrf.as_str()),
        ("Content-Type", "application/json"),
    ];
    // Wrong methods.
    let wrong = d.request("POST", "/", &headers, b"{}")?;
    wrong.fails(405, "POST is not allowed here; use GET")?;
    assert_eq!(wrong.header("allow"), Some("GET"));
    d.get(&path)?.fails(405, "use POST")?;
    d.request("DELETE", "/api/overview", &[], b"")?
        .fails(405, "use GET")?;
    d.request("PUT", "/api/bulk", &headers, b"{}")?
        .fails(405, "use POST")?;
    // Malformed bodies.
    d.request("POST", &path, &headers, b"{not json")?
        .fails(400, "the body is not JSON")?;
    d.request("POST", &path, &headers, b"[1, 2]")?
        .fails(400, "must be a JSON object")?;
    d.request("POST", &path, &headers, &[0xff, 0xfe, 0x00])?
        .fails(400, "not JSON")?;
    let huge = vec![b' '; 70 * 1024];
    d.request("POST", &path, &headers, &huge)?
        .fails(413, "too large")?;
    // Odd URLs.
    d.get("/api/jobs?state=%ZZ&queue=%E2%82")?
        .fails(400, "unknown state")?;
    d.get("/api/jobs/99999999999999999999999")?
        .fails(404, "not a job id")?;
    d.get(&format!("/{}", "a/".repeat(2000)))?
        .fails(404, "no page")?;
    // Garbage instead of HTTP, and a client that stalls mid-body, do not
    // stop the server from answering others.
    let _ = d.raw(b"\x16\x03\x01garbage\r\n\r\n");
    let mut stalled = TcpStream::connect(("127.0.0.1", d.port))?;
    stalled.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-CSRF-Token: {csrf}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
        )
        .as_bytes(),
    )?;
    let started = std::time::Instant::now();
    assert_eq!(d.get("/healthz")?.expect(200)?, json!({"ok": true}));
    d.get("/api/overview")?.expect(200)?;
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(stalled);
    // Every request gives its slot back: more requests than there are slots.
    for _ in 0..100 {
        assert_eq!(d.get("/healthz")?.status, 200);
    }
    Ok(())
}

fn read_only_mode_refuses_every_action(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &["--read-only"])?;
    let queue = s.db.open()?;
    assert!(d
        .get("/")?
        .body
        .contains("name=\"read-only\" content=\"1\""));
    assert_eq!(
        d.get("/api/overview")?.expect(200)?["read_only"],
        json!(true)
    );
    for path in [
        format!("/api/jobs/{}/retry", s.seeded.dead_script),
        format!("/api/jobs/{}/delete", s.seeded.completed),
        "/api/queues/emails/pause".to_owned(),
        "/api/bulk".to_owned(),
    ] {
        d.post(&path, json!({"action": "delete", "state": "dead"}))?
            .fails(403, "read-only")?;
    }
    assert_eq!(queue.get(s.seeded.dead_script)?.state, JobState::DEAD);
    assert!(queue.get(s.seeded.completed).is_ok());
    assert!(!queue.paused_queues()?.contains(&"emails".to_owned()));
    Ok(())
}

fn a_token_guards_every_route_but_healthz(s: &Setup) -> TestResult {
    // Any address but loopback without a token: refused at start.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_backlog"))
        .args([
            "dashboard",
            "--db",
            &s.db.target,
            "--addr",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .env_remove("BACKLOG_DASHBOARD_TOKEN")
        .output()?;
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("pass --token"), "{stderr}");

    let secret = "s3cret-token-0123";
    let d = Dashboard::start(&s.db.target, &["--addr", "0.0.0.0", "--token", secret])?;
    for path in ["/", "/api/overview", "/metrics", "/assets/app.js"] {
        d.get(path)?.fails(401, "needs its token")?;
    }
    d.request("GET", "/", &[("Authorization", "Bearer wrong")], b"")?
        .fails(401, "needs its token")?;
    assert_eq!(d.get("/healthz")?.status, 200);
    let bearer = format!("Bearer {secret}");
    d.request("GET", "/api/overview", &[("Authorization", &bearer)], b"")?
        .expect(200)?;
    // A browser signs in once with ?token=, then carries the cookie.
    let signed_in = d.get(&format!("/jobs?token={secret}"))?;
    assert_eq!(signed_in.status, 303);
    assert_eq!(signed_in.header("location"), Some("/jobs"));
    let cookie = signed_in.header("set-cookie").ok_or("no cookie")?;
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap_or_default().to_owned();
    d.request("GET", "/api/overview", &[("Cookie", &pair)], b"")?
        .expect(200)?;
    d.get("/?token=wrong")?.fails(401, "wrong token")?;
    // The sign-in redirect stays on this server: `//host/` would be
    // another host to a browser.
    for (asked, location) in [
        ("//evil.example/", "/evil.example/"),
        ("/\\evil.example/", "/evil.example/"),
        ("///evil.example", "/evil.example"),
    ] {
        let reply = d.get(&format!("{asked}?token={secret}"))?;
        assert_eq!(reply.status, 303, "{asked}: {}", reply.body);
        assert_eq!(reply.header("location"), Some(location), "{asked}");
    }
    // Actions still need the CSRF token on top.
    let path = format!("/api/jobs/{}/retry", s.seeded.dead_script);
    d.request(
        "POST",
        &path,
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        b"{}",
    )?
    .fails(403, "CSRF")?;
    Ok(())
}

fn the_workers_page_lists_live_workers_their_jobs_and_unhandled_kinds(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let none = d.get("/api/workers")?.expect(200)?;
    assert_eq!(none["workers"], json!([]));
    // Nobody runs: every due job waits for nobody.
    let flagged: Vec<(&str, &str)> = none["unhandled"]
        .as_array()
        .ok_or("no unhandled")?
        .iter()
        .filter_map(|u| Some((u["queue"].as_str()?, u["kind"].as_str()?)))
        .collect();
    assert!(flagged.contains(&("emails", "send_digest")), "{none}");

    // The worker the seeded leases name, back with a handler for another
    // kind: it holds the two running emails and leases nothing.
    let worker = Worker::builder(s.db.open()?)
        .worker_id("web-1.prod:4121")
        .queues(["emails", "webhooks"])
        .concurrency(4)
        .handle_raw("send_sms", |_, _| Ok(()))
        .start()?;
    let page = d.get("/workers")?;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("href=\"/workers\""), "the nav links it");
    let listed = d.get("/api/workers")?.expect(200)?;
    let w = &listed["workers"][0];
    assert_eq!(w["id"], json!("web-1.prod:4121"));
    assert_eq!(w["queues"], json!(["emails", "webhooks"]));
    assert_eq!(w["kinds"], json!(["send_sms"]));
    assert_eq!(w["concurrency"], json!(4));
    let held: Vec<i64> = w["running"]
        .as_array()
        .ok_or("no running")?
        .iter()
        .filter_map(|j| j["id"].as_i64())
        .collect();
    assert_eq!(held.len(), 2, "{w}");
    assert!(held.contains(&s.seeded.running), "{w}");
    let emails = listed["unhandled"]
        .as_array()
        .ok_or("no unhandled")?
        .iter()
        .find(|u| u["queue"] == json!("emails"))
        .ok_or("emails not flagged")?;
    assert_eq!(emails["kind"], json!("send_digest"));
    assert_eq!(emails["due"], json!(12));
    // The overview's queue rows carry the flag too.
    let overview = d.get("/api/overview")?.expect(200)?;
    let row = overview["queues"]
        .as_array()
        .ok_or("no queues")?
        .iter()
        .find(|q| q["queue"] == json!("emails"))
        .ok_or("no emails")?;
    assert_eq!(
        row["unhandled"],
        json!([{"kind": "send_digest", "due": 12}])
    );
    let js = d.get("/assets/app.js")?.body;
    assert!(js.contains("async function workersPage()"));
    worker.shutdown(Duration::from_secs(10))?;
    assert_eq!(d.get("/api/workers")?.expect(200)?["workers"], json!([]));
    Ok(())
}

fn the_chart_api_covers_an_hour_a_day_and_a_week_per_queue_and_kind(s: &Setup) -> TestResult {
    let d = Dashboard::start(&s.db.target, &[])?;
    let sum = |v: &serde_json::Value, key: &str| -> TestResult<u64> {
        Ok(v[key]
            .as_array()
            .ok_or_else(|| format!("no {key} in {v}"))?
            .iter()
            .filter_map(|n| n.as_u64())
            .sum())
    };
    // Seeded in the last minutes: 1 webhook delivered; 3 emails, 1 invoice
    // and 1 webhook dead. Every window holds them, in its own buckets.
    for (window, buckets, secs) in [("1h", 60, 60), ("24h", 24, 3600), ("7d", 168, 3600)] {
        let chart = d.get(&format!("/api/chart?window={window}"))?.expect(200)?;
        assert_eq!(chart["window"], json!(window));
        assert_eq!(
            (chart["buckets"].as_u64(), chart["bucket_secs"].as_u64()),
            (Some(buckets), Some(secs))
        );
        for key in ["completed", "failed", "cancelled"] {
            assert_eq!(
                chart[key].as_array().map(Vec::len),
                Some(buckets as usize),
                "{key}"
            );
        }
        assert_eq!(
            (sum(&chart, "completed")?, sum(&chart, "failed")?),
            (1, 5),
            "{window}"
        );
        assert_eq!(chart["queues"], json!(["billing", "emails", "webhooks"]));
        assert_eq!(
            chart["kinds"],
            json!(["charge_invoice", "deliver_webhook", "send_welcome_email"])
        );
    }
    // The default window is the hour; a queue or a kind narrows it.
    let emails = d.get("/api/chart?queue=emails")?.expect(200)?;
    assert_eq!(
        (emails["window"].as_str(), emails["queue"].as_str()),
        (Some("1h"), Some("emails"))
    );
    assert_eq!(
        (sum(&emails, "completed")?, sum(&emails, "failed")?),
        (0, 3)
    );
    let hooks = d
        .get("/api/chart?window=7d&kind=deliver_webhook")?
        .expect(200)?;
    assert_eq!((sum(&hooks, "completed")?, sum(&hooks, "failed")?), (1, 1));
    let none = d
        .get("/api/chart?window=24h&queue=emails&kind=charge_invoice")?
        .expect(200)?;
    assert_eq!((sum(&none, "completed")?, sum(&none, "failed")?), (0, 0));
    // A window it does not know is a 400 that says which it knows.
    let bad = d.get("/api/chart?window=30d")?;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("1h, 24h or 7d"), "{}", bad.body);
    // An operator cancel shows in its own column.
    let queue = s.db.open()?;
    queue.cancel(s.seeded.scheduled)?;
    let chart = d.get("/api/chart?window=24h&queue=billing")?.expect(200)?;
    assert_eq!(sum(&chart, "cancelled")?, 1);
    // Totals in the stats the overview shows carry the counts too.
    let overview = d.get("/api/overview")?.expect(200)?;
    let billing = &overview["queues"][0];
    assert_eq!(
        billing["finished"],
        json!({"completed": 0, "discarded": 0, "cancelled": 1, "dead": 1, "aggregated": 0})
    );
    Ok(())
}

/// The workflow and batch pages, their API, the job page's links, pending
/// jobs in the overview, and cancelling a workflow behind the CSRF token and
/// read-only rules of every action.
fn workflows_and_batches_have_pages_an_api_links_and_a_guarded_cancel(s: &Setup) -> TestResult {
    let queue = s.db.open()?;
    let flow = queue.enqueue_workflow(
        backlog::Workflow::new("report")
            .step("fetch", NewJob::new("fetch", json!({})).queue("flows"))
            .step_after(
                "merge",
                NewJob::new("merge", json!({})).queue("flows"),
                &["fetch"],
            ),
    )?;
    let (fetch, merge) = (
        flow.step("fetch").ok_or("fetch")?,
        flow.step("merge").ok_or("merge")?,
    );
    let batch = queue
        .batch()
        .on_complete(NewJob::new("report", json!({})).queue("flows"))
        .create()?
        .id;
    let member = queue
        .enqueue(NewJob::new("row", json!({})).queue("flows").batch(batch))?
        .id;
    let d = Dashboard::start(&s.db.target, &[])?;

    for page in [
        format!("/workflows/{}", flow.id),
        "/workflows/report".into(),
        format!("/batches/{batch}"),
    ] {
        let reply = d.get(&page)?;
        assert_eq!(reply.status, 200, "{page}: {}", reply.body);
        assert!(
            reply.body.contains("<script src=\"/assets/flows.js\""),
            "{page}"
        );
    }
    let js = d.get("/assets/flows.js")?;
    assert_eq!(js.status, 200);
    assert!(js.body.contains("function workflowPage("));
    assert!(!js.body.contains("http://") && !js.body.contains("https://"));

    for which in [flow.id.to_string(), "report".into()] {
        let w = d.get(&format!("/api/workflows/{which}"))?.expect(200)?;
        let w = &w["workflow"];
        assert_eq!((&w["id"], &w["name"]), (&json!(flow.id), &json!("report")));
        assert_eq!(w["steps"][1]["step"], "merge");
        assert_eq!(w["steps"][1]["state"], "pending");
        assert_eq!(w["steps"][1]["waiting_on"], json!(["fetch"]));
    }
    d.get("/api/workflows/nosuch")?
        .fails(404, "no workflow is named")?;
    d.get("/api/workflows/99999999")?
        .fails(404, "no workflow has id")?;

    let b = d.get(&format!("/api/batches/{batch}"))?.expect(200)?;
    let b = &b["batch"];
    assert_eq!(
        (&b["total"], &b["pending"], &b["sealed"]),
        (&json!(1), &json!(1), &json!(false))
    );
    assert_eq!(b["on_complete"]["enqueued"], false);
    d.get("/api/batches/99999999")?
        .fails(404, "no batch has id")?;
    d.get("/api/batches/abc")?.fails(404, "not a batch id")?;

    let job = d.get(&format!("/api/jobs/{merge}"))?.expect(200)?;
    assert_eq!(
        job["links"]["workflow"],
        json!({"id": flow.id, "name": "report", "step": "merge"})
    );
    assert_eq!(job["links"]["dependencies"][0]["job_id"], fetch);
    let job = d.get(&format!("/api/jobs/{member}"))?.expect(200)?;
    assert_eq!(job["links"]["batch"], batch);
    assert_eq!(job["links"]["workflow"], serde_json::Value::Null);

    let overview = d.get("/api/overview")?.expect(200)?;
    let flows = overview["queues"]
        .as_array()
        .ok_or("queues")?
        .iter()
        .find(|q| q["queue"] == "flows")
        .ok_or("no queue flows")?
        .clone();
    assert_eq!(flows["pending"], 1);

    // Cancelling: a POST with the CSRF token, refused without it, by GET,
    // and on a read-only dashboard.
    let cancel = format!("/api/workflows/{}/cancel", flow.id);
    d.request(
        "POST",
        &cancel,
        &[("Content-Type", "application/json")],
        b"{}",
    )?
    .fails(403, "missing CSRF token")?;
    let reply = d.get(&cancel)?;
    assert_eq!(reply.status, 405, "{}", reply.body);
    let read_only = Dashboard::start(&s.db.target, &["--read-only"])?;
    read_only
        .post(&cancel, json!({}))?
        .fails(403, "read-only")?;
    assert_eq!(queue.get(merge)?.state, JobState::Pending);
    d.post(&format!("/api/workflows/{}/pause", flow.id), json!({}))?
        .fails(404, "no workflow action")?;
    let done = d.post(&cancel, json!({}))?.expect(200)?;
    assert_eq!(done["cancelled"], 2, "{done}");
    assert_eq!(queue.get(fetch)?.state, JobState::CANCELLED);
    assert_eq!(queue.get(merge)?.state, JobState::CANCELLED);
    let w = d.get(&format!("/api/workflows/{}", flow.id))?.expect(200)?;
    assert_eq!(w["workflow"]["finished"], true);
    Ok(())
}
