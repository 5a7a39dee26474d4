//! `Queue::subscribe` is bounded: a subscription holds at most
//! `QueueOptions::event_capacity` unread events, the queue never waits for a
//! subscriber, and one that fell behind is told how many events it missed
//! (`Event::Lagged`) before the next one it receives. Events are the
//! engine's, so every backend behaves the same.

use std::time::Duration;

use backlog::{Error, Event, NewJob, QueueOptions};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn enqueued_id(event: &Event) -> Option<i64> {
    match event {
        Event::Enqueued { job_id, .. } => Some(*job_id),
        _ => None,
    }
}

fn a_slow_subscriber_misses_events_without_blocking_the_queue_and_is_told_how_many(
    b: &Backend,
) -> TestResult {
    let h = b.harness_with(QueueOptions::new().event_capacity(4))?;
    let slow = h.queue.subscribe();
    let fast = h.queue.subscribe();
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(h.queue.enqueue(NewJob::new("k", json!(n)))?.id);
        let seen = fast.recv_timeout(Duration::from_secs(5))?;
        assert_eq!(enqueued_id(&seen), Some(ids[n]), "{seen:?}");
    }
    // A batch far over the bound does not wait for the slow one either.
    let batch = h
        .queue
        .enqueue_many((0..100).map(|n| NewJob::new("k", json!(n))))?;
    assert_eq!(batch.len(), 100);

    let held: Vec<Event> = slow.try_iter().collect();
    let held_ids: Vec<Option<i64>> = held.iter().map(enqueued_id).collect();
    assert_eq!(
        held_ids,
        ids[..4].iter().copied().map(Some).collect::<Vec<_>>()
    );
    let after = h.queue.enqueue(NewJob::new("k", json!("after")))?;
    let told: Vec<Event> = slow.try_iter().collect();
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(told[0], Event::Lagged { missed: 6 + 100 });
    assert_eq!(enqueued_id(&told[1]), Some(after.id));
    Ok(())
}

fn an_event_capacity_of_zero_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    match h.handle_with(QueueOptions::new().event_capacity(0)) {
        Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::InvalidArgument(_))) => Ok(()),
        Err(e) => Err(format!("expected InvalidArgument, got {e:?}").into()),
        Ok(_) => Err("a queue opened with event_capacity(0)".into()),
    }
}

conformance!(
    a_slow_subscriber_misses_events_without_blocking_the_queue_and_is_told_how_many,
    an_event_capacity_of_zero_is_refused,
);
