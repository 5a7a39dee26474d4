//! Deterministic crash points for the reliability tests.
//!
//! `failpoint!("name")` marks an instant where a crash must leave the queue
//! consistent (between a write and its commit, after a commit and before the
//! process learns of it). Without the `failpoints` cargo feature it expands
//! to nothing. With it, the process aborts there when the environment variable
//! `BACKLOG_FAILPOINT` is `name` (the first hit) or `name:N` (the N-th hit in
//! this process); `tests/failpoints.rs` arms each point in a child process and
//! checks the invariants after the crash.

/// Aborts the process here when this failpoint is armed (feature
/// `failpoints` only; otherwise nothing).
macro_rules! failpoint {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        $crate::failpoint::hit($name);
    }};
}

#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);

    let armed = ARMED.get_or_init(|| {
        let spec = std::env::var("BACKLOG_FAILPOINT").ok()?;
        Some(match spec.split_once(':') {
            Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        })
    });
    if let Some((armed, nth)) = armed {
        if armed == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
            eprintln!("failpoint {name}: abort");
            std::process::abort();
        }
    }
}
