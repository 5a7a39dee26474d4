//! Bad input is rejected with a typed error, writes nothing and never panics;
//! names with SQL punctuation are data, stored and returned byte for byte.

use std::time::{Duration, SystemTime};

use backlog::{
    Error, JobFilter, JobState, LeaseRequest, NewJob, QueueOptions, MAX_JSON_DEPTH, MAX_NAME_BYTES,
    MAX_UNIQUE_KEY_BYTES,
};
use serde_json::{json, Value};

use crate::harness::{Backend, Harness, TestResult};

/// No row was written to any of the queue's tables.
fn assert_nothing_written(h: &Harness) -> TestResult {
    for table in ["backlog_jobs", "backlog_history", "backlog_queues"] {
        let rows = h.count(&format!("SELECT count(*) FROM {table}"))?;
        assert_eq!(rows, 0, "{table} has {rows} rows");
    }
    assert!(h.queue.counts()?.is_empty());
    Ok(())
}

fn enqueue_err(h: &Harness, job: NewJob) -> Error {
    match h.queue.enqueue(job) {
        Ok(e) => panic!("enqueue should have been refused, got {e:?}"),
        Err(e) => e,
    }
}

fn nested_array_text(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

fn nested_array_value(depth: usize) -> Value {
    let mut value = Value::Array(Vec::new());
    for _ in 1..depth {
        value = Value::Array(vec![value]);
    }
    value
}

fn payload_text_that_is_not_json_is_invalid_payload(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for text in [
        "",
        "   ",
        "{",
        "not json",
        "{'single': 'quotes'}",
        "{\"a\": 1} trailing",
        "NaN",
        "[1, 2,]",
        "\"unterminated",
        "1e400",
    ] {
        let err = enqueue_err(&h, NewJob::from_json_str("k", text));
        assert!(
            matches!(err, Error::InvalidPayload(_)),
            "{text:?} gave {err:?}"
        );
        assert!(err.is_invalid_input());
    }
    assert_nothing_written(&h)
}

fn payload_over_the_cap_is_payload_too_large(b: &Backend) -> TestResult {
    let h = b.harness_with(QueueOptions::new().max_payload_bytes(64))?;
    let big = json!({ "blob": "x".repeat(100) });
    let size = serde_json::to_string(&big)?.len();
    let err = enqueue_err(&h, NewJob::new("k", big));
    assert!(
        matches!(err, Error::PayloadTooLarge { size: s, limit: 64 } if s == size),
        "{err:?}"
    );
    let text = format!("[{}]", "1,".repeat(40) + "1");
    let err = enqueue_err(&h, NewJob::from_json_str("k", text.clone()));
    assert!(
        matches!(err, Error::PayloadTooLarge { size, limit: 64 } if size == text.len()),
        "{err:?}"
    );
    assert_nothing_written(&h)?;

    // Exactly at the cap is accepted.
    let at_cap = Value::String("y".repeat(62));
    assert_eq!(serde_json::to_string(&at_cap)?.len(), 64);
    h.queue.enqueue(NewJob::new("k", at_cap))?;
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

fn json_text_nested_deeper_than_serde_json_accepts_is_invalid_payload(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for depth in [MAX_JSON_DEPTH + 1, 100_000] {
        let err = enqueue_err(&h, NewJob::from_json_str("k", nested_array_text(depth)));
        assert!(matches!(err, Error::InvalidPayload(_)), "{err:?}");
    }
    let deep_object = "{\"a\":".repeat(MAX_JSON_DEPTH + 1) + "1" + &"}".repeat(MAX_JSON_DEPTH + 1);
    let err = enqueue_err(&h, NewJob::from_json_str("k", deep_object));
    assert!(matches!(err, Error::InvalidPayload(_)), "{err:?}");
    assert_nothing_written(&h)
}

fn json_value_nested_deeper_than_serde_json_accepts_is_invalid_payload(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for depth in [MAX_JSON_DEPTH + 1, 1000] {
        let err = enqueue_err(&h, NewJob::new("k", nested_array_value(depth)));
        assert!(matches!(err, Error::InvalidPayload(_)), "{err:?}");
    }
    assert_nothing_written(&h)?;

    // The deepest accepted payload can be read back by serde_json.
    let deepest = nested_array_value(MAX_JSON_DEPTH);
    h.queue.enqueue(NewJob::new("k", deepest.clone()))?;
    assert_eq!(h.lease_one("w")?.payload_value()?, deepest);
    Ok(())
}

/// Names that are empty, too long or contain control characters.
fn bad_names() -> Vec<String> {
    vec![
        String::new(),
        "q".repeat(MAX_NAME_BYTES + 1),
        // 43 three-byte characters: 129 bytes, though only 43 characters.
        "€".repeat(43),
        "line\nbreak".into(),
        "nul\0byte".into(),
        "tab\there".into(),
        "escape\u{1b}[31m".into(),
        "del\u{7f}".into(),
        "c1\u{85}control".into(),
    ]
}

fn empty_overlong_and_control_character_queue_names_are_invalid_name(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for name in bad_names() {
        let err = enqueue_err(&h, NewJob::new("k", json!(1)).queue(name.clone()));
        assert!(
            matches!(err, Error::InvalidName { what: "queue", .. }),
            "{name:?} gave {err:?}"
        );
        let err = h
            .queue
            .lease(&LeaseRequest::new("w", 1).queues([name.clone()]))
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidName { what: "queue", .. }),
            "{err:?}"
        );
        let err = h.queue.pause(&name).unwrap_err();
        assert!(
            matches!(err, Error::InvalidName { what: "queue", .. }),
            "{err:?}"
        );
    }
    assert_nothing_written(&h)?;
    // The longest allowed name is fine.
    let longest = "q".repeat(MAX_NAME_BYTES);
    let enqueued = h
        .queue
        .enqueue(NewJob::new("k", json!(1)).queue(longest.clone()))?;
    assert_eq!(h.record(enqueued.id)?.queue, longest);
    Ok(())
}

fn empty_overlong_and_control_character_kinds_are_invalid_name(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for name in bad_names() {
        let err = enqueue_err(&h, NewJob::new(name.clone(), json!(1)));
        assert!(
            matches!(err, Error::InvalidName { what: "kind", .. }),
            "{name:?} gave {err:?}"
        );
        let err = h
            .queue
            .lease(&LeaseRequest::new("w", 1).kinds([name.clone()]))
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidName { what: "kind", .. }),
            "{err:?}"
        );
    }
    assert_nothing_written(&h)
}

fn bad_worker_ids_and_unique_keys_are_invalid_name(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for name in bad_names() {
        let err = h
            .queue
            .lease(&LeaseRequest::new(name.clone(), 1))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidName {
                    what: "worker id",
                    ..
                }
            ),
            "{name:?} gave {err:?}"
        );
    }
    for key in [
        String::new(),
        "k".repeat(MAX_UNIQUE_KEY_BYTES + 1),
        "nul\0".into(),
    ] {
        let err = enqueue_err(&h, NewJob::new("k", json!(1)).unique_key(key));
        assert!(
            matches!(
                err,
                Error::InvalidName {
                    what: "unique key",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert_nothing_written(&h)
}

fn negative_or_not_finite_delay_is_invalid_schedule(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for secs in [-1.0, -1e-9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let err = enqueue_err(&h, NewJob::new("k", json!(1)).delay_secs(secs));
        assert!(
            matches!(err, Error::InvalidSchedule(_)),
            "{secs} gave {err:?}"
        );
    }
    assert_nothing_written(&h)
}

fn delay_or_run_at_so_far_ahead_it_overflows_is_invalid_schedule(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let far = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(i64::MAX as u64 / 2))
        .ok_or("this platform's SystemTime cannot hold the test time")?;
    let jobs = [
        NewJob::new("k", json!(1)).delay(Duration::MAX),
        // Fits in i64 µs alone, overflows once added to now.
        NewJob::new("k", json!(1)).delay(Duration::from_micros(i64::MAX as u64)),
        NewJob::new("k", json!(1)).delay_secs(1e300),
        NewJob::new("k", json!(1)).run_at(far),
    ];
    for job in jobs {
        let err = enqueue_err(&h, job);
        assert!(matches!(err, Error::InvalidSchedule(_)), "{err:?}");
    }
    assert_nothing_written(&h)
}

fn max_attempts_zero_is_invalid_argument(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let err = enqueue_err(&h, NewJob::new("k", json!(1)).max_attempts(0));
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_nothing_written(&h)
}

fn lease_of_zero_jobs_or_zero_queues_is_invalid_argument(b: &Backend) -> TestResult {
    let h = b.harness()?;
    h.queue.enqueue(NewJob::new("k", json!(1)))?;
    let err = h.queue.lease(&LeaseRequest::new("w", 0)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = h
        .queue
        .lease(&LeaseRequest::new("w", 1).queues(Vec::<String>::new()))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    // Nothing was claimed.
    let claimed =
        h.count("SELECT count(*) FROM backlog_jobs WHERE lease_token IS NOT NULL OR attempts > 0")?;
    assert_eq!(claimed, 0);
    Ok(())
}

fn unknown_job_id_is_not_found_for_get_retry_cancel_and_delete(b: &Backend) -> TestResult {
    let h = b.harness()?;
    for id in [0, 1, -1, i64::MAX, i64::MIN] {
        let not_found = |r: backlog::Result<()>| match r {
            Err(Error::NotFound { job_id }) => assert_eq!(job_id, id),
            other => panic!("expected NotFound for {id}, got {other:?}"),
        };
        not_found(h.queue.get(id).map(|_| ()));
        not_found(h.queue.retry(id));
        not_found(h.queue.cancel(id).map(|_| ()));
        not_found(h.queue.delete(id));
    }
    assert_nothing_written(&h)
}

fn a_batch_whose_last_job_is_invalid_writes_none_of_the_batch(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let batch = || {
        let mut jobs: Vec<NewJob> = (0..9)
            .map(|i| NewJob::new("k", json!(i)).unique_key(format!("key-{i}")))
            .collect();
        jobs.push(NewJob::from_json_str("k", "{not json"));
        jobs
    };
    let err = h.queue.enqueue_many(batch()).unwrap_err();
    assert!(matches!(err, Error::InvalidPayload(_)), "{err:?}");
    assert_nothing_written(&h)
}

fn names_with_quotes_semicolons_dashes_and_unicode_are_stored_byte_for_byte(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let names = [
        "a'; DROP TABLE backlog_jobs; --",
        "\"quoted\" -- comment",
        "Robert'); DELETE FROM backlog_history WHERE ('1'='1",
        "semi;colon;",
        "/* block */ comment",
        "100% _like_ \\escaped\\",
        "NULL",
        "📨 очередь 队列",
        "e\u{301}", // NFD: must not be normalised to the NFC below
        "\u{e9}",
        " leading and trailing spaces ",
        "?1 ?2 :name @p $v",
    ];
    for name in names {
        let enqueued = h.queue.enqueue(
            NewJob::new(name, json!({ "name": name }))
                .queue(name)
                .unique_key(name),
        )?;
        assert!(!enqueued.existed, "{name:?} collided with another name");

        let record = h.record(enqueued.id)?;
        assert_eq!(record.queue.as_bytes(), name.as_bytes());
        assert_eq!(record.kind.as_bytes(), name.as_bytes());
        assert_eq!(record.unique_key.as_deref(), Some(name));

        let page = h
            .queue
            .list(&JobFilter::new(JobState::Available).queue(name))?;
        assert_eq!(
            page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![enqueued.id],
            "list by queue {name:?}"
        );

        h.queue.pause(name)?;
        assert!(h.queue.paused_queues()?.iter().any(|q| q == name));
        h.queue.resume(name)?;

        let jobs = h
            .queue
            .lease(&LeaseRequest::new(name, 10).queues([name]).kinds([name]))?;
        assert_eq!(jobs.len(), 1, "lease from {name:?}");
        assert_eq!(jobs[0].id, enqueued.id);
        assert_eq!(jobs[0].queue.as_bytes(), name.as_bytes());
        assert_eq!(jobs[0].kind.as_bytes(), name.as_bytes());
        assert_eq!(jobs[0].payload_value()?, json!({ "name": name }));
        h.queue.complete(&jobs[0], None)?;
        assert_eq!(h.record(enqueued.id)?.worker.as_deref(), Some(name));
    }
    assert_eq!(h.history_rows()?, names.len() as i64);
    // The tables are all still there, holding only what was enqueued.
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(
        h.count("SELECT count(*) FROM backlog_queues")?,
        names.len() as i64
    );
    Ok(())
}

conformance!(
    payload_text_that_is_not_json_is_invalid_payload,
    payload_over_the_cap_is_payload_too_large,
    json_text_nested_deeper_than_serde_json_accepts_is_invalid_payload,
    json_value_nested_deeper_than_serde_json_accepts_is_invalid_payload,
    empty_overlong_and_control_character_queue_names_are_invalid_name,
    empty_overlong_and_control_character_kinds_are_invalid_name,
    bad_worker_ids_and_unique_keys_are_invalid_name,
    negative_or_not_finite_delay_is_invalid_schedule,
    delay_or_run_at_so_far_ahead_it_overflows_is_invalid_schedule,
    max_attempts_zero_is_invalid_argument,
    lease_of_zero_jobs_or_zero_queues_is_invalid_argument,
    unknown_job_id_is_not_found_for_get_retry_cancel_and_delete,
    a_batch_whose_last_job_is_invalid_writes_none_of_the_batch,
    names_with_quotes_semicolons_dashes_and_unicode_are_stored_byte_for_byte,
);
