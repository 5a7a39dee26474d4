//! Inspection and operator actions: get, list, counts, cancel, delete, prune.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use backlog::{
    CancelOutcome, Error, FinalStatus, JobFilter, JobState, LeaseRequest, NewJob, Retention,
    StateCount,
};
use serde_json::json;

use crate::harness::{Backend, TestResult};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn get_finds_live_and_finished_jobs_and_unknown_ids_are_not_found(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let live = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let done = h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let jobs = h.lease("w", 2)?;
    h.queue.complete(&jobs[1], None)?;
    assert_eq!(h.record(live.id)?.state, JobState::Running);
    assert_eq!(
        h.record(done.id)?.state,
        JobState::Finished(FinalStatus::Completed)
    );
    let err = h.queue.get(done.id + 1000).unwrap_err();
    assert!(
        matches!(err, Error::NotFound { job_id } if job_id == done.id + 1000),
        "{err:?}"
    );
    Ok(())
}

fn cancel_of_a_queued_job_moves_it_to_cancelled(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let available = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let scheduled = h
        .queue
        .enqueue(NewJob::new("k", json!(2)).delay(Duration::from_secs(60)))?;
    assert_eq!(h.queue.cancel(available.id)?, CancelOutcome::Cancelled);
    assert_eq!(h.queue.cancel(scheduled.id)?, CancelOutcome::Cancelled);
    for id in [available.id, scheduled.id] {
        let record = h.record(id)?;
        assert_eq!(record.state, JobState::Finished(FinalStatus::Cancelled));
        assert_eq!(record.finished_at, Some(h.now()));
    }
    assert_eq!(h.live_rows()?, 0);
    h.advance(Duration::from_secs(60));
    assert!(h.lease("w", 10)?.is_empty());
    // A finished job cannot be cancelled again.
    let err = h.queue.cancel(available.id).unwrap_err();
    assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    Ok(())
}

fn cancel_of_a_running_job_is_requested_reported_by_heartbeat_and_honoured_on_fail(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    assert_eq!(h.queue.cancel(enqueued.id)?, CancelOutcome::Requested);

    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Running);
    assert!(record.cancel_requested);
    let report = h.queue.heartbeat(&[job.lease()], Duration::from_secs(30))?;
    assert_eq!(report.cancel_requested, vec![enqueued.id]);
    assert_eq!(report.extended, vec![job.lease()]);

    // The handler stops and reports an error: the cancel wins over a retry.
    h.queue.fail(&job, "interrupted")?;
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Cancelled));
    assert!(record.cancel_requested);
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

fn cancel_requested_job_that_completes_anyway_is_completed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    assert_eq!(h.queue.cancel(enqueued.id)?, CancelOutcome::Requested);
    h.queue.complete(&job, None)?;
    assert_eq!(
        h.state(enqueued.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn delete_removes_live_and_finished_jobs(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let queued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let running = h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let finished = h.queue.enqueue(NewJob::new("k", json!(3)))?;
    let jobs = h.lease("w", 3)?;
    let running_job = jobs.iter().find(|j| j.id == running.id).ok_or("no job")?;
    let finished_job = jobs.iter().find(|j| j.id == finished.id).ok_or("no job")?;
    h.queue.complete(finished_job, None)?;
    h.queue
        .release(jobs.iter().find(|j| j.id == queued.id).ok_or("no job")?)?;

    for id in [queued.id, running.id, finished.id] {
        h.queue.delete(id)?;
        assert!(matches!(h.queue.get(id), Err(Error::NotFound { .. })));
    }
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.history_rows()?, 0);
    // The worker that was running a deleted job finds its lease gone.
    let err = h.queue.complete(running_job, None).unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(h.history_rows()?, 0);
    Ok(())
}

fn list_filters_by_state_queue_and_kind(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    let a_email = q.enqueue(NewJob::new("email", json!(1)).queue("a"))?;
    let a_resize = q.enqueue(NewJob::new("resize", json!(2)).queue("a"))?;
    let b_email = q.enqueue(NewJob::new("email", json!(3)).queue("b"))?;
    let later = q.enqueue(
        NewJob::new("email", json!(4))
            .queue("a")
            .delay(Duration::from_secs(60)),
    )?;
    let running = q
        .lease(&LeaseRequest::new("w", 1).queues(["b"]))?
        .pop()
        .ok_or("no job")?;
    assert_eq!(running.id, b_email.id);

    let ids = |filter: JobFilter| -> TestResult<Vec<i64>> {
        Ok(q.list(&filter)?.jobs.iter().map(|j| j.id).collect())
    };
    assert_eq!(
        ids(JobFilter::new(JobState::Available))?,
        vec![a_email.id, a_resize.id]
    );
    assert_eq!(
        ids(JobFilter::new(JobState::Available).kind("email"))?,
        vec![a_email.id]
    );
    assert!(ids(JobFilter::new(JobState::Available).queue("b"))?.is_empty());
    assert_eq!(ids(JobFilter::new(JobState::Running))?, vec![b_email.id]);
    assert_eq!(
        ids(JobFilter::new(JobState::Scheduled).queue("a"))?,
        vec![later.id]
    );
    q.complete(&running, None)?;
    assert_eq!(
        ids(JobFilter::new(JobState::Finished(FinalStatus::Completed)).queue("b"))?,
        vec![b_email.id]
    );
    assert!(ids(JobFilter::new(JobState::Finished(FinalStatus::Completed)).queue("a"))?.is_empty());
    Ok(())
}

fn list_pages_by_keyset_over_several_pages(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = h
        .queue
        .enqueue_many((0..25).map(|i| NewJob::new("k", json!(i)).queue("pages")))?
        .iter()
        .map(|e| e.id)
        .collect();
    h.queue
        .enqueue_many((0..5).map(|i| NewJob::new("k", json!(i)).queue("other")))?;

    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut filter = JobFilter::new(JobState::Available).queue("pages").limit(10);
    loop {
        let page = h.queue.list(&filter)?;
        sizes.push(page.jobs.len());
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next_after {
            Some(after) => filter = filter.after(after),
            None => break,
        }
    }
    assert_eq!(sizes, vec![10, 10, 5]);
    assert_eq!(seen, ids, "every job once, ascending");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 25);
    Ok(())
}

fn counts_report_every_queue_and_state(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    // Queue a: 2 available, 1 scheduled, 1 retrying, 1 running.
    q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).queue("a")))?;
    q.enqueue(
        NewJob::new("k", json!("later"))
            .queue("a")
            .delay(Duration::from_secs(3600)),
    )?;
    q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).queue("a").priority(9)))?;
    let leased = q.lease(&LeaseRequest::new("w", 2).queues(["a"]))?;
    q.fail(&leased[0], "retry me")?;
    // Queue b: 2 completed, 1 dead, 1 discarded, 1 cancelled.
    q.enqueue_many((0..4).map(|i| NewJob::new("k", json!(i)).queue("b").max_attempts(1)))?;
    let cancelled = q.enqueue(NewJob::new("k", json!("c")).queue("b"))?;
    q.cancel(cancelled.id)?;
    let b = q.lease(&LeaseRequest::new("w", 4).queues(["b"]))?;
    q.complete(&b[0], None)?;
    q.complete(&b[1], None)?;
    q.fail(&b[2], "dead")?;
    q.discard(&b[3], "bad")?;

    let count = |queue: &str, state: JobState, count: u64| StateCount {
        queue: queue.to_owned(),
        state,
        count,
    };
    assert_eq!(
        q.counts()?,
        vec![
            count("a", JobState::Available, 2),
            count("a", JobState::Scheduled, 1),
            count("a", JobState::Retrying, 1),
            count("a", JobState::Running, 1),
            count("b", JobState::Finished(FinalStatus::Completed), 2),
            count("b", JobState::Finished(FinalStatus::Discarded), 1),
            count("b", JobState::Finished(FinalStatus::Cancelled), 1),
            count("b", JobState::Finished(FinalStatus::Dead), 1),
        ]
    );
    // Time moves the scheduled and retrying jobs to available.
    h.advance(Duration::from_secs(3600));
    assert_eq!(
        q.counts()?[..2],
        [
            count("a", JobState::Available, 4),
            count("a", JobState::Running, 1)
        ]
    );
    Ok(())
}

fn prune_history_deletes_expired_rows_in_small_batches(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..5).map(|i| NewJob::new("k", json!(i))))?;
    let old = h.lease("w", 5)?;
    for job in &old {
        h.queue.complete(job, None)?;
    }
    h.advance(6 * DAY);
    let fresh = h.queue.enqueue(NewJob::new("k", json!("fresh")))?;
    let job = h.lease_one("w")?;
    h.queue.complete(&job, None)?;

    let retention = Retention::default();
    assert_eq!(h.queue.prune_history(&retention, 2)?, 0, "not 7 days yet");
    h.advance(DAY + Duration::from_secs(1));
    assert_eq!(h.queue.prune_history(&retention, 2)?, 2);
    assert_eq!(h.queue.prune_history(&retention, 2)?, 2);
    assert_eq!(h.queue.prune_history(&retention, 2)?, 1);
    assert_eq!(h.queue.prune_history(&retention, 2)?, 0);
    assert_eq!(h.history_rows()?, 1);
    assert_eq!(
        h.state(fresh.id)?,
        JobState::Finished(FinalStatus::Completed)
    );
    for job in &old {
        assert!(matches!(h.queue.get(job.id), Err(Error::NotFound { .. })));
    }
    Ok(())
}

fn prune_history_keeps_each_status_for_its_own_retention(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue
        .enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).max_attempts(1)))?;
    let jobs = h.lease("w", 2)?;
    h.queue.complete(&jobs[0], None)?;
    h.queue.fail(&jobs[1], "dead")?;

    h.advance(31 * DAY);
    let retention = Retention {
        dead: None,
        ..Retention::default()
    };
    assert_eq!(h.queue.prune_history(&retention, 100)?, 1);
    assert_eq!(
        h.state(jobs[1].id)?,
        JobState::Finished(FinalStatus::Dead),
        "None keeps forever"
    );
    assert!(matches!(
        h.queue.get(jobs[0].id),
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

fn run_now_makes_a_scheduled_or_retrying_job_due_and_keeps_its_attempts(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let scheduled = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(3600)))?;
    let retrying = h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let job = h.lease_one("w")?;
    h.queue.fail(&job, "boom")?;
    assert_eq!(h.state(retrying.id)?, JobState::Retrying);
    assert_eq!(h.state(scheduled.id)?, JobState::Scheduled);

    h.queue.run_now(scheduled.id)?;
    h.queue.run_now(retrying.id)?;
    for id in [scheduled.id, retrying.id] {
        let record = h.record(id)?;
        assert_eq!(record.state, JobState::Available);
        assert_eq!(record.available_at, h.now());
    }
    assert_eq!(
        h.record(retrying.id)?.attempts,
        1,
        "the failed attempt is kept"
    );
    assert_eq!(h.lease("w", 10)?.len(), 2);
    Ok(())
}

fn run_now_refuses_running_and_finished_jobs_and_retry_refuses_live_ones(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let running = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let waiting = h
        .queue
        .enqueue(NewJob::new("k", json!(2)).delay(Duration::from_secs(60)))?;
    let job = h.lease_one("w")?;
    let invalid = |r: backlog::Result<()>| match r {
        Err(Error::InvalidState { .. }) => {}
        other => panic!("expected InvalidState, got {other:?}"),
    };
    invalid(h.queue.run_now(running.id));
    invalid(h.queue.retry(running.id));
    invalid(h.queue.retry(waiting.id));
    h.queue.complete(&job, None)?;
    invalid(h.queue.run_now(running.id));
    assert!(matches!(
        h.queue.run_now(waiting.id + 1000),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(h.state(waiting.id)?, JobState::Scheduled);
    Ok(())
}

/// A job moving between tables (a dependent released from waiting into the
/// live jobs, its dependency from the live jobs into the finished ones) is
/// read at one moment: `get` always finds it, and `counts` always adds up
/// to every job. Read a table at a time, a read could land between the move's
/// two halves and miss the job (`wait` then reported `NotFound`).
fn reads_of_jobs_moving_between_tables_see_one_moment(b: &Backend) -> TestResult {
    const ROUNDS: usize = 40;
    let h = b.harness()?;
    let settler = h.second_handle()?;
    for round in 0..ROUNDS {
        let first = h.queue.enqueue(NewJob::new("k", json!(round)))?;
        let dependent = h
            .queue
            .enqueue(NewJob::new("k", json!(round)).depends_on([first.id]))?;
        let leased = h.lease_one("w")?;
        assert_eq!(leased.id, first.id);
        let done = Arc::new(AtomicBool::new(false));
        let settling = {
            let done = Arc::clone(&done);
            let settler = settler.clone();
            thread::spawn(move || {
                let settled = settler.complete(&leased, None);
                done.store(true, Ordering::SeqCst);
                settled
            })
        };
        let total = 2 * (round as u64 + 1);
        // Read while the settle runs, and a few times after it.
        let mut after = 0;
        while after < 3 {
            if done.load(Ordering::SeqCst) {
                after += 1;
            }
            for id in [first.id, dependent.id] {
                if let Err(e) = h.queue.get(id) {
                    return Err(format!("round {round}: get({id}) failed mid-move: {e:?}").into());
                }
            }
            let counted: u64 = h.queue.counts()?.iter().map(|c| c.count).sum();
            assert_eq!(counted, total, "round {round}: counts mid-move");
        }
        settling.join().map_err(|_| "settler panicked")??;
        // The dependent is released: lease and finish it for the next round.
        let next = h.lease_one("w")?;
        assert_eq!(next.id, dependent.id);
        h.queue.complete(&next, None)?;
    }
    Ok(())
}

conformance!(
    run_now_makes_a_scheduled_or_retrying_job_due_and_keeps_its_attempts,
    run_now_refuses_running_and_finished_jobs_and_retry_refuses_live_ones,
    get_finds_live_and_finished_jobs_and_unknown_ids_are_not_found,
    cancel_of_a_queued_job_moves_it_to_cancelled,
    cancel_of_a_running_job_is_requested_reported_by_heartbeat_and_honoured_on_fail,
    cancel_requested_job_that_completes_anyway_is_completed,
    delete_removes_live_and_finished_jobs,
    list_filters_by_state_queue_and_kind,
    list_pages_by_keyset_over_several_pages,
    counts_report_every_queue_and_state,
    reads_of_jobs_moving_between_tables_see_one_moment,
    prune_history_deletes_expired_rows_in_small_batches,
    prune_history_keeps_each_status_for_its_own_retention,
);
