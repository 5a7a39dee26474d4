//! `backlog::copy`: a SQLite queue's live jobs and history move to another
//! database (each backend in turn) keeping ids, attempts, schedules and
//! unique keys; leased jobs arrive available. Dependencies, workflows and
//! batches come along, both ways (SQLite to each backend, each backend to
//! SQLite): a workflow half-run on one finishes on the other, every step
//! once and in order, and a batch's callbacks fire once.

use std::time::Duration;

use backlog::{
    Batch, EnqueuedWorkflow, FinalStatus, JobState, LeaseRequest, ManualClock, NewJob, Queue,
    QueueOptions, Workflow,
};
use serde_json::json;

use crate::harness::{Backend, TestResult};

/// A SQLite queue in `dir` (file `name`) on `clock`: the other side of a
/// copy.
fn sqlite_file(dir: &tempfile::TempDir, name: &str, clock: &ManualClock) -> TestResult<Queue> {
    Ok(QueueOptions::new()
        .clock(clock.clone())
        .open(dir.path().join(name))?)
}

fn copy_from_sqlite_keeps_ids_attempts_schedules_and_keys(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::at(h.now());
    let from = sqlite_file(&dir, "old.db", &clock)?;
    // Some history first, so live ids are not 1..n.
    let done = from.enqueue(NewJob::new("k", json!({"done": true})))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.complete(&job, Some(json!({"ok": 1})))?;
    let dead = from.enqueue(NewJob::new("k", json!("dead")).max_attempts(1))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.fail(&job, "boom")?;
    let scheduled = from.enqueue(
        NewJob::new("k", json!({"later": 1}))
            .queue("mail")
            .priority(3)
            .delay(Duration::from_secs(3600))
            .unique_key("once"),
    )?;
    let retrying = from.enqueue(NewJob::new("k", json!("retry")))?;
    let job = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    from.fail(&job, "flaky")?;
    let running = from.enqueue(NewJob::new("k", json!("running")))?;
    let leased = from
        .lease(&backlog::LeaseRequest::new("w", 1))?
        .pop()
        .ok_or("no job")?;
    assert_eq!(leased.id, running.id);
    from.pause("mail")?;

    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!((report.live, report.history, report.skipped), (3, 2, 0));
    assert_eq!(
        (report.pending, report.workflows, report.batches),
        (0, 0, 0)
    );
    assert_eq!(report.paused_queues, 1);

    let got = h.record(scheduled.id)?;
    let want = from.get(scheduled.id)?;
    assert_eq!(got.state, JobState::Scheduled);
    assert_eq!((got.queue.as_str(), got.priority), ("mail", 3));
    assert_eq!(got.unique_key.as_deref(), Some("once"));
    assert_eq!(got.available_at, want.available_at);
    assert_eq!(got.created_at, want.created_at);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&got.payload)?,
        json!({"later": 1})
    );

    let got = h.record(retrying.id)?;
    assert_eq!(got.state, JobState::Retrying);
    assert_eq!(got.attempts, 1);
    assert_eq!(got.errors.len(), 1);
    assert_eq!(got.errors[0].message, "flaky");

    let got = h.record(running.id)?;
    assert_eq!(
        got.state,
        JobState::Available,
        "a leased job arrives available"
    );
    assert_eq!(got.attempts, 1);
    assert_eq!(got.available_at, from.get(running.id)?.available_at);

    let got = h.record(done.id)?;
    assert_eq!(got.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(got.result.as_deref().ok_or("no result")?)?,
        json!({"ok": 1})
    );
    assert_eq!(got.worker.as_deref(), Some("w"));
    assert_eq!(h.state(dead.id)?, JobState::Finished(FinalStatus::Dead));
    assert_eq!(h.queue.paused_queues()?, vec!["mail".to_owned()]);

    // The unique key is held on the target, new ids come after the copied
    // ones, and copying again changes nothing.
    let again = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).queue("mail").unique_key("once"))?;
    assert_eq!((again.id, again.existed), (scheduled.id, true));
    let fresh = h.queue.enqueue(NewJob::new("k", json!("new")))?;
    assert!(fresh.id > running.id, "{} <= {}", fresh.id, running.id);
    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!((report.live, report.history, report.skipped), (0, 0, 5));
    // The copied available job runs on the target.
    let job = h.lease_one("new-worker")?;
    assert_eq!(job.id, running.id);
    assert_eq!(job.attempt, 2);
    Ok(())
}

fn copy_onto_the_same_database_is_refused(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let err = backlog::copy(&h.queue, &h.queue).unwrap_err();
    assert!(matches!(err, backlog::Error::InvalidArgument(_)), "{err:?}");
    Ok(())
}

/// A diamond (a; b and c after a; d after b and c) and a sealed batch of
/// three with both callbacks, on `from`: step a and one member run there.
fn half_run(from: &Queue) -> TestResult<(EnqueuedWorkflow, Batch)> {
    let flow = from.enqueue_workflow(
        Workflow::new("diamond")
            .step("a", NewJob::new("step", json!({"step": "a"})))
            .step_after("b", NewJob::new("step", json!({"step": "b"})), &["a"])
            .step_after("c", NewJob::new("step", json!({"step": "c"})), &["a"])
            .step_after("d", NewJob::new("step", json!({"step": "d"})), &["b", "c"]),
    )?;
    let batch = from
        .batch()
        .on_complete(NewJob::new("batch_complete", json!({})))
        .on_success(NewJob::new("batch_success", json!({})))
        .create()?;
    for member in 0..3 {
        from.enqueue(NewJob::new("member", json!({"member": member})).batch(batch.id))?;
    }
    from.seal_batch(batch.id)?;
    let a = flow.step("a").ok_or("no step a")?;
    assert_eq!(run_one(from, "step")?, Some(a));
    assert!(run_one(from, "member")?.is_some());
    Ok((flow, batch))
}

/// Leases the first due job of `kind` and completes it with its id as
/// result; its id, `None` when there was none.
fn run_one(queue: &Queue, kind: &str) -> TestResult<Option<i64>> {
    let Some(job) = queue.lease(&LeaseRequest::new("w", 1).kinds([kind]))?.pop() else {
        return Ok(None);
    };
    queue.complete(&job, Some(json!({"ran": job.id})))?;
    Ok(Some(job.id))
}

/// Runs every due job, one at a time, until none is left: their ids and
/// kinds in the order they ran.
fn run_all(queue: &Queue) -> TestResult<Vec<(i64, String)>> {
    let mut ran = Vec::new();
    while let Some(job) = queue.lease(&LeaseRequest::new("w", 1))?.pop() {
        queue.complete(&job, Some(json!({"ran": job.id})))?;
        ran.push((job.id, job.kind));
    }
    Ok(ran)
}

/// On `to`, after the copy of [`half_run`]'s `from`: the rest of the
/// workflow runs once each, in order, and the batch's callbacks fire once.
fn finish(to: &Queue, flow: &EnqueuedWorkflow, batch: Batch) -> TestResult {
    let id = |name: &str| flow.step(name).ok_or("no step");
    let info = to.workflow(flow.id)?.ok_or("the workflow was not copied")?;
    assert_eq!(info.name, "diamond");
    assert_eq!(info.step("a").ok_or("a")?.state, JobState::COMPLETED);
    assert_eq!(info.step("d").ok_or("d")?.state, JobState::Pending);
    let status = to.batch_status(batch.id)?;
    assert_eq!(
        (status.sealed, status.total, status.completed),
        (true, 3, 1)
    );

    let ran = run_all(to)?;
    let steps: Vec<i64> = ran
        .iter()
        .filter(|(_, k)| k == "step")
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(steps.len(), 3, "b, c and d once each, a not again: {ran:?}");
    let at = |step: i64| steps.iter().position(|s| *s == step);
    assert_eq!(at(id("d")?), Some(2), "d after b and c: {ran:?}");
    assert!(at(id("b")?).is_some() && at(id("c")?).is_some());
    let kinds = |kind: &str| ran.iter().filter(|(_, k)| k == kind).count();
    assert_eq!(kinds("member"), 2);
    assert_eq!((kinds("batch_complete"), kinds("batch_success")), (1, 1));
    // d read what b and c returned on `to`; b what a returned on `from`.
    let results: Vec<_> = to
        .dependencies(id("d")?)?
        .into_iter()
        .map(|d| (d.step, d.result))
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|(_, r)| r.is_some()), "{results:?}");
    let of_b = to.dependencies(id("b")?)?;
    assert_eq!(of_b[0].step.as_deref(), Some("a"));
    assert_eq!(
        of_b[0].result::<serde_json::Value>()?,
        Some(json!({"ran": id("a")?}))
    );
    assert!(to.workflow(flow.id)?.ok_or("workflow")?.is_finished());
    let status = to.batch_status(batch.id)?;
    assert_eq!(status.completed, 3);
    assert!(status.finished_at.is_some() && status.success_job_id.is_some());
    assert!(run_all(to)?.is_empty(), "nothing fires twice");

    // New workflows and batches get ids above the copied ones.
    let next = to.enqueue_workflow(Workflow::new("next").step("x", NewJob::new("x", json!(1))))?;
    assert!(next.id > flow.id, "{} <= {}", next.id, flow.id);
    assert!(to.batch().create()?.id > batch.id);
    Ok(())
}

fn copy_carries_a_half_run_workflow_and_batch_from_sqlite(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let from = sqlite_file(&dir, "old.db", &ManualClock::at(h.now()))?;
    let (flow, batch) = half_run(&from)?;

    let report = backlog::copy(&from, &h.queue)?;
    // b and c were released by a: live; d waits for them.
    assert_eq!((report.pending, report.live, report.history), (1, 4, 2));
    assert_eq!(
        (report.dependencies, report.workflows, report.batches),
        (4, 1, 1)
    );
    let again = backlog::copy(&from, &h.queue)?;
    assert_eq!((again.pending, again.dependencies), (0, 0));
    assert_eq!((again.workflows, again.batches, again.skipped), (0, 0, 7));
    finish(&h.queue, &flow, batch)
}

fn copy_carries_a_half_run_workflow_and_batch_to_sqlite(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let (flow, batch) = half_run(&h.queue)?;
    let to = sqlite_file(&dir, "new.db", &ManualClock::at(h.now()))?;
    let report = backlog::copy(&h.queue, &to)?;
    assert_eq!((report.pending, report.live, report.history), (1, 4, 2));
    assert_eq!(
        (report.dependencies, report.workflows, report.batches),
        (4, 1, 1)
    );
    finish(&to, &flow, batch)
}

/// Queue to queue across databases: PostgreSQL to MariaDB, MariaDB to
/// PostgreSQL, and (on SQLite) the harness's SQLite queue to PostgreSQL.
fn copy_carries_a_half_run_workflow_and_batch_to_the_other_server(b: &Backend) -> TestResult {
    let other = match b {
        Backend::Postgres => Backend::Mysql,
        Backend::Mysql | Backend::Sqlite => Backend::Postgres,
    };
    if let Some(why) = other.skip_reason() {
        println!("SKIPPED: {why} (the other side of the copy)");
        return Ok(());
    }
    let h = b.harness()?;
    let target = other.harness()?;
    let (flow, batch) = half_run(&h.queue)?;
    let report = backlog::copy(&h.queue, &target.queue)?;
    assert_eq!((report.pending, report.live, report.history), (1, 4, 2));
    assert_eq!(
        (report.dependencies, report.workflows, report.batches),
        (4, 1, 1)
    );
    finish(&target.queue, &flow, batch)
}

/// More edges and waiting jobs than one page (500) of copy: every one
/// arrives, keyed on (dependent, dependency) across the page boundary.
fn copy_pages_through_more_edges_than_one_page(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let from = sqlite_file(&dir, "old.db", &ManualClock::at(h.now()))?;
    let mut flow = Workflow::new("fan")
        .step("a", NewJob::new("root", json!(0)))
        .step("b", NewJob::new("root", json!(1)));
    for i in 0..300 {
        flow = flow.step_after(format!("s{i}"), NewJob::new("leaf", json!(i)), &["a", "b"]);
    }
    from.enqueue_workflow(flow)?;
    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!(
        (report.pending, report.live, report.dependencies),
        (300, 2, 600)
    );
    assert_eq!(run_one(&h.queue, "root")?.map(|_| ()), Some(()));
    assert_eq!(run_one(&h.queue, "root")?.map(|_| ()), Some(()));
    let leaves = h
        .queue
        .list(&backlog::JobFilter::new(JobState::Available).limit(1000))?;
    assert_eq!(
        leaves.jobs.len(),
        300,
        "every leaf released by its two roots"
    );
    Ok(())
}

fn copy_refuses_a_target_holding_another_batch_under_the_same_id(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::at(h.now());
    let from = sqlite_file(&dir, "old.db", &clock)?;
    // The target's own batch, created earlier than the source's.
    let theirs = h.queue.batch().create()?;
    clock.advance(Duration::from_secs(1));
    let ours = from.batch().create()?;
    assert_eq!(ours.id, theirs.id);
    from.enqueue(NewJob::new("member", json!(1)).batch(ours.id))?;
    from.enqueue_workflow(Workflow::new("w").step("s", NewJob::new("s", json!(1))))?;

    let err = backlog::copy(&from, &h.queue).unwrap_err();
    match &err {
        backlog::Error::InvalidArgument(why) => {
            assert!(why.contains(&format!("batch with id {}", ours.id)), "{why}")
        }
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    // Nothing was written.
    assert_eq!((h.live_rows()?, h.history_rows()?), (0, 0));
    assert!(h.queue.workflow("w")?.is_none());
    assert_eq!(h.queue.batch_status(theirs.id)?.total, 0);
    Ok(())
}

/// A sequence half-run on the backend, copied to a SQLite file: a job of
/// the same key enqueued there waits for the copied ones, and all run one
/// at a time in order of enqueue.
fn copy_keeps_a_sequence_in_order(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let seq = |n: i64| NewJob::new("step", json!(n)).sequence("account-7");
    let first = h.queue.enqueue(seq(1))?.id;
    let second = h.queue.enqueue(seq(2))?.id;
    assert_eq!(run_one(&h.queue, "step")?, Some(first));
    let third = h.queue.enqueue(seq(3))?.id;
    h.queue
        .enqueue(NewJob::new("other", json!(0)).sequence("account-8"))?;
    let to = sqlite_file(&dir, "new.db", &ManualClock::at(h.now()))?;
    let report = backlog::copy(&h.queue, &to)?;
    assert_eq!(report.sequences, 2, "one per key");
    assert_eq!(to.get(second)?.sequence_key.as_deref(), Some("account-7"));
    let fourth = to.enqueue(seq(4))?.id;
    assert_eq!(
        to.get(fourth)?.state,
        JobState::Pending,
        "a job enqueued after the copy must wait for the copied ones of its sequence"
    );
    let mut ran = Vec::new();
    while let Some(id) = run_one(&to, "step")? {
        ran.push(id);
    }
    assert_eq!(ran, [second, third, fourth]);
    Ok(())
}

conformance!(
    copy_keeps_a_sequence_in_order,
    copy_from_sqlite_keeps_ids_attempts_schedules_and_keys,
    copy_onto_the_same_database_is_refused,
    copy_carries_a_half_run_workflow_and_batch_from_sqlite,
    copy_carries_a_half_run_workflow_and_batch_to_sqlite,
    copy_carries_a_half_run_workflow_and_batch_to_the_other_server,
    copy_pages_through_more_edges_than_one_page,
    copy_refuses_a_target_holding_another_batch_under_the_same_id,
);
