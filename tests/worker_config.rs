//! A worker's settings are checked at start and refused with a typed error,
//! never a panic.

mod worker_common;

use std::time::Duration;

use backlog::{Error, Queue, RetryPolicy, Worker, WorkerBuilder};
use worker_common::*;

fn with_handler(queue: &Queue) -> WorkerBuilder {
    Worker::builder(queue.clone()).handle(|_: Work, _| Ok(()))
}

fn refused(builder: WorkerBuilder) -> TestResult<Error> {
    match builder.start() {
        Ok(_) => Err("start() accepted a bad setting".into()),
        Err(e) => Ok(e),
    }
}

#[test]
fn bad_worker_settings_are_refused_with_typed_errors() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let invalid_argument = |e: Error| matches!(e, Error::InvalidArgument(_));
    let invalid_name = |e: Error| matches!(e, Error::InvalidName { .. });

    assert!(
        invalid_argument(refused(Worker::builder(queue.clone()))?),
        "no handlers"
    );
    assert!(
        invalid_argument(refused(with_handler(&queue).handle(|_: Work, _| Ok(())))?),
        "kind twice"
    );
    assert!(invalid_argument(refused(
        with_handler(&queue).concurrency(0)
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).concurrency(100_000)
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).lease_ttl(Duration::ZERO)
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue)
            .lease_ttl(Duration::from_secs(1))
            .heartbeat_interval(Duration::from_secs(2))
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).queues(Vec::<String>::new())
    )?));
    assert!(invalid_name(refused(
        with_handler(&queue).queues(["ok", ""])
    )?));
    assert!(invalid_name(refused(
        with_handler(&queue).worker_id("bad\nid")
    )?));
    assert!(invalid_name(refused(
        Worker::builder(queue.clone()).handle_raw("", |_, _| Ok(()))
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).timeout_for("no_such_kind", Duration::from_secs(1))
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).retry_policy_for("no_such_kind", RetryPolicy::default())
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).timeout(Duration::ZERO)
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).completer_batch(0, Duration::ZERO)
    )?));
    assert!(invalid_argument(refused(
        with_handler(&queue).watch_interval(Duration::ZERO)
    )?));

    // And the defaults start.
    let worker = with_handler(&queue).start()?;
    assert!(!worker.id().is_empty());
    worker.shutdown(Duration::from_secs(1))?;
    Ok(())
}
