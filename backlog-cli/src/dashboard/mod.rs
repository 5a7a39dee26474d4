//! `backlog dashboard`: the queue in a browser. An HTTP server (hyper, see
//! [`http`] for its limits on size, time and connections) serves one page
//! shell, its script and style (embedded in the binary: no CDN, no external
//! font) and the JSON API the page calls.
//!
//! Safety, in the order a request meets it (see [`Server::admit`]):
//! - the listener binds 127.0.0.1 unless told otherwise, and any other
//!   address needs `--token`: every request but `/healthz` then carries it
//!   (`Authorization: Bearer`, or the cookie `/?token=` sets);
//! - on a loopback bind the `Host` header must name loopback, so a web page
//!   cannot reach the dashboard through a rebound DNS name;
//! - every action is a POST carrying the per-process CSRF token (the page
//!   reads it from its shell) as `X-CSRF-Token`, with a JSON body;
//! - `--read-only` refuses every action server-side (the page hides them);
//! - every response carries Content-Security-Policy (scripts and styles from
//!   the dashboard only, no framing), X-Frame-Options and
//!   X-Content-Type-Options; the page writes job data as text, never HTML.

mod api;
mod http;

pub use http::LIMITS_HELP;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use backlog::Queue;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Response, StatusCode};
use serde_json::{json, Value};

use crate::fail::{Code, Failure};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FLOWS_JS: &str = include_str!("assets/flows.js");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// How `backlog dashboard` was asked to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub addr: IpAddr,
    pub port: u16,
    pub token: Option<String>,
    pub read_only: bool,
    /// The database as messages name it (a URL without its password).
    pub database: String,
}

/// Serves until the process is stopped. Prints the URL first (with port 0,
/// the port the system chose), for people and for tests.
pub fn run(queue: Queue, config: Config) -> Result<(), Failure> {
    if let Some(token) = &config.token {
        check_token(token)?;
    }
    if !config.addr.is_loopback() && config.token.as_deref().unwrap_or_default().is_empty() {
        return Err(Failure::new(
            Code::Usage,
            format!(
                "binding {} exposes the queue beyond this machine: pass --token SECRET \
                 (or BACKLOG_DASHBOARD_TOKEN), or bind 127.0.0.1",
                config.addr
            ),
        ));
    }
    let bind = SocketAddr::new(config.addr, config.port);
    let listener = std::net::TcpListener::bind(bind)
        .map_err(|e| Failure::new(Code::Other, format!("cannot listen on {bind}: {e}")))?;
    let local = listener.local_addr()?;
    let server = Arc::new(Server {
        queue,
        csrf: random_token(),
        config,
    });
    let shown = match &server.config.token {
        Some(_) => format!("http://{local}/?token=…"),
        None => format!("http://{local}/"),
    };
    println!(
        "dashboard for {} on {shown}{}",
        crate::output::safe(&server.config.database),
        if server.config.read_only {
            " (read-only)"
        } else {
            ""
        }
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    http::serve(listener, server)?;
    Ok(())
}

struct Server {
    queue: Queue,
    config: Config,
    /// Every POST must carry it; only a page this server sent knows it.
    csrf: String,
}

/// A response under construction: status, body, content type, extra headers.
pub struct Reply {
    status: u16,
    body: Vec<u8>,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type,
            headers: Vec::new(),
        }
    }

    pub fn json(status: u16, value: &Value) -> Reply {
        Reply::new(status, "application/json", value.to_string())
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }
}

/// A JSON error: `{"error": message}`.
pub fn error(status: u16, message: impl Into<String>) -> Reply {
    Reply::json(status, &json!({ "error": message.into() }))
}

/// The HTTP status of a failed library call.
pub fn failure(f: Failure) -> Reply {
    let status = match f.code {
        Code::NotFound | Code::UnknownQueue => 404,
        Code::InvalidInput | Code::Usage => 400,
        Code::InvalidState => 409,
        Code::Unreachable => 503,
        _ => 500,
    };
    // The page's button, where the terminal's message names the command.
    error(status, f.message.replace("`backlog run-now`", "Run now"))
}

/// What a handler sees of a request.
pub struct Incoming<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: &'a str,
    pub body: &'a [u8],
}

/// A request's line and headers, read before its body.
pub struct Head {
    method: Method,
    path: String,
    query: String,
    headers: HeaderMap,
}

impl Head {
    /// A header's value, `None` when absent or not visible ASCII.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Server {
    /// The checks that need no database, before the body is read: `None`
    /// lets the request through to [`Server::handle`].
    fn admit(&self, head: &Head) -> Option<Reply> {
        if head.path == "/healthz" {
            return None;
        }
        if let Some(refused) = self.check_host(head) {
            return Some(refused);
        }
        if let Some(token) = &self.config.token {
            // `/?token=` once: a cookie keeps the browser signed in.
            if let Some(given) = query_param(&head.query, "token") {
                if !same(&given, token) {
                    return Some(error(401, "wrong token"));
                }
                return Some(
                    Reply::new(303, "text/plain", "signed in")
                        .header("Location", local_path(&head.path))
                        .header(
                            "Set-Cookie",
                            format!("backlog_token={token}; Path=/; HttpOnly; SameSite=Strict"),
                        ),
                );
            }
            if !self.authorized(head, token) {
                return Some(error(
                    401,
                    "this dashboard needs its token: open /?token=SECRET once, \
                     or send Authorization: Bearer SECRET",
                ));
            }
        }
        if head.method == Method::POST {
            return self.check_post(head);
        }
        None
    }

    /// An admitted request, its body read: runs on a blocking thread (it
    /// calls the database).
    fn handle(&self, head: &Head, body: &[u8]) -> Reply {
        if head.path == "/healthz" {
            return api::healthz(&self.queue, &head.method);
        }
        self.route(&Incoming {
            method: &head.method,
            path: &head.path,
            query: &head.query,
            body,
        })
    }

    fn route(&self, r: &Incoming<'_>) -> Reply {
        let segments: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
        let get = *r.method == Method::GET || *r.method == Method::HEAD;
        let post = *r.method == Method::POST;
        let only = |allowed: &'static str, ok: bool, reply: &dyn Fn() -> Reply| -> Reply {
            if ok {
                reply()
            } else {
                error(
                    405,
                    format!("{} is not allowed here; use {allowed}", r.method),
                )
                .header("Allow", allowed)
            }
        };
        match segments.as_slice() {
            [""] | ["jobs"] | ["dead"] | ["workers"] => only("GET", get, &|| self.shell()),
            ["jobs", id] => only("GET", get, &|| match id.parse::<i64>() {
                Ok(_) => self.shell(),
                Err(_) => error(404, format!("{id:?} is not a job id")),
            }),
            ["assets", "app.js"] => only("GET", get, &|| {
                Reply::new(200, "text/javascript; charset=utf-8", APP_JS)
            }),
            ["workflows", _] | ["batches", _] => only("GET", get, &|| self.shell()),
            ["assets", "flows.js"] => only("GET", get, &|| {
                Reply::new(200, "text/javascript; charset=utf-8", FLOWS_JS)
            }),
            ["assets", "app.css"] => only("GET", get, &|| {
                Reply::new(200, "text/css; charset=utf-8", APP_CSS)
            }),
            ["metrics"] => only("GET", get, &|| match self.queue.metrics() {
                Ok(text) => Reply::new(200, "text/plain; version=0.0.4; charset=utf-8", text),
                Err(e) => failure(e.into()),
            }),
            ["api", "overview"] => only("GET", get, &|| api::overview(&self.queue, &self.config)),
            ["api", "jobs"] => only("GET", get, &|| api::jobs(&self.queue, r.query)),
            ["api", "workers"] => only("GET", get, &|| api::workers(&self.queue)),
            ["api", "chart"] => only("GET", get, &|| api::chart_api(&self.queue, r.query)),
            ["api", "jobs", id] => only("GET", get, &|| api::job(&self.queue, id)),
            ["api", "workflows", which] => only("GET", get, &|| api::workflow(&self.queue, which)),
            ["api", "workflows", which, action] => only("POST", post, &|| {
                self.action(|| api::workflow_action(&self.queue, which, action))
            }),
            ["api", "batches", id] => only("GET", get, &|| api::batch(&self.queue, id)),
            ["api", "jobs", id, action] => only("POST", post, &|| {
                self.action(|| api::job_action(&self.queue, id, action, r.body))
            }),
            ["api", "queues", name, action] => only("POST", post, &|| {
                self.action(|| api::queue_action(&self.queue, name, action))
            }),
            ["api", "bulk"] => only("POST", post, &|| {
                self.action(|| api::bulk(&self.queue, r.body))
            }),
            _ => error(404, format!("no page at {}", r.path)),
        }
    }

    /// Runs an action unless the dashboard is read-only.
    fn action(&self, act: impl FnOnce() -> Reply) -> Reply {
        if self.config.read_only {
            return error(403, "this dashboard is read-only: actions are refused");
        }
        act()
    }

    fn shell(&self) -> Reply {
        let html = INDEX_HTML
            .replace("{{csrf}}", &self.csrf)
            .replace(
                "{{read_only}}",
                if self.config.read_only { "1" } else { "0" },
            )
            .replace("{{database}}", &escape_html(&self.config.database));
        Reply::new(200, "text/html; charset=utf-8", html)
    }

    /// Refuses a Host header that is not loopback when bound to loopback: a
    /// DNS name rebound to 127.0.0.1 must not reach the page and its token.
    fn check_host(&self, head: &Head) -> Option<Reply> {
        if !self.config.addr.is_loopback() {
            return None;
        }
        let host = head.header("Host").unwrap_or_default();
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => host.split(':').next().unwrap_or_default(),
        };
        match name {
            "127.0.0.1" | "localhost" | "::1" => None,
            _ => Some(error(
                403,
                format!("Host {host:?} is not this machine: open the dashboard at 127.0.0.1"),
            )),
        }
    }

    /// Every POST carries the CSRF token and a JSON body.
    fn check_post(&self, head: &Head) -> Option<Reply> {
        match head.header("X-CSRF-Token") {
            Some(token) if same(token, &self.csrf) => {}
            Some(_) => return Some(error(403, "wrong CSRF token: reload the page")),
            None => {
                return Some(error(
                    403,
                    "missing CSRF token: actions are POSTs carrying X-CSRF-Token",
                ))
            }
        }
        let json = head
            .header("Content-Type")
            .is_some_and(|t| t.trim().starts_with("application/json"));
        if !json {
            return Some(error(
                415,
                "actions take a JSON body (Content-Type: application/json)",
            ));
        }
        None
    }

    fn authorized(&self, head: &Head, token: &str) -> bool {
        if let Some(auth) = head.header("Authorization") {
            if let Some(given) = auth.strip_prefix("Bearer ") {
                return same(given.trim(), token);
            }
        }
        // A browser sends one Cookie header; HTTP/2 proxies may split it.
        head.headers.get_all("Cookie").iter().any(|cookies| {
            cookies.to_str().unwrap_or_default().split(';').any(|c| {
                c.trim()
                    .strip_prefix("backlog_token=")
                    .is_some_and(|v| same(v, token))
            })
        })
    }

    /// The headers every response carries.
    fn finish(&self, reply: Reply) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(reply.body)));
        *response.status_mut() =
            StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        let mut add = |name: &str, value: &str| {
            // A value that cannot be a header (it never comes from a
            // client) is left out rather than failing the response.
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(n, v);
            }
        };
        add("Content-Type", reply.content_type);
        add("Content-Security-Policy", CSP);
        add("X-Frame-Options", "DENY");
        add("X-Content-Type-Options", "nosniff");
        add("Referrer-Policy", "no-referrer");
        add("Cache-Control", "no-store");
        for (name, value) in &reply.headers {
            add(name, value);
        }
        response
    }
}

/// The shortest `--token`: a guessable secret guards nothing.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Refuses a token too short to guard anything, or one a cookie or header
/// cannot carry as it is (it would be dropped silently).
fn check_token(token: &str) -> Result<(), Failure> {
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(Failure::new(
            Code::Usage,
            format!("--token must be at least {MIN_TOKEN_CHARS} characters (try `openssl rand -hex 16`)"),
        ));
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    {
        return Err(Failure::new(
            Code::Usage,
            "--token must be printable ASCII without spaces, ';' or ','",
        ));
    }
    Ok(())
}

/// Where to send a browser after `?token=`: the path it asked for, on this
/// server. `//evil.example/` (or `/\evil.example/`) would be another
/// host to a browser: it becomes `/evil.example/`.
fn local_path(path: &str) -> String {
    format!("/{}", path.trim_start_matches(['/', '\\']))
}

/// Compares secrets in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// One `name=value` of a query string, percent-decoded; `None` when absent.
pub fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k) == name).then(|| decode(v))
    })
}

/// Percent-decodes `text`, a `+` standing for a space as in a form.
pub fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Text made safe inside HTML.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
