//! `Queue::wait`: the final record of a job, whichever handle, process or
//! node finished it; a timeout; an unknown id.

use std::thread;
use std::time::{Duration, Instant};

use backlog::{Error, FinalStatus, JobState, LeaseRequest, NewJob, Queue};
use serde_json::json;

use crate::harness::{Backend, TestResult};

/// How a test finishes a leased job.
type Finish = fn(&Queue, &backlog::Job) -> backlog::Result<()>;

/// Finishes the only job of `other` after a moment, as `finish` says.
fn finish_later(other: Queue, finish: Finish) -> thread::JoinHandle<backlog::Result<()>> {
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let job = other
            .lease(&LeaseRequest::new("elsewhere", 1))?
            .pop()
            .ok_or(Error::NotFound { job_id: 0 })?;
        finish(&other, &job)
    })
}

fn wait_returns_the_final_record_finished_through_other_connections(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let cases: [(FinalStatus, Finish); 4] = [
        (FinalStatus::Completed, |q, j| {
            q.complete(j, Some(json!({"answer": 42})))
        }),
        (FinalStatus::Dead, |q, j| q.fail(j, "fatal")),
        (FinalStatus::Discarded, |q, j| q.discard(j, "unwanted")),
        (FinalStatus::Cancelled, |q, j| {
            q.release(j)?;
            q.cancel(j.id).map(|_| ())
        }),
    ];
    for (status, finish) in cases {
        let job = h
            .queue
            .enqueue(NewJob::new("k", json!(1)).max_attempts(1))?;
        // Another handle (its own connections and events): another process.
        let other = h.second_handle()?;
        let finisher = finish_later(other, finish);
        let record = h.queue.wait(job.id, Duration::from_secs(20))?;
        finisher.join().map_err(|_| "finisher panicked")??;
        assert_eq!(record.id, job.id);
        assert_eq!(record.state, JobState::Finished(status), "{status:?}");
        if status == FinalStatus::Completed {
            let result: serde_json::Value =
                serde_json::from_str(record.result.as_deref().ok_or("no result")?)?;
            assert_eq!(result, json!({"answer": 42}));
        }
    }
    Ok(())
}

fn wait_on_an_unfinished_job_times_out_and_on_an_unknown_id_is_not_found(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let start = Instant::now();
    let err = h
        .queue
        .wait(job.id, Duration::from_millis(300))
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { job_id } if job_id == job.id),
        "{err:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(h.state(job.id)?, JobState::Available);
    let err = h
        .queue
        .wait(job.id + 1000, Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    Ok(())
}

fn wait_on_a_finished_job_returns_at_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let leased = h.lease_one("w")?;
    h.queue.complete(&leased, None)?;
    let record = h.queue.wait(job.id, Duration::ZERO)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    Ok(())
}

conformance!(
    wait_returns_the_final_record_finished_through_other_connections,
    wait_on_an_unfinished_job_times_out_and_on_an_unknown_id_is_not_found,
    wait_on_a_finished_job_returns_at_once,
);
