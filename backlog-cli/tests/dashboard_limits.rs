//! The dashboard under a hostile client: 200 connections that send their
//! headers and hold back the body, plus one 200 MB header line, against the
//! real `backlog dashboard` process started with a token. Other requests are
//! still answered within a second, the server's memory grows by at most
//! 10 MB, the long header is cut off, and a stalled request is closed once
//! its time to send runs out.
//!
//! SQLite only: these limits live in the HTTP layer, before any database
//! call, and are the same whatever the database.

#![cfg(all(feature = "dashboard", target_os = "linux"))]

mod dashboard_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dashboard_common::{seed, Backend, Dashboard, Database, TestResult};

const TOKEN: &str = "a-long-enough-test-token";
const STALLED: usize = 200;
const BIG_HEADER: usize = 200 * 1024 * 1024;
/// The dashboard's `REQUEST_TIMEOUT` (src/dashboard/http.rs).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The dashboard's `MAX_PER_CLIENT` (src/dashboard/http.rs).
const MAX_PER_CLIENT: usize = 256;

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> TestResult<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/PID/status".into())
}

/// Opens a connection and sends `head`, leaving the body unsent.
fn stall(port: u16, head: &str) -> TestResult<TcpStream> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(head.as_bytes())?;
    Ok(stream)
}

/// One authorized request on its own connection: its status and how long
/// the answer took (a frozen server fails the read after 5 s).
fn probe(port: u16, path: &str) -> TestResult<(u16, Duration)> {
    let started = Instant::now();
    let status = ask(TcpStream::connect(("127.0.0.1", port))?, port, path)?;
    Ok((status, started.elapsed()))
}

/// Sends one authorized GET on `stream` and returns the answer's status.
fn ask(mut stream: TcpStream, port: u16, path: &str) -> TestResult<u16> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| format!("no answer to {path} within 5 s: {e}"))?;
    let status = String::from_utf8_lossy(&response)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP response to {path}"))?;
    Ok(status)
}

/// A connection to the dashboard on 127.0.0.1 from `source`, another
/// loopback address standing for another client.
fn connect_from(source: [u8; 4], port: u16) -> TestResult<TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |ip: [u8; 4], port: u16| {
        // SAFETY: sockaddr_in is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        // Both fields are in network byte order.
        addr.sin_addr.s_addr = u32::from_ne_bytes(ip);
        addr.sin_port = port.to_be();
        addr
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream from here on (closed on
    // every path), and addresses that live across the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let from = sockaddr(source, 0);
        if libc::bind(fd, (&raw const from).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let to = sockaddr([127, 0, 0, 1], port);
        if libc::connect(fd, (&raw const to).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(stream)
    }
}

/// Streams one header line of up to [`BIG_HEADER`] bytes; returns how many
/// bytes went out before the server closed the connection.
fn send_big_header(port: u16) -> TestResult<usize> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_write_timeout(Some(Duration::from_secs(20)))?;
    stream.write_all(format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Big: ").as_bytes())?;
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0;
    while sent < BIG_HEADER {
        match stream.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => sent += n,
        }
    }
    Ok(sent)
}

#[test]
fn stalled_bodies_and_a_huge_header_freeze_nothing() -> TestResult {
    let Some(db) = Database::new(Backend::Sqlite)? else {
        return Ok(());
    };
    seed(&db, false)?;
    let d = Dashboard::start(&db.target, &["--token", TOKEN])?;
    let port = d.port;
    // Warm up (threads, pools, the page's routes) before the baseline.
    for path in ["/", "/api/overview", "/api/jobs", "/healthz"] {
        probe(port, path)?;
    }
    let baseline = rss_kib(d.pid())?;

    // Half carry the token and the CSRF header (the server waits for their
    // body), half carry nothing (no authentication is needed to stall).
    let mut stalled = Vec::with_capacity(STALLED);
    for i in 0..STALLED {
        let auth = if i % 2 == 0 {
            format!(
                "Authorization: Bearer {TOKEN}\r\nX-CSRF-Token: {}\r\n",
                d.csrf
            )
        } else {
            String::new()
        };
        stalled.push(stall(
            port,
            &format!(
                "POST /api/bulk HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}\
                 Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n{{"
            ),
        )?);
    }
    // Connections that send nothing, or half a header line, hold no slot
    // past the time to send either.
    let silent = TcpStream::connect(("127.0.0.1", port))?;
    let half = stall(port, "GET /api/overview HTTP/1.1\r\nHost: 127.")?;
    let big = std::thread::spawn(move || send_big_header(port).map_err(|e| e.to_string()));

    let mut peak = baseline;
    let mut slowest = Duration::ZERO;
    for round in 0..10 {
        for path in ["/api/overview", "/healthz", "/api/jobs?state=dead"] {
            let (status, took) = probe(port, path)?;
            assert_eq!(status, 200, "{path} in round {round}");
            slowest = slowest.max(took);
        }
        peak = peak.max(rss_kib(d.pid())?);
        std::thread::sleep(Duration::from_millis(200));
    }
    let sent = big.join().map_err(|_| "the header thread panicked")??;
    peak = peak.max(rss_kib(d.pid())?);
    let grown_kib = peak.saturating_sub(baseline);
    println!(
        "dashboard limits: stalled={STALLED} slowest_answer_ms={} rss_baseline_kib={baseline} \
         rss_peak_kib={peak} grown_kib={grown_kib} big_header_sent_bytes={sent}",
        slowest.as_millis()
    );
    assert!(
        slowest <= Duration::from_secs(1),
        "an answer took {slowest:?} beside {STALLED} stalled connections"
    );
    assert!(
        sent < BIG_HEADER,
        "the server read a {BIG_HEADER}-byte header line to its end"
    );
    assert!(
        grown_kib <= 10 * 1024,
        "the server's memory grew by {grown_kib} KiB (baseline {baseline} KiB)"
    );

    // An authorized request whose body never comes is closed with 408 once
    // its time to send is over, counted from the connection.
    let mut waiting = stalled.swap_remove(0);
    waiting.set_read_timeout(Some(REQUEST_TIMEOUT + Duration::from_secs(10)))?;
    let mut response = Vec::new();
    waiting.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    assert!(
        response.starts_with("HTTP/1.1 408"),
        "a stalled body got {response:?}"
    );
    for (name, mut stream) in [("silent", silent), ("half-header", half)] {
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut rest = Vec::new();
        // Closed (EOF or reset), whatever hyper wrote before closing.
        if let Err(e) = stream.read_to_end(&mut rest) {
            assert!(
                e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut,
                "the {name} connection is still open after {REQUEST_TIMEOUT:?}"
            );
        }
    }
    drop(stalled);
    assert_eq!(probe(port, "/api/overview")?.0, 200);
    Ok(())
}

#[test]
fn one_address_cannot_take_every_connection() -> TestResult {
    let Some(db) = Database::new(Backend::Sqlite)? else {
        return Ok(());
    };
    seed(&db, false)?;
    let d = Dashboard::start(&db.target, &["--token", TOKEN])?;
    let port = d.port;
    // Connections that send nothing yet; the server accepts in order, so
    // every one holds its slot before the next connection below is seen.
    let held = (0..MAX_PER_CLIENT)
        .map(|_| TcpStream::connect(("127.0.0.1", port)))
        .collect::<Result<Vec<_>, _>>()?;
    let refused = ask(TcpStream::connect(("127.0.0.1", port))?, port, "/healthz")?;
    assert_eq!(
        refused, 503,
        "one address past its {MAX_PER_CLIENT} connections"
    );
    let other = ask(connect_from([127, 0, 0, 2], port)?, port, "/healthz")?;
    assert_eq!(other, 200, "another address beside a full one");
    drop(held);
    // The slots come back as the server sees the closes.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match probe(port, "/api/overview")?.0 {
            200 => return Ok(()),
            status if Instant::now() > deadline => {
                return Err(format!("still {status} after the connections closed").into())
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
