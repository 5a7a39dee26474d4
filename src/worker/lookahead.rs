//! The default worker's look-ahead: how many jobs it may lease beyond its
//! handler threads, from how long its handlers take.
//!
//! A worker holds at most the jobs (running and waiting) that its threads
//! finish within [`HORIZON`] of measured handler time, and never more than
//! [`CAP`] beyond its threads. Short
//! jobs then ride in batches (one lease and one completion commit per
//! batch instead of about one per job), while jobs that take a sizeable
//! part of the horizon get little or no look-ahead, so one process does not
//! hoard jobs that other processes could start now.
//!
//! The bound it gives: a job that is leased behind the look-ahead (say, a
//! higher-priority job enqueued just after a lease) waits for the jobs held
//! when it was enqueued, running ones included:
//! `held × mean / threads ≤ HORIZON`.
//!
//! Under a concurrency limit, a leased job counts as running, held ahead or
//! not. A worker whose threads plus look-ahead would fill the tightest
//! concurrency limit of its queues holds no look-ahead at all: its jobs
//! would only take places that other workers' threads could run now, and
//! its completer then refills the threads' slots in the transaction that
//! settles their jobs, where the places those jobs free pass straight on to
//! the next ones without the queue's lock (see [`crate::limits`]). A limit
//! well above that (say, 1,000,000) leaves the look-ahead as it is. The
//! limits are read again every [`crate::limits::LIMITS_SEEN_WITHIN`].
//!
//! One process cannot tell from its own threads whether several processes
//! together fill a limit: three workers of 4 threads and 3 jobs ahead each
//! hold 21 places of a limit of 12, so some hold places that their busy
//! threads cannot run while the others' threads idle. So a lease of a
//! concurrency-limited queue that came back short (the limit was full, or
//! the queue ran dry) turns the look-ahead off for
//! [`crate::limits::LIMITS_SEEN_WITHIN`]: every worker then holds no more
//! places than it has threads, and its completer hands them on. A queue
//! that merely ran dry loses nothing by it: there is nothing to hold
//! ahead.
//!
//! The measure is a running mean that rises at once to a slower run and
//! decays slowly (by an eighth per job) towards faster ones: a job kind that
//! turns slow shrinks the look-ahead from its first slow run. Handler time is
//! read on the monotonic clock; with a manual queue clock
//! ([`crate::ManualClock`]), the longer of that and the clock's advance, so a
//! test can give handlers a duration without sleeping.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync;

/// How much measured handler time the look-ahead may hold: the most extra
/// wait it gives a job leased behind it.
pub const HORIZON: Duration = Duration::from_millis(20);

/// The most jobs the look-ahead holds, however short the jobs.
pub const CAP: usize = 128;

/// No run measured yet.
const UNKNOWN: u64 = u64::MAX;

/// The mean handler time of a worker, shared by its handler threads.
#[derive(Debug)]
pub(crate) struct LookAhead {
    /// Nanoseconds; [`UNKNOWN`] until the first run.
    mean_ns: AtomicU64,
    threads: u64,
    /// The tightest concurrency limit of the worker's queues at the last
    /// look; `usize::MAX` for none.
    places: AtomicUsize,
    /// When the limits were last read.
    looked: Mutex<Option<Instant>>,
    /// Until when (nanoseconds after `born`) a concurrency limit binds: a
    /// lease of a limited queue came back short.
    binding_until: AtomicU64,
    born: Instant,
}

impl LookAhead {
    pub(crate) fn new(threads: usize) -> Self {
        LookAhead {
            mean_ns: AtomicU64::new(UNKNOWN),
            threads: u64::try_from(threads).unwrap_or(u64::MAX).max(1),
            places: AtomicUsize::new(usize::MAX),
            looked: Mutex::new(None),
            binding_until: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// True when the limits of the worker's queues are due to be read again
    /// (and notes the look as made: a failed read is tried a look later).
    pub(crate) fn limits_due(&self) -> bool {
        let mut looked = sync::lock(&self.looked);
        if looked.is_some_and(|at| at.elapsed() < crate::limits::LIMITS_SEEN_WITHIN) {
            return false;
        }
        *looked = Some(Instant::now());
        true
    }

    /// Notes the tightest concurrency limit of the worker's queues.
    pub(crate) fn set_places(&self, limit: Option<u32>) {
        let places = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        self.places.store(places, Ordering::Relaxed);
    }

    /// Notes that a lease of a concurrency-limited queue came back short:
    /// no look-ahead for [`crate::limits::LIMITS_SEEN_WITHIN`].
    pub(crate) fn note_binding(&self) {
        let until = self.born.elapsed() + crate::limits::LIMITS_SEEN_WITHIN;
        let until = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        self.binding_until.fetch_max(until, Ordering::Relaxed);
    }

    /// True while a concurrency limit was seen binding (see
    /// [`LookAhead::note_binding`]).
    fn binding(&self) -> bool {
        let now = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        now < self.binding_until.load(Ordering::Relaxed)
    }

    /// Records one handler run.
    pub(crate) fn record(&self, took: Duration) {
        let sample = u64::try_from(took.as_nanos()).unwrap_or(UNKNOWN - 1);
        // A lost update between two threads only skips one sample of a mean.
        let mean = self.mean_ns.load(Ordering::Relaxed);
        let next = if mean == UNKNOWN || sample >= mean {
            sample
        } else {
            mean - (mean - sample) / 8
        };
        self.mean_ns.store(next, Ordering::Relaxed);
    }

    /// Jobs to hold beyond the handler threads now: 0 until a run was
    /// measured (the first lease takes no more than there are threads), and
    /// 0 for jobs of half the horizon or more per thread.
    pub(crate) fn depth(&self) -> usize {
        let mean = self.mean_ns.load(Ordering::Relaxed);
        if mean == UNKNOWN {
            return 0;
        }
        let horizon = u64::try_from(HORIZON.as_nanos()).unwrap_or(u64::MAX);
        // Running jobs count against the horizon too.
        let held = horizon.saturating_mul(self.threads) / mean.max(1);
        let depth = usize::try_from(held.saturating_sub(self.threads))
            .unwrap_or(CAP)
            .min(CAP);
        let threads = usize::try_from(self.threads).unwrap_or(usize::MAX);
        let places = self.places.load(Ordering::Relaxed);
        if depth > 0 && threads.saturating_add(depth) >= places {
            return 0; // it would fill a concurrency limit
        }
        if depth > 0 && places != usize::MAX && self.binding() {
            return 0; // the limit is full with other workers' jobs too
        }
        depth
    }

    /// How many of `n` jobs one handler thread may take in one hand-off:
    /// no more than the horizon's worth, and no more than its share of the
    /// `n`, so every thread gets work. One until a run was measured.
    /// Handing short jobs over in runs saves a wake-up per job.
    pub(crate) fn run_length(&self, n: usize) -> usize {
        let mean = self.mean_ns.load(Ordering::Relaxed);
        if mean == UNKNOWN {
            return 1;
        }
        let horizon = u64::try_from(HORIZON.as_nanos()).unwrap_or(u64::MAX);
        let fit = usize::try_from(horizon / mean.max(1)).unwrap_or(usize::MAX);
        let threads = usize::try_from(self.threads).unwrap_or(1);
        fit.min(n.div_ceil(threads)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_look_ahead_before_a_run_is_measured() {
        assert_eq!(LookAhead::new(4).depth(), 0);
    }

    #[test]
    fn short_jobs_get_the_cap_and_long_ones_none() {
        let short = LookAhead::new(4);
        short.record(Duration::from_micros(2));
        assert_eq!(short.depth(), CAP);
        let long = LookAhead::new(4);
        long.record(Duration::from_secs(2));
        assert_eq!(long.depth(), 0);
    }

    #[test]
    fn the_held_jobs_fit_in_the_horizon() {
        let la = LookAhead::new(4);
        la.record(Duration::from_millis(5));
        // 4 threads × 20 ms / 5 ms: 16 jobs held, 20 ms of the threads'
        // time; 4 of them running.
        assert_eq!(la.depth(), 12);
    }

    #[test]
    fn a_slow_run_shrinks_it_at_once_and_fast_runs_grow_it_back_slowly() {
        let la = LookAhead::new(1);
        la.record(Duration::from_micros(10));
        assert_eq!(la.depth(), CAP);
        la.record(Duration::from_millis(5));
        assert_eq!(la.depth(), 3);
        la.record(Duration::from_micros(10));
        assert_eq!(la.depth(), 3, "one fast run moves the mean by an eighth");
        for _ in 0..100 {
            la.record(Duration::from_micros(10));
        }
        assert_eq!(la.depth(), CAP);
    }

    #[test]
    fn no_look_ahead_that_would_fill_a_concurrency_limit() {
        let la = LookAhead::new(4);
        la.record(Duration::from_micros(2));
        la.set_places(Some(12));
        assert_eq!(
            la.depth(),
            0,
            "4 threads and 128 ahead would fill 12 places"
        );
        la.set_places(Some(1_000_000));
        assert_eq!(la.depth(), CAP);
        la.set_places(Some(4 + CAP as u32));
        assert_eq!(la.depth(), 0, "exactly filled is filled");
        la.set_places(Some(4 + CAP as u32 + 1));
        assert_eq!(la.depth(), CAP);
        la.set_places(None);
        assert_eq!(la.depth(), CAP);
    }

    #[test]
    fn no_look_ahead_while_a_concurrency_limit_binds() {
        let la = LookAhead::new(4);
        la.record(Duration::from_millis(10));
        la.set_places(Some(12));
        assert_eq!(la.depth(), 4, "4 threads and 4 ahead leave 12 places");
        la.note_binding();
        assert_eq!(la.depth(), 0, "other workers fill the rest");
        la.set_places(None);
        assert_eq!(la.depth(), 4, "no limit: nothing to bind");
        la.binding_until.store(0, Ordering::Relaxed);
        la.set_places(Some(12));
        assert_eq!(la.depth(), 4, "the binding was forgotten");
    }

    #[test]
    fn a_hand_off_holds_a_horizon_of_jobs_and_a_share_of_the_lease() {
        let la = LookAhead::new(4);
        assert_eq!(la.run_length(100), 1, "nothing measured yet");
        la.record(Duration::from_micros(5));
        assert_eq!(la.run_length(100), 25, "a quarter of the lease each");
        assert_eq!(la.run_length(3), 1);
        la.record(Duration::from_millis(5));
        assert_eq!(la.run_length(100), 4, "20 ms of 5 ms jobs");
        la.record(Duration::from_secs(1));
        assert_eq!(la.run_length(100), 1);
    }
}
