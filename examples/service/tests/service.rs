//! The example service end to end: the binary started on an ephemeral
//! port, a real HTTP request, the order charged by the worker in the same
//! process, a clean exit on SIGTERM. Without `BACKLOG_TEST_POSTGRES_URL`
//! the binary must say so and exit 0, which is checked instead.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const BIN: &str = env!("CARGO_BIN_EXE_backlog-example-service");

/// Sends one HTTP/1.1 request and returns the status and the JSON body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, Value), Box<dyn std::error::Error + Send + Sync>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP response: {response:?}"))?;
    let status: u16 = head.split(' ').nth(1).ok_or("no status")?.parse()?;
    let json = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
    Ok((status, json))
}

/// Kills the service if the test fails before it stops it.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_posted_order_is_accepted_then_charged_by_the_worker() -> TestResult {
    let url = match std::env::var("BACKLOG_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            let out = Command::new(BIN)
                .env_remove("DATABASE_URL")
                .env_remove("BACKLOG_TEST_POSTGRES_URL")
                .output()?;
            assert!(out.status.success());
            assert!(String::from_utf8_lossy(&out.stdout).contains("SKIPPED"));
            println!("SKIPPED: set BACKLOG_TEST_POSTGRES_URL to run the service");
            return Ok(());
        }
    };
    let schema = format!("service_{}", std::process::id());
    let result = run(&url, &schema);
    drop_schema(&url, &schema)?;
    result
}

fn run(url: &str, schema: &str) -> TestResult {
    let mut service = Service(
        Command::new(BIN)
            .args(["--bind", "127.0.0.1:0", "--schema", schema])
            .env("DATABASE_URL", url)
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let stdout = service.0.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().ok_or("the service printed nothing")??;
    let addr = first
        .strip_prefix("listening on http://")
        .ok_or_else(|| format!("unexpected first line {first:?}"))?
        .to_owned();

    let (status, body) = http(&addr, "POST", "/orders", r#"{"cents": 1250}"#)?;
    assert_eq!(status, 202, "{body}");
    let order = body["order"].as_i64().ok_or("no order id")?;
    assert!(body["job"].as_i64().is_some(), "{body}");

    let (status, _) = http(&addr, "POST", "/orders", r#"{"cents": -1}"#)?;
    assert_eq!(status, 422);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http(&addr, "GET", &format!("/orders/{order}"), "")?;
        assert_eq!(status, 200, "{body}");
        if body["paid"] == Value::Bool(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "order {order} not paid after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // SIGTERM: the server drains, the worker stops, the process exits 0.
    let pid = service.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()?
        .success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = service.0.try_wait()? {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let rest: Vec<String> = lines.collect::<Result<_, _>>()?;
    assert!(rest.iter().any(|l| l.starts_with("stopped")), "{rest:?}");
    Ok(())
}

fn drop_schema(url: &str, schema: &str) -> TestResult {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(url).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&pool)
        .await?;
        Ok(())
    })
}
