//! No deadlock by construction: every public call of a `Queue` made by a
//! thread inside one of that queue's own transactions (`QueueExt::transaction`
//! of the backend's module, `ctx.transaction` in a handler) answers at once.
//! Writes, `migrate`, a nested transaction and `JobContext::heartbeat` return
//! `InsideTransaction` and write nothing; reads work and see what was
//! committed; the `_in` forms join the transaction. Without the refusal, a
//! write waits for itself: on SQLite for the write connection the
//! transaction holds, on a server for a row lock it holds, 30 s either way.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backlog::{
    Error, Job, JobContext, JobFilter, JobRecord, JobState, JobUpdate, LeaseRequest, NewJob,
    Outcome, Queue, QueueLimits, QueueOptions, Retention, Worker,
};
use serde_json::json;

use crate::harness::{Backend, Harness, QueueTx, TestResult};

/// "At once", generously: the alternative is the 30 s write deadline.
const AT_ONCE: Duration = Duration::from_secs(5);

/// Jobs in every state a call could change, so that a refused call that had
/// written anything would show in their records.
#[derive(Clone)]
struct Fixture {
    /// Available: a lease, `discard_job`, `delete` or `discard_matching`
    /// would take it.
    avail: i64,
    /// Scheduled a minute ahead, unique key `u-1`: `update`, `run_now`,
    /// `cancel` and `cancel_matching` would change it.
    waiting: i64,
    /// Dead: `retry` and `retry_matching` would bring it back.
    dead: i64,
    /// Completed: `prune_history` (keeping nothing) and `delete_matching`
    /// would remove it.
    done: i64,
    /// Leased, its lease run out: `rescue` would free it.
    expired: Job,
    /// Leased: completed with `complete_in` inside the transaction, which
    /// then holds its row; every settle of it through the queue would wait
    /// for that.
    held: Job,
}

impl Fixture {
    fn new(h: &Harness) -> TestResult<Fixture> {
        let q = &h.queue;
        let lease = |ttl: Duration| -> TestResult<Job> {
            q.lease(&LeaseRequest::new("w", 1).ttl(ttl))?
                .pop()
                .ok_or_else(|| "nothing to lease".into())
        };
        let dead = q
            .enqueue(NewJob::new("k", json!("dead")).max_attempts(1))?
            .id;
        q.fail(&lease(Duration::from_secs(60))?, "boom")?;
        let done = q.enqueue(NewJob::new("k", json!("done")))?.id;
        q.complete(&lease(Duration::from_secs(60))?, None)?;
        q.enqueue(NewJob::new("k", json!("expired")))?;
        let expired = lease(Duration::from_secs(5))?;
        q.enqueue(NewJob::new("k", json!("held")))?;
        let held = lease(Duration::from_secs(600))?;
        h.advance(Duration::from_secs(10));
        let avail = q.enqueue(NewJob::new("k", json!("avail")))?.id;
        let waiting = q
            .enqueue(
                NewJob::new("k", json!("waiting"))
                    .delay(Duration::from_secs(60))
                    .unique_key("u-1"),
            )?
            .id;
        assert_eq!(h.state(dead)?, JobState::DEAD);
        assert_eq!(h.state(done)?, JobState::COMPLETED);
        assert_eq!(h.state(waiting)?, JobState::Scheduled);
        Ok(Fixture {
            avail,
            waiting,
            dead,
            done,
            expired,
            held,
        })
    }

    /// The records of the jobs no call inside the transaction may change.
    fn untouched(&self, q: &Queue) -> TestResult<Vec<JobRecord>> {
        [
            self.avail,
            self.waiting,
            self.dead,
            self.done,
            self.expired.id,
        ]
        .into_iter()
        .map(|id| Ok(q.get(id)?))
        .collect()
    }
}

fn refused<T: std::fmt::Debug>(what: &str, result: backlog::Result<T>) -> TestResult {
    match result {
        Err(Error::InsideTransaction) => Ok(()),
        other => Err(format!("{what}: expected InsideTransaction at once, got {other:?}").into()),
    }
}

fn works<T>(what: &str, result: backlog::Result<T>) -> TestResult<T> {
    result.map_err(|e| format!("{what}: expected it to work inside the transaction: {e:?}").into())
}

/// Calls every public method of `q` from inside its transaction `tx` (and,
/// in a handler, those of `ctx`), checking each answer. Returns at the first
/// wrong one.
fn call_every_method(
    backend: Backend,
    q: &Queue,
    fx: &Fixture,
    tx: &mut QueueTx<'_, '_>,
    ctx: Option<&JobContext>,
) -> TestResult {
    // The `_in` forms join the transaction. Fence first: on a server the
    // held job's row is locked from here to the commit.
    works("complete_in", tx.complete_in(q, &fx.held))?;
    let joined = works(
        "enqueue_in",
        tx.enqueue_in(q, NewJob::new("k", json!("joined"))),
    )?
    .id;

    // Reads work, at once, and see what was committed: not the row this
    // transaction locked and changed, nor the job it inserted.
    assert_eq!(works("get", q.get(fx.held.id))?.state, JobState::Running);
    assert!(matches!(q.get(joined), Err(Error::NotFound { .. })));
    let available = works("list", q.list(&JobFilter::new(JobState::Available)))?;
    assert_eq!(
        available.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [fx.avail]
    );
    assert!(!works("counts", q.counts())?.is_empty());
    assert!(!works("stats", q.stats())?.is_empty());
    assert!(works("paused_queues", q.paused_queues())?.is_empty());
    assert_eq!(
        works("limits", q.limits("default"))?,
        QueueLimits::default()
    );
    assert!(works("all_limits", q.all_limits())?.is_empty());
    assert!(works("pending_migrations", q.pending_migrations())?.is_empty());
    assert!(!works("explain_lease", q.explain_lease(&LeaseRequest::new("w", 1)))?.is_empty());
    let unique = works("find_by_unique_key", q.find_by_unique_key("default", "u-1"))?;
    assert_eq!(
        unique.iter().map(|r| r.id).collect::<Vec<_>>(),
        [fx.waiting]
    );
    assert!(!works("finished_per_minute", q.finished_per_minute(60))?.is_empty());
    assert!(works("schedules", q.schedules())?.is_empty());
    let finished = works("wait", q.wait(fx.done, AT_ONCE))?;
    assert_eq!(finished.state, JobState::COMPLETED);
    // Its completion is this transaction's, not committed: nobody sees it yet.
    assert!(matches!(
        q.wait(fx.held.id, Duration::from_millis(20)),
        Err(Error::Timeout { .. })
    ));
    #[cfg(feature = "metrics")]
    assert!(!works("metrics", q.metrics())?.is_empty());
    let _ = (q.path(), q.now(), q.busy_retries(), q.subscribe());
    let _ = (
        backlog::sqlite::QueueExt::wal_size(q),
        backlog::sqlite::QueueExt::longest_maintenance_hold(q),
    );

    // Every write answers InsideTransaction at once, writing nothing.
    refused("migrate", q.migrate())?;
    refused("enqueue", q.enqueue(NewJob::new("k", json!("no"))))?;
    refused(
        "enqueue_many",
        q.enqueue_many([NewJob::new("k", json!("no"))]),
    )?;
    refused("lease", q.lease(&LeaseRequest::new("w", 1)))?;
    let held = &fx.held;
    refused("complete", q.complete(held, None))?;
    refused("fail", q.fail(held, "no"))?;
    refused("snooze", q.snooze(held, Duration::from_secs(1)))?;
    refused("discard", q.discard(held, "no"))?;
    refused("release", q.release(held))?;
    refused("settle", q.settle(held, Outcome::Complete(None)))?;
    refused(
        "settle_many",
        q.settle_many([(held, Outcome::Complete(None))]),
    )?;
    refused("complete_many", q.complete_many([held]))?;
    refused(
        "heartbeat",
        q.heartbeat(&[held.lease()], Duration::from_secs(60)),
    )?;
    refused("rescue", q.rescue(10))?;
    refused("retry", q.retry(fx.dead))?;
    refused("run_now", q.run_now(fx.waiting))?;
    refused("cancel", q.cancel(fx.waiting))?;
    refused("delete", q.delete(fx.avail))?;
    refused("discard_job", q.discard_job(fx.avail, "no"))?;
    refused(
        "update",
        q.update(fx.waiting, &JobUpdate::new().priority(3)),
    )?;
    refused("pause", q.pause("default"))?;
    refused("resume", q.resume("default"))?;
    let limits = QueueLimits {
        concurrency: Some(2),
        ..QueueLimits::default()
    };
    refused("set_limits", q.set_limits("default", limits))?;
    let keep_nothing = Retention {
        completed: Some(Duration::ZERO),
        ..Retention::default()
    };
    refused("prune_history", q.prune_history(&keep_nothing, 10))?;
    refused("aggregate", q.aggregate(10))?;
    refused(
        "discard_matching",
        q.discard_matching(&JobFilter::new(JobState::Available), "no"),
    )?;
    refused(
        "retry_matching",
        q.retry_matching(&JobFilter::new(JobState::DEAD)),
    )?;
    refused(
        "cancel_matching",
        q.cancel_matching(&JobFilter::new(JobState::Scheduled)),
    )?;
    refused(
        "delete_matching",
        q.delete_matching(&JobFilter::new(JobState::COMPLETED)),
    )?;
    refused("remove_schedule", q.remove_schedule("nightly"))?;
    let nested = backend.in_queue_transaction(q, |_| Ok(()));
    match nested {
        Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::InsideTransaction)) => {}
        other => return Err(format!("a nested transaction: got {other:?}").into()),
    }

    if let Some(ctx) = ctx {
        refused("ctx.heartbeat", ctx.heartbeat())?;
        works("ctx.set_progress", ctx.set_progress(&json!({"done": 1})))?;
        let nested = backend.in_job_transaction(ctx, |_| Ok(()));
        match nested {
            Err(e) if matches!(e.backlog_error(), Some(Error::InsideTransaction)) => {}
            other => return Err(format!("a nested ctx.transaction: got {other:?}").into()),
        }
    }
    Ok(())
}

/// What the fixture must look like after the transaction committed: the
/// `_in` calls applied, nothing else changed.
fn check_after(h: &Harness, fx: &Fixture, before: &[JobRecord], live: i64) -> TestResult {
    let q = &h.queue;
    assert_eq!(
        h.state(fx.held.id)?,
        JobState::COMPLETED,
        "complete_in joined"
    );
    let joined = q.list(&JobFilter::new(JobState::Available))?;
    assert_eq!(joined.jobs.len(), 2, "avail and the job enqueue_in added");
    assert_eq!(
        fx.untouched(q)?,
        before,
        "a refused call changed a job's record"
    );
    assert!(q.paused_queues()?.is_empty());
    assert!(q.all_limits()?.is_empty());
    assert_eq!(h.live_rows()?, live, "held left, the joined job came in");
    // Outside the transaction the same thread writes again: the expired
    // lease the refused rescue left alone is rescued now.
    assert_eq!(q.rescue(10)?.rescued, 1);
    Ok(())
}

fn every_call_inside_the_queues_transaction_answers_at_once_and_refused_ones_write_nothing(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let fx = Fixture::new(&h)?;
    let before = fx.untouched(&h.queue)?;
    let live = h.live_rows()?;

    let start = Instant::now();
    b.in_queue_transaction(&h.queue, |tx| {
        call_every_method(*b, &h.queue, &fx, tx, None)
    })?;
    let took = start.elapsed();
    assert!(took < AT_ONCE, "took {took:?}: something waited for itself");
    check_after(&h, &fx, &before, live)?;

    // A transaction that rolled back leaves the thread free too.
    let rolled_back = b.in_queue_transaction(&h.queue, |tx| -> TestResult {
        tx.enqueue_in(&h.queue, NewJob::new("k", json!("rolled back")))?;
        Err("roll back".into())
    });
    assert!(rolled_back.is_err());
    h.queue.enqueue(NewJob::new("k", json!("after")))?;
    Ok(())
}

fn every_call_inside_a_handlers_ctx_transaction_answers_at_once_and_refused_ones_write_nothing(
    b: &Backend,
) -> TestResult {
    let h = b.harness()?;
    let fx = Fixture::new(&h)?;
    let handled = h
        .queue
        .enqueue(NewJob::new("inside", json!({})).queue("handler"))?
        .id;
    let before = fx.untouched(&h.queue)?;
    let live = h.live_rows()?;

    // The handler runs on this thread (`testing::drain`), as a worker's
    // handler thread would run it; its answer is kept for the assertions.
    let answer: Arc<Mutex<Option<String>>> = Arc::default();
    let (backend, queue, fixture, seen) = (*b, h.queue.clone(), fx.clone(), answer.clone());
    let worker = Worker::builder(h.queue.clone())
        .queues(["handler"])
        .handle_raw("inside", move |_, ctx: &JobContext| {
            let result = backend.in_job_transaction(ctx, |tx| {
                call_every_method(backend, &queue, &fixture, tx, Some(ctx))
            });
            *seen.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("{:?}", result.as_ref().map_err(|e| e.to_string())));
            result
        });
    let start = Instant::now();
    let runs = backlog::testing::drain(&worker)?;
    let took = start.elapsed();
    let answer = answer.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        answer.as_deref(),
        Some("Ok(())"),
        "the handler's transaction"
    );
    assert!(took < AT_ONCE, "took {took:?}: something waited for itself");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].job_id, handled);
    assert_eq!(
        h.state(handled)?,
        JobState::COMPLETED,
        "ctx.transaction committed"
    );
    // The handled job left the live table as well as `held`.
    check_after(&h, &fx, &before, live - 1)?;
    Ok(())
}

/// With one pooled connection, a read inside the transaction cannot have a
/// connection of its own on a server (the transaction holds the only one):
/// it answers InsideTransaction at once instead of waiting for the pool. On
/// SQLite reads have their own pool, apart from the write connection, and
/// work. Either way nothing waits.
fn with_one_pooled_connection_a_read_inside_the_transaction_answers_at_once(
    b: &Backend,
) -> TestResult {
    let h = b.harness_with(QueueOptions::new().pool_size(1))?;
    let id = h.queue.enqueue(NewJob::new("k", json!(1)))?.id;
    let start = Instant::now();
    b.in_queue_transaction(&h.queue, |_| {
        let read = h.queue.get(id);
        match b {
            Backend::Sqlite => assert_eq!(read?.state, JobState::Available),
            _ => refused("get on a full pool", read)?,
        }
        refused("enqueue", h.queue.enqueue(NewJob::new("k", json!(2))))
    })?;
    let took = start.elapsed();
    assert!(took < AT_ONCE, "took {took:?}: something waited for itself");
    // Outside, the one connection serves reads and writes again.
    assert_eq!(h.state(id)?, JobState::Available);
    h.queue.enqueue(NewJob::new("k", json!(3)))?;
    assert_eq!(h.live_rows()?, 2);
    Ok(())
}

conformance!(
    every_call_inside_the_queues_transaction_answers_at_once_and_refused_ones_write_nothing,
    every_call_inside_a_handlers_ctx_transaction_answers_at_once_and_refused_ones_write_nothing,
    with_one_pooled_connection_a_read_inside_the_transaction_answers_at_once,
);
