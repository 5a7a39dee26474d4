//! Prefetch: a worker may lease jobs ahead of its handler threads. Those jobs
//! are leased (running) and heartbeated while they wait, and shutdown
//! releases them with their attempts unchanged. Without a prefetch no more
//! jobs are leased than there are handler threads.

mod worker_common;

use std::time::Duration;

use backlog::{Event, JobFilter, JobState, NewJob, Worker};
use crossbeam_channel::bounded;
use serde_json::json;
use worker_common::*;

fn running(queue: &backlog::Queue) -> TestResult<usize> {
    Ok(queue
        .list(&JobFilter::new(JobState::Running).limit(1000))?
        .jobs
        .len())
}

/// Starts a worker of `threads` blocked handlers with `prefetch`, waits until
/// every thread holds a job and the fetcher has leased what it may, and
/// returns how many jobs are leased.
fn leased_while_blocked(threads: usize, prefetch: usize) -> TestResult<usize> {
    let db = Db::new()?;
    let queue = db.queue()?;
    queue.enqueue_many((0..20).map(|n| NewJob::new("block", json!(n))))?;
    let events = queue.subscribe();
    let (release, blocked) = bounded::<()>(0);
    let worker = Worker::builder(queue.clone())
        .concurrency(threads)
        .prefetch(prefetch)
        .lease_ttl(Duration::from_secs(2))
        .heartbeat_interval(Duration::from_millis(200))
        .handle_raw("block", move |_, _| {
            let _ = blocked.recv();
            Ok(())
        })
        .start()?;
    wait_count(&events, threads, PATIENCE, "starts", started)?;
    // Past the lease TTL: only heartbeats keep the waiting jobs leased.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(queue.rescue(100)?.rescued, 0, "a prefetched lease expired");
    let leased = running(&queue)?;
    worker.shutdown(Duration::from_millis(100))?;
    drop(release);
    Ok(leased)
}

#[test]
fn without_prefetch_no_more_jobs_are_leased_than_handler_threads() -> TestResult {
    let leased = leased_while_blocked(2, 0)?;
    assert_eq!(leased, 2);
    Ok(())
}

#[test]
fn prefetched_jobs_stay_leased_by_heartbeats_and_shutdown_releases_them_unused() -> TestResult {
    let leased = leased_while_blocked(2, 5)?;
    assert_eq!(leased, 2 + 5, "two running, five waiting");

    // A fresh run to check what shutdown leaves behind.
    let db = Db::new()?;
    let queue = db.queue()?;
    let ids: Vec<i64> = (0..10)
        .map(|n| Ok(queue.enqueue(NewJob::new("block", json!(n)))?.id))
        .collect::<TestResult<_>>()?;
    let events = queue.subscribe();
    let worker = Worker::builder(queue.clone())
        .concurrency(1)
        .prefetch(4)
        .handle_raw("block", move |_, ctx| {
            while !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
        .start()?;
    // One lease claims the thread's job and the prefetch together, before
    // the first handler starts.
    wait_for(&events, PATIENCE, "a start", |e| started(e).is_some())?;
    assert_eq!(running(&queue)?, 5);
    worker.shutdown(Duration::from_millis(50))?;
    let releases = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|e| matches!(e, Event::Released { .. }))
        .count();
    assert_eq!(
        releases, 5,
        "the running job and the four waiting are released"
    );
    for id in ids {
        let record = queue.get(id)?;
        assert_eq!(record.state, JobState::Available, "job {id}");
        assert_eq!(record.attempts, 0, "job {id} used no attempt");
    }
    Ok(())
}
