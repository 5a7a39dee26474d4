//! Time, read through an injectable clock so tests can move it.
//!
//! SQLite stores times as unix microseconds from the host clock. Every time the
//! engine writes (schedules, lease expiries, history stamps) comes from the
//! queue's [`Clock`], so a test can use a [`ManualClock`] and step over a lease
//! TTL or a backoff without sleeping.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// A source of the current time in unix microseconds.
pub trait Clock: Send + Sync + Debug {
    /// Microseconds since the unix epoch.
    fn now_micros(&self) -> i64;

    /// True for a clock moved by hand ([`ManualClock`]). On SQLite every time
    /// comes from the queue's clock either way. The server backends
    /// (PostgreSQL, MySQL) read "now" from the database server, so that nodes
    /// whose clocks disagree still agree on leases and schedules, and use
    /// this clock only to measure offsets (a delay, a backoff); a manual
    /// clock overrides the server's, so tests can step over a lease TTL on
    /// every backend. Defaults to `false`.
    fn is_manual(&self) -> bool {
        false
    }
}

/// The host's wall clock. The default.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> i64 {
        system_time_to_micros(SystemTime::now()).unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at the host's current time.
    pub fn new() -> Self {
        Self::at_micros(SystemClock.now_micros())
    }

    /// A clock standing at `micros` since the unix epoch.
    pub fn at_micros(micros: i64) -> Self {
        ManualClock {
            micros: Arc::new(AtomicI64::new(micros)),
        }
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the clock to `micros` since the unix epoch.
    pub fn set_micros(&self, micros: i64) {
        self.micros.store(micros, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> i64 {
        self.micros.load(Ordering::SeqCst)
    }

    fn is_manual(&self) -> bool {
        true
    }
}

/// Converts a duration to microseconds, or `InvalidSchedule` if it does not fit.
pub(crate) fn duration_micros(d: Duration) -> Result<i64> {
    i64::try_from(d.as_micros())
        .map_err(|_| Error::InvalidSchedule(format!("duration {d:?} is out of range")))
}

/// Converts a point in time to unix microseconds, or `InvalidSchedule`.
pub(crate) fn system_time_to_micros(t: SystemTime) -> Result<i64> {
    let since = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::InvalidSchedule("time is before the unix epoch".into()))?;
    duration_micros(since)
}

/// `now + d`, or `InvalidSchedule` on overflow.
pub(crate) fn add_micros(now: i64, d: Duration) -> Result<i64> {
    now.checked_add(duration_micros(d)?)
        .ok_or_else(|| Error::InvalidSchedule(format!("now + {d:?} overflows")))
}

/// Unix microseconds back to a `SystemTime` (saturating at the epoch).
pub fn micros_to_system_time(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}
