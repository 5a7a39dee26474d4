//! Waiting for room on a full server. A server that refuses a connection
//! for lack of room (PostgreSQL `too_many_connections`, MySQL
//! `ER_CON_COUNT_ERROR`) will take one as soon as another session ends: a
//! rolling deploy that briefly doubles the nodes, or more nodes than
//! `max_connections` allows their whole budget. Each backend says which of
//! its errors is such a refusal; this module waits and tries again, with
//! jittered backoff, up to a bound its caller documents, and warns at most
//! once per [`WARN_EVERY`] per process.
//!
//! Every other connection error (a wrong password, an unknown database, an
//! unreachable host) is returned at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The first wait after a refusal.
const FIRST_WAIT: Duration = Duration::from_millis(50);

/// The longest wait between two tries: a session that ends is taken within
/// about this long, and a full server sees one try per second from each
/// waiting caller.
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// At most one warning about refusals per this long, per process: a full
/// server refuses every node many times a second.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Runs `connect` until it succeeds, fails with an error `refused` does not
/// accept, or `bound` has passed since the first try; then returns the last
/// error. `what` and `url` (without its password) name the connection in
/// the warning.
pub(crate) fn wait_for_room<T>(
    what: &str,
    url: &str,
    bound: Duration,
    refused: impl Fn(&Error) -> bool,
    mut connect: impl FnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut wait = FIRST_WAIT;
    loop {
        match connect() {
            Err(error) if refused(&error) && start.elapsed() < bound => {
                warn_refused(what, url, &error);
                let left = bound.saturating_sub(start.elapsed());
                thread::sleep(jittered(wait).min(left));
                wait = (wait * 2).min(LONGEST_WAIT);
            }
            other => return other,
        }
    }
}

/// `wait`, ±50 %: nodes refused together do not all come back together.
pub(crate) fn jittered(wait: Duration) -> Duration {
    wait.mul_f64(rand::random_range(0.5..=1.5))
}

/// Warns that the server refused a connection for lack of room, unless a
/// warning went out in the last [`WARN_EVERY`].
pub(crate) fn warn_refused(what: &str, url: &str, error: &dyn std::fmt::Display) {
    if due() {
        tracing::warn!(
            %error,
            url,
            "the server refused {what} for lack of room; waiting for one to free up \
             (said at most every {}s)",
            WARN_EVERY.as_secs()
        );
    }
}

/// True at most once per [`WARN_EVERY`] in this process.
fn due() -> bool {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // Milliseconds since EPOCH of the last warning, plus one (0: none yet).
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let last = LAST.load(Ordering::Relaxed);
    let every = u64::try_from(WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
    (last == 0 || now.saturating_sub(last) >= every)
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
