//! [`Scheduler`]: the thread that claims the due ticks of this process's
//! schedules, and the claim itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::{Schedule, LATE_TICK_GRACE};
use crate::backend::params::{ClaimTickParams, Claimed, RegisterScheduleParams};
use crate::clock::{duration_micros, ClockMicros};
use crate::error::{Error, Result};
use crate::queue::Queue;
use crate::sync;
use crate::validate;

/// The longest the scheduler thread sleeps without reading the schedules
/// again: it notices a schedule registered, changed or removed by another
/// process within this, even with no tick of its own due.
const REFRESH: Duration = Duration::from_secs(5);

/// After a failed look at the schedules (the database unreachable), the
/// thread tries again this much later.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long [`Scheduler::shutdown`] waits for the thread to end.
const STOP_WAIT: Duration = Duration::from_millis(1500);

/// Runs [`Schedule`]s: at each due tick, claims it and enqueues its job,
/// exactly once across every scheduler of the database (see
/// [the module docs](crate::periodic)).
///
/// [`Scheduler::start`] runs a thread (`backlog-periodic`) that sleeps until
/// the next tick of its schedules; [`Scheduler::new`] runs none, for a
/// program (or a test on a [`ManualClock`](crate::ManualClock)) that calls
/// [`Scheduler::run_due`] itself. A [`Worker`](crate::Worker) runs one for
/// the schedules given to
/// [`WorkerBuilder::periodic`](crate::WorkerBuilder::periodic).
///
/// Every process may run a scheduler with the same schedules: that is how
/// ticks keep coming while any one of them is down.
#[derive(Debug)]
pub struct Scheduler {
    shared: Arc<Shared>,
    thread: Option<Running>,
}

#[derive(Debug)]
struct Shared {
    queue: Queue,
    schedules: Mutex<BTreeMap<String, Schedule>>,
    /// Wakes the thread when a schedule is added.
    wake: Sender<()>,
    woken: Receiver<()>,
    stats: Counters,
}

#[derive(Debug)]
struct Running {
    /// Dropped to stop the thread.
    stop: Option<Sender<()>>,
    /// Disconnects when the thread ends.
    done: Receiver<()>,
    handle: Option<JoinHandle<()>>,
}

/// What one look at the schedules did.
struct Due {
    /// Jobs enqueued.
    enqueued: usize,
    /// The next tick of the schedules this scheduler runs (`None`: none).
    next: Option<i64>,
    /// The first failed claim.
    failed: Option<Error>,
}

#[derive(Debug, Default)]
struct Counters {
    enqueued: AtomicU64,
    duplicates: AtomicU64,
    skipped: AtomicU64,
    passed_over: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
    wakeups: AtomicU64,
}

/// The most passed-over ticks one claim counts (a seconds-field cron
/// expression after a day of downtime would walk 86,400 of them).
const PASSED_OVER_COUNTED: u64 = 10_000;

/// What a scheduler did since it was made: see [`Scheduler::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerStats {
    /// Ticks this scheduler claimed and enqueued a job for.
    pub enqueued: u64,
    /// Ticks it claimed whose unique key a job already held, so nothing was
    /// inserted: the second guard caught a tick enqueued twice. Zero unless
    /// something is wrong.
    pub duplicates: u64,
    /// Missed ticks it skipped (see [`Schedule::catch_up`]).
    pub skipped: u64,
    /// Ticks a late claim passed over: when this scheduler claimed a
    /// schedule after more than one of its ticks had come due (its thread,
    /// or a write lock, held it up), it enqueued the latest one only, and
    /// counts the earlier ones here (at most 10,000 per claim are counted).
    pub passed_over: u64,
    /// Due ticks another scheduler claimed first.
    pub lost: u64,
    /// Failed looks at the schedules or claims (logged, and tried again).
    pub errors: u64,
    /// Times the thread woke up (0 for [`Scheduler::new`]).
    pub wakeups: u64,
}

impl Scheduler {
    /// A scheduler without a thread: due ticks are claimed when
    /// [`Scheduler::run_due`] is called.
    pub fn new(queue: Queue) -> Scheduler {
        let (wake, woken) = bounded(1);
        Scheduler {
            shared: Arc::new(Shared {
                queue,
                schedules: Mutex::new(BTreeMap::new()),
                wake,
                woken,
                stats: Counters::default(),
            }),
            thread: None,
        }
    }

    /// A scheduler with its own thread (`backlog-periodic`), which sleeps
    /// until the next tick of its schedules (or at most 5 s, to notice other
    /// processes' changes) and claims what is due. It sleeps in real time:
    /// on a [`ManualClock`](crate::ManualClock) a moved clock is noticed
    /// within those 5 s, so tests call [`Scheduler::run_due`] instead.
    ///
    /// [`Error::Worker`] if the thread cannot be spawned.
    pub fn start(queue: Queue) -> Result<Scheduler> {
        let mut scheduler = Scheduler::new(queue);
        let (stop, stopped) = bounded::<()>(0);
        let (alive, done) = bounded::<()>(0);
        let shared = scheduler.shared.clone();
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let handle = std::thread::Builder::new()
            .name("backlog-periodic".into())
            .spawn(move || {
                let _alive = alive;
                tracing::dispatcher::with_default(&dispatch, || shared.run(&stopped))
            })
            .map_err(|e| Error::Worker(format!("cannot spawn a thread: {e}")))?;
        scheduler.thread = Some(Running {
            stop: Some(stop),
            done,
            handle: Some(handle),
        });
        Ok(scheduler)
    }

    /// Registers `schedule` in the database and runs it from now on. A
    /// schedule of the same name is replaced: with another expression, the
    /// stored one changes too and the next tick is the new expression's (in
    /// every process: the last registration wins). The same expression keeps
    /// the stored next tick, so ticks missed while no scheduler ran are seen
    /// as missed.
    ///
    /// The job is checked as an enqueue would check it (names, payload
    /// size): [`Error::InvalidName`], [`Error::InvalidPayload`],
    /// [`Error::PayloadTooLarge`], before anything is written.
    pub fn add(&self, schedule: Schedule) -> Result<()> {
        let queue = &self.shared.queue;
        let now = queue.now_micros();
        queue.check_job(schedule.template(), now)?;
        queue.store().register_schedule(&RegisterScheduleParams {
            name: schedule.name(),
            expression: &schedule.expression(),
            next_tick: schedule.next_after(now)?,
            now,
        })?;
        self.shared
            .lock()
            .insert(schedule.name().to_owned(), schedule);
        let _ = self.shared.wake.try_send(());
        Ok(())
    }

    /// Stops running the schedule `name` here, and removes it from the
    /// database, so every other scheduler stops too (see
    /// [`Queue::remove_schedule`]). Returns whether the database had it.
    pub fn remove(&self, name: &str) -> Result<bool> {
        validate::name("schedule", name)?;
        self.shared.lock().remove(name);
        self.shared.queue.remove_schedule(name)
    }

    /// The names of the schedules this scheduler runs.
    pub fn names(&self) -> Vec<String> {
        self.shared.lock().keys().cloned().collect()
    }

    /// Claims every tick of this scheduler's schedules that is due at the
    /// queue clock's now, enqueueing their jobs; returns how many it
    /// enqueued. Ticks other schedulers claimed first are left to them.
    ///
    /// A schedule whose claim fails does not stop the others: the first
    /// error is returned after every schedule was tried.
    pub fn run_due(&self) -> Result<usize> {
        let now = self.shared.queue.now_micros();
        let due = self.shared.run_due(now)?;
        match due.failed {
            Some(e) => Err(e),
            None => Ok(due.enqueued),
        }
    }

    /// What this scheduler did so far.
    pub fn stats(&self) -> SchedulerStats {
        let c = &self.shared.stats;
        SchedulerStats {
            enqueued: c.enqueued.load(Relaxed),
            duplicates: c.duplicates.load(Relaxed),
            skipped: c.skipped.load(Relaxed),
            passed_over: c.passed_over.load(Relaxed),
            lost: c.lost.load(Relaxed),
            errors: c.errors.load(Relaxed),
            wakeups: c.wakeups.load(Relaxed),
        }
    }

    /// Stops the thread. **Bound**: returns within 1.5 s; a thread still
    /// inside a database call then (a write lock held by another process)
    /// is left to finish it on its own and then ends. The schedules stay in
    /// the database for the other schedulers. Returns the final
    /// [`Scheduler::stats`].
    pub fn shutdown(mut self) -> SchedulerStats {
        self.stop_by(Instant::now() + STOP_WAIT);
        self.stats()
    }

    /// Stops the thread, waiting for it until `deadline`.
    pub(crate) fn stop_by(&mut self, deadline: Instant) {
        let Some(mut running) = self.thread.take() else {
            return;
        };
        running.stop.take();
        // Nothing is sent: this returns when the thread drops its sender.
        let _ = running.done.recv_deadline(deadline);
        if let Some(handle) = running.handle.take() {
            if handle.is_finished() {
                let _ = handle.join();
            }
        }
    }
}

impl Drop for Scheduler {
    /// Stops the thread as [`Scheduler::shutdown`] does.
    fn drop(&mut self) {
        self.stop_by(Instant::now() + STOP_WAIT);
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Schedule>> {
        sync::lock(&self.schedules)
    }

    /// The thread: claim what is due, sleep until the next tick.
    fn run(&self, stop: &Receiver<()>) {
        let clock = self.queue.options().clock.clone();
        loop {
            self.stats.wakeups.fetch_add(1, Relaxed);
            let now = clock.now_micros();
            let retry = now.saturating_add(duration_micros(RETRY_AFTER).unwrap_or(0));
            let next = match self.run_due(now) {
                Ok(due) => match due.failed {
                    Some(_) => Some(due.next.map_or(retry, |n| n.min(retry))),
                    None => due.next,
                },
                Err(e) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    tracing::warn!(error = %e, "periodic: cannot read the schedules; trying again");
                    Some(retry)
                }
            };
            let wait = next.map_or(REFRESH, |t| {
                let left = t.saturating_sub(clock.now_micros()).max(0);
                Duration::from_micros(u64::try_from(left).unwrap_or(0)).min(REFRESH)
            });
            select! {
                recv(stop) -> _ => return,
                recv(self.woken) -> _ => {}
                default(wait) => {}
            }
        }
    }

    /// Claims the due ticks at `now`. Fails only when the schedules cannot
    /// be read; a failed claim is counted, logged and reported in `failed`,
    /// and the other schedules go on.
    fn run_due(&self, now: i64) -> Result<Due> {
        let schedules: Vec<Schedule> = self.lock().values().cloned().collect();
        let mut due = Due {
            enqueued: 0,
            next: None,
            failed: None,
        };
        if schedules.is_empty() {
            return Ok(due);
        }
        let rows: BTreeMap<String, crate::backend::params::ScheduleRow> = self
            .queue
            .store()
            .schedules()?
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        for schedule in &schedules {
            let expression = schedule.expression();
            // No row: removed. Another expression: another registration
            // governs it. Either way this scheduler leaves it alone.
            let Some(row) = rows
                .get(schedule.name())
                .filter(|r| r.expression == expression)
            else {
                continue;
            };
            let upcoming = if row.next_tick > now {
                row.next_tick
            } else {
                match self.claim(schedule, &expression, row.next_tick, now) {
                    Ok((claimed, upcoming)) => {
                        due.enqueued += usize::from(claimed);
                        upcoming
                    }
                    Err(e) => {
                        self.stats.errors.fetch_add(1, Relaxed);
                        tracing::warn!(
                            schedule = schedule.name(),
                            error = %e,
                            "periodic: cannot claim a due tick; trying again"
                        );
                        if matches!(e, Error::InvalidPeriodic { .. }) {
                            // No tick left (a cron whose years are over):
                            // nothing to try again.
                            self.lock().remove(schedule.name());
                        }
                        due.failed.get_or_insert(e);
                        continue;
                    }
                }
            };
            due.next = Some(due.next.map_or(upcoming, |n| n.min(upcoming)));
        }
        Ok(due)
    }

    /// Claims the due tick of `schedule` whose row holds `seen`: enqueues
    /// the latest tick at or before `now` (or skips it when it was missed),
    /// and moves the row to the first tick after `now`. Returns whether a
    /// job was enqueued, and the next tick.
    fn claim(
        &self,
        schedule: &Schedule,
        expression: &str,
        seen: i64,
        now: i64,
    ) -> Result<(bool, i64)> {
        let tick = schedule
            .latest_at_or_before(now)?
            .map_or(seen, |t| t.max(seen));
        let next_tick = schedule.next_after(now)?;
        let late = now.saturating_sub(tick);
        let on_time = late <= duration_micros(LATE_TICK_GRACE)?;
        let job = (on_time || schedule.catches_up()).then(|| schedule.job_at(tick));
        let claimed = self.queue.claim_tick(
            ClaimTickParams {
                name: schedule.name(),
                expression,
                seen,
                next_tick,
                tick,
                job: None,
                now,
            },
            job,
        )?;
        let c = &self.stats;
        if !matches!(claimed, Claimed::Lost) {
            // Ticks from the stored one up to the claimed one: due, and
            // passed over by this claim. Only counted: the claim has
            // committed, so a tick that cannot be computed (a stored tick out
            // of the calendar's range) counts none rather than failing it.
            let passed = schedule
                .ticks_from_until(seen, tick, PASSED_OVER_COUNTED)
                .unwrap_or(0);
            if passed > 0 {
                c.passed_over.fetch_add(passed, Relaxed);
                tracing::info!(
                    schedule = schedule.name(),
                    tick,
                    passed,
                    "periodic: a late claim passed ticks over"
                );
            }
        }
        let enqueued = match claimed {
            Claimed::Lost => {
                c.lost.fetch_add(1, Relaxed);
                // The winner moved the row on to the same next tick.
                false
            }
            Claimed::Skipped => {
                c.skipped.fetch_add(1, Relaxed);
                tracing::info!(
                    schedule = schedule.name(),
                    tick,
                    "periodic: missed tick skipped"
                );
                false
            }
            Claimed::Enqueued(e) if e.existed => {
                c.duplicates.fetch_add(1, Relaxed);
                tracing::warn!(
                    schedule = schedule.name(),
                    tick,
                    job_id = e.id,
                    "periodic: tick already enqueued"
                );
                false
            }
            Claimed::Enqueued(e) => {
                c.enqueued.fetch_add(1, Relaxed);
                tracing::debug!(
                    schedule = schedule.name(),
                    tick,
                    job_id = e.id,
                    "periodic: tick enqueued"
                );
                true
            }
        };
        Ok((enqueued, next_tick))
    }
}
