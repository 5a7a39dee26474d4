//! An enqueue by another process wakes an idle worker through
//! `PRAGMA data_version` within milliseconds, far sooner than its idle poll.

mod worker_common;

use std::time::Duration;

use backlog::{Clock, SystemClock, Worker};
use crossbeam_channel::unbounded;
use worker_common::*;

const TEST: &str = "an_enqueue_in_another_process_wakes_an_idle_worker";
const JOBS: u32 = 3;

#[test]
fn an_enqueue_in_another_process_wakes_an_idle_worker() -> TestResult {
    if let Some((_, path)) = child_role() {
        let queue = backlog::Queue::open(path)?;
        for n in 0..JOBS {
            queue.enqueue(Work { n })?;
            std::thread::sleep(Duration::from_millis(300)); // pacing, so the worker idles between
        }
        return Ok(());
    }

    let db = Db::new()?;
    let queue = db.queue()?;
    let poll = Duration::from_secs(60); // idle polls 6 s apart at the soonest
    let (latency_tx, latencies) = unbounded();
    let worker = Worker::builder(queue.clone())
        .poll_interval(poll)
        .handle(move |_: Work, ctx| {
            let waited = SystemClock
                .now()
                .duration_since(ctx.job().created_at)
                .unwrap_or_default()
                .as_micros() as i64;
            let _ = latency_tx.send(Duration::from_micros(waited.max(0) as u64));
            Ok(())
        })
        .start()?;

    let mut child = spawn_child(TEST, "enqueuer", &db)?;
    let mut seen = Vec::new();
    for _ in 0..JOBS {
        seen.push(latencies.recv_timeout(PATIENCE)?);
    }
    child.wait()?;
    worker.shutdown(PATIENCE)?;

    println!("enqueue (other process) to handler start: {seen:?}; idle poll interval {poll:?}");
    for latency in seen {
        assert!(
            latency < Duration::from_secs(1),
            "woken by the poll, not the watcher: {latency:?}"
        );
    }
    Ok(())
}
