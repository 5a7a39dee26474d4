//! Time, read through an injectable clock so tests can move it.
//!
//! Every point in time the public API shows or takes is a [`SystemTime`]:
//! records, leased jobs, events, `run_at`. `Instant` appears only where a
//! deadline must be monotonic (a handler's [`deadline`](crate::JobContext::deadline)).
//! The databases store unix microseconds. Every time the engine writes
//! (schedules, lease expiries, history stamps) comes from the queue's
//! [`Clock`], so a test can use a [`ManualClock`] and step over a lease TTL or
//! a backoff without sleeping.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// A source of the current time.
pub trait Clock: Send + Sync + Debug {
    /// The current time. The databases keep microseconds; finer parts are
    /// dropped.
    fn now(&self) -> SystemTime;

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
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The engine's view of any clock: unix microseconds, as the databases
/// store them.
pub(crate) trait ClockMicros {
    /// Microseconds since the unix epoch (0 for a clock before it).
    fn now_micros(&self) -> i64;
}

impl<C: Clock + ?Sized> ClockMicros for C {
    fn now_micros(&self) -> i64 {
        system_time_to_micros(self.now()).unwrap_or(0)
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
        Self::at(SystemTime::now())
    }

    /// A clock standing at `t` (microseconds kept; a time before the unix
    /// epoch stands at the epoch).
    pub fn at(t: SystemTime) -> Self {
        ManualClock {
            micros: Arc::new(AtomicI64::new(system_time_to_micros(t).unwrap_or(0))),
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

    /// Sets the clock to `t` (microseconds kept).
    pub fn set(&self, t: SystemTime) {
        self.micros
            .store(system_time_to_micros(t).unwrap_or(0), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        at(self.micros.load(Ordering::SeqCst))
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

/// A stored time (unix µs) as the public API shows it (saturating at the
/// epoch).
pub(crate) fn at(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}

/// [`at`] for an optional time.
pub(crate) fn at_opt(micros: Option<i64>) -> Option<SystemTime> {
    micros.map(at)
}

/// A public time back to what the databases store: unix µs, 0 before the
/// epoch, saturating far in the future.
pub(crate) fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// Serializes a `SystemTime` as unix microseconds, the form stored in a
/// job's `errors` column.
pub(crate) mod serde_micros {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(super::micros(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        i64::deserialize(d).map(super::at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::AttemptError;

    #[test]
    fn an_attempt_error_keeps_its_stored_form_unix_micros() {
        let stored = r#"{"attempt":2,"at":1700000000123456,"message":"boom"}"#;
        let error: AttemptError = serde_json::from_str(stored).unwrap();
        assert_eq!(
            error.at,
            UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456)
        );
        assert_eq!(serde_json::to_string(&error).unwrap(), stored);
    }

    #[test]
    fn stored_micros_and_public_times_round_trip() {
        for m in [0, 1, 1_700_000_000_123_456, i64::MAX] {
            assert_eq!(micros(at(m)), m);
        }
        assert_eq!(micros(UNIX_EPOCH - Duration::from_secs(1)), 0);
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_micros(5));
        clock.advance(Duration::from_micros(3));
        assert_eq!(clock.now(), UNIX_EPOCH + Duration::from_micros(8));
        assert_eq!(clock.now_micros(), 8);
    }
}
