//! Sequences: jobs of one sequence key run one at a time, in the order they
//! were enqueued; each waits as `pending` until the one before it has
//! finished, however it ended. Different keys run in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{Error, Group, JobFilter, JobState, NewJob, Outcome, QueueOptions, Worker};
use serde_json::{json, Value};

use crate::harness::{Backend, Harness, TestResult};

fn job(key: &str, n: usize) -> NewJob {
    NewJob::new("step", json!({ "key": key, "n": n })).sequence(key)
}

fn enqueue(h: &Harness, job: NewJob) -> TestResult<i64> {
    Ok(h.queue.enqueue(job)?.id)
}

/// Leases every available job and returns their ids, sorted, released again.
fn available(h: &Harness) -> TestResult<Vec<i64>> {
    let jobs = h.lease("w", 100)?;
    for j in &jobs {
        h.queue.release(j)?;
    }
    let mut ids: Vec<i64> = jobs.into_iter().map(|j| j.id).collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Leases job `id` (it must be available) and settles it with `outcome`.
fn run(h: &Harness, id: i64, outcome: Outcome) -> TestResult {
    let jobs = h.lease("w", 100)?;
    let job = jobs
        .iter()
        .find(|j| j.id == id)
        .ok_or_else(|| format!("job {id} was not leased"))?;
    for other in jobs.iter().filter(|j| j.id != id) {
        h.queue.release(other)?;
    }
    h.queue.settle(job, outcome)?;
    Ok(())
}

/// The jobs `id` waits on (or waited on), by id.
fn predecessors(h: &Harness, id: i64) -> TestResult<Vec<i64>> {
    Ok(h.queue
        .dependencies(id)?
        .into_iter()
        .map(|d| d.job_id)
        .collect())
}

fn the_next_job_of_a_sequence_waits_until_the_one_before_it_has_finished(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = (0..3)
        .map(|n| enqueue(&h, job("a", n)))
        .collect::<TestResult<_>>()?;
    assert_eq!(h.state(ids[0])?, JobState::Available);
    assert_eq!(h.state(ids[1])?, JobState::Pending);
    assert_eq!(h.state(ids[2])?, JobState::Pending);
    assert_eq!(h.live_rows()?, 1, "a waiting job is not a live row");
    assert_eq!(available(&h)?, vec![ids[0]]);
    run(&h, ids[0], Outcome::Complete(None))?;
    assert_eq!(available(&h)?, vec![ids[1]]);
    assert_eq!(h.state(ids[2])?, JobState::Pending);
    assert_eq!(predecessors(&h, ids[2])?, vec![ids[1]], "one link per job");
    run(&h, ids[1], Outcome::Complete(None))?;
    assert_eq!(available(&h)?, vec![ids[2]]);
    Ok(())
}

fn different_keys_and_queues_run_in_parallel(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let a1 = enqueue(&h, job("a", 1))?;
    let a2 = enqueue(&h, job("a", 2))?;
    let b1 = enqueue(&h, job("b", 1))?;
    // The same key in another queue is another sequence.
    let other = enqueue(&h, job("a", 1).queue("other"))?;
    let leased: Vec<i64> = h.lease("w", 10)?.into_iter().map(|j| j.id).collect();
    assert!(leased.contains(&a1) && leased.contains(&b1), "{leased:?}");
    assert!(!leased.contains(&a2));
    assert_eq!(h.state(other)?, JobState::Available);
    Ok(())
}

fn a_failing_job_holds_the_next_until_its_retries_end(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = enqueue(&h, job("a", 0).max_attempts(2))?;
    let next = enqueue(&h, job("a", 1))?;
    run(&h, first, Outcome::fail("flaky"))?;
    assert_eq!(h.state(first)?, JobState::Retrying);
    assert_eq!(h.state(next)?, JobState::Pending, "a retry holds the next");
    h.advance(Duration::from_secs(3600));
    run(&h, first, Outcome::fail("flaky again"))?;
    assert_eq!(h.state(first)?, JobState::DEAD);
    assert_eq!(h.state(next)?, JobState::Available, "a dead job lets it go");
    Ok(())
}

fn a_discarded_or_cancelled_job_lets_the_next_run(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = (0..4)
        .map(|n| enqueue(&h, job("a", n)))
        .collect::<TestResult<_>>()?;
    run(&h, ids[0], Outcome::Discard("bad input".into()))?;
    assert_eq!(h.state(ids[1])?, JobState::Available);
    h.queue.cancel(ids[1])?;
    assert_eq!(h.state(ids[1])?, JobState::CANCELLED);
    assert_eq!(h.state(ids[2])?, JobState::Available);
    // An operator's cancel of a waiting job lets the one after it go too.
    h.queue.cancel(ids[3])?;
    assert_eq!(h.state(ids[3])?, JobState::CANCELLED);
    let later = enqueue(&h, job("a", 4))?;
    assert_eq!(h.state(later)?, JobState::Pending, "waits for ids[2]");
    run(&h, ids[2], Outcome::Complete(None))?;
    assert_eq!(h.state(later)?, JobState::Available);
    Ok(())
}

fn a_waiting_job_cancelled_or_deleted_hands_its_place_to_the_next(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = (0..5)
        .map(|n| enqueue(&h, job("a", n)))
        .collect::<TestResult<_>>()?;
    // 1 and 2 never run: 3 must still wait for 0, not run beside it.
    h.queue.cancel(ids[1])?;
    h.queue.delete(ids[2])?;
    assert_eq!(h.state(ids[3])?, JobState::Pending);
    // The sequence's tail cancelled: a new job waits for 3, not for nothing.
    h.queue.cancel(ids[4])?;
    let later = enqueue(&h, job("a", 5))?;
    assert_eq!(available(&h)?, vec![ids[0]]);
    run(&h, ids[0], Outcome::Complete(None))?;
    assert_eq!(available(&h)?, vec![ids[3]]);
    assert_eq!(h.state(later)?, JobState::Pending);
    run(&h, ids[3], Outcome::Complete(None))?;
    assert_eq!(available(&h)?, vec![later]);
    Ok(())
}

fn a_tail_that_finished_or_is_gone_lets_the_next_start_at_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = enqueue(&h, job("a", 0))?;
    run(&h, first, Outcome::Complete(None))?;
    let second = enqueue(&h, job("a", 1))?;
    assert_eq!(h.state(second)?, JobState::Available, "its tail completed");
    assert!(
        predecessors(&h, second)?.is_empty(),
        "no edge to a finished job"
    );
    h.queue.delete(second)?;
    let third = enqueue(&h, job("a", 2))?;
    assert_eq!(h.state(third)?, JobState::Available, "its tail is gone");
    Ok(())
}

fn a_sequenced_job_with_dependencies_waits_for_both(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dependency = enqueue(&h, NewJob::new("dep", json!({})))?;
    let first = enqueue(&h, job("a", 0))?;
    let second = enqueue(&h, job("a", 1).depends_on([dependency]))?;
    assert_eq!(predecessors(&h, second)?, vec![dependency, first]);
    run(&h, first, Outcome::Complete(None))?;
    assert_eq!(h.state(second)?, JobState::Pending, "its dependency runs");
    run(&h, dependency, Outcome::Complete(None))?;
    assert_eq!(h.state(second)?, JobState::Available);
    Ok(())
}

fn enqueue_many_chains_its_jobs_in_order(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let ids: Vec<i64> = h
        .queue
        .enqueue_many((0..4).map(|n| job(if n % 2 == 0 { "a" } else { "b" }, n)))?
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(available(&h)?, vec![ids[0], ids[1]]);
    assert_eq!(predecessors(&h, ids[2])?, vec![ids[0]]);
    assert_eq!(predecessors(&h, ids[3])?, vec![ids[1]]);
    Ok(())
}

fn concurrent_enqueues_from_two_handles_keep_one_chain(b: &Backend) -> TestResult {
    const EACH: usize = 40;
    let h = b.harness()?;
    let handles = [h.queue.clone(), h.second_handle()?];
    let ids: Vec<i64> = thread::scope(|s| {
        let threads: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(t, queue)| {
                s.spawn(move || -> backlog::Result<Vec<i64>> {
                    (0..EACH)
                        .map(|n| queue.enqueue(job("k", t * EACH + n)).map(|e| e.id))
                        .collect()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| "an enqueuing thread panicked"))
            .collect::<Result<Vec<_>, _>>()
    })?
    .into_iter()
    .collect::<backlog::Result<Vec<Vec<i64>>>>()?
    .concat();
    assert_eq!(ids.len(), 2 * EACH);
    // Each job has at most one predecessor, and no two jobs have the same
    // one: the links form one chain through every job.
    let mut next_of = HashMap::new();
    let mut heads = Vec::new();
    for &id in &ids {
        match predecessors(&h, id)?.as_slice() {
            [] => heads.push(id),
            [before] => {
                if let Some(other) = next_of.insert(*before, id) {
                    return Err(format!("{other} and {id} both chain on {before}").into());
                }
            }
            more => return Err(format!("job {id} waits on {more:?}").into()),
        }
    }
    assert_eq!(heads.len(), 1, "one head: {heads:?}");
    let mut walked = 1;
    let mut at = heads[0];
    while let Some(&next) = next_of.get(&at) {
        walked += 1;
        at = next;
    }
    assert_eq!(walked, ids.len(), "the chain reaches every job");
    // And it runs one job at a time, in the chain's order.
    let mut at = heads[0];
    for i in 0..ids.len() {
        assert_eq!(available(&h)?, vec![at], "step {i}");
        run(&h, at, Outcome::Complete(None))?;
        at = next_of.get(&at).copied().unwrap_or(0);
    }
    Ok(())
}

fn an_enqueue_in_rolled_back_leaves_the_chain_untouched(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = enqueue(&h, job("a", 0))?;
    h.enqueue_in(first, vec![job("a", 1)], false)??;
    let second = enqueue(&h, job("a", 2))?;
    assert_eq!(predecessors(&h, second)?, vec![first]);
    let third = h.enqueue_in(first, vec![job("a", 3)], true)??[0].id;
    assert_eq!(h.state(third)?, JobState::Pending);
    assert_eq!(predecessors(&h, third)?, vec![second]);
    run(&h, first, Outcome::Complete(None))?;
    run(&h, second, Outcome::Complete(None))?;
    assert_eq!(h.state(third)?, JobState::Available);
    Ok(())
}

fn a_bad_sequence_key_or_combination_is_refused_and_nothing_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for key in [String::new(), "k".repeat(129), "a\nb".to_owned()] {
        let refused = h.queue.enqueue(job(&key, 0));
        assert!(
            matches!(refused, Err(Error::InvalidName { .. })),
            "{key:?}: {refused:?}"
        );
    }
    let batch = h.queue.batch().create()?;
    for (what, bad) in [
        ("a unique key", job("a", 0).unique_key("u")),
        ("a group", job("a", 0).group(Group::new("g"))),
        ("a batch", job("a", 0).batch(batch.id)),
    ] {
        let refused = h.queue.enqueue(bad);
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{what}: {refused:?}"
        );
    }
    // A good job in the same enqueue_many does not get in either.
    let refused = h.queue.enqueue_many([job("a", 0), job("", 1)]);
    assert!(refused.is_err());
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.count("SELECT count(*) FROM backlog_sequences")?, 0);
    Ok(())
}

/// One handler run: key, n, start, end.
type Run = (String, usize, Instant, Instant);

fn workers_with_many_threads_run_a_sequence_one_at_a_time_in_order(b: &Backend) -> TestResult {
    const KEYS: usize = 3;
    const PER_KEY: usize = 15;
    let h = b.harness_on_real_time(QueueOptions::new())?;
    // Interleaved, so that the jobs of one key are not adjacent ids.
    let jobs = (0..PER_KEY).flat_map(|n| (0..KEYS).map(move |k| job(&format!("k{k}"), n)));
    h.queue.enqueue_many(jobs)?;
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let (done, finished) = crossbeam_channel::unbounded();
    let worker = {
        let runs = runs.clone();
        Worker::builder(h.queue.clone())
            .concurrency(8)
            .poll_interval(Duration::from_millis(50))
            .handle_raw("step", move |args: Value, _ctx| {
                let start = Instant::now();
                thread::sleep(Duration::from_millis(5));
                let key = args["key"].as_str().unwrap_or_default().to_owned();
                let n = args["n"].as_u64().unwrap_or(0) as usize;
                if let Ok(mut runs) = runs.lock() {
                    runs.push((key, n, start, Instant::now()));
                }
                let _ = done.send(());
                Ok(())
            })
            .start()?
    };
    for _ in 0..KEYS * PER_KEY {
        finished.recv_timeout(Duration::from_secs(30))?;
    }
    worker.shutdown(Duration::from_secs(5))?;
    let runs = runs.lock().map_err(|_| "poisoned")?.clone();
    let mut parallel = false;
    for k in 0..KEYS {
        let key = format!("k{k}");
        let mut mine: Vec<_> = runs.iter().filter(|r| r.0 == key).collect();
        mine.sort_by_key(|r| r.2);
        let order: Vec<usize> = mine.iter().map(|r| r.1).collect();
        assert_eq!(order, (0..PER_KEY).collect::<Vec<_>>(), "{key} in order");
        for pair in mine.windows(2) {
            assert!(
                pair[0].3 <= pair[1].2,
                "{key}: job {} started before job {} ended",
                pair[1].1,
                pair[0].1
            );
        }
        parallel |= runs
            .iter()
            .filter(|r| r.0 != key)
            .any(|o| mine.iter().any(|m| m.2 < o.3 && o.2 < m.3));
    }
    assert!(parallel, "no two keys ever ran at the same time");
    Ok(())
}

/// A sequenced job's record carries its key, waiting, live and finished, in
/// `get` and `list`; a job of no sequence has none; deleting a job takes
/// its key.
fn a_job_record_carries_its_sequence_key(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = enqueue(&h, job("account-7", 1))?;
    let second = enqueue(&h, job("account-7", 2))?;
    let plain = enqueue(&h, NewJob::new("step", json!({})))?;
    let key = |id: i64| -> TestResult<Option<String>> { Ok(h.queue.get(id)?.sequence_key) };
    let listed = |state: JobState| -> TestResult<Vec<(i64, Option<String>)>> {
        let page = h.queue.list(&JobFilter::new(state))?;
        Ok(page
            .jobs
            .into_iter()
            .map(|j| (j.id, j.sequence_key))
            .collect())
    };
    let account = Some("account-7".to_owned());
    assert_eq!(key(first)?, account);
    assert_eq!(key(second)?, account, "waiting for the first");
    assert_eq!(key(plain)?, None);
    assert_eq!(listed(JobState::Pending)?, [(second, account.clone())]);
    assert_eq!(
        listed(JobState::Available)?,
        [(first, account.clone()), (plain, None)]
    );
    for j in h.lease("w", 10)? {
        h.queue.complete(&j, None)?;
    }
    assert_eq!(key(first)?, account, "kept in history");
    assert_eq!(
        listed(JobState::Finished(backlog::FinalStatus::Completed))?,
        [(first, account.clone()), (plain, None)]
    );
    assert_eq!(key(second)?, account, "released");
    h.queue.delete(first)?;
    assert_eq!(
        h.count(&format!(
            "SELECT count(*) FROM backlog_sequence_jobs WHERE job_id = {first}"
        ))?,
        0
    );
    Ok(())
}

conformance!(
    a_job_record_carries_its_sequence_key,
    the_next_job_of_a_sequence_waits_until_the_one_before_it_has_finished,
    different_keys_and_queues_run_in_parallel,
    a_failing_job_holds_the_next_until_its_retries_end,
    a_discarded_or_cancelled_job_lets_the_next_run,
    a_waiting_job_cancelled_or_deleted_hands_its_place_to_the_next,
    a_tail_that_finished_or_is_gone_lets_the_next_start_at_once,
    a_sequenced_job_with_dependencies_waits_for_both,
    enqueue_many_chains_its_jobs_in_order,
    concurrent_enqueues_from_two_handles_keep_one_chain,
    an_enqueue_in_rolled_back_leaves_the_chain_untouched,
    a_bad_sequence_key_or_combination_is_refused_and_nothing_is_written,
    workers_with_many_threads_run_a_sequence_one_at_a_time_in_order,
);
