//! Queue limits: set, read and clear them; bad values refused; a lease
//! honours a global concurrency limit and a rate limit (fixed windows of the
//! manual clock), fills from other queues, and admits more at once when a
//! limit is raised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backlog::{Error, JobState, LeaseRequest, NewJob, QueueLimits, Rate};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

fn concurrency(n: u32) -> QueueLimits {
    QueueLimits {
        concurrency: Some(n),
        rate: None,
    }
}

fn rate(n: u32, period: Duration) -> QueueLimits {
    QueueLimits {
        concurrency: None,
        rate: Some(Rate::new(n, period)),
    }
}

fn enqueue(q: &backlog::Queue, queue: &str, n: usize) -> backlog::Result<()> {
    q.enqueue_many((0..n).map(|i| NewJob::new("k", json!(i)).queue(queue)))?;
    Ok(())
}

fn lease(q: &backlog::Queue, queues: &[&str], n: usize) -> backlog::Result<Vec<backlog::Job>> {
    q.lease(&LeaseRequest::new("w", n).queues(queues.iter().copied()))
}

fn limits_are_set_read_and_cleared(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    assert_eq!(q.limits("smtp")?, QueueLimits::default());
    assert!(q.all_limits()?.is_empty());

    let both = QueueLimits {
        concurrency: Some(3),
        rate: Some(Rate::per_minute(10)),
    };
    q.set_limits("smtp", both)?;
    q.set_limits("other", concurrency(7))?;
    assert_eq!(q.limits("smtp")?, both);
    assert_eq!(
        q.all_limits()?,
        vec![
            ("other".to_owned(), concurrency(7)),
            ("smtp".to_owned(), both)
        ]
    );
    // Another handle (another process or node) reads the same.
    assert_eq!(h.second_handle()?.limits("smtp")?, both);

    // Replacing keeps nothing of the old limits.
    q.set_limits("smtp", rate(5, Duration::from_secs(2)))?;
    assert_eq!(q.limits("smtp")?, rate(5, Duration::from_secs(2)));

    q.set_limits("smtp", QueueLimits::default())?;
    assert_eq!(q.limits("smtp")?, QueueLimits::default());
    assert_eq!(q.all_limits()?, vec![("other".to_owned(), concurrency(7))]);

    // The scrape shows them as gauges.
    #[cfg(feature = "metrics")]
    {
        let text = q.metrics()?;
        assert!(text.contains(r#"backlog_queue_concurrency_limit{queue="other"} 7"#));
        assert!(!text.contains(r#"backlog_queue_concurrency_limit{queue="smtp"}"#));
    }

    // Limits and pausing are separate controls of the same queue.
    q.set_limits("smtp", concurrency(2))?;
    q.pause("smtp")?;
    q.resume("smtp")?;
    assert_eq!(q.limits("smtp")?, concurrency(2));
    Ok(())
}

fn zero_negative_and_absurd_limits_are_refused_and_nothing_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.set_limits("smtp", concurrency(4))?;
    let bad = [
        concurrency(0),
        concurrency(backlog::limits::MAX_CONCURRENCY_LIMIT + 1),
        rate(0, Duration::from_secs(1)),
        rate(backlog::limits::MAX_RATE_LIMIT + 1, Duration::from_secs(1)),
        rate(10, Duration::ZERO),
        rate(10, Duration::from_micros(1500)),
        rate(10, Duration::from_secs(8 * 24 * 3600)),
    ];
    for limits in bad {
        match q.set_limits("smtp", limits) {
            Err(Error::InvalidLimit(_)) => {}
            other => return Err(format!("{limits:?}: expected InvalidLimit, got {other:?}").into()),
        }
    }
    assert!(matches!(
        q.set_limits("", concurrency(1)),
        Err(Error::InvalidName { .. })
    ));
    // Negative and malformed rates are refused as text too.
    for text in ["-5/s", "0/s", "5/0s", "5", "five/s", "5/fortnight"] {
        assert!(
            matches!(text.parse::<Rate>(), Err(Error::InvalidLimit(_))),
            "{text}"
        );
    }
    assert_eq!(q.limits("smtp")?, concurrency(4));
    assert_eq!(q.all_limits()?.len(), 1);
    Ok(())
}

fn a_lease_never_runs_more_than_the_concurrency_limit(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "smtp", 10)?;
    q.set_limits("smtp", concurrency(3))?;

    let first = lease(q, &["smtp"], 10)?;
    assert_eq!(first.len(), 3);
    // Another handle (another node) gets nothing while three run.
    let other = h.second_handle()?;
    assert!(lease(&other, &["smtp"], 10)?.is_empty());
    assert!(lease(q, &["smtp"], 1)?.is_empty());

    // Each finished job (completed, failed or expired) frees one place.
    q.complete(&first[0], None)?;
    let second = lease(&other, &["smtp"], 10)?;
    assert_eq!(second.len(), 1);
    q.fail(&first[1], "boom")?;
    assert_eq!(lease(q, &["smtp"], 10)?.len(), 1);
    assert!(lease(q, &["smtp"], 10)?.is_empty());

    // Clearing the limit admits the rest.
    q.set_limits("smtp", QueueLimits::default())?;
    // (the failed job waits for its retry.)
    assert_eq!(lease(q, &["smtp"], 10)?.len(), 5);
    Ok(())
}

fn a_lease_never_starts_more_than_the_rate_limit_per_window(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "api", 20)?;
    q.set_limits("api", rate(4, Duration::from_secs(1)))?;

    // The harness clock starts on a whole second: one window.
    let mut started = Vec::new();
    started.extend(lease(q, &["api"], 3)?);
    assert_eq!(started.len(), 3);
    h.advance(Duration::from_millis(500));
    started.extend(lease(q, &["api"], 10)?);
    assert_eq!(started.len(), 4);
    // Finishing jobs frees no start within the window.
    for job in started.drain(..) {
        q.complete(&job, None)?;
    }
    h.advance(Duration::from_millis(499));
    assert!(lease(q, &["api"], 10)?.is_empty());
    assert!(lease(&h.second_handle()?, &["api"], 10)?.is_empty());

    // The next window starts at the next whole second.
    h.advance(Duration::from_millis(1));
    assert_eq!(lease(q, &["api"], 10)?.len(), 4);
    assert!(lease(q, &["api"], 10)?.is_empty());

    // A window skipped entirely does not carry its starts over.
    h.advance(Duration::from_secs(5));
    assert_eq!(lease(q, &["api"], 10)?.len(), 4);
    Ok(())
}

fn a_lease_whose_clock_is_behind_a_newer_window_does_not_reopen_the_old_one(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "api", 20)?;
    q.set_limits("api", rate(4, Duration::from_secs(1)))?;
    // A lease in the window of second 1 fills it.
    h.advance(Duration::from_millis(1200));
    assert_eq!(lease(q, &["api"], 10)?.len(), 4);
    // Another lease read its clock before that one (still in second 0) and
    // only now gets its turn: it starts nothing in second 1, and second 0
    // is not opened again.
    h.clock.set(h.now() - Duration::from_millis(400));
    assert!(lease(q, &["api"], 10)?.is_empty());
    let running = q.list(&backlog::JobFilter::new(JobState::Running).queue("api"))?;
    assert_eq!(running.jobs.len(), 4);
    Ok(())
}

fn both_limits_apply_together(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "smtp", 10)?;
    q.set_limits(
        "smtp",
        QueueLimits {
            concurrency: Some(2),
            rate: Some(Rate::per_minute(3)),
        },
    )?;
    let first = lease(q, &["smtp"], 10)?;
    assert_eq!(first.len(), 2, "the concurrency limit");
    for job in &first {
        q.complete(job, None)?;
    }
    assert_eq!(lease(q, &["smtp"], 10)?.len(), 1, "the rate limit's third");
    h.advance(Duration::from_secs(60));
    assert_eq!(lease(q, &["smtp"], 10)?.len(), 1, "one place left running");
    Ok(())
}

fn a_limited_queue_does_not_hold_back_the_others(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    // The limited queue's jobs come first in claim order.
    q.enqueue_many((0..5).map(|i| NewJob::new("k", json!(i)).queue("slow").priority(9)))?;
    enqueue(q, "fast", 5)?;
    q.set_limits("slow", concurrency(1))?;

    let jobs = lease(q, &["slow", "fast"], 4)?;
    let slow = jobs.iter().filter(|j| j.queue == "slow").count();
    assert_eq!((slow, jobs.len()), (1, 4));
    // Claim order still holds within the lease.
    assert_eq!(jobs[0].queue, "slow");

    // A full limited queue leaves the whole lease to the others.
    let more = lease(q, &["slow", "fast"], 10)?;
    assert_eq!(more.len(), 2);
    assert!(more.iter().all(|j| j.queue == "fast"));

    // Naming the limited queue twice claims it once.
    q.complete(&jobs[0], None)?;
    let twice = lease(q, &["slow", "slow"], 10)?;
    assert_eq!(twice.len(), 1);
    Ok(())
}

fn raising_a_limit_admits_more_at_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "smtp", 10)?;
    enqueue(q, "api", 10)?;
    q.set_limits("smtp", concurrency(1))?;
    q.set_limits("api", rate(1, Duration::from_secs(60)))?;
    assert_eq!(lease(q, &["smtp", "api"], 10)?.len(), 2);
    assert!(lease(q, &["smtp", "api"], 10)?.is_empty());

    // No clock step, no waiting: the next lease reads the new limits.
    q.set_limits("smtp", concurrency(4))?;
    q.set_limits("api", rate(3, Duration::from_secs(60)))?;
    let jobs = lease(q, &["smtp", "api"], 10)?;
    let count = |queue: &str| jobs.iter().filter(|j| j.queue == queue).count();
    assert_eq!((count("smtp"), count("api")), (3, 2));

    // Lowering below what runs admits nothing until enough finish.
    q.set_limits("smtp", concurrency(2))?;
    assert!(lease(q, &["smtp"], 10)?.is_empty());
    Ok(())
}

fn a_limit_set_by_another_handle_is_never_exceeded(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "smtp", 10)?;
    // This handle has leased the queue unlimited (and may remember that).
    let first = lease(q, &["smtp"], 1)?;
    assert_eq!(first.len(), 1);
    h.second_handle()?.set_limits("smtp", concurrency(2))?;

    // At most one more may run; a server handle that has not looked again
    // yet skips the queue rather than over-admit.
    let more = lease(q, &["smtp"], 10)?;
    assert!(more.len() <= 1, "{} leased past the limit", more.len());
    std::thread::sleep(backlog::limits::LIMITS_SEEN_WITHIN);
    let rest = lease(q, &["smtp"], 10)?;
    assert_eq!(more.len() + rest.len(), 1);
    assert_eq!(h.state(first[0].id)?, JobState::Running);
    Ok(())
}

/// A limit lifted and set again counts the jobs leased while the queue had
/// none: nothing a lease learned before the lift stands for them (a backend
/// that remembers a bound of the running jobs must forget it).
fn a_limit_set_again_counts_the_jobs_leased_while_there_was_none(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "smtp", 20)?;
    q.set_limits("smtp", concurrency(10))?;
    assert_eq!(lease(q, &["smtp"], 2)?.len(), 2);
    q.set_limits("smtp", QueueLimits::default())?;
    assert_eq!(lease(q, &["smtp"], 8)?.len(), 8);

    // One at a time: a lease asking for less than the limit leaves room
    // that only the count of the jobs running now can refuse.
    q.set_limits("smtp", concurrency(10))?;
    for _ in 0..3 {
        let over = lease(q, &["smtp"], 1)?;
        assert!(over.is_empty(), "{} leased past the limit", over.len());
    }
    q.set_limits("smtp", concurrency(12))?;
    assert_eq!(lease(q, &["smtp"], 10)?.len(), 2);
    Ok(())
}

/// Many handles leasing at once, each a few jobs at a time, fill a limit far
/// above their requests exactly: no interleaving of their claims runs more.
/// (On PostgreSQL a claim of a room this large is made before the queue's
/// lock is taken and undone when the count under the lock finds it over:
/// `limits::lease_ahead`.)
fn handles_leasing_at_once_fill_a_large_concurrency_limit_exactly(b: &Backend) -> TestResult {
    const LIMIT: usize = 40;
    let h = b.harness()?;
    enqueue(&h.queue, "bulk", 200)?;
    h.queue.set_limits("bulk", concurrency(LIMIT as u32))?;
    let leased = six_handles_lease_at_once(&h, "bulk")?;
    assert_eq!(leased.iter().sum::<usize>(), LIMIT, "{leased:?}");
    Ok(())
}

/// Six more handles on `h`'s queue lease `queue` at once, 3 jobs at a time,
/// until a lease takes nothing: how many each took.
fn six_handles_lease_at_once(h: &Harness, queue: &str) -> TestResult<Vec<usize>> {
    let handles = (0..6)
        .map(|_| h.second_handle())
        .collect::<TestResult<Vec<_>>>()?;
    let start = std::sync::Barrier::new(handles.len());
    let leased = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .iter()
            .map(|other| {
                let start = &start;
                s.spawn(move || -> backlog::Result<usize> {
                    start.wait();
                    let mut held = 0;
                    loop {
                        match lease(other, &[queue], 3)?.len() {
                            0 => return Ok(held),
                            n => held += n,
                        }
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a leasing thread panicked"))
            .collect::<backlog::Result<Vec<usize>>>()
    })?;
    Ok(leased)
}

/// Many handles leasing at once, each a few jobs at a time, fill a rate
/// limit far above their requests exactly, in one window, with or without a
/// concurrency limit beside it: no interleaving of their claims starts
/// more. (On PostgreSQL a claim of a room this large is made before the
/// queue's lock is taken, and undone when its starts do not fit in the
/// window under the lock: `limits::lease_ahead_rated`.)
fn handles_leasing_at_once_fill_a_large_rate_limit_exactly(b: &Backend) -> TestResult {
    const LIMIT: usize = 40;
    let h = b.harness()?;
    let rated = rate(LIMIT as u32, Duration::from_secs(3600));
    let both = QueueLimits {
        concurrency: Some(1000),
        ..rated
    };
    for (queue, limits) in [("rated", rated), ("both", both)] {
        enqueue(&h.queue, queue, 200)?;
        h.queue.set_limits(queue, limits)?;
        let leased = six_handles_lease_at_once(&h, queue)?;
        assert_eq!(leased.iter().sum::<usize>(), LIMIT, "{queue}: {leased:?}");
    }
    Ok(())
}

/// A lease whose clock is behind a window a later lease opened counts its
/// starts in that window, also when its room was large enough to claim
/// before taking the queue's lock: the window is not moved back, and the
/// later window's starts stay counted.
fn a_lease_behind_a_newer_window_counts_its_starts_in_that_window(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "api", 300)?;
    q.set_limits("api", rate(100, Duration::from_secs(1)))?;
    // A lease in the window of second 1 starts 10 there.
    h.advance(Duration::from_millis(1200));
    assert_eq!(lease(q, &["api"], 10)?.len(), 10);
    // Another read its clock in second 0 and only now gets its turn.
    h.clock.set(h.now() - Duration::from_millis(400));
    assert_eq!(lease(q, &["api"], 10)?.len(), 10);
    // Second 1 has 80 starts left, however they are asked for.
    h.clock.set(h.now() + Duration::from_millis(500));
    let mut more = 0;
    loop {
        match lease(q, &["api"], 7)?.len() {
            0 => break,
            n => more += n,
        }
    }
    assert_eq!(more, 80);
    Ok(())
}

/// Jobs of each queue running at once, now and at most.
#[derive(Default)]
struct Overlap(Mutex<HashMap<String, (usize, usize)>>);

impl Overlap {
    fn enter(&self, queue: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(queue.to_owned()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }

    fn leave(&self, queue: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = m.get_mut(queue) {
            e.0 -= 1;
        }
    }

    fn max(&self, queue: &str) -> usize {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.get(queue).map_or(0, |e| e.1)
    }
}

fn a_worker_runs_no_more_of_a_queue_than_its_cap_or_the_global_limit(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    for queue in ["capped", "limited", "free"] {
        enqueue(q, queue, 8)?;
    }
    q.set_limits("limited", concurrency(2))?;
    let overlap = Arc::new(Overlap::default());
    let events = q.subscribe();
    let seen = overlap.clone();
    let worker = backlog::Worker::builder(q.clone())
        .queues(["capped", "limited", "free"])
        .concurrency(6)
        .queue_concurrency("capped", 1)
        .handle_raw("k", move |_, ctx| {
            seen.enter(ctx.queue());
            std::thread::sleep(Duration::from_millis(20));
            seen.leave(ctx.queue());
            Ok(())
        })
        .start()?;
    let mut completed = 0;
    while completed < 24 {
        if let backlog::Event::Completed { .. } = events.recv_timeout(Duration::from_secs(30))? {
            completed += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(overlap.max("capped"), 1);
    assert!(overlap.max("limited") <= 2, "{}", overlap.max("limited"));
    // The capped and limited queues left the other slots to `free`.
    assert!(overlap.max("free") >= 2, "{}", overlap.max("free"));
    Ok(())
}

fn a_worker_refuses_a_bad_queue_cap(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for (queue, n) in [("smtp", 0), ("elsewhere", 2)] {
        let started = backlog::Worker::builder(h.queue.clone())
            .queues(["smtp"])
            .queue_concurrency(queue, n)
            .handle_raw("k", |_, _| Ok(()))
            .start();
        assert!(
            matches!(started, Err(Error::InvalidLimit(_))),
            "{queue} {n}: {:?}",
            started.err()
        );
    }
    Ok(())
}

fn a_lease_request_caps_a_queue_on_top_of_its_limits(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    enqueue(q, "a", 5)?;
    enqueue(q, "b", 5)?;
    q.set_limits("b", concurrency(3))?;
    let req = LeaseRequest::new("w", 10)
        .queues(["a", "b"])
        .queue_limit("a", 2)
        .queue_limit("b", 5);
    let jobs = q.lease(&req)?;
    let count = |queue: &str| jobs.iter().filter(|j| j.queue == queue).count();
    assert_eq!((count("a"), count("b")), (2, 3));
    let none = q.lease(&LeaseRequest::new("w", 10).queues(["a"]).queue_limit("a", 0))?;
    assert!(none.is_empty());
    Ok(())
}

fn a_worker_starts_rate_limited_jobs_as_each_window_opens(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(backlog::QueueOptions::new())?;
    let q = &h.queue;
    enqueue(q, "api", 20)?;
    q.set_limits("api", rate(5, Duration::from_millis(500)))?;
    let events = q.subscribe();
    let start = std::time::Instant::now();
    // An idle poll of a minute: only the window's wake-up can start the
    // next five in time.
    let worker = backlog::Worker::builder(q.clone())
        .queues(["api"])
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    let mut completed = 0;
    while completed < 20 {
        if let backlog::Event::Completed { .. } = events.recv_timeout(Duration::from_secs(20))? {
            completed += 1;
        }
    }
    let took = start.elapsed();
    worker.shutdown(Duration::from_secs(5))?;
    // Four windows at least (five a window), and not one idle poll.
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    Ok(())
}

conformance!(
    limits_are_set_read_and_cleared,
    a_worker_starts_rate_limited_jobs_as_each_window_opens,
    a_worker_runs_no_more_of_a_queue_than_its_cap_or_the_global_limit,
    a_worker_refuses_a_bad_queue_cap,
    a_lease_request_caps_a_queue_on_top_of_its_limits,
    zero_negative_and_absurd_limits_are_refused_and_nothing_is_written,
    a_lease_never_runs_more_than_the_concurrency_limit,
    a_lease_never_starts_more_than_the_rate_limit_per_window,
    both_limits_apply_together,
    a_lease_whose_clock_is_behind_a_newer_window_does_not_reopen_the_old_one,
    a_limited_queue_does_not_hold_back_the_others,
    raising_a_limit_admits_more_at_once,
    a_limit_set_by_another_handle_is_never_exceeded,
    handles_leasing_at_once_fill_a_large_concurrency_limit_exactly,
    handles_leasing_at_once_fill_a_large_rate_limit_exactly,
    a_lease_behind_a_newer_window_counts_its_starts_in_that_window,
    a_limit_set_again_counts_the_jobs_leased_while_there_was_none,
);
