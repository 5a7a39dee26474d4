//! `Queue::find_by_unique_key`: the jobs holding a unique key in a queue,
//! the dashboard's search by key.

use std::time::Duration;

use backlog::{LeaseRequest, NewJob, FIND_UNIQUE_HISTORY};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn find_by_unique_key_returns_the_live_job_then_history_newest_first(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let keyed = |queue: &str| NewJob::new("k", json!(1)).queue(queue).unique_key("INV-7");
    let worker = LeaseRequest::new("w", 1).queues(["a"]).kinds(["k"]);
    let mut finished = Vec::new();
    for _ in 0..2 {
        finished.push(h.queue.enqueue(keyed("a"))?.id);
        h.queue.complete(&h.queue.lease(&worker)?[0], None)?;
        h.advance(Duration::from_secs(1));
    }
    let live = h.queue.enqueue(keyed("a"))?.id;
    let elsewhere = h.queue.enqueue(keyed("b"))?.id;
    h.queue.enqueue(
        NewJob::new("other", json!(2))
            .queue("a")
            .unique_key("INV-8"),
    )?;

    let ids = |queue: &str, key: &str| -> TestResult<Vec<i64>> {
        Ok(h.queue
            .find_by_unique_key(queue, key)?
            .iter()
            .map(|r| r.id)
            .collect())
    };
    assert_eq!(ids("a", "INV-7")?, [live, finished[1], finished[0]]);
    assert_eq!(ids("b", "INV-7")?, [elsewhere]);
    assert_eq!(ids("a", "INV-9")?, Vec::<i64>::new());
    assert_eq!(ids("c", "INV-7")?, Vec::<i64>::new());
    // A deleted job is no longer found.
    h.queue.delete(finished[1])?;
    assert_eq!(ids("a", "INV-7")?, [live, finished[0]]);
    // History is capped, the most recent kept.
    h.queue.delete(live)?;
    for _ in 0..FIND_UNIQUE_HISTORY {
        h.queue.enqueue(keyed("a"))?;
        h.queue.complete(&h.queue.lease(&worker)?[0], None)?;
        h.advance(Duration::from_secs(1));
    }
    let found = ids("a", "INV-7")?;
    assert_eq!(found.len(), FIND_UNIQUE_HISTORY);
    assert!(!found.contains(&finished[0]), "{found:?}");
    Ok(())
}

conformance!(find_by_unique_key_returns_the_live_job_then_history_newest_first);
