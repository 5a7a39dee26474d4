//! The completer's group commit: outcomes settle in batches, but a batch
//! whose outcomes hold handler threads idle (no look-ahead: the commit
//! leases their next jobs) does not wait out its delay for threads still
//! running.

use std::time::{Duration, Instant};

use backlog::{Event, NewJob, Worker};
use crossbeam_channel::bounded;
use serde_json::{json, Value};

use crate::harness::{Backend, TestResult};

/// Far longer than the scenario may take: a batch that waited it out fails.
const DELAY: Duration = Duration::from_secs(60);

fn without_a_look_ahead_an_outcome_is_committed_while_other_handlers_still_run(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let held = h.queue.enqueue(NewJob::new("hold", json!(0)))?;
    let quick = h.queue.enqueue(NewJob::new("quick", json!(0)))?;
    let events = h.queue.subscribe();
    let (holding_tx, holding) = bounded(1);
    let (release, released) = bounded::<()>(1);
    let worker = Worker::builder(h.queue.clone())
        .concurrency(2)
        .prefetch(0)
        .completer_batch(100, DELAY)
        .handle_raw("hold", move |_: Value, _| {
            let _ = holding_tx.try_send(());
            let _ = released.recv_timeout(Duration::from_secs(120));
            Ok(())
        })
        // Ends only once the held job runs: its outcome then always meets a
        // handler still running (a lone outcome is committed at once).
        .handle_raw("quick", move |_: Value, _| {
            holding.recv_timeout(Duration::from_secs(30))?;
            Ok(())
        })
        .start()?;
    // Its completion event is sent after its commit.
    let since = Instant::now();
    let deadline = since + Duration::from_secs(20);
    let committed = loop {
        match events.recv_deadline(deadline) {
            Ok(Event::Completed { job_id }) if job_id == quick.id => break Ok(since.elapsed()),
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    release.send(())?;
    worker.shutdown(Duration::from_secs(10))?;
    let committed = committed.map_err(|_| {
        format!("the quick job's completion was not committed within 20 s of the worker's start (the batch waits out its {DELAY:?} delay)")
    })?;
    println!(
        "group commit ({b:?}): the quick job committed {committed:?} after the worker started"
    );
    assert_eq!(
        h.state(held.id)?,
        backlog::JobState::Finished(backlog::FinalStatus::Completed)
    );
    Ok(())
}

conformance!(without_a_look_ahead_an_outcome_is_committed_while_other_handlers_still_run);
