//! SQLite's BUSY, retried: the last of the write path's waits, for a lock
//! held by a connection that does not take turns (another program's).

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Retries `f` while it fails with [`Error::Busy`], sleeping a jittered,
/// doubling backoff (1 ms up to 100 ms), until `deadline` has passed.
pub(crate) fn retry_busy<T>(
    deadline: Duration,
    retries: &AtomicU64,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(1);
    let mut tries = 0u64;
    loop {
        match f() {
            Err(Error::Busy) if start.elapsed() < deadline => {
                retries.fetch_add(1, Ordering::Relaxed);
                tries += 1;
                let jittered = backoff.mul_f64(rand::random_range(0.5..=1.5));
                thread::sleep(jittered.min(deadline.saturating_sub(start.elapsed())));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(Error::Busy) => {
                tracing::warn!(
                    waited = ?start.elapsed(),
                    ?deadline,
                    retries = tries,
                    "the database stayed locked by another connection past the write \
                     deadline: giving up with Error::Busy"
                );
                return Err(Error::Busy);
            }
            other => return other,
        }
    }
}
