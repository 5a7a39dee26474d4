//! `Queue::finished_per_minute`: finished jobs per queue, status and minute,
//! the dashboard's throughput chart.

use std::time::Duration;

use backlog::{Error, FinalStatus, FinishedCount, LeaseRequest, NewJob};
use serde_json::json;

use crate::harness::{Backend, TestResult};

const MINUTE: Duration = Duration::from_secs(60);

fn finished_per_minute_counts_each_minute_queue_and_status(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let count = |queue: &str, status, minutes_ago, count| FinishedCount {
        queue: queue.into(),
        status,
        minutes_ago,
        count,
    };
    // Two hours ago: outside the window asked for below.
    h.queue.enqueue(NewJob::new("k", json!(0)))?;
    h.queue.complete(&h.lease_one("w")?, None)?;
    h.advance(2 * 60 * MINUTE);
    // 45 minutes ago: two completed in `a`, one dead in `b`.
    for queue in ["a", "a", "b"] {
        h.queue
            .enqueue(NewJob::new("k", json!(1)).queue(queue).max_attempts(1))?;
    }
    let jobs = h
        .queue
        .lease(&LeaseRequest::new("w", 3).queues(["a", "b"]))?;
    h.queue.complete(&jobs[0], None)?;
    h.queue.complete(&jobs[1], None)?;
    h.queue.fail(&jobs[2], "boom")?;
    h.advance(45 * MINUTE - Duration::from_secs(1));
    // Seconds ago: one discarded in `a`.
    h.queue.enqueue(NewJob::new("k", json!(2)).queue("a"))?;
    let job = h
        .queue
        .lease(&LeaseRequest::new("w", 1).queues(["a"]))?
        .remove(0);
    h.queue.discard(&job, "bad input")?;
    h.advance(Duration::from_secs(1));

    assert_eq!(
        h.queue.finished_per_minute(60)?,
        [
            count("a", FinalStatus::Discarded, 0, 1),
            count("a", FinalStatus::Completed, 45, 2),
            count("b", FinalStatus::Dead, 45, 1),
        ]
    );
    // A shorter window leaves the older minutes out.
    assert_eq!(
        h.queue.finished_per_minute(10)?,
        [count("a", FinalStatus::Discarded, 0, 1)]
    );
    for minutes in [0, 1441] {
        let err = h.queue.finished_per_minute(minutes).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    Ok(())
}

conformance!(finished_per_minute_counts_each_minute_queue_and_status);
