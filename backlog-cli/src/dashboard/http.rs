//! The dashboard's transport: hyper's HTTP/1 server on a small tokio runtime
//! inside the binary, with the bounds that keep one slow or hostile client
//! from freezing everyone else. The library stays synchronous: handlers that
//! touch the [`Queue`](backlog::Queue) run on tokio's blocking pool.
//!
//! Every bound, and what a client past it gets:
//! - headers: at most [`MAX_HEADER_BYTES`] (hyper answers 431 and closes);
//! - body: at most [`MAX_BODY`] (413, before reading it when it is announced);
//! - time to send the request, headers and body together: [`REQUEST_TIMEOUT`]
//!   from the accept (the connection is closed, or 408 once headers are in);
//! - a connection's whole life, response included: [`CONNECTION_TIMEOUT`];
//! - open connections: [`MAX_CONNECTIONS`] in all and [`MAX_PER_CLIENT`] from
//!   one IP address; past either, a fixed 503 and the connection is closed;
//! - handlers running at once: [`MAX_HANDLERS`] threads (more wait their turn).
//!
//! One request per connection (no keep-alive): an idle connection then never
//! holds a slot, and the page's few requests per refresh cost little on a
//! dashboard.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{error, Head, Reply, Server};

/// The largest request head (request line and headers) read.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The largest request body read (an action's JSON is a few bytes).
pub const MAX_BODY: usize = 64 * 1024;
/// How long a client may take to send its whole request, from the accept.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection stays open, answer included (a slow database
/// call or a client that does not read its answer ends there).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections open at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections open at once from one IP address, so that one client cannot
/// take every slot.
pub const MAX_PER_CLIENT: usize = 256;
/// Handlers calling the database at once (tokio's blocking threads).
pub const MAX_HANDLERS: usize = 16;

/// The limits as `backlog dashboard --help` states them (a test holds them
/// to the constants above).
pub const LIMITS_HELP: &str = "\
Limits (a slow or hostile client cannot hold the server for others):
  request line and headers  16 KiB (else 431)
  request body              64 KiB (else 413)
  time to send a request    10 s from the connection, headers and body (else closed, or 408)
  a connection's life       60 s, answer included; one request per connection
  open connections          1024, at most 256 from one IP address (else 503 at once)
  database calls at once    16 (the others wait their turn)";

/// Refusals being written at once; past them a connection is closed
/// without a word, so that a flood costs no more than that many sockets.
const MAX_REFUSING: usize = 64;
/// Sockets beside the connections: the listener, the database, files.
const SPARE_FILES: u64 = 256;

/// What a client past the connection limits reads before the close.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
Content-Length: 30\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections at once\r\n";

/// Serves `listener` until the process is stopped.
pub fn serve(listener: std::net::TcpListener, server: Arc<Server>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(MAX_HANDLERS)
        .thread_name("backlog-dashboard")
        .enable_io()
        .enable_time()
        .build()?;
    runtime.block_on(accept(listener, server))
}

async fn accept(listener: std::net::TcpListener, server: Arc<Server>) -> std::io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let slots = Arc::new(Slots::default());
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, or a connection reset before the
                // accept: transient, so wait a little instead of spinning.
                eprintln!("dashboard: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(peer.ip()) else {
            if let Ok(refusing) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(refusing);
                });
            }
            continue;
        };
        let server = server.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            let service = service_fn(move |request| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(respond(server, request, deadline).await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .max_header_size(MAX_HEADER_BYTES)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection closes it; its handler, if running,
            // finishes on its own thread and its answer is dropped.
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
        });
    }
}

/// A fixed 503 for a client past the limits, all within one second.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(BUSY).await?;
        stream.shutdown().await?;
        // Read what the client sent (a request head at most): closing on
        // unread data is a reset, which can lose the 503 on its side.
        let mut sink = [0u8; 4096];
        let mut left = MAX_HEADER_BYTES;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Raises the soft limit on open files (often 1024) towards the hard one,
/// so that [`MAX_CONNECTIONS`] fit beside the database's sockets; says so
/// when they cannot (accepts then fail, and are retried, past the limit).
#[cfg(unix)]
// rlim_t is u64 on Linux and macOS but not on every Unix.
#[allow(clippy::useless_conversion)]
fn raise_open_files_limit() {
    let wanted = MAX_CONNECTIONS as u64 + MAX_REFUSING as u64 + SPARE_FILES;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the call to fill and to read.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let current = u64::from(limit.rlim_cur);
    if current >= wanted {
        return;
    }
    let raised = wanted.min(u64::from(limit.rlim_max));
    limit.rlim_cur = libc::rlim_t::try_from(raised).unwrap_or(limit.rlim_max);
    // SAFETY: as above; raising the soft limit up to the hard one is allowed.
    let ok = raised > current && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0;
    let now = if ok { raised } else { current };
    if now < wanted {
        eprintln!(
            "dashboard: the open-files limit is {now}; {wanted} would fit {MAX_CONNECTIONS} \
             connections (raise `ulimit -n`)"
        );
    }
}

#[cfg(not(unix))]
fn raise_open_files_limit() {}

/// One request: the checks that need no database first (so a client
/// without the token or the CSRF header is refused before its body is
/// read), then the body within the deadline, then the handler on the
/// blocking pool.
async fn respond(
    server: Arc<Server>,
    request: Request<Incoming>,
    deadline: Instant,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let head = Head {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        headers: parts.headers,
    };
    let reply = match server.admit(&head) {
        Some(refused) => refused,
        None => match read_body(&head, body, deadline).await {
            Err(refused) => refused,
            Ok(body) => {
                let handler = server.clone();
                match tokio::task::spawn_blocking(move || handler.handle(&head, &body)).await {
                    Ok(reply) => reply,
                    // A panic (printed by the hook): this request fails, the
                    // server goes on.
                    Err(_) => error(500, "internal error (see the dashboard's log)"),
                }
            }
        },
    };
    server.finish(reply)
}

/// A POST's body, at most [`MAX_BODY`] bytes, in by `deadline`; other
/// methods' bodies are not read.
async fn read_body(head: &Head, body: Incoming, deadline: Instant) -> Result<Vec<u8>, Reply> {
    if head.method != Method::POST {
        return Ok(Vec::new());
    }
    let announced = head
        .header("Content-Length")
        .and_then(|n| n.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(error(413, "the request body is too large"));
    }
    match tokio::time::timeout_at(deadline, Limited::new(body, MAX_BODY).collect()).await {
        Err(_) => Err(error(
            408,
            format!(
                "the request was not sent within {} s",
                REQUEST_TIMEOUT.as_secs()
            ),
        )),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            Err(error(413, "the request body is too large"))
        }
        Ok(Err(e)) => Err(error(400, format!("could not read the request body: {e}"))),
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
    }
}

/// Open connections, in all and per client address.
#[derive(Default)]
struct Slots {
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One open connection's place in [`Slots`], given back on drop.
struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Slots {
    fn take(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_client) = &mut *open;
        let mine = per_client.entry(peer).or_insert(0);
        if *total >= MAX_CONNECTIONS || *mine >= MAX_PER_CLIENT {
            if *mine == 0 {
                per_client.remove(&peer);
            }
            return None;
        }
        *total += 1;
        *mine += 1;
        Some(Slot {
            slots: self.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_client) = &mut *open;
        *total -= 1;
        if let Some(mine) = per_client.get_mut(&self.peer) {
            *mine -= 1;
            if *mine == 0 {
                per_client.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_states_the_limits_in_force() {
        for stated in [
            format!("headers  {} KiB", MAX_HEADER_BYTES / 1024),
            format!("body              {} KiB", MAX_BODY / 1024),
            format!("request    {} s", REQUEST_TIMEOUT.as_secs()),
            format!("life       {} s", CONNECTION_TIMEOUT.as_secs()),
            format!("connections          {MAX_CONNECTIONS}, at most {MAX_PER_CLIENT}"),
            format!("at once    {MAX_HANDLERS} "),
        ] {
            assert!(LIMITS_HELP.contains(&stated), "{stated:?} not in the help");
        }
    }
}
