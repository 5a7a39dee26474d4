//! The live-worker registry: a started worker is listed with what it serves
//! and the jobs it holds; a shut-down worker is gone; a worker whose
//! heartbeat stopped ages out and maintenance deletes its row; a due job of
//! a kind no live worker handles is flagged until a worker for it starts,
//! unless its queue is paused.
//! Time is the harness's manual clock.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use backlog::{Event, NewJob, QueueLimits, Rate, Worker, EXPIRY_HEARTBEATS};
use serde_json::json;

use crate::harness::{Backend, TestResult};

conformance!(
    a_started_worker_is_listed_with_its_queues_kinds_and_running_jobs,
    a_shut_down_worker_is_gone,
    a_worker_whose_heartbeat_stopped_ages_out_and_maintenance_deletes_it,
    a_due_job_no_live_worker_handles_is_flagged_until_a_worker_for_it_starts,
    the_metrics_count_live_workers_and_unhandled_jobs,
);

const WAIT: Duration = Duration::from_secs(20);

fn a_started_worker_is_listed_with_its_queues_kinds_and_running_jobs(
    backend: &Backend,
) -> TestResult {
    let h = backend.harness()?;
    let events = h.queue.subscribe();
    let (release, held) = mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let worker = Worker::builder(h.queue.clone())
        .worker_id("registry-a")
        .queues(["mail", "default"])
        .concurrency(3)
        .handle_raw("send", move |_, _| {
            let _ = held.lock().map(|rx| rx.recv_timeout(WAIT));
            Ok(())
        })
        .handle_raw("bounce", |_, _| Ok(()))
        .start()?;
    let id = h
        .queue
        .enqueue(NewJob::new("send", json!({})).queue("mail"))?
        .id;
    loop {
        if let Event::Started { job_id, .. } = events.recv_timeout(WAIT)? {
            if job_id == id {
                break;
            }
        }
    }

    let workers = h.queue.workers()?;
    assert_eq!(workers.len(), 1, "{workers:?}");
    let w = &workers[0];
    assert_eq!(w.id, "registry-a");
    assert_eq!(w.queues, ["default", "mail"]);
    assert_eq!(w.kinds, ["bounce", "send"]);
    assert_eq!(w.concurrency, 3);
    assert_eq!(w.pid, std::process::id());
    assert!(!w.host.is_empty());
    assert_eq!(w.started_at, h.now());
    assert!(w.heartbeat_at >= w.started_at);
    assert!(w.expires_at > h.now());
    let running: Vec<(i64, &str, &str)> = w
        .running
        .iter()
        .map(|j| (j.id, j.queue.as_str(), j.kind.as_str()))
        .collect();
    assert_eq!(running, [(id, "mail", "send")]);

    release.send(())?;
    worker.shutdown(WAIT)?;
    Ok(())
}

fn a_shut_down_worker_is_gone(backend: &Backend) -> TestResult {
    let h = backend.harness()?;
    let worker = Worker::builder(h.queue.clone())
        .worker_id("registry-b")
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    assert_eq!(h.queue.workers()?.len(), 1);
    worker.shutdown(WAIT)?;
    assert!(h.queue.workers()?.is_empty());
    assert_eq!(h.count("SELECT count(*) FROM backlog_workers")?, 0);
    Ok(())
}

fn a_worker_whose_heartbeat_stopped_ages_out_and_maintenance_deletes_it(
    backend: &Backend,
) -> TestResult {
    let h = backend.harness()?;
    // Its heartbeat is an hour of real time away: on the manual clock it
    // stops beating, as a crashed worker's would.
    let beat = Duration::from_secs(3600);
    let stalled = Worker::builder(h.queue.clone())
        .worker_id("registry-stalled")
        .lease_ttl(2 * beat)
        .heartbeat_interval(beat)
        .rescue_interval(Duration::from_secs(3600))
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    let listed = h.queue.workers()?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].expires_at, h.now() + EXPIRY_HEARTBEATS * beat);

    h.advance(EXPIRY_HEARTBEATS * beat - Duration::from_secs(1));
    assert_eq!(h.queue.workers()?.len(), 1, "live until its expiry");
    h.advance(Duration::from_secs(1));
    // Its own maintenance thread makes a first pass at start, which may run
    // only now, on the moved clock, and delete the row: the listing must
    // leave it out either way, and maintenance (its own or the sweeper's)
    // must delete it.
    let rows = h.count("SELECT count(*) FROM backlog_workers")?;
    assert!(
        h.queue.workers()?.is_empty(),
        "gone at its expiry ({rows} row)"
    );

    // Another worker's maintenance deletes the expired row.
    let sweeper = Worker::builder(h.queue.clone())
        .worker_id("registry-sweeper")
        .rescue_interval(Duration::from_millis(20))
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    let deadline = Instant::now() + WAIT;
    while h.count("SELECT count(*) FROM backlog_workers WHERE id = 'registry-stalled'")? > 0 {
        assert!(
            Instant::now() < deadline,
            "maintenance never deleted the row"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ids: Vec<String> = h.queue.workers()?.into_iter().map(|w| w.id).collect();
    assert_eq!(ids, ["registry-sweeper"]);
    sweeper.shutdown(WAIT)?;
    stalled.shutdown(WAIT)?;
    Ok(())
}

fn a_due_job_no_live_worker_handles_is_flagged_until_a_worker_for_it_starts(
    backend: &Backend,
) -> TestResult {
    let h = backend.harness()?;
    h.queue.enqueue_many([
        NewJob::new("orphan", json!(1)),
        NewJob::new("orphan", json!(2)),
    ])?;
    h.queue
        .enqueue(NewJob::new("later", json!({})).delay(Duration::from_secs(60)))?;
    let flagged = |h: &crate::harness::Harness| -> TestResult<Vec<(String, String, u64)>> {
        Ok(h.queue
            .unhandled()?
            .into_iter()
            .map(|u| (u.queue, u.kind, u.due))
            .collect())
    };
    // No worker at all: every due job waits for nobody; the scheduled one
    // is not due.
    assert_eq!(flagged(&h)?, [("default".into(), "orphan".into(), 2)]);
    let stats = h.queue.stats()?;
    assert_eq!(stats[0].queue, "default");
    assert_eq!(stats[0].unhandled.len(), 1);
    assert_eq!(
        (
            stats[0].unhandled[0].kind.as_str(),
            stats[0].unhandled[0].due
        ),
        ("orphan", 2)
    );

    // A paused queue's due jobs wait for the queue, not for a worker.
    h.queue.pause("default")?;
    assert!(flagged(&h)?.is_empty(), "paused");
    assert!(h.queue.stats()?.iter().all(|s| s.unhandled.is_empty()));
    h.queue.resume("default")?;
    assert_eq!(flagged(&h)?, [("default".into(), "orphan".into(), 2)]);

    let other_kind = Worker::builder(h.queue.clone())
        .worker_id("registry-other-kind")
        .handle_raw("something-else", |_, _| Ok(()))
        .start()?;
    let other_queue = Worker::builder(h.queue.clone())
        .worker_id("registry-other-queue")
        .queues(["elsewhere"])
        .handle_raw("orphan", |_, _| Ok(()))
        .start()?;
    assert_eq!(
        flagged(&h)?,
        [("default".into(), "orphan".into(), 2)],
        "neither handles orphan on default"
    );

    // One start per hour (the clock stands still): the handler runs one
    // orphan, the other stays due, with a live worker for it.
    h.queue.set_limits(
        "default",
        QueueLimits {
            rate: Some(Rate::per_hour(1)),
            ..QueueLimits::default()
        },
    )?;
    let (ran, runs) = mpsc::channel();
    let handler = Worker::builder(h.queue.clone())
        .worker_id("registry-handler")
        .handle_raw("orphan", move |_, _| {
            ran.send(()).ok();
            Ok(())
        })
        .start()?;
    runs.recv_timeout(WAIT)?;
    assert!(flagged(&h)?.is_empty());
    assert!(h.queue.stats()?.iter().all(|s| s.unhandled.is_empty()));

    // Once it is gone, the one left is flagged again.
    handler.shutdown(WAIT)?;
    assert_eq!(flagged(&h)?, [("default".into(), "orphan".into(), 1)]);
    other_kind.shutdown(WAIT)?;
    other_queue.shutdown(WAIT)?;
    Ok(())
}

fn the_metrics_count_live_workers_and_unhandled_jobs(backend: &Backend) -> TestResult {
    let h = backend.harness()?;
    h.queue.enqueue(NewJob::new("orphan", json!({})))?;
    h.queue.enqueue(NewJob::new("k", json!({})))?;
    let worker = Worker::builder(h.queue.clone())
        .worker_id("registry-metrics")
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    let text = h.queue.metrics()?;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.contains(&"backlog_workers 1"), "{text}");
    assert!(
        lines.contains(&r#"backlog_unhandled_jobs{queue="default",kind="orphan"} 1"#),
        "{text}"
    );
    assert!(!text.contains(r#"kind="k"}"#), "k has a worker: {text}");
    worker.shutdown(WAIT)?;
    let text = h.queue.metrics()?;
    assert!(text.lines().any(|l| l == "backlog_workers 0"), "{text}");
    Ok(())
}
