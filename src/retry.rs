//! The retry policy: how long a failed job waits before its next attempt.

use std::time::Duration;

/// Exponential backoff with jitter and a cap: attempt `n` waits
/// `base * 2^(n-1)`, moved by up to ±`jitter` of itself, and never more than `max`.
///
/// A pure function of the attempt number and a jitter sample, so it is tested
/// without randomness; [`RetryPolicy::backoff`] draws the sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// The wait after the first failed attempt. Defaults to 1 second.
    pub base: Duration,
    /// The fraction of the wait that jitter may add or remove, in `0.0..=1.0`.
    /// Defaults to 0.2 (±20 %).
    pub jitter: f64,
    /// The longest wait. Defaults to 6 hours.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            jitter: 0.2,
            max: Duration::from_secs(6 * 60 * 60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based), with a random jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        self.backoff_with(attempt, rand::random_range(-1.0..=1.0))
    }

    /// The wait after failed attempt `attempt` (1-based) for a jitter sample
    /// `unit` in `-1.0..=1.0`: `-1` shortens by the full jitter, `1` lengthens.
    pub fn backoff_with(&self, attempt: u32, unit: f64) -> Duration {
        let exponent = attempt.saturating_sub(1).min(62);
        let nominal = self.base.as_secs_f64() * (1u64 << exponent) as f64;
        let capped = nominal.min(self.max.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(-1.0, 1.0);
        let secs = (capped * (1.0 + jitter)).clamp(0.0, self.max.as_secs_f64());
        Duration::try_from_secs_f64(secs).unwrap_or(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_base_without_jitter() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_with(1, 0.0), Duration::from_secs(1));
        assert_eq!(p.backoff_with(2, 0.0), Duration::from_secs(2));
        assert_eq!(p.backoff_with(5, 0.0), Duration::from_secs(16));
    }

    #[test]
    fn backoff_is_capped_at_max_even_with_jitter() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_with(30, 0.0), p.max);
        assert_eq!(p.backoff_with(30, 1.0), p.max);
        assert_eq!(p.backoff_with(u32::MAX, 1.0), p.max);
        assert!(p.backoff_with(30, -1.0) >= p.max.mul_f64(0.8) - Duration::from_millis(1));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_with(3, 1.0), Duration::from_secs_f64(4.8));
        assert_eq!(p.backoff_with(3, -1.0), Duration::from_secs_f64(3.2));
        for _ in 0..1000 {
            let d = p.backoff(3).as_secs_f64();
            assert!((3.2..=4.8).contains(&d), "{d}");
        }
    }

    #[test]
    fn attempt_zero_is_treated_as_the_first() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_with(0, 0.0), p.base);
    }
}
