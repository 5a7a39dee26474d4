//! `backlog::testing` on every backend. The `_in` helpers read through the
//! application's open transaction: an enqueue not committed yet is seen
//! inside the transaction and not outside it, and once committed, outside
//! too (the matching is the plain forms'; only the read differs per
//! database). `drain` runs a workflow in order, each step after the steps
//! it comes after, and a batch's callbacks once its members are done.

use backlog::testing::{self, Expected, RunOutcome};
use backlog::{JobContext, NewJob, Worker, Workflow};
use serde_json::{json, Value};

use crate::harness::{Backend, QueueTx, TestResult};

/// `$call` with the transaction `tx` holds, as each backend's
/// `ReadThrough` takes it.
macro_rules! through {
    ($tx:expr, |$t:ident| $call:expr) => {
        match $tx {
            QueueTx::Sqlite($t) => {
                let $t = *$t;
                $call
            }
            #[cfg(feature = "postgres")]
            QueueTx::Postgres($t) => {
                let $t = &mut **$t;
                $call
            }
            #[cfg(feature = "mysql")]
            QueueTx::Mysql($t) => {
                let $t = &mut **$t;
                $call
            }
        }
    };
}

fn the_in_helpers_see_an_uncommitted_enqueue_inside_not_outside(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.enqueue(NewJob::new("send_email", json!({"to": "old@b.c"})))?;
    b.in_queue_transaction(q, |tx| {
        tx.enqueue_in(
            q,
            NewJob::new("send_email", json!({"to": "a@b.c"})).queue("mail"),
        )?;
        let expected = Expected::kind("send_email").args(json!({"to": "a@b.c"}));
        let seen = through!(tx, |t| testing::assert_enqueued_in(q, t, expected))?;
        assert_eq!(seen.queue, "mail");
        let all = through!(tx, |t| testing::enqueued_in(q, t, "send_email"))?;
        assert_eq!(all.len(), 2, "the committed job and the uncommitted one");
        through!(tx, |t| testing::assert_not_enqueued_in(q, t, "send_sms"))?;
        let err = through!(tx, |t| testing::assert_not_enqueued_in(
            q,
            t,
            Expected::kind("send_email").queue("mail")
        ))
        .expect_err("the uncommitted job is there inside");
        assert!(err.to_string().contains("a@b.c"), "{err}");
        // Outside the transaction (the queue's own connections): not yet.
        testing::assert_not_enqueued(q, Expected::kind("send_email").queue("mail"))?;
        Ok(())
    })?;
    testing::assert_enqueued(q, Expected::kind("send_email").args(json!({"to": "a@b.c"})))?;
    Ok(())
}

fn drain_runs_a_workflow_in_order_and_a_batch_s_callbacks_once(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    let step = |name: &str| NewJob::new("step", json!({ "step": name }));
    // Added out of order: the workflow's order is its edges'.
    let flow = q.enqueue_workflow(
        Workflow::new("diamond")
            .step_after("d", step("d"), &["b", "c"])
            .step_after("b", step("b"), &["a"])
            .step_after("c", step("c"), &["a"])
            .step("a", step("a")),
    )?;
    let batch = q
        .batch()
        .on_complete(NewJob::new("report", json!({})))
        .on_success(NewJob::new("celebrate", json!({})))
        .create()?;
    for member in 0..2 {
        q.enqueue(NewJob::new("member", json!({ "member": member })).batch(batch.id))?;
    }
    q.seal_batch(batch.id)?;

    let worker = Worker::builder(q.clone())
        // Each step returns its name and what the steps before it returned.
        .handle_raw("step", |args: Value, ctx: &JobContext| {
            let mut before: Vec<String> = ctx
                .dependencies()?
                .iter()
                .filter_map(|d| d.result::<String>().ok().flatten())
                .collect();
            before.sort();
            let name = args["step"].as_str().unwrap_or_default().to_owned();
            Ok(if before.is_empty() {
                name
            } else {
                format!("{name}({})", before.join(","))
            })
        })
        .handle_raw("member", |_: Value, _: &JobContext| Ok(()))
        .handle_raw("report", |args: Value, _: &JobContext| {
            Ok(args["batch_id"].clone())
        })
        .handle_raw("celebrate", |_: Value, _: &JobContext| Ok(()));
    let runs = testing::drain(&worker)?;

    let results: Vec<String> = runs
        .iter()
        .filter(|r| r.kind == "step")
        .map(|r| match &r.outcome {
            RunOutcome::Completed { result: Some(v) } => v.as_str().unwrap_or_default().into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(results.len(), 4, "each step once: {results:?}");
    assert_eq!(results[0], "a");
    let mut middle = results[1..3].to_vec();
    middle.sort();
    assert_eq!(middle, ["b(a)", "c(a)"]);
    assert_eq!(results[3], "d(b(a),c(a))");
    let kinds: Vec<&str> = runs.iter().map(|r| r.kind.as_str()).collect();
    let at = |kind: &str| kinds.iter().rposition(|k| *k == kind);
    assert_eq!(kinds.iter().filter(|k| **k == "report").count(), 1);
    assert_eq!(kinds.iter().filter(|k| **k == "celebrate").count(), 1);
    assert!(
        at("report") > at("member") && at("celebrate") > at("member"),
        "{kinds:?}"
    );
    let report = runs
        .iter()
        .find(|r| r.kind == "report")
        .ok_or("no report")?;
    assert_eq!(report.result::<i64>()?, Some(batch.id));
    assert!(q.workflow(flow.id)?.ok_or("workflow")?.is_finished());
    assert!(testing::drain(&worker)?.is_empty(), "nothing left to run");
    Ok(())
}

conformance!(
    the_in_helpers_see_an_uncommitted_enqueue_inside_not_outside,
    drain_runs_a_workflow_in_order_and_a_batch_s_callbacks_once,
);
