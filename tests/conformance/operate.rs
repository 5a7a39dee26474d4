//! What an operator does to a queue: update a waiting job, read the stats,
//! and retry, cancel or delete many jobs at once.

use std::time::{Duration, UNIX_EPOCH};

use backlog::{
    BulkReport, Error, FinalStatus, JobFilter, JobState, JobUpdate, LeaseRequest, NewJob,
    QueueStats,
};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn update_changes_priority_run_time_and_queue_of_a_waiting_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let first = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let second = h.queue.enqueue(NewJob::new("k", json!(2)))?;
    h.queue.update(second.id, &JobUpdate::new().priority(5))?;
    assert_eq!(h.record(second.id)?.priority, 5);
    assert_eq!(h.lease_one("w")?.id, second.id, "higher priority first");

    let at = h.now() + Duration::from_secs(600);
    h.queue.update(first.id, &JobUpdate::new().run_at(at))?;
    let record = h.record(first.id)?;
    assert_eq!(record.state, JobState::Scheduled);
    assert_eq!(record.available_at, h.now() + Duration::from_secs(600));
    assert!(h.lease("w", 10)?.is_empty());

    h.queue.update(first.id, &JobUpdate::new().queue("other"))?;
    let record = h.record(first.id)?;
    assert_eq!(record.queue, "other");
    assert_eq!(record.updated_at, h.now());
    h.advance(Duration::from_secs(600));
    assert!(
        h.lease("w", 10)?.is_empty(),
        "no longer in the default queue"
    );
    let moved = h
        .queue
        .lease(&LeaseRequest::new("w", 10).queues(["other"]))?;
    assert_eq!(moved.iter().map(|j| j.id).collect::<Vec<_>>(), [first.id]);
    Ok(())
}

fn update_with_a_past_run_time_makes_the_job_due_now(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(3600)))?;
    h.queue
        .update(job.id, &JobUpdate::new().run_at(UNIX_EPOCH))?;
    let record = h.record(job.id)?;
    assert_eq!(record.state, JobState::Available);
    assert_eq!(record.available_at, h.now());
    assert_eq!(h.lease_one("w")?.id, job.id, "a lease finds it at once");
    Ok(())
}

fn update_keeps_attempts_and_errors_of_a_retrying_job(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let enqueued = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    h.queue.fail(&job, "boom")?;
    h.queue.update(enqueued.id, &JobUpdate::new().priority(3))?;
    let record = h.record(enqueued.id)?;
    assert_eq!(record.state, JobState::Retrying);
    assert_eq!((record.attempts, record.errors.len()), (1, 1));
    Ok(())
}

fn update_refuses_unknown_running_and_finished_jobs(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let running = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let job = h.lease_one("w")?;
    let change = JobUpdate::new().priority(1);
    let err = h.queue.update(running.id + 1000, &change).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    let err = h.queue.update(running.id, &change).unwrap_err();
    assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    h.queue.complete(&job, None)?;
    let err = h.queue.update(running.id, &change).unwrap_err();
    assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    assert_eq!(h.record(running.id)?.priority, 0);
    Ok(())
}

fn update_validates_every_value_before_writing(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let job = h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let before = h.record(job.id)?;
    let bad = [
        JobUpdate::new(),
        JobUpdate::new().priority(7).queue(""),
        JobUpdate::new().priority(7).queue("a\nb"),
        JobUpdate::new().priority(7).queue("q".repeat(200)),
    ];
    for update in bad {
        let err = h.queue.update(job.id, &update).unwrap_err();
        assert!(err.is_invalid_input(), "{update:?}: {err:?}");
    }
    assert_eq!(h.record(job.id)?, before, "nothing written");
    Ok(())
}

fn update_refuses_a_move_onto_a_unique_key_held_in_the_target_queue(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let here = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).unique_key("u"))?;
    h.queue
        .enqueue(NewJob::new("k", json!(2)).unique_key("u").queue("there"))?;
    let err = h
        .queue
        .update(here.id, &JobUpdate::new().queue("there"))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    assert_eq!(h.record(here.id)?.queue, "default");
    Ok(())
}

fn stats_report_each_queue_with_recent_completions_and_pauses(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    // Queue a: 1 completed two hours ago, 2 completed now, 1 dead, then
    // 2 available, 1 scheduled, 1 retrying, 1 running.
    q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).queue("a").max_attempts(1)))?;
    let old = q.lease(&LeaseRequest::new("w", 2).queues(["a"]))?;
    q.complete(&old[0], None)?;
    q.fail(&old[1], "dead")?;
    h.advance(Duration::from_secs(7200));
    q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).queue("a")))?;
    let done = q.lease(&LeaseRequest::new("w", 2).queues(["a"]))?;
    h.advance(Duration::from_secs(30));
    q.complete_many(&done)?;
    h.advance(Duration::from_secs(75));
    q.enqueue_many((0..4).map(|i| NewJob::new("k", json!(i)).queue("a")))?;
    q.enqueue(
        NewJob::new("k", json!("later"))
            .queue("a")
            .delay(Duration::from_secs(600)),
    )?;
    let leased = q.lease(&LeaseRequest::new("w", 2).queues(["a"]))?;
    q.fail(&leased[0], "retry me")?;
    // Queue b is empty but paused; queue c has one available job.
    q.pause("b")?;
    q.enqueue(NewJob::new("k", json!(1)).queue("c"))?;

    let stats = q.stats()?;
    // Finished totals since the counts began (see finished_counts.rs).
    let finished = stats[0].finished;
    assert_eq!((finished.completed, finished.dead), (3, 1));
    assert_eq!(
        stats,
        vec![
            QueueStats {
                queue: "a".into(),
                available: 2,
                scheduled: 1,
                retrying: 1,
                running: 1,
                grouped: 0,
                pending: 0,
                dead: 1,
                completed_last_hour: 2,
                completed_last_minute: 0,
                finished,
                paused: false,
                limits: Default::default(),
                // No worker runs: every due job waits for nobody.
                unhandled: vec![unhandled("a", "k", 2)],
            },
            QueueStats {
                queue: "b".into(),
                paused: true,
                ..QueueStats::default()
            },
            QueueStats {
                queue: "c".into(),
                available: 1,
                unhandled: vec![unhandled("c", "k", 1)],
                ..QueueStats::default()
            },
        ]
    );
    // Completions within the last minute are the throughput.
    q.complete(&leased[1], None)?;
    let a = q.stats()?.into_iter().next().ok_or("no queue")?;
    assert_eq!((a.completed_last_minute, a.completed_last_hour), (1, 3));
    assert_eq!(a.running, 0);
    Ok(())
}

fn unhandled(queue: &str, kind: &str, due: u64) -> backlog::UnhandledJobs {
    backlog::UnhandledJobs {
        queue: queue.into(),
        kind: kind.into(),
        due,
    }
}

fn stats_of_an_empty_database_is_empty(b: &Backend) -> TestResult {
    let h = b.harness()?;
    assert!(h.queue.stats()?.is_empty());
    Ok(())
}

fn retry_matching_retries_every_dead_job_of_a_queue_across_pages(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.enqueue_many((0..7).map(|i| NewJob::new("k", json!(i)).queue("a").max_attempts(1)))?;
    q.enqueue(NewJob::new("k", json!("b")).queue("b").max_attempts(1))?;
    for queue in ["a", "b"] {
        for job in q.lease(&LeaseRequest::new("w", 10).queues([queue]))? {
            q.fail(&job, "dead")?;
        }
    }
    let dead = JobFilter::new(JobState::Finished(FinalStatus::Dead));
    let report = q.retry_matching(&dead.clone().queue("a").limit(3))?;
    assert_eq!(
        report,
        BulkReport {
            done: 7,
            ..BulkReport::default()
        }
    );
    assert_eq!(q.list(&JobFilter::new(JobState::Available))?.jobs.len(), 7);
    assert_eq!(q.list(&dead)?.jobs.len(), 1, "queue b untouched");
    Ok(())
}

fn cancel_matching_cancels_waiting_jobs_and_asks_running_ones_to_stop(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.enqueue_many((0..3).map(|i| NewJob::new("email", json!(i))))?;
    q.enqueue(NewJob::new("resize", json!(1)))?;
    let running = q
        .lease(&LeaseRequest::new("w", 1).kinds(["email"]))?
        .pop()
        .ok_or("no job")?;
    let waiting = q.cancel_matching(&JobFilter::new(JobState::Available).kind("email"))?;
    assert_eq!(
        waiting,
        BulkReport {
            done: 2,
            ..BulkReport::default()
        }
    );
    let report = q.cancel_matching(&JobFilter::new(JobState::Running))?;
    assert_eq!((report.done, report.requested), (1, 1));
    assert!(h.record(running.id)?.cancel_requested);
    let cancelled = JobFilter::new(JobState::Finished(FinalStatus::Cancelled));
    assert_eq!(q.list(&cancelled)?.jobs.len(), 2);
    assert_eq!(q.list(&JobFilter::new(JobState::Available))?.jobs.len(), 1);
    Ok(())
}

fn delete_matching_deletes_only_what_the_filter_lists(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.enqueue_many((0..5).map(|i| NewJob::new("k", json!(i)).queue("a")))?;
    q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i)).queue("b")))?;
    let report = q.delete_matching(&JobFilter::new(JobState::Available).queue("a").limit(2))?;
    assert_eq!(report.done, 5);
    assert_eq!(h.live_rows()?, 2);
    let none = q.delete_matching(&JobFilter::new(JobState::Available).queue("a"))?;
    assert_eq!(none, BulkReport::default());
    Ok(())
}

fn discard_job_moves_a_waiting_job_to_history_and_refuses_running_ones(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let waiting = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(60)))?;
    let running = h.queue.enqueue(NewJob::new("k", json!(2)))?;
    let job = h.lease_one("w")?;
    h.queue.discard_job(waiting.id, "bad data")?;
    let record = h.record(waiting.id)?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Discarded));
    assert_eq!(record.finished_at, Some(h.now()));
    assert_eq!(
        record.errors.last().map(|e| e.message.as_str()),
        Some("bad data")
    );
    for id in [waiting.id, running.id] {
        let err = h.queue.discard_job(id, "x").unwrap_err();
        assert!(matches!(err, Error::InvalidState { .. }), "{err:?}");
    }
    let err = h.queue.discard_job(running.id + 1000, "x").unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    h.queue.complete(&job, None)?;

    h.queue
        .enqueue_many((0..3).map(|i| NewJob::new("k", json!(i)).queue("bulk")))?;
    let report = h
        .queue
        .discard_matching(&JobFilter::new(JobState::Available).queue("bulk"), "drain")?;
    assert_eq!(report.done, 3);
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

conformance!(
    discard_job_moves_a_waiting_job_to_history_and_refuses_running_ones,
    update_changes_priority_run_time_and_queue_of_a_waiting_job,
    update_with_a_past_run_time_makes_the_job_due_now,
    update_keeps_attempts_and_errors_of_a_retrying_job,
    update_refuses_unknown_running_and_finished_jobs,
    update_validates_every_value_before_writing,
    update_refuses_a_move_onto_a_unique_key_held_in_the_target_queue,
    stats_report_each_queue_with_recent_completions_and_pauses,
    stats_of_an_empty_database_is_empty,
    retry_matching_retries_every_dead_job_of_a_queue_across_pages,
    cancel_matching_cancels_waiting_jobs_and_asks_running_ones_to_stop,
    delete_matching_deletes_only_what_the_filter_lists,
);

#[cfg(feature = "metrics")]
mod metrics {
    use std::collections::HashMap;

    use backlog::metrics::Metrics;
    use backlog::{LeaseRequest, NewJob};
    use serde_json::json;

    use crate::harness::{Backend, TestResult};

    /// Metric families by name with their type, and samples by series.
    fn parse(text: &str) -> TestResult<(HashMap<String, String>, HashMap<String, f64>)> {
        let mut types = HashMap::new();
        let mut samples = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or(line.to_owned())?;
                types.insert(name.to_owned(), kind.to_owned());
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').ok_or(line.to_owned())?;
                samples.insert(series.to_owned(), value.parse()?);
            }
        }
        Ok((types, samples))
    }

    fn metrics_count_a_known_workload_by_queue_state_and_event(b: &Backend) -> TestResult {
        let h = b.harness()?;
        let q = &h.queue;
        let metrics = Metrics::new(q);
        q.enqueue_many((0..3).map(|i| NewJob::new("email", json!(i)).queue("a")))?;
        q.enqueue(NewJob::new("resize", json!(1)).queue("b").max_attempts(1))?;
        let a = q.lease(&LeaseRequest::new("w", 3).queues(["a"]))?;
        q.complete(&a[0], None)?;
        q.fail(&a[1], "boom")?;
        let b_job = q.lease(&LeaseRequest::new("w", 1).queues(["b"]))?;
        q.fail(&b_job[0], "fatal")?;
        q.pause("b")?;

        let text = metrics.render()?;
        assert!(text.ends_with("# EOF\n"), "{text}");
        let (types, samples) = parse(&text)?;
        assert!(types.keys().all(|n| n.starts_with("backlog_")), "{types:?}");
        let kind = |name: &str| types.get(name).map(String::as_str);
        assert_eq!(kind("backlog_jobs"), Some("gauge"));
        assert_eq!(kind("backlog_dead_letter_jobs"), Some("gauge"));
        assert_eq!(kind("backlog_jobs_enqueued"), Some("counter"));
        assert_eq!(kind("backlog_job_events"), Some("counter"));
        assert_eq!(kind("backlog_job_run_seconds"), Some("histogram"));
        assert_eq!(kind("backlog_busy_retries"), Some("counter"));
        let sample = |series: &str| samples.get(series).copied();
        assert_eq!(
            sample(r#"backlog_jobs{queue="a",state="retrying"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(r#"backlog_jobs{queue="a",state="running"}"#),
            Some(1.0)
        );
        assert_eq!(sample(r#"backlog_jobs{queue="a",state="available"}"#), None);
        assert_eq!(sample(r#"backlog_dead_letter_jobs{queue="b"}"#), Some(1.0));
        assert_eq!(sample(r#"backlog_queue_paused{queue="b"}"#), Some(1.0));
        assert_eq!(
            sample(r#"backlog_jobs_enqueued_total{queue="a",kind="email"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(r#"backlog_jobs_enqueued_total{queue="b",kind="resize"}"#),
            Some(1.0)
        );
        for (event, queue, kind, n) in [
            ("leased", "a", "email", 3.0),
            ("leased", "b", "resize", 1.0),
            ("completed", "a", "email", 1.0),
            ("retried", "a", "email", 1.0),
            ("dead", "b", "resize", 1.0),
        ] {
            let series = format!(
                r#"backlog_job_events_total{{event="{event}",queue="{queue}",kind="{kind}"}}"#
            );
            assert_eq!(sample(&series), Some(n), "{series}");
        }
        assert_eq!(kind("backlog_job_start_latency_seconds"), Some("histogram"));
        // The three started jobs... none was started by a worker here; the
        // lease alone is counted in the events, and the latency is empty.
        assert_eq!(
            sample(r#"backlog_job_start_latency_seconds_count{queue="a",kind="email"}"#),
            None
        );
        assert_eq!(sample("backlog_jobs_in_flight"), Some(1.0));
        assert_eq!(sample("backlog_database_up"), Some(1.0));
        assert_eq!(
            sample("backlog_sqlite_wal_size_bytes").is_some(),
            *b == Backend::Sqlite
        );
        assert_eq!(
            kind("backlog_sqlite_checkpoints").is_some(),
            *b == Backend::Sqlite
        );
        // The gauges alone, as `backlog metrics` prints them.
        let (types, _) = parse(&q.metrics()?)?;
        assert!(types.contains_key("backlog_jobs"));
        assert!(!types.contains_key("backlog_job_events"));
        Ok(())
    }

    fn a_worker_run_is_timed_by_queue_and_kind(b: &Backend) -> TestResult {
        let h = b.harness()?;
        let q = &h.queue;
        let metrics = Metrics::new(q);
        let events = q.subscribe();
        q.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i))))?;
        let worker = backlog::Worker::builder(q.clone())
            .handle_raw("k", |_, _| Ok(()))
            .start()?;
        let mut completed = 0;
        while completed < 2 {
            if let backlog::Event::Completed { .. } =
                events.recv_timeout(std::time::Duration::from_secs(20))?
            {
                completed += 1;
            }
        }
        worker.shutdown(std::time::Duration::from_secs(5))?;
        let (_, samples) = parse(&metrics.render()?)?;
        let sample = |series: &str| samples.get(series).copied();
        for histogram in [
            "backlog_job_start_latency_seconds",
            "backlog_job_run_seconds",
        ] {
            let series = format!(r#"{histogram}_count{{queue="default",kind="k"}}"#);
            assert_eq!(sample(&series), Some(2.0), "{series}");
        }
        Ok(())
    }

    /// Open batches and workflows in progress, as a batch finishes, a
    /// workflow's last step completes and another workflow is cancelled.
    fn metrics_count_open_batches_and_live_workflows(b: &Backend) -> TestResult {
        let h = b.harness()?;
        let q = &h.queue;
        let gauges = || -> TestResult<(Option<f64>, Option<f64>)> {
            let (_, samples) = parse(&q.metrics()?)?;
            Ok((
                samples.get("backlog_open_batches").copied(),
                samples.get("backlog_live_workflows").copied(),
            ))
        };
        assert_eq!(gauges()?, (Some(0.0), Some(0.0)));

        // Open with a member; sealed and empty (finished at once); sealed
        // with a member.
        let open = q.batch().create()?;
        q.enqueue(NewJob::new("member", json!(1)).batch(open.id))?;
        let empty = q.batch().create()?;
        q.seal_batch(empty.id)?;
        let sealed = q
            .batch()
            .on_complete(NewJob::new("report", json!({})).queue("callbacks"))
            .create()?;
        q.enqueue(NewJob::new("last", json!(2)).batch(sealed.id))?;
        q.seal_batch(sealed.id)?;
        let two = q.enqueue_workflow(
            backlog::Workflow::new("two")
                .step("first", NewJob::new("first", json!(1)))
                .step_after("second", NewJob::new("second", json!(2)), &["first"]),
        )?;
        q.enqueue_workflow(
            backlog::Workflow::new("one").step("only", NewJob::new("only", json!(3))),
        )?;
        assert_eq!(gauges()?, (Some(2.0), Some(2.0)));

        let last = q.lease(&LeaseRequest::new("w", 1).kinds(["last"]))?;
        q.complete(&last[0], None)?;
        let only = q.lease(&LeaseRequest::new("w", 1).kinds(["only"]))?;
        q.complete(&only[0], None)?;
        assert_eq!(
            gauges()?,
            (Some(1.0), Some(1.0)),
            "one batch and one workflow left"
        );

        // A running step keeps its workflow in progress.
        let first = q.lease(&LeaseRequest::new("w", 1).kinds(["first"]))?;
        assert_eq!(gauges()?, (Some(1.0), Some(1.0)));
        q.complete(&first[0], None)?;
        assert_eq!(
            gauges()?,
            (Some(1.0), Some(1.0)),
            "the second step is available"
        );
        q.cancel_workflow(two.id)?;
        assert_eq!(gauges()?, (Some(1.0), Some(0.0)));
        Ok(())
    }

    conformance!(
        metrics_count_a_known_workload_by_queue_state_and_event,
        a_worker_run_is_timed_by_queue_and_kind,
        metrics_count_open_batches_and_live_workflows,
    );
}
