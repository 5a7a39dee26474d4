//! Many jobs across several kinds and queues, eight handler threads: each
//! runs and completes exactly once, with its result stored; kinds without a
//! handler and queues not served are never leased.

mod worker_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use backlog::{JobState, NewJob, Worker};
use serde_json::{json, Value};
use worker_common::*;

#[test]
fn jobs_across_kinds_and_queues_complete_exactly_once_with_results() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let events = queue.subscribe();

    const PER_KIND: u32 = 100;
    let mut ids = Vec::new();
    for n in 0..PER_KIND {
        ids.push(queue.enqueue(Work { n })?.id);
        ids.push(
            queue
                .enqueue(NewJob::new("double", json!({"n": n})).queue("media"))?
                .id,
        );
        ids.push(
            queue
                .enqueue(
                    NewJob::new("echo", json!([n, "x"]))
                        .queue("media")
                        .priority(n as i32 % 3),
                )?
                .id,
        );
    }
    let unserved_queue = queue
        .enqueue(NewJob::new("double", json!({"n": 0})).queue("elsewhere"))?
        .id;
    let unknown_kind = queue
        .enqueue(NewJob::new("nobody_handles_this", json!({})))?
        .id;

    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let count = |runs: &Arc<Mutex<HashMap<i64, u32>>>, id: i64| {
        *runs.lock().unwrap().entry(id).or_default() += 1;
    };
    let (r1, r2, r3) = (runs.clone(), runs.clone(), runs.clone());
    let worker = Worker::builder(queue.clone())
        .queues(["default", "media"])
        .concurrency(8)
        .handle(move |args: Work, ctx| {
            count(&r1, ctx.id());
            Ok(json!({"work": args.n}))
        })
        .handle_raw("double", move |payload: Value, ctx| {
            count(&r2, ctx.id());
            Ok(payload["n"].as_u64().unwrap_or(0) * 2)
        })
        .handle_raw("echo", move |payload: Value, ctx| {
            count(&r3, ctx.id());
            Ok(payload)
        })
        .start()?;

    let total = ids.len();
    let seen = wait_count(&events, total, PATIENCE, "completions", completed)?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(seen.len(), total, "every job completed");
    assert!(seen.values().all(|&c| c == 1), "no job completed twice");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), total);
    assert!(runs.values().all(|&c| c == 1), "no handler ran twice");

    for (i, id) in ids.iter().enumerate() {
        let record = expect_state(&queue, *id, "completed")?;
        assert_eq!(record.attempts, 1);
        let n = (i / 3) as u64;
        let expected = match record.kind.as_str() {
            "work" => json!({"work": n}),
            "double" => json!(n * 2),
            _ => json!([n, "x"]),
        };
        let result: Value = serde_json::from_str(record.result.as_deref().ok_or("no result")?)?;
        assert_eq!(result, expected, "result of job {id}");
    }
    for id in [unserved_queue, unknown_kind] {
        let record = queue.get(id)?;
        assert_eq!(record.state, JobState::Available);
        assert_eq!(record.attempts, 0, "never leased");
    }
    Ok(())
}
