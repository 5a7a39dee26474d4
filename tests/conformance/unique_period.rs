//! Unique for a period (`NewJob::unique_for`): a unique key also refuses new
//! jobs while a finished job of the same queue with that key is younger than
//! the period, and two enqueues racing the finish of the job holding the key
//! never both get in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backlog::{FinalStatus, LeaseRequest, NewJob, Queue};
use serde_json::json;

use crate::harness::{Backend, TestResult};

const HOUR: Duration = Duration::from_secs(3600);

fn keyed(key: &str) -> NewJob {
    NewJob::new("digest", json!({}))
        .unique_key(key)
        .unique_for(HOUR)
}

fn a_finished_job_blocks_its_key_until_the_period_has_passed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = h.queue.enqueue(keyed("d-7"))?;
    assert!(!first.existed);
    // Live: refused as today.
    assert_eq!(h.queue.enqueue(keyed("d-7"))?.id, first.id);
    h.queue.complete(&h.lease_one("w")?, None)?;

    // Finished, inside the period: still refused, whatever the status.
    h.advance(Duration::from_secs(59 * 60));
    let again = h.queue.enqueue(keyed("d-7"))?;
    assert_eq!((again.id, again.existed), (first.id, true));
    // Another queue or another key is not blocked.
    assert!(!h.queue.enqueue(keyed("d-7").queue("other"))?.existed);
    assert!(!h.queue.enqueue(keyed("d-8").queue("other"))?.existed);
    // A key without a period only looks at live jobs.
    let live_only = NewJob::new("digest", json!({})).unique_key("d-7");
    let live_only = h.queue.enqueue(live_only)?;
    assert!(!live_only.existed);
    h.queue.delete(live_only.id)?;

    // The window closes once the finished job is older than the period.
    h.advance(Duration::from_secs(2 * 60));
    let later = h.queue.enqueue(keyed("d-7"))?;
    assert!(!later.existed);
    assert_ne!(later.id, first.id);

    // A discarded job holds its key too.
    let job = h.lease_one("w")?;
    assert_eq!(job.id, later.id);
    h.queue.discard(&job, "bad")?;
    assert_eq!(h.queue.enqueue(keyed("d-7"))?.id, later.id);
    Ok(())
}

fn racing_enqueues_never_slip_past_a_job_finishing_inside_the_period(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueuers: Vec<Queue> = (0..3)
        .map(|_| h.second_handle())
        .collect::<TestResult<_>>()?;
    for round in 0..10 {
        let key = format!("race-{round}");
        let holder = h.queue.enqueue(keyed(&key))?.id;
        let job = h
            .queue
            .lease(&LeaseRequest::new("w", 1).kinds(["digest"]))?
            .pop()
            .ok_or("nothing leased")?;
        assert_eq!(job.id, holder);
        let finished = AtomicBool::new(false);
        std::thread::scope(|s| -> TestResult {
            let racers: Vec<_> = enqueuers
                .iter()
                .map(|queue| {
                    let (key, finished) = (&key, &finished);
                    s.spawn(move || -> backlog::Result<Vec<i64>> {
                        let mut ids = Vec::new();
                        // Enqueue until a little after the finish is seen.
                        let mut after = 0;
                        while after < 3 {
                            if finished.load(Ordering::SeqCst) {
                                after += 1;
                            }
                            ids.push(queue.enqueue(keyed(key))?.id);
                        }
                        Ok(ids)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(5));
            h.queue.complete(&job, None)?;
            finished.store(true, Ordering::SeqCst);
            for r in racers {
                let ids = r.join().map_err(|_| "racer panicked")??;
                assert!(ids.iter().all(|&id| id == holder), "round {round}: {ids:?}");
            }
            Ok(())
        })?;
        let holding = h.count(&format!(
            "SELECT count(*) FROM backlog_jobs WHERE unique_key = '{key}'"
        ))?;
        assert_eq!(holding, 0, "round {round}: a job slipped in");
    }
    Ok(())
}

fn unique_states_choose_which_finished_jobs_hold_the_key(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let by_state = || keyed("s-1").unique_states([FinalStatus::Completed]);
    let first = h.queue.enqueue(by_state())?.id;
    h.queue.discard(&h.lease_one("w")?, "bad")?;
    // Without a selection, the discarded job holds the key ...
    assert_eq!(h.queue.enqueue(keyed("s-1"))?.id, first);
    // ... with one that leaves discarded out, a new one gets in.
    let second = h.queue.enqueue(by_state())?;
    assert!(!second.existed);
    assert_ne!(second.id, first);
    h.queue.complete(&h.lease_one("w")?, None)?;
    // A completed one does, for the period.
    assert_eq!(h.queue.enqueue(by_state())?.id, second.id);
    h.advance(HOUR + Duration::from_secs(1));
    assert!(!h.queue.enqueue(by_state())?.existed);
    Ok(())
}

conformance!(
    unique_states_choose_which_finished_jobs_hold_the_key,
    a_finished_job_blocks_its_key_until_the_period_has_passed,
    racing_enqueues_never_slip_past_a_job_finishing_inside_the_period,
);
