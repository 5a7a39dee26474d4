//! Lease: claim order, visibility (delay, pause, kind), and exclusivity.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, SystemTime};

use backlog::{JobState, LeaseRequest, NewJob, Queue};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn ids(jobs: &[backlog::Job]) -> Vec<i64> {
    jobs.iter().map(|j| j.id).collect()
}

fn lease_orders_by_priority_then_available_at_then_id(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    // Due 10 s from now, enqueued first: lowest id, latest available_at.
    let late = q.enqueue(NewJob::new("k", json!("late")).delay(Duration::from_secs(10)))?;
    let early_a = q.enqueue(NewJob::new("k", json!("early a")))?;
    let early_b = q.enqueue(NewJob::new("k", json!("early b")))?;
    let urgent = q.enqueue(NewJob::new("k", json!("urgent")).priority(5))?;
    let low = q.enqueue(NewJob::new("k", json!("low")).priority(-1))?;
    h.advance(Duration::from_secs(10));

    let jobs = h.lease("w", 10)?;
    assert_eq!(
        ids(&jobs),
        vec![urgent.id, early_a.id, early_b.id, late.id, low.id]
    );
    Ok(())
}

fn lease_limit_takes_the_head_of_the_claim_order(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids_in: Vec<i64> = h
        .queue
        .enqueue_many((0..6).map(|i| NewJob::new("k", json!(i)).priority(i % 3)))?
        .iter()
        .map(|e| e.id)
        .collect();
    // priority 2: ids[2], ids[5]; priority 1: ids[1], ids[4]; priority 0: ...
    let first = h.lease("w", 3)?;
    assert_eq!(ids(&first), vec![ids_in[2], ids_in[5], ids_in[1]]);
    let rest = h.lease("w", 10)?;
    assert_eq!(ids(&rest), vec![ids_in[4], ids_in[0], ids_in[3]]);
    assert!(h.lease("w", 10)?.is_empty());
    Ok(())
}

fn lease_orders_across_two_queues_by_priority_then_available_at_then_id(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    let a_late = q.enqueue(
        NewJob::new("k", json!(1))
            .queue("a")
            .delay(Duration::from_secs(5)),
    )?;
    let b_late = q.enqueue(
        NewJob::new("k", json!(2))
            .queue("b")
            .delay(Duration::from_secs(5)),
    )?;
    let b_now = q.enqueue(NewJob::new("k", json!(3)).queue("b"))?;
    let a_now = q.enqueue(NewJob::new("k", json!(4)).queue("a"))?;
    let b_high = q.enqueue(NewJob::new("k", json!(5)).queue("b").priority(9))?;
    let a_mid = q.enqueue(NewJob::new("k", json!(6)).queue("a").priority(4))?;
    let c_top = q.enqueue(NewJob::new("k", json!(7)).queue("c").priority(99))?;
    h.advance(Duration::from_secs(5));

    let request = LeaseRequest::new("w", 4).queues(["a", "b"]);
    let first = q.lease(&request)?;
    assert_eq!(
        ids(&first),
        vec![b_high.id, a_mid.id, b_now.id, a_now.id],
        "the limit applies to the merged order, not per queue"
    );
    let rest = q.lease(&request)?;
    assert_eq!(ids(&rest), vec![a_late.id, b_late.id]);
    // Queue c was never asked for.
    assert_eq!(h.state(c_top.id)?, JobState::Available);
    Ok(())
}

fn lease_marks_each_claim_with_attempt_token_expiry_and_worker(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let t0 = h.now();
    let job = h
        .queue
        .lease(&LeaseRequest::new("worker-7", 1).ttl(Duration::from_secs(12)))?
        .pop()
        .ok_or("no job")?;
    assert_eq!(job.id, enqueued.id);
    assert_eq!(job.attempt, 1);
    assert_eq!(job.lease_until, t0 + Duration::from_secs(12));

    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Running);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.worker.as_deref(), Some("worker-7"));
    assert_eq!(record.lease_until, Some(job.lease_until));
    assert_eq!(record.started_at, Some(t0));
    let token = h.count(&format!(
        "SELECT lease_token FROM backlog_jobs WHERE id = {}",
        job.id
    ))?;
    assert_eq!(token, job.lease_token);

    // A second claim gets a new token, a new attempt, and keeps first_leased_at.
    h.queue.release(&job)?;
    h.advance(Duration::from_secs(1));
    let again = h.lease_one("worker-8")?;
    assert_ne!(again.lease_token, job.lease_token);
    assert_eq!(again.attempt, 1, "release gave the attempt back");
    assert_eq!(h.record(job.id)?.started_at, Some(t0));
    assert_eq!(h.record(job.id)?.worker.as_deref(), Some("worker-8"));
    Ok(())
}

fn delayed_jobs_are_invisible_until_due(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let delayed = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(60)))?;
    let at = h
        .queue
        .enqueue(NewJob::new("k", json!(2)).run_at(h.now() + Duration::from_secs(120)))?;
    let secs = h
        .queue
        .enqueue(NewJob::new("k", json!(3)).delay_secs(90.5))?;
    assert_eq!(h.state(delayed.id)?, JobState::Scheduled);
    assert!(h.lease("w", 10)?.is_empty());

    h.advance(Duration::from_secs(59));
    assert!(h.lease("w", 10)?.is_empty());

    h.advance(Duration::from_secs(1));
    assert_eq!(h.state(delayed.id)?, JobState::Available);
    assert_eq!(ids(&h.lease("w", 10)?), vec![delayed.id]);

    h.advance(Duration::from_secs(30));
    assert!(h.lease("w", 10)?.is_empty(), "90.5 s not reached yet");
    h.advance(Duration::from_millis(500));
    assert_eq!(ids(&h.lease("w", 10)?), vec![secs.id]);

    h.advance(Duration::from_secs(29));
    assert!(h.lease("w", 10)?.is_empty());
    h.advance(Duration::from_secs(1));
    assert_eq!(ids(&h.lease("w", 10)?), vec![at.id]);
    Ok(())
}

fn run_at_in_the_past_means_now(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let past = h.now() - Duration::from_secs(3600);
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)).run_at(past))?;
    assert_eq!(h.record(enqueued.id)?.available_at, h.now());
    assert_eq!(ids(&h.lease("w", 1)?), vec![enqueued.id]);
    Ok(())
}

fn run_at_before_the_unix_epoch_means_now(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let before_epoch = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).run_at(before_epoch))?;
    assert_eq!(h.record(enqueued.id)?.available_at, h.now());
    assert_eq!(ids(&h.lease("w", 1)?), vec![enqueued.id]);
    Ok(())
}

fn lease_naming_a_queue_twice_still_claims_up_to_the_limit(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a: Vec<i64> = h
        .queue
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!(i)).queue("a")))?
        .iter()
        .map(|e| e.id)
        .collect();
    let b = h.queue.enqueue(NewJob::new("k", json!(9)).queue("b"))?;
    let leased = h
        .queue
        .lease(&LeaseRequest::new("w", 3).queues(["a", "b", "a"]))?;
    assert_eq!(ids(&leased), a);
    let leased = h
        .queue
        .lease(&LeaseRequest::new("w", 3).queues(["b", "b"]))?;
    assert_eq!(ids(&leased), vec![b.id]);
    Ok(())
}

fn paused_queue_is_skipped_until_resumed(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    let a = q.enqueue(NewJob::new("k", json!(1)).queue("a").priority(10))?;
    let b = q.enqueue(NewJob::new("k", json!(2)).queue("b"))?;
    q.pause("a")?;
    assert_eq!(q.paused_queues()?, vec!["a".to_owned()]);

    assert!(q
        .lease(&LeaseRequest::new("w", 10).queues(["a"]))?
        .is_empty());
    let leased = q.lease(&LeaseRequest::new("w", 10).queues(["a", "b"]))?;
    assert_eq!(ids(&leased), vec![b.id]);
    assert_eq!(h.state(a.id)?, JobState::Available);

    q.resume("a")?;
    assert!(q.paused_queues()?.is_empty());
    let leased = q.lease(&LeaseRequest::new("w", 10).queues(["a", "b"]))?;
    assert_eq!(ids(&leased), vec![a.id]);
    Ok(())
}

fn lease_only_claims_the_requested_kinds(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    let email = q.enqueue(NewJob::new("email", json!(1)))?;
    let resize = q.enqueue(NewJob::new("resize", json!(2)))?;
    let other = q.enqueue(NewJob::new("other", json!(3)))?;

    let leased = q.lease(&LeaseRequest::new("w", 10).kinds(["resize", "email"]))?;
    assert_eq!(ids(&leased), vec![email.id, resize.id]);
    assert_eq!(h.state(other.id)?, JobState::Available);
    // An empty kind list claims nothing.
    assert!(q
        .lease(&LeaseRequest::new("w", 10).kinds(Vec::<String>::new()))?
        .is_empty());
    assert_eq!(h.state(other.id)?, JobState::Available);
    Ok(())
}

fn a_leased_job_is_not_leased_again_while_its_lease_holds(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w1")?;
    assert!(h.lease("w2", 10)?.is_empty());
    // Even just before the lease expires.
    h.advance(Duration::from_secs(29));
    assert!(h.lease("w2", 10)?.is_empty());
    assert_eq!(h.record(job.id)?.worker.as_deref(), Some("w1"));
    Ok(())
}

/// Leases from `queue` in small batches until nothing is left, returning every id.
fn drain(queue: Queue, worker: String, barrier: Arc<Barrier>) -> backlog::Result<Vec<i64>> {
    barrier.wait();
    let mut got = Vec::new();
    loop {
        let jobs = queue.lease(&LeaseRequest::new(worker.as_str(), 7))?;
        if jobs.is_empty() {
            return Ok(got);
        }
        got.extend(jobs.iter().map(|j| j.id));
    }
}

fn concurrent_leases_from_clones_and_two_handles_are_disjoint_and_cover_every_job(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let other = h.second_handle()?;
    let all: HashSet<i64> = h
        .queue
        .enqueue_many((0..400).map(|i| NewJob::new("k", json!(i)).priority(i % 4)))?
        .iter()
        .map(|e| e.id)
        .collect();
    const THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let queue = if i % 2 == 0 {
                h.queue.clone()
            } else {
                other.clone()
            };
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || drain(queue, format!("w{i}"), barrier))
        })
        .collect();

    let mut seen = HashSet::new();
    let mut per_handle = [0usize; 2];
    for (i, handle) in handles.into_iter().enumerate() {
        let got = handle.join().map_err(|_| "lease thread panicked")??;
        per_handle[i % 2] += got.len();
        for id in got {
            assert!(seen.insert(id), "job {id} was leased twice");
        }
    }
    assert_eq!(seen, all);
    // Every job was claimed exactly once.
    let claims: i64 = h.count("SELECT sum(attempts) FROM backlog_jobs")?;
    assert_eq!(claims, 400);
    assert_eq!(per_handle[0] + per_handle[1], 400);
    Ok(())
}

fn run_at_a_future_time_is_stored_to_the_microsecond(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let when = SystemTime::UNIX_EPOCH + Duration::from_micros(1_800_000_000_123_456);
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)).run_at(when))?;
    assert_eq!(h.record(enqueued.id)?.available_at, when);
    Ok(())
}

conformance!(
    lease_orders_by_priority_then_available_at_then_id,
    lease_limit_takes_the_head_of_the_claim_order,
    lease_orders_across_two_queues_by_priority_then_available_at_then_id,
    lease_marks_each_claim_with_attempt_token_expiry_and_worker,
    delayed_jobs_are_invisible_until_due,
    run_at_in_the_past_means_now,
    run_at_before_the_unix_epoch_means_now,
    lease_naming_a_queue_twice_still_claims_up_to_the_limit,
    paused_queue_is_skipped_until_resumed,
    lease_only_claims_the_requested_kinds,
    a_leased_job_is_not_leased_again_while_its_lease_holds,
    concurrent_leases_from_clones_and_two_handles_are_disjoint_and_cover_every_job,
    run_at_a_future_time_is_stored_to_the_microsecond,
);
