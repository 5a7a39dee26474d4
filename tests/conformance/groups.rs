//! Grouped jobs: jobs enqueued into a group wait outside the lease, and are
//! combined into one job (payload: the array of theirs) when the group is
//! full, when its grace period passes without a new member, or when its
//! max delay passes since the first; each member ends in history as
//! `aggregated` with the id of the job it went into.

use std::collections::HashSet;
use std::time::Duration;

use backlog::{
    Error, Event, FinalStatus, Group, JobArgs, JobFilter, JobState, LeaseRequest, ManualClock,
    NewJob, QueueOptions, Worker,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::harness::{Backend, Harness, TestResult};

const SEC: Duration = Duration::from_secs(1);

fn member(h: &Harness, n: i64, group: Group) -> TestResult<i64> {
    Ok(h.queue
        .enqueue(NewJob::new("digest", json!({"n": n})).group(group))?
        .id)
}

fn hourly(key: &str) -> Group {
    Group::new(key)
        .max_size(100)
        .grace(Duration::from_secs(3600))
        .max_delay(Duration::from_secs(7200))
}

/// The members' history rows point at `into`, in order.
fn assert_aggregated_into(h: &Harness, members: &[i64], into: i64) -> TestResult {
    for id in members {
        let record = h.record(*id)?;
        assert_eq!(record.state, JobState::AGGREGATED, "member {id}");
        assert_eq!(record.aggregated_into, Some(into), "member {id}");
        assert_eq!(
            record.group_key.as_deref().map(|k| !k.is_empty()),
            Some(true)
        );
    }
    Ok(())
}

fn a_full_group_is_combined_into_one_job_holding_every_payload(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let group = hourly("user-1").max_size(3);
    let members: Vec<i64> = (1..=3)
        .map(|n| member(&h, n, group.clone()))
        .collect::<TestResult<_>>()?;
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1);
    let (into, size) = report.jobs[0];
    assert_eq!(size, 3);
    assert!(
        !members.contains(&into),
        "the combined job has an id of its own"
    );
    let job = h.lease_one("w")?;
    assert_eq!(job.id, into);
    assert_eq!(job.kind, "digest");
    let payload: Value = serde_json::from_str(&job.payload)?;
    assert_eq!(payload, json!([{"n": 1}, {"n": 2}, {"n": 3}]));
    assert_aggregated_into(&h, &members, into)?;
    assert_eq!(h.record(members[0])?.group_key.as_deref(), Some("user-1"));
    // Nothing left to combine.
    assert!(h.queue.aggregate(10)?.jobs.is_empty());
    Ok(())
}

fn a_group_is_combined_once_its_grace_passes_without_a_new_member(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let group = Group::new("g")
        .max_size(100)
        .grace(10 * SEC)
        .max_delay(Duration::from_secs(3600));
    let mut members = vec![member(&h, 1, group.clone())?];
    h.advance(6 * SEC);
    members.push(member(&h, 2, group.clone())?);
    h.advance(6 * SEC); // 12 s after the first, 6 s after the last
    assert!(
        h.queue.aggregate(10)?.jobs.is_empty(),
        "grace counts from the last"
    );
    h.advance(5 * SEC);
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1);
    assert_eq!(report.jobs[0].1, 2);
    assert_aggregated_into(&h, &members, report.jobs[0].0)?;
    Ok(())
}

fn a_group_is_combined_at_its_max_delay_however_often_members_come(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let group = Group::new("busy")
        .max_size(100)
        .grace(10 * SEC)
        .max_delay(30 * SEC);
    let mut members = Vec::new();
    for n in 0..4 {
        members.push(member(&h, n, group.clone())?);
        assert!(h.queue.aggregate(10)?.jobs.is_empty(), "at {}s", n * 8);
        h.advance(8 * SEC);
    }
    // 32 s after the first member, 8 s after the last: the max delay, not
    // the grace, made it ready.
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1);
    assert_eq!(report.jobs[0].1, 4);
    assert_aggregated_into(&h, &members, report.jobs[0].0)?;
    Ok(())
}

fn waiting_members_are_grouped_never_leased_and_not_for_operators(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let id = member(&h, 1, hourly("g"))?;
    member(&h, 2, hourly("g").max_size(5))?;
    h.queue
        .enqueue(NewJob::new("digest", json!({"alone": true})))?;
    let leased = h.queue.lease(&LeaseRequest::new("w", 10))?;
    assert_eq!(leased.len(), 1, "only the job outside the group");
    let record = h.record(id)?;
    assert_eq!(record.state, JobState::Grouped);
    assert_eq!(record.group_key.as_deref(), Some("g"));
    assert_eq!(record.args::<Value>()?, json!({"n": 1}));
    let page = h
        .queue
        .list(&JobFilter::new(JobState::Grouped).queue("default"))?;
    assert_eq!(page.jobs.len(), 2);
    let grouped: u64 = h
        .queue
        .counts()?
        .iter()
        .filter(|c| c.state == JobState::Grouped)
        .map(|c| c.count)
        .sum();
    assert_eq!(grouped, 2);
    assert_eq!(h.queue.stats()?[0].grouped, 2);
    for result in [
        h.queue.cancel(id).map(|_| ()),
        h.queue.delete(id),
        h.queue.run_now(id),
        h.queue.discard_job(id, "no"),
    ] {
        assert!(
            matches!(result, Err(Error::InvalidState { job_id, .. }) if job_id == id),
            "{result:?}"
        );
    }
    assert_eq!(h.record(id)?.state, JobState::Grouped);
    Ok(())
}

fn a_group_larger_than_its_max_size_is_combined_in_max_size_parts(b: &Backend) -> TestResult {
    let h = b.harness()?;
    // A policy that grew: the first three joined under max_size 10.
    for n in 0..3 {
        member(&h, n, hourly("g").max_size(10))?;
    }
    for n in 3..5 {
        member(&h, n, hourly("g").max_size(2))?;
    }
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1, "one part per group and call");
    assert_eq!(report.jobs[0].1, 2);
    assert_eq!(h.queue.aggregate(10)?.jobs[0].1, 2);
    // One left: no longer full, it waits for its grace.
    assert!(h.queue.aggregate(10)?.jobs.is_empty());
    h.advance(Duration::from_secs(3601));
    assert_eq!(h.queue.aggregate(10)?.jobs[0].1, 1);
    let mut seen = Vec::new();
    for job in h.queue.lease(&LeaseRequest::new("w", 10))? {
        let payload: Vec<Value> = serde_json::from_str(&job.payload)?;
        seen.extend(payload.iter().map(|v| v["n"].as_i64().unwrap_or(-1)));
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2, 3, 4], "every member exactly once");
    Ok(())
}

fn groups_are_per_queue_kind_and_key(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let g = hourly("same").max_size(2);
    h.queue
        .enqueue(NewJob::new("a", json!(1)).group(g.clone()))?;
    h.queue
        .enqueue(NewJob::new("b", json!(2)).group(g.clone()))?;
    h.queue
        .enqueue(NewJob::new("a", json!(3)).queue("other").group(g.clone()))?;
    assert!(
        h.queue.aggregate(10)?.jobs.is_empty(),
        "three groups of one"
    );
    h.queue.enqueue(NewJob::new("a", json!(4)).group(g))?;
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1);
    let job = h.lease_one("w")?;
    assert_eq!(job.kind, "a");
    assert_eq!(serde_json::from_str::<Value>(&job.payload)?, json!([1, 4]));
    Ok(())
}

fn bad_group_input_is_refused_before_anything_is_written(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let cases = [
        NewJob::new("k", json!(1)).group(Group::new("g")).delay(SEC),
        NewJob::new("k", json!(1))
            .group(Group::new("g"))
            .unique_key("u"),
        NewJob::new("k", json!(1)).group(Group::new("g").max_size(0)),
        NewJob::new("k", json!(1)).group(Group::new("g").max_size(backlog::MAX_GROUP_SIZE + 1)),
        NewJob::new("k", json!(1)).group(Group::new("g").grace(10 * SEC).max_delay(SEC)),
        NewJob::new("k", json!(1)).group(Group::new("")),
        NewJob::new("k", json!(1)).group(Group::new("bad\nkey")),
    ];
    for job in cases {
        let result = h.queue.enqueue(job.clone());
        assert!(
            matches!(&result, Err(e) if e.is_invalid_input()),
            "{job:?}: {result:?}"
        );
    }
    assert_eq!(h.live_rows()?, 0);
    assert!(h
        .queue
        .list(&JobFilter::new(JobState::Grouped))?
        .jobs
        .is_empty());
    Ok(())
}

fn copy_carries_waiting_members_and_aggregated_history(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let from = QueueOptions::new()
        .clock(ManualClock::at(h.now()))
        .open(dir.path().join("old.db"))?;
    let g = hourly("g").max_size(2);
    let a = from
        .enqueue(NewJob::new("digest", json!(1)).group(g.clone()))?
        .id;
    let b2 = from
        .enqueue(NewJob::new("digest", json!(2)).group(g.clone()))?
        .id;
    let into = from.aggregate(10)?.jobs[0].0;
    let waiting = from.enqueue(NewJob::new("digest", json!(3)).group(g))?.id;

    backlog::copy(&from, &h.queue)?;
    for id in [a, b2] {
        let record = h.record(id)?;
        assert_eq!(record.state, JobState::AGGREGATED);
        assert_eq!(record.aggregated_into, Some(into));
    }
    assert_eq!(h.record(waiting)?.state, JobState::Grouped);
    // The copied member is in a group the target combines.
    h.queue
        .enqueue(NewJob::new("digest", json!(4)).group(hourly("g").max_size(2)))?;
    let report = h.queue.aggregate(10)?;
    assert_eq!(report.jobs.len(), 1);
    assert_eq!(report.jobs[0].1, 2);
    assert_eq!(h.record(waiting)?.state, JobState::AGGREGATED);
    Ok(())
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Like {
    user: i64,
    from: String,
}

impl JobArgs for Like {
    const KIND: &'static str = "like";
}

fn a_worker_combines_groups_on_time_and_its_handler_gets_every_args(b: &Backend) -> TestResult {
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let events = h.queue.subscribe();
    let (tx, rx) = crossbeam_channel::unbounded::<(i64, Vec<Like>)>();
    let worker = Worker::builder(h.queue.clone())
        .poll_interval(Duration::from_secs(60))
        .handle_group(move |likes: Vec<Like>, ctx| {
            let _ = tx.send((ctx.id(), likes));
            Ok(())
        })
        .start()?;
    // Full at three: combined at once.
    let full = Group::new("user-1")
        .max_size(3)
        .grace(Duration::from_secs(600))
        .max_delay(Duration::from_secs(600));
    for from in ["a", "b", "c"] {
        h.queue.enqueue(
            NewJob::from_args(&Like {
                user: 1,
                from: from.into(),
            })?
            .group(full.clone()),
        )?;
    }
    // A short grace: combined when it passes, not at the minute's poll.
    let short = Group::new("user-2")
        .max_size(100)
        .grace(Duration::from_millis(300))
        .max_delay(Duration::from_secs(600));
    let lone = h.queue.enqueue(
        NewJob::from_args(&Like {
            user: 2,
            from: "d".into(),
        })?
        .group(short),
    )?;
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(rx.recv_timeout(Duration::from_secs(20))?);
    }
    got.sort_by_key(|(_, likes)| likes.len());
    assert_eq!(
        got[0].1,
        vec![Like {
            user: 2,
            from: "d".into()
        }]
    );
    let froms: Vec<&str> = got[1].1.iter().map(|l| l.from.as_str()).collect();
    assert_eq!(froms, ["a", "b", "c"]);
    let lone_into = got[0].0;
    let mut completed = HashSet::new();
    while completed.len() < 2 {
        if let Event::Completed { job_id } = events.recv_timeout(Duration::from_secs(20))? {
            completed.insert(job_id);
        }
    }
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(h.record(lone.id)?.aggregated_into, Some(lone_into));
    assert_eq!(
        h.record(lone_into)?.state,
        JobState::Finished(FinalStatus::Completed)
    );
    Ok(())
}

fn drain_combines_ready_groups_and_runs_them(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let g = Group::new("u")
        .max_size(10)
        .grace(10 * SEC)
        .max_delay(Duration::from_secs(60));
    for from in ["x", "y"] {
        h.queue.enqueue(
            NewJob::from_args(&Like {
                user: 7,
                from: from.into(),
            })?
            .group(g.clone()),
        )?;
    }
    let worker =
        Worker::builder(h.queue.clone()).handle_group(|likes: Vec<Like>, _ctx| Ok(likes.len()));
    assert!(
        backlog::testing::drain(&worker)?.is_empty(),
        "not ready yet"
    );
    h.advance(11 * SEC);
    let runs = backlog::testing::drain(&worker)?;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].result::<usize>()?, Some(2));
    Ok(())
}

conformance!(
    drain_combines_ready_groups_and_runs_them,
    a_full_group_is_combined_into_one_job_holding_every_payload,
    a_group_is_combined_once_its_grace_passes_without_a_new_member,
    a_group_is_combined_at_its_max_delay_however_often_members_come,
    waiting_members_are_grouped_never_leased_and_not_for_operators,
    a_group_larger_than_its_max_size_is_combined_in_max_size_parts,
    groups_are_per_queue_kind_and_key,
    bad_group_input_is_refused_before_anything_is_written,
    copy_carries_waiting_members_and_aggregated_history,
    a_worker_combines_groups_on_time_and_its_handler_gets_every_args,
);
