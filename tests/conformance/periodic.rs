//! Periodic jobs: each tick of a schedule is enqueued once however many
//! schedulers run it on one database, missed ticks are skipped (or caught up
//! once), and removing or changing a schedule reaches every scheduler. Time
//! is the harness's manual clock; the schedulers are driven with
//! `run_due`, so each step is deterministic. The multi-process version is
//! `tests/periodic_processes.rs`.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backlog::periodic::tick_key;
use backlog::{Error, Event, JobFilter, JobState, NewJob, Queue, Schedule, Scheduler, Worker};
use serde_json::{json, Value};

use crate::harness::{micros, Backend, Harness, TestResult};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

conformance!(
    each_tick_is_enqueued_once_by_two_schedulers_on_one_database,
    missed_ticks_are_skipped_after_downtime_by_default,
    catch_up_enqueues_one_job_for_all_missed_ticks,
    a_late_claim_enqueues_the_latest_due_tick_and_counts_those_it_passed_over,
    removing_a_schedule_stops_every_scheduler,
    changing_the_expression_takes_effect_at_the_next_tick,
    a_bad_expression_or_job_is_a_typed_error_and_writes_nothing,
    interval_ticks_are_multiples_of_the_interval,
    schedules_lists_the_last_and_next_tick,
    a_worker_runs_its_periodic_schedules,
);

fn job() -> NewJob {
    NewJob::new("tick", json!({"report": true}))
}

/// The ticks (µs) of the schedule `name` whose jobs are waiting, from their
/// unique keys, in order; a tick enqueued twice would appear twice.
fn enqueued_ticks(queue: &Queue, name: &str) -> TestResult<Vec<i64>> {
    let prefix = format!("periodic:{name}:");
    let mut ticks = Vec::new();
    for state in [JobState::Available, JobState::Scheduled] {
        let mut filter = JobFilter::new(state).limit(500);
        loop {
            let page = queue.list(&filter)?;
            for job in &page.jobs {
                if let Some(tick) = job
                    .unique_key
                    .as_deref()
                    .and_then(|k| k.strip_prefix(&prefix))
                {
                    ticks.push(tick.parse::<i64>()?);
                }
            }
            match page.next_after {
                Some(after) => filter = filter.after(after),
                None => break,
            }
        }
    }
    ticks.sort_unstable();
    Ok(ticks)
}

/// The harness clock's now, unix µs.
fn now_us(h: &Harness) -> i64 {
    micros(h.now().duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// Sets the harness clock to `us` (unix µs).
fn set_us(h: &Harness, us: i64) {
    h.clock.set(at(us));
}

/// Unix µs as a point in time.
fn at(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// The first multiple of `every` after `t`.
fn next_multiple(t: i64, every: Duration) -> i64 {
    let every = micros(every);
    (t.div_euclid(every) + 1) * every
}

fn each_tick_is_enqueued_once_by_two_schedulers_on_one_database(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let other = h.second_handle()?;
    let first = Scheduler::new(h.queue.clone());
    let second = Scheduler::new(other);
    for s in [&first, &second] {
        s.add(Schedule::cron("minutely", "* * * * *", job())?)?;
    }
    let start = next_multiple(now_us(&h), MINUTE);
    // A simulated hour: each minute both schedulers look, in turn or at once.
    for minute in 0..60 {
        h.advance(MINUTE);
        if minute % 3 == 0 {
            let (a, b) = std::thread::scope(|scope| {
                let a = scope.spawn(|| first.run_due());
                let b = scope.spawn(|| second.run_due());
                (a.join(), b.join())
            });
            a.map_err(|_| "scheduler thread panicked")??;
            b.map_err(|_| "scheduler thread panicked")??;
        } else if minute % 2 == 0 {
            first.run_due()?;
            second.run_due()?;
        } else {
            second.run_due()?;
            first.run_due()?;
        }
    }
    let ticks = enqueued_ticks(&h.queue, "minutely")?;
    let expected: Vec<i64> = (0..60).map(|m| start + m * micros(MINUTE)).collect();
    assert_eq!(ticks, expected, "every minute once, none twice");
    let (a, c) = (first.stats(), second.stats());
    assert_eq!(a.enqueued + c.enqueued, 60);
    assert!(
        a.lost + c.lost <= 20,
        "a claim lost only in a race: {a:?} {c:?}"
    );
    assert_eq!(
        a.duplicates + c.duplicates,
        0,
        "the claim alone kept ticks single"
    );
    assert!(a.enqueued > 0 && c.enqueued > 0, "{a:?} {c:?}");
    Ok(())
}

fn missed_ticks_are_skipped_after_downtime_by_default(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let scheduler = Scheduler::new(h.queue.clone());
    scheduler.add(Schedule::every("hourly", HOUR, job())?)?;
    let first = next_multiple(now_us(&h), HOUR);
    // Down until half past the fourth tick: four ticks missed.
    set_us(&h, first + micros(HOUR * 3 + HOUR / 2));
    assert_eq!(scheduler.run_due()?, 0);
    assert_eq!(scheduler.stats().skipped, 1, "one claim skips them all");
    assert_eq!(
        scheduler.stats().passed_over,
        3,
        "and passes the other three over"
    );
    assert!(enqueued_ticks(&h.queue, "hourly")?.is_empty());
    // The next tick comes as usual; half a minute late is still on time.
    set_us(&h, first + micros(HOUR * 4 + Duration::from_secs(30)));
    assert_eq!(scheduler.run_due()?, 1);
    assert_eq!(
        enqueued_ticks(&h.queue, "hourly")?,
        [first + 4 * micros(HOUR)]
    );
    Ok(())
}

fn catch_up_enqueues_one_job_for_all_missed_ticks(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let scheduler = Scheduler::new(h.queue.clone());
    scheduler.add(Schedule::every("hourly", HOUR, job())?.catch_up(true))?;
    let first = next_multiple(now_us(&h), HOUR);
    set_us(&h, first + micros(HOUR * 3 + HOUR / 2));
    // A process restarting registers the same schedule again: the missed
    // ticks stay missed (the stored next tick is kept).
    let restarted = Scheduler::new(h.second_handle()?);
    restarted.add(Schedule::every("hourly", HOUR, job())?.catch_up(true))?;
    assert_eq!(restarted.run_due()? + scheduler.run_due()?, 1);
    // One job, for the latest missed tick.
    assert_eq!(
        enqueued_ticks(&h.queue, "hourly")?,
        [first + 3 * micros(HOUR)]
    );
    assert_eq!(
        restarted.stats().passed_over + scheduler.stats().passed_over,
        3
    );
    set_us(&h, first + micros(HOUR * 4));
    assert_eq!(scheduler.run_due()? + restarted.run_due()?, 1);
    assert_eq!(enqueued_ticks(&h.queue, "hourly")?.len(), 2);
    Ok(())
}

/// A scheduler held up for several ticks of a short interval (well inside
/// the late-tick grace) enqueues one job, for the latest due tick, and
/// counts the earlier ones; on time again, it passes none over.
fn a_late_claim_enqueues_the_latest_due_tick_and_counts_those_it_passed_over(
    b: &Backend,
) -> TestResult {
    const EVERY: Duration = Duration::from_secs(10);
    let h = b.harness()?;
    let scheduler = Scheduler::new(h.queue.clone());
    scheduler.add(Schedule::every("fast", EVERY, job())?)?;
    let first = next_multiple(now_us(&h), EVERY);
    set_us(&h, first + micros(EVERY * 3 + EVERY / 2));
    assert_eq!(scheduler.run_due()?, 1);
    assert_eq!(
        enqueued_ticks(&h.queue, "fast")?,
        [first + 3 * micros(EVERY)]
    );
    let stats = scheduler.stats();
    assert_eq!(
        (stats.enqueued, stats.passed_over, stats.skipped),
        (1, 3, 0)
    );
    set_us(&h, first + micros(EVERY * 4));
    assert_eq!(scheduler.run_due()?, 1);
    assert_eq!(
        scheduler.stats().passed_over,
        3,
        "on time: none passed over"
    );
    Ok(())
}

fn removing_a_schedule_stops_every_scheduler(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let here = Scheduler::new(h.queue.clone());
    let there = Scheduler::new(h.second_handle()?);
    for s in [&here, &there] {
        s.add(Schedule::every("cleanup", MINUTE, job())?)?;
        s.add(Schedule::every("other", MINUTE, job())?)?;
    }
    h.advance(MINUTE);
    assert_eq!(here.run_due()? + there.run_due()?, 2);
    assert!(here.remove("cleanup")?, "the row was there");
    assert_eq!(here.names(), ["other"]);
    for _ in 0..3 {
        h.advance(MINUTE);
        here.run_due()?;
        there.run_due()?;
    }
    assert_eq!(
        enqueued_ticks(&h.queue, "cleanup")?.len(),
        1,
        "none after removal"
    );
    assert_eq!(
        enqueued_ticks(&h.queue, "other")?.len(),
        4,
        "the other goes on"
    );
    let names: Vec<String> = h.queue.schedules()?.into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["other"]);
    // Removed by name from anywhere (the CLI), and registered again.
    assert!(h.queue.remove_schedule("other")?);
    assert!(!h.queue.remove_schedule("other")?);
    there.add(Schedule::every("cleanup", MINUTE, job())?)?;
    h.advance(MINUTE);
    assert_eq!(
        here.run_due()? + there.run_due()?,
        1,
        "cleanup again, other still gone"
    );
    assert_eq!(enqueued_ticks(&h.queue, "cleanup")?.len(), 2);
    Ok(())
}

fn changing_the_expression_takes_effect_at_the_next_tick(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let old = Scheduler::new(h.queue.clone());
    old.add(Schedule::every("sync", HOUR, job())?)?;
    h.advance(Duration::from_secs(60));
    // A redeployed process registers every ten minutes: its next tick is the
    // new expression's, and the old registration leaves the schedule alone.
    let new = Scheduler::new(h.second_handle()?);
    new.add(Schedule::every("sync", MINUTE * 10, job())?)?;
    let next = next_multiple(now_us(&h), MINUTE * 10);
    let listed = h.queue.schedules()?;
    assert_eq!(listed[0].expression, "every 600s");
    assert_eq!(listed[0].next_tick, at(next));
    for k in 0..6 {
        set_us(&h, next + k * micros(MINUTE * 10));
        old.run_due()?;
        new.run_due()?;
    }
    let ticks = enqueued_ticks(&h.queue, "sync")?;
    assert_eq!(ticks.len(), 6, "{ticks:?}");
    assert!(ticks.windows(2).all(|w| w[1] - w[0] == micros(MINUTE * 10)));
    assert_eq!(old.stats().enqueued, 0);
    // Changed back in the first process, from its next tick on.
    old.add(Schedule::every("sync", HOUR, job())?)?;
    set_us(&h, next_multiple(now_us(&h), HOUR));
    assert_eq!(old.run_due()? + new.run_due()?, 1);
    Ok(())
}

fn a_bad_expression_or_job_is_a_typed_error_and_writes_nothing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for bad in [
        "* * *",
        "99 * * * *",
        "0 0 31 2 *",
        "*/0 * * * *",
        "@reboot",
    ] {
        match Schedule::cron("bad", bad, job()) {
            Err(e @ Error::InvalidPeriodic { .. }) => assert!(e.is_invalid_input()),
            other => return Err(format!("{bad:?} gave {other:?}").into()),
        }
    }
    let zone = Schedule::cron("bad", "0 * * * *", job())?.in_time_zone("Nowhere/Special");
    assert!(
        matches!(zone, Err(Error::InvalidPeriodic { .. })),
        "{zone:?}"
    );
    assert!(matches!(
        Schedule::every("bad", Duration::ZERO, job()),
        Err(Error::InvalidPeriodic { .. })
    ));
    // A job enqueue would refuse is refused when the schedule is added.
    let scheduler = Scheduler::new(h.queue.clone());
    let no_kind = Schedule::every("bad", MINUTE, NewJob::new("", json!({})))?;
    assert!(matches!(
        scheduler.add(no_kind),
        Err(Error::InvalidName { what: "kind", .. })
    ));
    let bad_json = Schedule::every("bad", MINUTE, NewJob::from_json_str("k", "{nope"))?;
    assert!(matches!(
        scheduler.add(bad_json),
        Err(Error::InvalidPayload(_))
    ));
    assert!(h.queue.schedules()?.is_empty());
    assert!(scheduler.names().is_empty());
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn interval_ticks_are_multiples_of_the_interval(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let every = Duration::from_secs(90);
    let scheduler = Scheduler::new(h.queue.clone());
    scheduler.add(Schedule::every("ninety", every, job())?)?;
    let start = now_us(&h);
    for _ in 0..20 {
        h.advance(Duration::from_secs(30));
        scheduler.run_due()?;
    }
    let ticks = enqueued_ticks(&h.queue, "ninety")?;
    let expected: Vec<i64> = (start / 1_000_000 + 1..=now_us(&h) / 1_000_000)
        .map(|secs| secs * 1_000_000)
        .filter(|t| t % micros(every) == 0)
        .collect();
    assert_eq!(ticks, expected, "the 90 s multiples of 600 s");
    // Due when claimed: available at once, the first tick's first.
    let job = h.lease_one("w")?;
    assert_eq!(
        h.record(job.id)?.unique_key,
        Some(tick_key("ninety", ticks[0]))
    );
    Ok(())
}

fn schedules_lists_the_last_and_next_tick(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let scheduler = Scheduler::new(h.queue.clone());
    scheduler.add(Schedule::cron("five", "*/5 * * * *", job())?)?;
    scheduler.add(Schedule::every("minute", MINUTE, job())?)?;
    let listed = h.queue.schedules()?;
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["five", "minute"]);
    assert_eq!(listed[0].expression, "*/5 * * * * (UTC)");
    assert!(listed.iter().all(|s| s.last_tick.is_none()));
    let five = next_multiple(now_us(&h), MINUTE * 5);
    set_us(&h, five);
    assert_eq!(scheduler.run_due()?, 2);
    let listed = h.queue.schedules()?;
    assert_eq!(listed[0].last_tick, Some(at(five)));
    assert_eq!(listed[0].next_tick, at(five + micros(MINUTE * 5)));
    assert_eq!(listed[1].last_tick, Some(at(five)));
    assert_eq!(listed[1].next_tick, at(five + micros(MINUTE)));
    Ok(())
}

fn a_worker_runs_its_periodic_schedules(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(backlog::QueueOptions::new())?;
    let events = h.queue.subscribe();
    let schedule = Schedule::every(
        "fast",
        Duration::from_millis(100),
        NewJob::new("tick", json!(1)),
    )?;
    let worker = Worker::builder(h.queue.clone())
        .poll_interval(Duration::from_secs(60))
        .handle_raw("tick", |_: Value, _| Ok(()))
        .periodic(schedule)
        .start()?;
    let mut done = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while done.len() < 3 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if let Event::Completed { job_id } = events.recv_timeout(left)? {
            done.insert(job_id);
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    let listed = h.queue.schedules()?;
    assert_eq!(listed.len(), 1, "the schedule stays for other processes");
    assert!(listed[0].last_tick.is_some());
    Ok(())
}
