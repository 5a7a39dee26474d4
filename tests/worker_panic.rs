//! A handler that panics: the attempt is recorded with the panic's message,
//! and the handler threads go on to complete every other job.

mod worker_common;

use backlog::{Event, NewJob, Worker};
use serde_json::json;
use worker_common::*;

#[test]
fn a_panicking_handler_is_recorded_and_the_pool_completes_the_rest() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();
    // Every fifth job panics on its only attempt.
    let ids = queue
        .enqueue_many((0..40).map(|n| NewJob::new("work", json!({"n": n})).max_attempts(1)))?
        .into_iter()
        .map(|e| e.id)
        .collect::<Vec<_>>();

    // Two threads: each must survive several panics to finish the queue.
    let worker = Worker::builder(queue.clone())
        .concurrency(2)
        .handle(|args: Work, _| {
            if args.n.is_multiple_of(5) {
                panic!("boom on {}", args.n);
            }
            Ok(args.n)
        })
        .start()?;
    let finished = wait_count(&events, ids.len(), PATIENCE, "finished jobs", |e| match e {
        Event::Completed { job_id } | Event::Dead { job_id } => Some(*job_id),
        _ => None,
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(finished.len(), ids.len());
    for (n, id) in ids.iter().enumerate() {
        if n.is_multiple_of(5) {
            let record = expect_state(&queue, *id, "dead")?;
            assert_eq!(record.errors.len(), 1);
            assert_eq!(
                record.errors[0].message,
                format!("handler panicked: boom on {n}")
            );
        } else {
            let record = expect_state(&queue, *id, "completed")?;
            assert_eq!(record.result, Some(n.to_string()));
        }
    }
    Ok(())
}
