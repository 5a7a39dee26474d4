//! Job dependencies: a job enqueued with `depends_on` waits as `pending`,
//! outside the lease, until every job it depends on has finished; the
//! transaction that finishes the last one makes it available. A dependency
//! that does not complete cancels what waits on it (in cascade) unless the
//! dependent runs anyway.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backlog::{Error, JobFilter, JobState, LeaseRequest, NewJob, Outcome, QueueOptions, Worker};
use serde_json::{json, Value};

use crate::harness::{child_queue, Backend, Harness, TestResult};

fn job(kind: &str) -> NewJob {
    NewJob::new(kind, json!({}))
}

fn enqueue(h: &Harness, job: NewJob) -> TestResult<i64> {
    Ok(h.queue.enqueue(job)?.id)
}

/// Leases every available job and returns their ids, sorted.
fn lease_all(h: &Harness) -> TestResult<Vec<i64>> {
    let mut ids: Vec<i64> = h.lease("w", 100)?.into_iter().map(|j| j.id).collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Leases job `id` (it must be available) and settles it with `outcome`.
pub(crate) fn run(h: &Harness, id: i64, outcome: Outcome) -> TestResult {
    let jobs = h.lease("w", 100)?;
    let job = jobs
        .iter()
        .find(|j| j.id == id)
        .ok_or_else(|| format!("job {id} was not leased"))?;
    h.queue.settle(job, outcome)?;
    for other in jobs.iter().filter(|j| j.id != id) {
        h.queue.release(other)?;
    }
    Ok(())
}

fn a_dependent_is_pending_and_never_leased_until_its_dependency_completes(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let dependent = enqueue(&h, job("b").depends_on([a]))?;
    assert_eq!(h.state(dependent)?, JobState::Pending);
    assert_eq!(h.live_rows()?, 1, "a pending job is not a live row");
    let leased = h.lease("w", 10)?;
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a]);
    h.queue.complete(&leased[0], None)?;
    assert_eq!(h.state(dependent)?, JobState::Available);
    assert_eq!(lease_all(&h)?, vec![dependent]);
    Ok(())
}

fn a_released_job_with_a_delay_waits_for_its_time(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let later = enqueue(
        &h,
        job("later").depends_on([a]).delay(Duration::from_secs(60)),
    )?;
    run(&h, a, Outcome::Complete(None))?;
    assert_eq!(h.state(later)?, JobState::Scheduled);
    assert!(h.lease("w", 10)?.is_empty(), "not due yet");
    h.advance(Duration::from_secs(61));
    assert_eq!(lease_all(&h)?, vec![later]);
    Ok(())
}

/// The scenario above with a worker, on real time: a delayed dependent
/// released before its time must wait where a worker's next-due look finds
/// it, so the worker (idle poll 300 s) starts it within 3 s of its time.
/// Released into the due index instead (SQLite's `RELEASE` with `due` 1,
/// fixed in 35ce8c1), it started only at the fetcher's next idle wake-up
/// (about 9 s after its time here), and this fails; the lease-only scenario
/// above passes either way.
fn a_released_job_with_a_delay_starts_when_due_not_at_the_idle_poll(b: &Backend) -> TestResult {
    const DELAY: Duration = Duration::from_millis(1_500);
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let worker = Worker::builder(h.queue.clone())
        .poll_interval(Duration::from_secs(300))
        .handle_raw("later", |_: Value, _| Ok(()))
        .start()?;
    let enqueued = std::time::Instant::now();
    // The dependency in a queue of its own: on MySQL the worker's lease of
    // `later`, walking `default`'s lease index, locks the rows it passes,
    // and a lease of ours meanwhile would skip them (SKIP LOCKED).
    let a = enqueue(&h, job("a").queue("gates"))?;
    let later = enqueue(&h, job("later").depends_on([a]).delay(DELAY))?;
    let gate = h
        .queue
        .lease(&LeaseRequest::new("w", 1).queues(["gates"]))?
        .pop()
        .ok_or("the dependency was not leased")?;
    h.queue.complete(&gate, None)?;
    // Released before its time (unless this machine took the whole delay
    // to get here: then the scenario shows nothing, but fails nothing).
    if enqueued.elapsed() + Duration::from_millis(500) < DELAY {
        assert_eq!(h.state(later)?, JobState::Scheduled, "released early");
    }
    let deadline = enqueued + DELAY + Duration::from_secs(3);
    let started = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left) {
            Ok(backlog::Event::Started { job_id, .. }) if job_id == later => {
                break enqueued.elapsed()
            }
            Ok(_) => {}
            Err(_) => return Err("the released job did not start within 3 s of its time".into()),
        }
    };
    worker.shutdown(Duration::from_secs(5))?;
    assert!(started >= DELAY, "started early: {started:?}");
    Ok(())
}

fn fan_in_waits_for_every_dependency_and_fan_out_releases_every_dependent(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let roots: Vec<i64> = (0..3)
        .map(|_| enqueue(&h, job("root")))
        .collect::<TestResult<_>>()?;
    let join = enqueue(&h, job("join").depends_on(roots.clone()))?;
    let fan: Vec<i64> = (0..2)
        .map(|_| enqueue(&h, job("fan").depends_on([roots[0]])))
        .collect::<TestResult<_>>()?;
    run(&h, roots[0], Outcome::Complete(None))?;
    for id in &fan {
        assert_eq!(h.state(*id)?, JobState::Available, "fan-out job {id}");
    }
    run(&h, roots[1], Outcome::Complete(None))?;
    assert_eq!(h.state(join)?, JobState::Pending, "one dependency left");
    run(&h, roots[2], Outcome::Complete(None))?;
    assert_eq!(h.state(join)?, JobState::Available);
    Ok(())
}

fn a_dependency_finished_at_enqueue_counts_at_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let done = enqueue(&h, job("a"))?;
    run(&h, done, Outcome::Complete(None))?;
    let failed = enqueue(&h, job("a"))?;
    run(&h, failed, Outcome::Discard("no".into()))?;

    let after_done = enqueue(&h, job("b").depends_on([done]))?;
    assert_eq!(h.state(after_done)?, JobState::Available);
    let anyway = enqueue(&h, job("b").depends_on([failed]).run_anyway())?;
    assert_eq!(h.state(anyway)?, JobState::Available);
    let cancelled = enqueue(&h, job("b").depends_on([done, failed]))?;
    let record = h.record(cancelled)?;
    assert_eq!(record.state, JobState::CANCELLED);
    assert_eq!(record.attempts, 0);
    let message = &record.errors.last().ok_or("no error")?.message;
    assert!(
        message.contains(&failed.to_string()) && message.contains("discarded"),
        "{message}"
    );
    Ok(())
}

fn a_dependency_that_does_not_complete_cancels_its_dependents_in_cascade(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a").max_attempts(1))?;
    let b1 = enqueue(&h, job("b").depends_on([a]))?;
    let c = enqueue(&h, job("c").depends_on([b1]))?;
    let other = enqueue(&h, job("other"))?;
    let d = enqueue(&h, job("d").depends_on([c, other]))?;
    run(&h, a, Outcome::fail("boom"))?;
    assert_eq!(h.state(a)?, JobState::DEAD);
    for id in [b1, c, d] {
        assert_eq!(h.state(id)?, JobState::CANCELLED, "job {id}");
    }
    assert_eq!(h.state(other)?, JobState::Available, "not a dependent");
    assert_eq!(h.count("SELECT count(*) FROM backlog_pending")?, 0);
    Ok(())
}

/// A wide and deep cascade (the servers cancel it a level per statement):
/// every job that waits on the dead one, directly or not, is cancelled with
/// an error naming a dependency that ended; a job joining two cancelled
/// branches is cancelled once; a run-anyway dependent runs; and a retry of
/// the dead job brings every cancelled one back, waiting.
fn a_wide_cascade_cancels_every_level_and_a_retry_brings_it_back(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a").max_attempts(1))?;
    let other = enqueue(&h, job("other"))?;
    let fan: Vec<i64> = (0..40)
        .map(|_| enqueue(&h, job("fan").depends_on([a])))
        .collect::<TestResult<_>>()?;
    let children: Vec<i64> = fan
        .iter()
        .map(|&f| enqueue(&h, job("child").depends_on([f])))
        .collect::<TestResult<_>>()?;
    let join = enqueue(&h, job("join").depends_on([fan[0], fan[1], other]))?;
    let deep = enqueue(&h, job("deep").depends_on([join, children[2]]))?;
    let anyway = enqueue(&h, job("anyway").depends_on([fan[3]]).run_anyway())?;
    run(&h, other, Outcome::Complete(None))?;
    run(&h, a, Outcome::fail("boom"))?;

    let cancelled: Vec<i64> = fan
        .iter()
        .chain(&children)
        .chain([&join, &deep])
        .copied()
        .collect();
    for &id in &cancelled {
        let record = h.record(id)?;
        assert_eq!(record.state, JobState::CANCELLED, "job {id}");
        assert_eq!(record.errors.len(), 1, "job {id}: {:?}", record.errors);
        let message = &record.errors[0].message;
        assert!(message.contains("ended"), "job {id}: {message}");
    }
    assert!(h.record(join)?.errors[0]
        .message
        .contains("ended cancelled"));
    assert_eq!(h.state(anyway)?, JobState::Available, "run anyway");
    assert_eq!(h.count("SELECT count(*) FROM backlog_pending")?, 0);
    assert_eq!(
        h.count("SELECT count(*) FROM backlog_dependencies WHERE cancelled")?,
        i64::try_from(cancelled.len())?,
        "one marked edge per cancelled job"
    );

    h.queue.retry(a)?;
    for &id in &cancelled {
        assert_eq!(h.state(id)?, JobState::Pending, "job {id}");
    }
    run(&h, a, Outcome::Complete(None))?;
    for &id in &fan {
        assert_eq!(h.state(id)?, JobState::Available, "job {id}");
    }
    Ok(())
}

fn run_anyway_releases_the_dependent_whatever_its_dependency_ended(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let cleanup = enqueue(&h, job("cleanup").depends_on([a]).run_anyway())?;
    let strict = enqueue(&h, job("strict").depends_on([a]))?;
    run(&h, a, Outcome::Discard("gave up".into()))?;
    assert_eq!(h.state(cleanup)?, JobState::Available);
    assert_eq!(h.state(strict)?, JobState::CANCELLED);
    Ok(())
}

fn an_unknown_dependency_is_refused_and_nothing_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let unknown = a + 1000;
    let err = h
        .queue
        .enqueue_many([job("x"), job("y").depends_on([a, unknown])])
        .expect_err("an unknown id is refused");
    assert!(
        matches!(err, Error::UnknownDependency { job_id } if job_id == unknown),
        "{err:?}"
    );
    assert_eq!(h.live_rows()?, 1, "only the first job, enqueued before");
    assert_eq!(h.count("SELECT count(*) FROM backlog_pending")?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_dependencies")?, 0);
    Ok(())
}

/// The servers plan a whole `enqueue_many` (and release a whole
/// `complete_many`) at once: every case of the one-job scenarios above in
/// one batch, including jobs of the batch waiting on jobs of the batch that
/// wait themselves or were cancelled at enqueue, and a dependent of two jobs
/// completed in one transaction.
fn a_batch_of_dependents_waits_and_is_released_as_each_job_alone_would(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let done = enqueue(&h, job("a"))?;
    run(&h, done, Outcome::Complete(None))?;
    let failed = enqueue(&h, job("a"))?;
    run(&h, failed, Outcome::Discard("no".into()))?;
    let r1 = enqueue(&h, job("root"))?;
    let r2 = enqueue(&h, job("root"))?;
    let flow = h.queue.enqueue_workflow(
        backlog::Workflow::new("batch")
            .step("x", job("x").depends_on([r1]))
            .step("y", job("y").depends_on([r1, r2]))
            .step("z", job("z").depends_on([done]))
            .step("c", job("c").depends_on([done, failed]))
            .step_after("after-c", job("after-c"), &["c"])
            .step_after_anyway("anyway-c", job("anyway-c"), &["c"])
            .step_after("after-x", job("after-x"), &["x"])
            .step_after("after-z", job("after-z"), &["z"]),
    )?;
    let id = |name: &str| flow.step(name).ok_or(format!("no step {name}"));
    for (name, state) in [
        ("x", JobState::Pending),
        ("y", JobState::Pending),
        ("z", JobState::Available),
        ("c", JobState::CANCELLED),
        ("after-c", JobState::CANCELLED),
        ("anyway-c", JobState::Available),
        ("after-x", JobState::Pending),
        ("after-z", JobState::Pending),
    ] {
        assert_eq!(h.state(id(name)?)?, state, "step {name} after enqueue");
    }
    assert_eq!(h.count("SELECT count(*) FROM backlog_pending")?, 4);

    let mut roots = Vec::new();
    for j in h.lease("w", 100)? {
        if j.id == r1 || j.id == r2 {
            roots.push(j);
        } else {
            h.queue.release(&j)?;
        }
    }
    assert_eq!(roots.len(), 2);
    for result in h.queue.complete_many(&roots)? {
        result?;
    }
    assert_eq!(h.state(id("x")?)?, JobState::Available);
    assert_eq!(
        h.state(id("y")?)?,
        JobState::Available,
        "both of its edges counted"
    );
    assert_eq!(h.state(id("after-x")?)?, JobState::Pending);
    run(&h, id("x")?, Outcome::Complete(None))?;
    assert_eq!(h.state(id("after-x")?)?, JobState::Available);
    assert_eq!(
        h.count("SELECT count(*) FROM backlog_pending")?,
        1,
        "after-z"
    );
    Ok(())
}

fn a_dependency_with_a_unique_key_or_a_group_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    for bad in [
        job("b").depends_on([a]).unique_key("k"),
        job("b").depends_on([a]).group(backlog::Group::new("g")),
    ] {
        let err = h.queue.enqueue(bad).expect_err("refused");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

fn an_operator_cancel_or_delete_of_a_waiting_job_cancels_what_waits_on_it(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let p = enqueue(&h, job("p").depends_on([a]))?;
    let q = enqueue(&h, job("q").depends_on([p]))?;
    h.queue.cancel(p)?;
    assert_eq!(h.state(p)?, JobState::CANCELLED);
    assert_eq!(h.state(q)?, JobState::CANCELLED);

    let r = enqueue(&h, job("r").depends_on([a]))?;
    let s = enqueue(&h, job("s").depends_on([r]))?;
    h.queue.delete(r)?;
    assert!(matches!(h.queue.get(r), Err(Error::NotFound { .. })));
    assert_eq!(h.state(s)?, JobState::CANCELLED);

    let t = enqueue(&h, job("t").depends_on([a]))?;
    h.queue.delete(a)?;
    assert_eq!(h.state(t)?, JobState::CANCELLED, "a deleted dependency");
    Ok(())
}

fn pending_jobs_are_listed_and_counted(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let p = enqueue(&h, job("p").depends_on([a]))?;
    let page = h.queue.list(&JobFilter::new(JobState::Pending))?;
    assert_eq!(page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![p]);
    let counts = h.queue.counts()?;
    let pending = counts
        .iter()
        .find(|c| c.state == JobState::Pending)
        .map_or(0, |c| c.count);
    assert_eq!(pending, 1);
    assert_eq!(h.queue.stats()?.iter().map(|s| s.pending).sum::<u64>(), 1);
    Ok(())
}

fn a_retried_dependency_brings_back_the_dependents_it_cancelled(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a = enqueue(&h, job("a"))?;
    let other = enqueue(&h, job("other"))?;
    let b1 = enqueue(&h, job("b").depends_on([a, other]))?;
    let c = enqueue(&h, job("c").depends_on([b1]))?;
    run(&h, other, Outcome::Complete(None))?;
    run(&h, a, Outcome::Discard("bad input".into()))?;
    assert_eq!(h.state(c)?, JobState::CANCELLED);
    h.queue.retry(a)?;
    assert_eq!(h.state(a)?, JobState::Available);
    assert_eq!(h.state(b1)?, JobState::Pending);
    assert_eq!(h.state(c)?, JobState::Pending);
    run(&h, a, Outcome::Complete(None))?;
    assert_eq!(h.state(b1)?, JobState::Available, "`other` counted already");
    run(&h, b1, Outcome::Complete(None))?;
    assert_eq!(h.state(c)?, JobState::Available);
    Ok(())
}

// ---- wake-ups ------------------------------------------------------------
//
// As `wake_up.rs` for an enqueue. The workers' idle poll is 60 s: an idle
// worker polls 6 s after it started, then 12 s later (at 18 s), since the
// wait starts at a tenth of the interval and doubles. The dependencies are
// completed (here, or by another process) from 7 s on, between those two
// polls, and must all be completed by 16 s. Each dependent must start
// within a second: only the release's wake-up can explain that. Each
// dependent has a queue and a worker of its own (see `wake_up.rs`). The
// 9 s between the first completion and the guard leave room for a loaded
// machine: at 3.5 s with 0.5 s to spare, CI once completed the roots late.

/// When the child starts completing (unix µs, the machine's clock).
const RELEASE_AT: &str = "BACKLOG_RELEASE_AT";
const CHAINS: usize = 8;
const POLL: Duration = Duration::from_secs(60);
const COMPLETE_AFTER: Duration = Duration::from_secs(7);
/// The roots must all be completed this long after the workers started:
/// the second idle poll (18 s), less the bound, less a second for starting
/// the workers one after another.
const COMPLETED_BY: Duration = Duration::from_secs(16);
const SPACING: Duration = Duration::from_millis(250);
const BOUND: Duration = Duration::from_secs(1);

fn unix_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Completes the roots one by one from `at`, each printed with the time
/// just before its completion: here or in the child process.
fn complete_roots(queue: &backlog::Queue, at: i64) -> TestResult<Vec<(i64, i64)>> {
    let wait = u64::try_from(at - unix_micros()).unwrap_or(0);
    thread::sleep(Duration::from_micros(wait));
    let mut done = Vec::new();
    for _ in 0..CHAINS {
        let job = queue
            .lease(&LeaseRequest::new("releaser", 1).queues(["roots"]))?
            .pop()
            .ok_or("no root left")?;
        let before = unix_micros();
        queue.complete(&job, None)?;
        println!("completed {} {before}", job.id);
        done.push((job.id, before));
        thread::sleep(SPACING);
    }
    Ok(done)
}

/// The child's entry point; without [`RELEASE_AT`] it returns at once.
#[test]
#[ignore = "a child process of the release wake-up scenario"]
fn releaser_child() -> TestResult {
    let Ok(at) = std::env::var(RELEASE_AT) else {
        return Ok(());
    };
    let (queue, _) = child_queue(QueueOptions::new())?.ok_or("no database given")?;
    complete_roots(&queue, at.parse()?)?;
    Ok(())
}

/// Enqueues the chains, starts a worker per dependent, lets `release`
/// complete the roots from 7 s on, and checks that each dependent started
/// within the bound of its root's completion.
fn released_jobs_start_within_the_bound(
    b: &Backend,
    release: impl FnOnce(&Harness, i64) -> TestResult<Vec<(i64, i64)>>,
) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let mut dependent_of = Vec::new();
    for i in 0..CHAINS {
        let root = h.queue.enqueue(job("root").queue("roots"))?.id;
        let dependent = h
            .queue
            .enqueue(job("k").queue(format!("released-{i}")).depends_on([root]))?
            .id;
        dependent_of.push((root, dependent));
    }
    let (started, starts) = crossbeam_channel::unbounded();
    let workers = (0..CHAINS)
        .map(|i| {
            let started = started.clone();
            Worker::builder(h.queue.clone())
                .queues([format!("released-{i}")])
                .poll_interval(POLL)
                .concurrency(1)
                .handle_raw("k", move |_: Value, ctx| {
                    let _ = started.send((ctx.id(), unix_micros()));
                    Ok(())
                })
                .start()
        })
        .collect::<backlog::Result<Vec<_>>>()?;
    let worker_started = unix_micros();
    let completed = release(
        &h,
        worker_started + i64::try_from(COMPLETE_AFTER.as_micros())?,
    )?;
    assert_eq!(completed.len(), CHAINS);
    let last = completed.iter().map(|c| c.1).max().unwrap_or(0);
    assert!(
        last - worker_started < i64::try_from(COMPLETED_BY.as_micros())?,
        "the roots completed too late; the scenario proves nothing"
    );
    let mut seen = Vec::new();
    while seen.len() < CHAINS {
        seen.push(starts.recv_timeout(Duration::from_secs(15))?);
    }
    for worker in workers {
        worker.shutdown(Duration::from_secs(5))?;
    }
    for (root, completed_at) in completed {
        let dependent = dependent_of
            .iter()
            .find(|(r, _)| *r == root)
            .ok_or("unknown root")?
            .1;
        let (_, started_at) = seen
            .iter()
            .find(|(s, _)| *s == dependent)
            .ok_or("a dependent never started")?;
        let waited = Duration::from_micros(u64::try_from(started_at - completed_at)?);
        assert!(
            waited < BOUND,
            "job {dependent} started {waited:?} after its dependency completed: \
             it waited for the idle poll"
        );
    }
    Ok(())
}

fn a_job_released_in_this_process_starts_before_the_idle_poll(b: &Backend) -> TestResult {
    released_jobs_start_within_the_bound(b, |h, at| complete_roots(&h.queue, at))
}

fn a_job_released_by_another_process_starts_before_the_idle_poll(b: &Backend) -> TestResult {
    released_jobs_start_within_the_bound(b, |h, at| {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args([
                "--exact",
                "dependencies::releaser_child",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(RELEASE_AT, at.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in h.child_env() {
            command.env(k, v);
        }
        let output = command.spawn()?.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "releaser failed: {stdout}");
        stdout
            .lines()
            .filter_map(|l| l.split_once("completed ").map(|(_, rest)| rest))
            .map(|l| -> TestResult<(i64, i64)> {
                let (id, at) = l.split_once(' ').ok_or("bad releaser line")?;
                Ok((id.parse()?, at.parse()?))
            })
            .collect()
    })
}

conformance!(
    a_job_released_in_this_process_starts_before_the_idle_poll,
    a_job_released_by_another_process_starts_before_the_idle_poll,
    a_dependent_is_pending_and_never_leased_until_its_dependency_completes,
    a_released_job_with_a_delay_waits_for_its_time,
    a_released_job_with_a_delay_starts_when_due_not_at_the_idle_poll,
    fan_in_waits_for_every_dependency_and_fan_out_releases_every_dependent,
    a_dependency_finished_at_enqueue_counts_at_once,
    a_dependency_that_does_not_complete_cancels_its_dependents_in_cascade,
    a_wide_cascade_cancels_every_level_and_a_retry_brings_it_back,
    run_anyway_releases_the_dependent_whatever_its_dependency_ended,
    an_unknown_dependency_is_refused_and_nothing_is_written,
    a_batch_of_dependents_waits_and_is_released_as_each_job_alone_would,
    a_dependency_with_a_unique_key_or_a_group_is_refused,
    an_operator_cancel_or_delete_of_a_waiting_job_cancels_what_waits_on_it,
    pending_jobs_are_listed_and_counted,
    a_retried_dependency_brings_back_the_dependents_it_cancelled,
);
