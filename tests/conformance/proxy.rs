//! A TCP proxy in the test process, between a queue and its server, for the
//! scenarios that break the network (`enqueue_cut.rs`, `reconnect.rs`). It
//! can cut every connection ([`Proxy::cut`], in one of two ways, see
//! [`Cut`]) until [`Proxy::restore`], close them all once
//! ([`Proxy::close_all`]), or lose the answer to one request
//! ([`Proxy::lose_answer_to`]). It stops when dropped.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::harness::TestResult;

/// What a cut does to the connections through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Every connection is closed at once and new ones are refused: a
    /// server restart, a firewall resetting connections.
    Drop,
    /// Bytes stop flowing both ways and new connections hang, and all of it
    /// flows again at the restore: packets lost on a network that comes back.
    Hold,
}

pub struct Proxy {
    /// Where the queue connects instead of the server (`host:port`).
    pub addr: String,
    state: Arc<State>,
}

struct State {
    mode: Cut,
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Bytes whose request's answer is lost, with its connection.
    marker: Mutex<Option<Vec<u8>>>,
    /// Both ends of every open connection.
    streams: Mutex<Vec<TcpStream>>,
}

impl State {
    /// While a `Hold` cut lasts, waits (bytes and new connections are held).
    fn wait_while_held(&self) {
        while self.mode == Cut::Hold
            && self.cut.load(Ordering::SeqCst)
            && !self.stopped.load(Ordering::SeqCst)
        {
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn close_all(&self) {
        let streams = std::mem::take(&mut *self.streams.lock().unwrap_or_else(|p| p.into_inner()));
        for stream in streams {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// True if `request` carries the marker, which is then spent.
    fn marks(&self, request: &[u8]) -> bool {
        let mut marker = self.marker.lock().unwrap_or_else(|p| p.into_inner());
        let hit = marker
            .as_ref()
            .is_some_and(|m| request.windows(m.len()).any(|w| w == m.as_slice()));
        if hit {
            *marker = None;
        }
        hit
    }
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) whose cuts work as `mode` says.
    pub fn start(upstream: &str, mode: Cut) -> TestResult<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let state = Arc::new(State {
            mode,
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            marker: Mutex::default(),
            streams: Mutex::default(),
        });
        let upstream = upstream.to_owned();
        let shared = state.clone();
        thread::Builder::new()
            .name("test-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if shared.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    if shared.cut.load(Ordering::SeqCst) && shared.mode == Cut::Drop {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    let (shared, upstream) = (shared.clone(), upstream.clone());
                    thread::spawn(move || {
                        shared.wait_while_held();
                        let _ = forward(&shared, client, &upstream);
                    });
                }
            })?;
        Ok(Proxy { addr, state })
    }

    /// Cuts the network (see [`Cut`]) until [`Proxy::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        if self.state.mode == Cut::Drop {
            self.state.close_all();
        }
    }

    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Closes every open connection once; new ones are accepted.
    pub fn close_all(&self) {
        self.state.close_all();
    }

    /// The next request carrying `marker` reaches the server; its answer is
    /// dropped and the connection closed.
    pub fn lose_answer_to(&self, marker: &str) {
        *self.state.marker.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(marker.as_bytes().to_vec());
    }

    /// True once a request carried the marker of [`Proxy::lose_answer_to`]
    /// (its answer was lost), or when none was set.
    pub fn answer_lost(&self) -> bool {
        self.state
            .marker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.close_all();
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Connects `client` to the server: one thread copies the requests
/// (watching for the marker), another the answers (losing the marked one).
fn forward(state: &Arc<State>, client: TcpStream, upstream: &str) -> io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    state
        .streams
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend([client.try_clone()?, server.try_clone()?]);
    let lose = Arc::new(AtomicBool::new(false));
    let requests = (client.try_clone()?, server.try_clone()?);
    for (request, (mut from, mut to)) in [(true, requests), (false, (server, client))] {
        let (state, lose) = (state.clone(), lose.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                state.wait_while_held();
                if request && state.marks(&buf[..n]) {
                    lose.store(true, Ordering::SeqCst);
                }
                if (!request && lose.load(Ordering::SeqCst)) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
    Ok(())
}
