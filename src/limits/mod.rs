//! Per-queue flow control: a global concurrency limit and a rate limit, kept
//! in `backlog_queues` and checked by every lease, in the lease's own
//! transaction, on every backend.
//!
//! ```no_run
//! use backlog::{Queue, QueueLimits, Rate};
//! # fn main() -> backlog::Result<()> {
//! let queue = Queue::open("jobs.db")?;
//! // At most 3 `smtp` jobs running anywhere, and at most 100 started a second.
//! queue.set_limits("smtp", QueueLimits {
//!     concurrency: Some(3),
//!     rate: Some(Rate::per_second(100)),
//! })?;
//! assert_eq!(queue.limits("smtp")?.concurrency, Some(3));
//! queue.set_limits("smtp", QueueLimits::default())?; // no limits again
//! # Ok(()) }
//! ```
//!
//! ## How a lease honours them
//!
//! A lease reads the limits of the queues it asks for in the transaction
//! that claims (on PostgreSQL and MySQL it locks each limited queue's row
//! `FOR UPDATE` first, so concurrent leases of one limited queue take turns
//! and never over-admit; unlimited queues take no lock, nor do the places
//! handed on, below). A limited queue's
//! room is its concurrency limit minus its running jobs, and its rate limit
//! minus the jobs started in the current window; the lease claims at most
//! that many of its jobs, and fills the rest from the other queues asked
//! for, so a limited queue never holds the others back. A changed limit
//! applies to the next lease.
//!
//! ## Places handed on (PostgreSQL and MySQL)
//!
//! Each lease of a limited queue holds the queue's row from its lock to its
//! commit, log flush included, so under a limit that binds the leases of
//! every process would run one after another. But a transaction that
//! settles k of the queue's jobs and then claims at most k of them cannot
//! raise its running count, so it needs no lock (it still counts, so that a
//! lowered limit is honoured): the worker's completer, which settles and refills in one transaction,
//! hands the places its settles freed to its next claims of the same queue
//! (`limits::lease_handing_on`), and only a claim that grows a queue's running
//! count waits for the row. Places of a queue with a rate limit are not
//! handed on: every start must be counted in its window, under the lock.
//!
//! For that, a worker whose threads plus look-ahead would fill the
//! tightest concurrency limit of its queues leases no jobs ahead (see
//! `worker::lookahead`): under such a limit a job held ahead only takes a
//! place that another worker's idle thread could run now, and with no
//! look-ahead the completer refills the threads in its settling
//! transaction, where places pass on. Measured first (BENCHMARKS.md, issue
//! 20, "places"): the lighter hand-on was chosen over one row per place
//! claimed with `SKIP LOCKED`, which would need a migration and every path
//! that ends a lease (settle, rescue, release, cancel) to free its place
//! exactly once.
//!
//! A worker cannot tell from its own threads alone whether the workers of
//! several processes together fill a limit, so a lease of a
//! concurrency-limited queue that comes back short also turns the
//! look-ahead off, for [`LIMITS_SEEN_WITHIN`]. And a place that another
//! process frees is no change that a server's watcher reports (they report
//! new jobs): a worker whose lease of a limited queue came back short leases
//! again within milliseconds, backing off to every 100 ms while the limit
//! stays full, and no more once the queue has no job waiting (see
//! `worker::fetcher`). SQLite's watcher sees every commit, settles included.
//!
//! A running job counts until it is settled or rescued: the claims of a
//! worker that died (or whose lease answer was lost) hold their places in
//! the concurrency limit until the rescuer frees them, within `lease_ttl +
//! rescue_interval`.
//!
//! ## The rate window
//!
//! A fixed-window counter: time is cut into windows of the rate's period
//! aligned to the unix epoch (`[k·period, (k+1)·period)`; a per-second
//! limit's windows are whole seconds), and at most `limit` jobs start in each
//! window. Exact per window, and O(1) per lease (two columns of the queue's
//! row), but a burst of up to `2 × limit` can start across a window's
//! boundary, within less than one period. "Started" counts every claim of a
//! job, retries included. A worker whose lease came back short wakes when
//! the next window of its rate-limited queues opens (but not more often
//! than every 10 ms), so the starts a window allows are not left to its
//! idle poll.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::lease::Job;

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod servers;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use servers::{lease_handing_on, lease_locked, LimitedQueues};

/// The highest concurrency limit accepted: more than any database serves.
pub const MAX_CONCURRENCY_LIMIT: u32 = 1_000_000;

/// The highest number of starts a rate limit accepts per period.
pub const MAX_RATE_LIMIT: u32 = 1_000_000_000;

/// How soon a limit set by another process or node applies to this one's
/// leases: SQLite reads limits in every lease; PostgreSQL and MySQL take
/// at most this long to notice a queue newly limited elsewhere, and skip it
/// meanwhile (never exceeding the limit). Raised, lowered and cleared limits
/// of a queue known to be limited apply at the next lease everywhere.
pub const LIMITS_SEEN_WITHIN: Duration = Duration::from_secs(1);

/// The longest rate period accepted: one week.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);

/// The limits of one queue; `None` is no limit. The default has none.
///
/// Set with [`Queue::set_limits`](crate::Queue::set_limits), read with
/// [`Queue::limits`](crate::Queue::limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueLimits {
    /// At most this many of the queue's jobs running at once, across every
    /// worker, process and node. Between 1 and [`MAX_CONCURRENCY_LIMIT`].
    /// Defaults to `None`.
    pub concurrency: Option<u32>,
    /// At most this many of the queue's jobs started per period. Defaults
    /// to `None`.
    pub rate: Option<Rate>,
}

impl QueueLimits {
    /// True when neither limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.concurrency.is_none() && self.rate.is_none()
    }

    /// The limits of a `backlog_queues` row; a value out of range (a row
    /// written by hand) is a `Database` error rather than a silent default.
    pub(crate) fn from_stored(
        concurrency: Option<i64>,
        rate: Option<i64>,
        period_ms: Option<i64>,
    ) -> Result<QueueLimits> {
        let bad = || Error::Database("backlog_queues holds an out-of-range limit".into());
        let limits = QueueLimits {
            concurrency: match concurrency {
                Some(n) => Some(u32::try_from(n).map_err(|_| bad())?),
                None => None,
            },
            rate: match (rate, period_ms) {
                (Some(n), Some(ms)) => Some(Rate::from_stored(n, ms).ok_or_else(bad)?),
                (None, _) => None,
                (Some(_), None) => return Err(bad()),
            },
        };
        limits.validate().map_err(|_| bad())?;
        Ok(limits)
    }

    /// The values as stored: concurrency, rate limit, rate period in ms.
    pub(crate) fn to_stored(self) -> (Option<i64>, Option<i64>, Option<i64>) {
        (
            self.concurrency.map(i64::from),
            self.rate.map(|r| i64::from(r.limit)),
            self.rate.map(|r| r.period_ms()),
        )
    }

    /// Checks every value: [`Error::InvalidLimit`] for a zero or absurd one.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(n) = self.concurrency {
            if n == 0 {
                return Err(Error::InvalidLimit(
                    "a concurrency limit of 0 would run nothing: pause the queue instead, \
                     or remove the limit"
                        .into(),
                ));
            }
            if n > MAX_CONCURRENCY_LIMIT {
                return Err(Error::InvalidLimit(format!(
                    "a concurrency limit of {n} is over the maximum of {MAX_CONCURRENCY_LIMIT}"
                )));
            }
        }
        if let Some(rate) = self.rate {
            rate.validate()?;
        }
        Ok(())
    }
}

/// At most `limit` jobs started per `period`, counted in fixed windows of
/// `period` aligned to the unix epoch (see the [module docs](crate::limits)).
///
/// Parses from text as `N/PERIOD`: `100/s`, `10/min`, `5/2s`, `1000/h`,
/// `50/500ms`, `3/d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Starts allowed per period, between 1 and [`MAX_RATE_LIMIT`].
    pub limit: u32,
    /// The window: whole milliseconds, from 1 ms to [`MAX_RATE_PERIOD`].
    pub period: Duration,
}

impl Rate {
    /// `limit` starts per `period`.
    pub fn new(limit: u32, period: Duration) -> Rate {
        Rate { limit, period }
    }

    /// `limit` starts per second.
    pub fn per_second(limit: u32) -> Rate {
        Rate::new(limit, Duration::from_secs(1))
    }

    /// `limit` starts per minute.
    pub fn per_minute(limit: u32) -> Rate {
        Rate::new(limit, Duration::from_secs(60))
    }

    /// `limit` starts per hour.
    pub fn per_hour(limit: u32) -> Rate {
        Rate::new(limit, Duration::from_secs(3600))
    }

    fn validate(&self) -> Result<()> {
        if self.limit == 0 {
            return Err(Error::InvalidLimit(
                "a rate limit of 0 per period would start nothing: pause the queue instead".into(),
            ));
        }
        if self.limit > MAX_RATE_LIMIT {
            return Err(Error::InvalidLimit(format!(
                "a rate limit of {} per period is over the maximum of {MAX_RATE_LIMIT}",
                self.limit
            )));
        }
        if self.period < Duration::from_millis(1) || self.period > MAX_RATE_PERIOD {
            return Err(Error::InvalidLimit(format!(
                "a rate period of {:?} is outside 1 ms ..= 7 days",
                self.period
            )));
        }
        if !self.period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::InvalidLimit(format!(
                "a rate period of {:?} is not a whole number of milliseconds",
                self.period
            )));
        }
        Ok(())
    }

    /// The period in whole milliseconds, as stored.
    pub(crate) fn period_ms(&self) -> i64 {
        i64::try_from(self.period.as_millis()).unwrap_or(i64::MAX)
    }

    /// A rate read back from storage; `None` when a value is out of range
    /// (a row written by hand), which the caller reports as an error.
    pub(crate) fn from_stored(limit: i64, period_ms: i64) -> Option<Rate> {
        let rate = Rate::new(
            u32::try_from(limit).ok()?,
            Duration::from_millis(u64::try_from(period_ms).ok()?),
        );
        rate.validate().ok().map(|()| rate)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        let (n, unit) = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "min"),
            (1000, "s"),
        ]
        .into_iter()
        .find(|(unit, _)| ms.is_multiple_of(*unit))
        .map_or((ms, "ms"), |(u, name)| (ms / u, name));
        if n == 1 {
            write!(f, "{}/{unit}", self.limit)
        } else {
            write!(f, "{}/{n}{unit}", self.limit)
        }
    }
}

impl FromStr for Rate {
    type Err = Error;

    /// `N/PERIOD`, PERIOD an optional whole number and a unit of `ms`, `s`,
    /// `min` (or `m`), `h` or `d`. The result is validated.
    fn from_str(text: &str) -> Result<Rate> {
        let bad = || {
            Error::InvalidLimit(format!(
                "{text:?} is not a rate: write N/PERIOD, such as 100/s, 10/min or 5/2s"
            ))
        };
        let (limit, period) = text.trim().split_once('/').ok_or_else(bad)?;
        let limit: u32 = limit.trim().parse().map_err(|_| bad())?;
        let period = period.trim();
        let digits = period.len()
            - period
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        let (count, unit) = period.split_at(digits);
        let count: u64 = if count.is_empty() {
            1
        } else {
            count.parse().map_err(|_| bad())?
        };
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" | "sec" | "second" => 1000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            _ => return Err(bad()),
        };
        let ms = count.checked_mul(unit_ms).ok_or_else(bad)?;
        let rate = Rate::new(limit, Duration::from_millis(ms));
        rate.validate()?;
        Ok(rate)
    }
}

/// A worker whose lease came back short sleeps no longer than until the
/// next rate window of its rate-limited queues opens, and at least this
/// long: a queue limited per millisecond does not make an idle worker spin.
pub(crate) const MIN_WINDOW_WAKE_US: i64 = 10_000;

/// How long after `now` (unix µs) the next rate window of any of these
/// limits opens, in µs; `None` without a rate limit.
pub(crate) fn next_window_in<'a>(
    limits: impl IntoIterator<Item = &'a QueueLimits>,
    now: i64,
) -> Option<i64> {
    limits
        .into_iter()
        .filter_map(|l| l.rate)
        .map(|r| {
            let start = window_of(now, r.period_ms());
            let end = start.saturating_add(r.period_ms().saturating_mul(1000));
            (end - now).max(MIN_WINDOW_WAKE_US)
        })
        .min()
}

/// A limited queue as a lease finds it, in the lease's transaction.
#[derive(Debug, Clone)]
pub(crate) struct LimitState {
    pub queue: String,
    pub limits: QueueLimits,
    /// The start of the window `window_count` counts, unix µs.
    pub window_start: Option<i64>,
    pub window_count: i64,
    /// The queue's jobs leased now, by anyone.
    pub running: i64,
}

/// The new rate window of a queue after a lease started `count` in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowUpdate {
    pub queue: String,
    pub start: i64,
    pub count: i64,
}

/// The start of the window of `period_ms` that `now` (unix µs) falls in.
fn window_of(now: i64, period_ms: i64) -> i64 {
    let period = period_ms.saturating_mul(1000).max(1);
    now - now.rem_euclid(period)
}

impl LimitState {
    /// This state with its concurrency limit left out: for a server lease
    /// whose claim statement counts the queue's running jobs itself, so the
    /// engine applies only the rate limit and the caps.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn rate_only(&self) -> LimitState {
        LimitState {
            limits: QueueLimits {
                concurrency: None,
                ..self.limits
            },
            ..self.clone()
        }
    }

    /// The time a lease at `now` counts and stamps this queue's starts at.
    /// `now` is read before the lease waited for the write lock (or the
    /// queue's row), so a lease that waited may find the window already
    /// moved on by a later lease: then it starts its jobs at the stored
    /// window's start, never back in a window already closed (which it would
    /// reopen, admitting a second `limit` there).
    pub(crate) fn lease_time(&self, now: i64) -> i64 {
        match (self.limits.rate, self.window_start) {
            (Some(rate), Some(start)) if start > window_of(now, rate.period_ms()) => start,
            _ => now,
        }
    }

    /// Jobs started in the current window at `now`.
    fn started(&self, now: i64) -> i64 {
        match (self.limits.rate, self.window_start) {
            (Some(rate), Some(start)) if start == window_of(now, rate.period_ms()) => {
                self.window_count
            }
            _ => 0,
        }
    }

    /// How many more of the queue's jobs may start at `now`.
    pub(crate) fn room(&self, now: i64) -> usize {
        let concurrency = self
            .limits
            .concurrency
            .map_or(i64::MAX, |n| i64::from(n) - self.running);
        let rate = self
            .limits
            .rate
            .map_or(i64::MAX, |r| i64::from(r.limit) - self.started(now));
        usize::try_from(concurrency.min(rate).max(0)).unwrap_or(usize::MAX)
    }
}

/// What a lease over limited queues claims: each limited or capped queue
/// in the order asked, up to its room (the tighter of its limits' room and
/// the caller's cap in `caps`), then the others with what is left of
/// `limit`. `claim(queues, n, at)` claims up to `n` jobs of `queues` (in
/// claim order within them) with `at` as the lease's now (see
/// [`LimitState::lease_time`]). Returns the jobs in claim order and the rate
/// windows to store.
pub(crate) fn lease_within(
    queues: &[String],
    limit: usize,
    limited: &[LimitState],
    caps: &[(String, usize)],
    now: i64,
    mut claim: impl FnMut(&[String], usize, i64) -> Result<Vec<Job>>,
) -> Result<(Vec<Job>, Vec<WindowUpdate>)> {
    let mut jobs = Vec::new();
    let mut windows = Vec::new();
    let mut seen: Vec<&String> = Vec::with_capacity(queues.len());
    for q in queues {
        // A queue named twice is claimed once: its room is read once.
        if seen.contains(&q) {
            continue;
        }
        seen.push(q);
        let state = limited.iter().find(|s| &s.queue == q);
        let cap = caps.iter().find(|(c, _)| c == q).map(|(_, n)| *n);
        if state.is_none() && cap.is_none() {
            continue;
        }
        let at = state.map_or(now, |s| s.lease_time(now));
        let room = state
            .map_or(usize::MAX, |s| s.room(at))
            .min(cap.unwrap_or(usize::MAX))
            .min(limit - jobs.len());
        if room == 0 {
            continue;
        }
        let got = claim(std::slice::from_ref(q), room, at)?;
        if let (Some(Some(rate)), false) = (state.map(|s| s.limits.rate), got.is_empty()) {
            windows.push(WindowUpdate {
                queue: q.clone(),
                start: window_of(at, rate.period_ms()),
                count: state.map_or(0, |s| s.started(at))
                    + i64::try_from(got.len()).unwrap_or(i64::MAX),
            });
        }
        jobs.extend(got);
    }
    let rest: Vec<String> = queues
        .iter()
        .filter(|q| !limited.iter().any(|s| &s.queue == *q) && !caps.iter().any(|(c, _)| c == *q))
        .cloned()
        .collect();
    if !rest.is_empty() && jobs.len() < limit {
        jobs.extend(claim(&rest, limit - jobs.len(), now)?);
    }
    Job::sort_claimed(&mut jobs);
    Ok((jobs, windows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(limits: QueueLimits, running: i64, window: Option<(i64, i64)>) -> LimitState {
        LimitState {
            queue: "q".into(),
            limits,
            window_start: window.map(|w| w.0),
            window_count: window.map_or(0, |w| w.1),
            running,
        }
    }

    #[test]
    fn room_is_the_tighter_of_the_two_limits() {
        let both = QueueLimits {
            concurrency: Some(3),
            rate: Some(Rate::per_second(10)),
        };
        assert_eq!(state(both, 1, None).room(5_000_000), 2);
        assert_eq!(state(both, 0, Some((5_000_000, 9))).room(5_500_000), 1);
        // The count of a past window does not count.
        assert_eq!(state(both, 0, Some((4_000_000, 10))).room(5_500_000), 3);
        assert_eq!(state(both, 7, None).room(0), 0);
    }

    #[test]
    fn a_lease_that_read_its_clock_before_a_later_window_opened_starts_in_that_window() {
        let limits = QueueLimits {
            concurrency: None,
            rate: Some(Rate::per_second(4)),
        };
        // A later lease opened the window of second 8 and started 4 there.
        let s = state(limits, 0, Some((8_000_000, 4)));
        // This one read 7.9 s before it got the lock: no room in second 8.
        assert_eq!(s.lease_time(7_900_000), 8_000_000);
        assert_eq!(s.room(s.lease_time(7_900_000)), 0);
        // A current clock is used as it is.
        assert_eq!(s.lease_time(8_500_000), 8_500_000);
        assert_eq!(s.lease_time(9_100_000), 9_100_000);
    }

    #[test]
    fn the_next_window_opens_at_the_next_multiple_of_the_period() {
        let per_second = QueueLimits {
            concurrency: None,
            rate: Some(Rate::per_second(5)),
        };
        let per_ms = QueueLimits {
            concurrency: None,
            rate: Some(Rate::new(5, Duration::from_millis(1))),
        };
        assert_eq!(next_window_in([&per_second], 7_250_000), Some(750_000));
        assert_eq!(next_window_in([&per_second], 7_000_000), Some(1_000_000));
        assert_eq!(
            next_window_in([&per_ms], 7_000_100),
            Some(MIN_WINDOW_WAKE_US)
        );
        assert_eq!(next_window_in([&QueueLimits::default()], 0), None);
    }

    #[test]
    fn rates_parse_and_print() -> Result<()> {
        for (text, limit, ms, shown) in [
            ("100/s", 100, 1000, "100/s"),
            ("10/min", 10, 60_000, "10/min"),
            ("5/2s", 5, 2000, "5/2s"),
            ("50/500ms", 50, 500, "50/500ms"),
            ("3/d", 3, 86_400_000, "3/d"),
            ("7/90s", 7, 90_000, "7/90s"),
        ] {
            let rate: Rate = text.parse()?;
            assert_eq!(rate, Rate::new(limit, Duration::from_millis(ms)));
            assert_eq!(rate.to_string(), shown);
        }
        for bad in [
            "",
            "10",
            "0/s",
            "-1/s",
            "10/0s",
            "10/fortnight",
            "10/8d",
            "x/s",
        ] {
            assert!(
                matches!(bad.parse::<Rate>(), Err(Error::InvalidLimit(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn validation_refuses_zero_and_absurd_values() {
        let bad = [
            QueueLimits {
                concurrency: Some(0),
                rate: None,
            },
            QueueLimits {
                concurrency: Some(MAX_CONCURRENCY_LIMIT + 1),
                rate: None,
            },
            QueueLimits {
                concurrency: None,
                rate: Some(Rate::per_second(0)),
            },
            QueueLimits {
                concurrency: None,
                rate: Some(Rate::new(1, Duration::from_micros(1500))),
            },
            QueueLimits {
                concurrency: None,
                rate: Some(Rate::new(1, MAX_RATE_PERIOD * 2)),
            },
        ];
        for limits in bad {
            assert!(
                matches!(limits.validate(), Err(Error::InvalidLimit(_))),
                "{limits:?}"
            );
        }
    }
}
