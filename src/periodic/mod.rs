//! Periodic jobs: a [`Schedule`] enqueues a job at every tick of a cron
//! expression or a fixed interval, exactly once however many processes and
//! nodes run a [`Scheduler`] for it.
//!
//! ```
//! use std::time::Duration;
//!
//! use backlog::{NewJob, Queue, Schedule, Scheduler};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let queue = Queue::open(dir.path().join("app.db"))?;
//! let scheduler = Scheduler::start(queue.clone())?;
//! // At 03:00 every day in Paris, and every 30 seconds.
//! scheduler.add(
//!     Schedule::cron("nightly-report", "0 3 * * *", NewJob::new("report", json!({})))?
//!         .in_time_zone("Europe/Paris")?,
//! )?;
//! scheduler.add(Schedule::every("heartbeat", Duration::from_secs(30), NewJob::new("ping", json!({})))?)?;
//! assert_eq!(queue.schedules()?.len(), 2);
//! scheduler.shutdown();
//! # Ok(())
//! # }
//! ```
//!
//! ## How a tick is enqueued once
//!
//! Each schedule has a row in `backlog_schedules` holding its expression and
//! its next tick. A scheduler whose clock passes that tick claims it by
//! moving the row's `next_tick` on with a compare-and-set, in the same
//! transaction as the enqueue of the tick's job: of several schedulers, one
//! moves the row and the others change nothing; a crash between the claim
//! and the enqueue cannot happen, since they commit together. The job also
//! carries the unique key `periodic:<name>:<tick µs>`, checked against live
//! jobs and a day of history, as a second guard.
//!
//! ## Ticks
//!
//! A cron expression has five fields (minute, hour, day of month, month, day
//! of week) or six with seconds first (an optional seventh is the year), and
//! is read in UTC unless `Schedule::in_time_zone` names another zone (from
//! the operating system's time zone database; on Windows a bundled copy). An
//! interval schedule ticks at the multiples of its interval since the unix
//! epoch, so every process agrees on its ticks without asking anyone: an
//! hourly one ticks on the hour (UTC).
//!
//! A tick's job is enqueued due at once when its tick is claimed, within
//! milliseconds of the tick while a scheduler runs. Ticks are measured on
//! the clock of the process that claims them (the queue's
//! [`Clock`](crate::Clock)).
//!
//! ## Downtime, changes, removal
//!
//! - **Missed ticks** (no scheduler ran): the latest due tick is still
//!   enqueued when it is at most [`LATE_TICK_GRACE`] late; older ones are
//!   skipped. With [`Schedule::catch_up`] the latest is enqueued however
//!   late it is: one job stands for all the missed ticks, never one per
//!   tick.
//! - **Changing** a schedule (registering its name again with another
//!   expression, here or in any process) takes effect at the next tick of the
//!   new expression. The last registration wins: a scheduler whose
//!   registration has another expression than the stored one leaves that
//!   schedule alone. Only the expression is stored: every process should
//!   register the same job (kind, queue, payload) under a name, since the
//!   one that claims a tick enqueues its own.
//! - **Removing** a schedule ([`Scheduler::remove`], [`Queue::remove_schedule`],
//!   `backlog schedules --remove NAME`) deletes its row; every scheduler
//!   stops ticking it until it is registered again.

mod scheduler;

use std::time::{Duration, SystemTime};

use crate::clock::{self, duration_micros};
use crate::error::{Error, Result};
use crate::job::{IntoNewJob, NewJob, UniqueScope};
use crate::queue::Queue;
use crate::validate;

pub use scheduler::{Scheduler, SchedulerStats};

/// The latest due tick is still enqueued when it is at most this late,
/// without [`Schedule::catch_up`]; older ticks count as missed and are
/// skipped. A minute: longer than a restart or a write lock held under load,
/// shorter than any downtime worth calling one.
pub const LATE_TICK_GRACE: Duration = Duration::from_secs(60);

/// The shortest interval of [`Schedule::every`].
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// The longest interval of [`Schedule::every`]: a year.
pub const MAX_INTERVAL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How far back in history a tick's unique key is checked: a day.
const TICK_KEY_HISTORY: Duration = Duration::from_secs(24 * 60 * 60);

/// A job to enqueue at every tick of a cron expression or an interval.
///
/// Made with `Schedule::cron` (`cron` feature) or [`Schedule::every`], which check the
/// expression at once: a bad one is [`Error::InvalidPeriodic`] there, not at
/// the first tick. Run it with a [`Scheduler`] or
/// [`WorkerBuilder::periodic`](crate::WorkerBuilder::periodic).
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    rule: Rule,
    job: NewJob,
    catch_up: bool,
}

#[derive(Debug, Clone)]
enum Rule {
    /// Ticks at the multiples of this many µs since the epoch.
    Every(i64),
    #[cfg(feature = "cron")]
    Cron(Box<CronRule>),
}

#[cfg(feature = "cron")]
#[derive(Debug, Clone)]
struct CronRule {
    pattern: String,
    cron: croner::Cron,
    zone: jiff::tz::TimeZone,
    zone_name: String,
}

impl Schedule {
    /// Enqueues `job` at every tick of the cron expression `expression`, in
    /// UTC (see [`Schedule::in_time_zone`]): five fields (`"0 3 * * *"`:
    /// 03:00 every day), or six with seconds first (`"*/10 * * * * *"`:
    /// every ten seconds). `job` is a [`NewJob`] or typed
    /// [`JobArgs`](crate::JobArgs); its queue, priority, attempts and
    /// payload are the tick's. Its unique key and its delay are replaced:
    /// each tick's job gets the key `periodic:<name>:<tick µs>` and is due
    /// as soon as its tick is claimed. Needs the `cron` feature.
    ///
    /// [`Error::InvalidPeriodic`] for an expression that does not parse or
    /// never matches; [`Error::InvalidName`] for a bad name. The job itself
    /// is checked when the schedule is added to a scheduler.
    #[cfg(feature = "cron")]
    pub fn cron(name: impl Into<String>, expression: &str, job: impl IntoNewJob) -> Result<Self> {
        let name = name.into();
        let invalid = |reason: String| Error::InvalidPeriodic {
            schedule: name.clone(),
            expression: expression.to_owned(),
            reason,
        };
        validate::name("schedule", &name)?;
        let pattern = expression.trim().to_owned();
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(&pattern)
            .map_err(|e| invalid(e.to_string()))?;
        let schedule = Schedule {
            rule: Rule::Cron(Box::new(CronRule {
                pattern,
                cron,
                zone: jiff::tz::TimeZone::UTC,
                zone_name: "UTC".to_owned(),
            })),
            job: job.into_new_job()?,
            catch_up: false,
            name: name.clone(),
        };
        schedule.check_ticks()?;
        Ok(schedule)
    }

    /// Enqueues `job` every `interval`, at the multiples of `interval` since
    /// the unix epoch (every hour: on the hour, UTC). `job` is a [`NewJob`]
    /// or typed [`JobArgs`](crate::JobArgs); each tick's job gets the key
    /// `periodic:<name>:<tick µs>` and is due as soon as its tick is claimed.
    ///
    /// [`Error::InvalidPeriodic`] for an interval under [`MIN_INTERVAL`] or
    /// over [`MAX_INTERVAL`]; [`Error::InvalidName`] for a bad name.
    pub fn every(
        name: impl Into<String>,
        interval: Duration,
        job: impl IntoNewJob,
    ) -> Result<Self> {
        let name = name.into();
        validate::name("schedule", &name)?;
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
            return Err(Error::InvalidPeriodic {
                expression: format!("every {interval:?}"),
                schedule: name,
                reason: format!("an interval must be {MIN_INTERVAL:?} to {MAX_INTERVAL:?}"),
            });
        }
        Ok(Schedule {
            name,
            rule: Rule::Every(duration_micros(interval)?),
            job: job.into_new_job()?,
            catch_up: false,
        })
    }

    /// Reads the cron expression in the time zone `zone` (an IANA name such
    /// as `"Europe/Paris"`, from the operating system's time zone database)
    /// instead of UTC. Across a daylight-saving change a tick in the skipped
    /// hour runs at the end of the gap, and one in the repeated hour once.
    ///
    /// [`Error::InvalidPeriodic`] for an unknown zone, or an interval
    /// schedule (its ticks do not depend on a zone).
    #[cfg(feature = "cron")]
    pub fn in_time_zone(mut self, zone: &str) -> Result<Self> {
        let (schedule, expression) = (self.name.clone(), self.expression());
        let invalid = |reason: String| Error::InvalidPeriodic {
            schedule: schedule.clone(),
            expression: expression.clone(),
            reason,
        };
        let tz = jiff::tz::TimeZone::get(zone)
            .map_err(|e| invalid(format!("unknown time zone {zone:?}: {e}")))?;
        match &mut self.rule {
            Rule::Cron(rule) => {
                rule.zone = tz;
                rule.zone_name = zone.to_owned();
            }
            Rule::Every(_) => return Err(invalid("an interval schedule has no time zone".into())),
        }
        self.check_ticks()?;
        Ok(self)
    }

    /// After downtime with missed ticks, enqueues the latest of them however
    /// late it is: one job for all of them. Defaults to `false`: a tick more
    /// than [`LATE_TICK_GRACE`] late is skipped.
    pub fn catch_up(mut self, catch_up: bool) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The schedule's name, unique per queue database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The expression as stored and listed: `"0 3 * * * (Europe/Paris)"`,
    /// `"every 30s"`.
    pub fn expression(&self) -> String {
        match &self.rule {
            Rule::Every(us) => format!("every {}", format_micros(*us)),
            #[cfg(feature = "cron")]
            Rule::Cron(rule) => format!("{} ({})", rule.pattern, rule.zone_name),
        }
    }

    /// A cron expression that never matches (Feb 30, a past year) is an
    /// error now rather than at its first tick.
    #[cfg(feature = "cron")]
    fn check_ticks(&self) -> Result<()> {
        use crate::clock::ClockMicros;
        self.next_after(crate::clock::SystemClock.now_micros())
            .map(|_| ())
    }

    /// The first tick strictly after `t` (unix µs).
    pub(crate) fn next_after(&self, t: i64) -> Result<i64> {
        match &self.rule {
            Rule::Every(every) => t
                .div_euclid(*every)
                .checked_add(1)
                .and_then(|k| k.checked_mul(*every))
                .ok_or_else(|| self.out_of_range()),
            #[cfg(feature = "cron")]
            Rule::Cron(rule) => {
                let at = self.zoned(rule, t)?;
                let next = rule
                    .cron
                    .find_next_occurrence(&at, false)
                    .map_err(|e| self.no_tick(e))?;
                Ok(next.timestamp().as_microsecond())
            }
        }
    }

    /// How many ticks fall in `from..until` (unix µs), counting at most
    /// `cap` of them.
    pub(crate) fn ticks_from_until(&self, from: i64, until: i64, cap: u64) -> Result<u64> {
        let mut count = 0;
        let mut t = self.next_after(from.saturating_sub(1))?;
        while t < until && count < cap {
            count += 1;
            t = self.next_after(t)?;
        }
        Ok(count)
    }

    /// The last tick at or before `t`, if any.
    pub(crate) fn latest_at_or_before(&self, t: i64) -> Result<Option<i64>> {
        match &self.rule {
            Rule::Every(every) => Ok(Some(t.div_euclid(*every) * every)),
            #[cfg(feature = "cron")]
            Rule::Cron(rule) => {
                let at = self.zoned(rule, t)?;
                Ok(rule
                    .cron
                    .find_previous_occurrence(&at, true)
                    .ok()
                    .map(|z| z.timestamp().as_microsecond()))
            }
        }
    }

    #[cfg(feature = "cron")]
    fn zoned(&self, rule: &CronRule, t: i64) -> Result<jiff::Zoned> {
        let at = jiff::Timestamp::from_microsecond(t).map_err(|_| self.out_of_range())?;
        Ok(at.to_zoned(rule.zone.clone()))
    }

    #[cfg(feature = "cron")]
    fn no_tick(&self, e: croner::errors::CronError) -> Error {
        Error::InvalidPeriodic {
            schedule: self.name.clone(),
            expression: self.expression(),
            reason: format!("no next tick: {e}"),
        }
    }

    fn out_of_range(&self) -> Error {
        Error::InvalidPeriodic {
            schedule: self.name.clone(),
            expression: self.expression(),
            reason: "the next tick is out of range".into(),
        }
    }

    /// The job of the tick at `tick`: the schedule's, due at once, keyed by
    /// the tick.
    pub(crate) fn job_at(&self, tick: i64) -> NewJob {
        self.job
            .clone()
            .run_at(std::time::UNIX_EPOCH)
            .unique_key(tick_key(&self.name, tick))
            .unique_scope(UniqueScope::LiveAndHistory(TICK_KEY_HISTORY))
    }

    pub(crate) fn template(&self) -> &NewJob {
        &self.job
    }

    pub(crate) fn catches_up(&self) -> bool {
        self.catch_up
    }
}

/// The unique key of a schedule's tick.
pub fn tick_key(name: &str, tick_micros: i64) -> String {
    format!("periodic:{name}:{tick_micros}")
}

/// `30s`, `200ms`, `1500us`: the largest unit that divides `us`.
fn format_micros(us: i64) -> String {
    if us % 1_000_000 == 0 {
        format!("{}s", us / 1_000_000)
    } else if us % 1_000 == 0 {
        format!("{}ms", us / 1_000)
    } else {
        format!("{us}us")
    }
}

/// A schedule as stored, for the CLI and the dashboard: see
/// [`Queue::schedules`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The schedule's name.
    pub name: String,
    /// Its expression: `"0 3 * * * (UTC)"`, `"every 30s"`.
    pub expression: String,
    /// The last tick whose job was enqueued; `None` before the first.
    pub last_tick: Option<SystemTime>,
    /// The next tick not yet claimed. In the past while no scheduler runs.
    pub next_tick: SystemTime,
    /// When the row last changed (a claim or a registration).
    pub updated_at: SystemTime,
}

impl Queue {
    /// Every periodic schedule registered on this database, by name, with
    /// its last and next tick. One read of `backlog_schedules`.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        Ok(self
            .store()
            .schedules()?
            .into_iter()
            .map(|row| ScheduleInfo {
                name: row.name,
                expression: row.expression,
                last_tick: clock::at_opt(row.last_tick),
                next_tick: clock::at(row.next_tick),
                updated_at: clock::at(row.updated_at),
            })
            .collect())
    }

    /// Removes the schedule `name`: every scheduler stops ticking it until
    /// it is registered again. Jobs already enqueued stay. Returns whether
    /// there was one.
    pub fn remove_schedule(&self, name: &str) -> Result<bool> {
        validate::name("schedule", name)?;
        self.store().remove_schedule(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOUR: i64 = 3_600_000_000;

    fn job() -> NewJob {
        NewJob::new("k", json!({}))
    }

    #[test]
    fn ticks_from_until_counts_the_ticks_of_the_half_open_range() -> Result<()> {
        let s = Schedule::every("s", Duration::from_secs(3600), job())?;
        assert_eq!(s.ticks_from_until(5 * HOUR, 5 * HOUR, 100)?, 0);
        assert_eq!(s.ticks_from_until(5 * HOUR, 6 * HOUR, 100)?, 1);
        assert_eq!(s.ticks_from_until(5 * HOUR, 9 * HOUR, 100)?, 4);
        assert_eq!(s.ticks_from_until(5 * HOUR + 1, 9 * HOUR + 1, 100)?, 4);
        assert_eq!(s.ticks_from_until(5 * HOUR + 1, 9 * HOUR, 100)?, 3);
        assert_eq!(s.ticks_from_until(5 * HOUR, 9 * HOUR, 2)?, 2, "capped");
        assert_eq!(s.ticks_from_until(9 * HOUR, 5 * HOUR, 100)?, 0);
        Ok(())
    }

    #[test]
    fn interval_ticks_are_multiples_of_the_interval() -> Result<()> {
        let s = Schedule::every("s", Duration::from_secs(3600), job())?;
        assert_eq!(s.next_after(5 * HOUR)?, 6 * HOUR);
        assert_eq!(s.next_after(5 * HOUR + 1)?, 6 * HOUR);
        assert_eq!(s.latest_at_or_before(6 * HOUR - 1)?, Some(5 * HOUR));
        assert_eq!(s.latest_at_or_before(6 * HOUR)?, Some(6 * HOUR));
        assert_eq!(s.expression(), "every 3600s");
        Ok(())
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_ticks_follow_the_expression_and_zone() -> Result<()> {
        // 2023-11-14T22:13:20Z.
        let t = 1_700_000_000_000_000;
        let daily = Schedule::cron("d", "0 3 * * *", job())?;
        let next = daily.next_after(t)?;
        assert_eq!(next % (24 * HOUR), 3 * HOUR, "03:00 UTC");
        assert_eq!(daily.latest_at_or_before(next)?, Some(next));
        assert_eq!(daily.latest_at_or_before(next - 1)?, Some(next - 24 * HOUR));
        let paris = daily.clone().in_time_zone("Europe/Paris")?;
        assert_eq!(
            paris.next_after(t)?,
            next - HOUR,
            "03:00 in Paris is 02:00 UTC in November"
        );
        assert_eq!(paris.expression(), "0 3 * * * (Europe/Paris)");
        let seconds = Schedule::cron("s", "*/10 * * * * *", job())?;
        assert_eq!(seconds.next_after(t)?, t + 10_000_000);
        Ok(())
    }

    #[cfg(feature = "cron")]
    #[test]
    fn a_bad_expression_or_zone_is_a_typed_error_at_construction() {
        for bad in [
            "",
            "* * *",
            "61 * * * *",
            "0 0 30 2 *",
            "not cron",
            "0 0 1 1 * 2020",
        ] {
            match Schedule::cron("s", bad, job()) {
                Err(Error::InvalidPeriodic { expression, .. }) => {
                    assert!(expression.starts_with(bad))
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let zone =
            Schedule::cron("s", "0 * * * *", job()).and_then(|s| s.in_time_zone("Mars/Olympus"));
        assert!(
            matches!(zone, Err(Error::InvalidPeriodic { .. })),
            "{zone:?}"
        );
    }

    #[test]
    fn an_interval_out_of_range_or_a_bad_name_is_refused() {
        for bad in [Duration::ZERO, Duration::from_micros(999), MAX_INTERVAL * 2] {
            let r = Schedule::every("s", bad, job());
            assert!(
                matches!(r, Err(Error::InvalidPeriodic { .. })),
                "{bad:?}: {r:?}"
            );
        }
        let r = Schedule::every("", Duration::from_secs(1), job());
        assert!(
            matches!(
                r,
                Err(Error::InvalidName {
                    what: "schedule",
                    ..
                })
            ),
            "{r:?}"
        );
    }
}
