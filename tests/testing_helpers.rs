//! `backlog::testing`: asserting what was enqueued (in an open transaction
//! too), running jobs inline with a worker's handlers, and moving a manual
//! clock so scheduled jobs and retries come due.

mod worker_common;

use std::time::{Duration, SystemTime};

use backlog::sqlite::{JobContextExt, QueueExt};
use backlog::testing::{self, AssertError, Expected, RunOutcome};
use backlog::{
    Error, JobArgs, JobError, JobState, ManualClock, NewJob, Queue, QueueOptions, Worker,
    WorkerBuilder,
};
use rusqlite::TransactionBehavior;
use serde::{Deserialize, Serialize};
use serde_json::json;
use worker_common::*;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct SendEmail {
    to: String,
    template: Template,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Template {
    name: String,
    lang: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

fn email(to: &str, lang: &str) -> SendEmail {
    SendEmail {
        to: to.into(),
        template: Template {
            name: "welcome".into(),
            lang: lang.into(),
        },
    }
}

fn clocked(db: &Db) -> TestResult<(Queue, ManualClock)> {
    let clock = ManualClock::new();
    Ok((
        db.queue_with(QueueOptions::new().clock(clock.clone()))?,
        clock,
    ))
}

#[test]
fn assert_enqueued_matches_kind_args_subset_queue_and_priority() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    queue.enqueue(
        NewJob::from_args(&email("a@b.c", "en"))?
            .queue("mail")
            .priority(5),
    )?;
    let id = queue.enqueue(NewJob::from_args(&email("d@e.f", "fr"))?)?.id;

    // Kind only, as a string.
    testing::assert_enqueued(&queue, "send_email")?;
    // A subset of the arguments, nested objects included.
    let found = testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().args(json!({"template": {"lang": "fr"}})),
    )?;
    assert_eq!(found.id, id);
    testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>()
            .args(json!({"to": "a@b.c"}))
            .queue("mail")
            .priority(5),
    )?;

    // Each criterion can fail on its own.
    for wrong in [
        Expected::of::<SendEmail>().args(json!({"to": "x@y.z"})),
        Expected::of::<SendEmail>().args(json!({"template": {"lang": "de"}})),
        Expected::of::<SendEmail>()
            .args(json!({"to": "a@b.c"}))
            .queue("default"),
        Expected::of::<SendEmail>()
            .args(json!({"to": "a@b.c"}))
            .priority(0),
        Expected::kind("send_sms"),
    ] {
        let what = wrong.to_string();
        match testing::assert_enqueued(&queue, wrong) {
            Err(AssertError::NotEnqueued { .. }) => {}
            other => return Err(format!("{what}: expected NotEnqueued, got {other:?}").into()),
        }
    }
    assert_eq!(testing::enqueued(&queue, "send_email")?.len(), 2);
    Ok(())
}

#[test]
fn assert_enqueued_takes_a_typed_predicate() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    queue.enqueue(email("a@b.c", "en"))?;
    testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().args_where(|e: &SendEmail| e.to.ends_with("@b.c")),
    )?;
    let refused = testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().args_where(|e: &SendEmail| e.template.lang == "fr"),
    );
    assert!(matches!(refused, Err(AssertError::NotEnqueued { .. })));
    // Arguments that do not decode into the predicate's type do not match.
    let refused = testing::assert_enqueued(
        &queue,
        Expected::kind("send_email").args_where(|_: &u64| true),
    );
    assert!(matches!(refused, Err(AssertError::NotEnqueued { .. })));
    Ok(())
}

#[test]
fn a_failed_assertion_says_what_was_expected_and_lists_what_was_there() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let id = queue.enqueue(email("a@b.c", "en"))?.id;

    let missing = testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().args(json!({"to": "x@y.z"})),
    )
    .err()
    .ok_or("the assertion passed")?
    .to_string();
    assert!(
        missing.starts_with(
            r#"expected a job of kind "send_email" with args containing {"to":"x@y.z"}"#
        ),
        "{missing}"
    );
    assert!(missing.contains(&format!("#{id} available")), "{missing}");
    assert!(missing.contains(r#""to":"a@b.c""#), "{missing}");

    let unexpected = testing::assert_not_enqueued(&queue, "send_email")
        .err()
        .ok_or("the assertion passed")?
        .to_string();
    assert!(
        unexpected.starts_with(r#"expected no job of kind "send_email""#),
        "{unexpected}"
    );
    assert!(
        unexpected.contains(&format!("#{id} available")),
        "{unexpected}"
    );

    let nothing = testing::assert_enqueued(&queue, "send_sms")
        .err()
        .ok_or("the assertion passed")?
        .to_string();
    assert!(
        nothing.ends_with("no job of that kind was there"),
        "{nothing}"
    );
    Ok(())
}

#[test]
fn assert_not_enqueued_passes_when_nothing_of_the_kind_is_live() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    testing::assert_not_enqueued(&queue, "send_email")?;
    queue.enqueue(email("a@b.c", "en"))?;
    testing::assert_not_enqueued(
        &queue,
        Expected::of::<SendEmail>().args(json!({"to": "x@y.z"})),
    )?;
    // Once it ran it is history: no longer enqueued, but found by state.
    testing::drain(&Worker::builder(queue.clone()).handle(|_: SendEmail, _| Ok(())))?;
    testing::assert_not_enqueued(&queue, "send_email")?;
    testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().state(JobState::COMPLETED),
    )?;
    Ok(())
}

#[test]
fn the_in_forms_see_an_open_transaction_s_own_enqueues() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let mut conn = db.connect()?;
    conn.execute_batch("CREATE TABLE users (email TEXT NOT NULL)")?;

    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute("INSERT INTO users (email) VALUES ('a@b.c')", [])?;
    queue.enqueue_in(&tx, email("a@b.c", "en"))?;

    testing::assert_enqueued_in(
        &queue,
        &tx,
        Expected::of::<SendEmail>().args(json!({"to": "a@b.c"})),
    )?;
    testing::assert_not_enqueued_in(&queue, &tx, "send_sms")?;
    assert_eq!(testing::enqueued_in(&queue, &tx, "send_email")?.len(), 1);
    // Not committed: the queue's own connections do not see it yet.
    testing::assert_not_enqueued(&queue, "send_email")?;

    tx.rollback()?;
    testing::assert_not_enqueued(&queue, "send_email")?;
    testing::assert_not_enqueued_in(&queue, &conn, "send_email")?;
    Ok(())
}

#[test]
fn the_in_forms_refuse_a_connection_to_another_database() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let other = Db::new()?;
    let conn = other.connect()?;
    match testing::assert_enqueued_in(&queue, &conn, "send_email") {
        Err(AssertError::Database(Error::InvalidArgument(why))) => {
            assert!(why.contains("not on the queue's database"), "{why}")
        }
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    Ok(())
}

/// One handler per outcome, in the style of an application's registration.
fn every_outcome(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .handle_raw("complete", |args, _| Ok(json!({"echo": args})))
        .handle_raw("fail", |_, _| -> Result<(), JobError> {
            Err(JobError::retry_after(
                Duration::from_secs(30),
                "upstream down",
            ))
        })
        .handle_raw("snooze", |_, _| -> Result<(), JobError> {
            Err(JobError::snooze(Duration::from_secs(10)))
        })
        .handle_raw("discard", |_, _| -> Result<(), JobError> {
            Err(JobError::discard("bad address"))
        })
        .handle_raw("cancel", |_, _| -> Result<(), JobError> {
            Err(JobError::cancel("user left"))
        })
        .handle_raw("panic", |_, _| -> Result<(), JobError> { panic!("boom") })
        .handle_raw("in_tx", |_, ctx| ctx.transaction(|_| Ok(7)))
        .handle(|args: SendEmail, _| Ok(args.to))
}

#[test]
fn drain_reports_what_happened_to_each_job() -> TestResult {
    let db = Db::new()?;
    let (queue, clock) = clocked(&db)?;
    let now = queue.now();
    let mut ids = Vec::new();
    for kind in [
        "complete", "fail", "snooze", "discard", "cancel", "panic", "in_tx",
    ] {
        ids.push(queue.enqueue(NewJob::new(kind, json!({"n": 1})))?.id);
    }
    let last_try = queue
        .enqueue(NewJob::new("fail", json!({})).max_attempts(1))?
        .id;
    let undecodable = queue
        .enqueue(NewJob::new("send_email", json!({"to": 3})))?
        .id;

    let runs = testing::drain(&every_outcome(Worker::builder(queue.clone())))?;
    let outcomes: Vec<(i64, RunOutcome)> =
        runs.iter().map(|r| (r.job_id, r.outcome.clone())).collect();
    let secs = |s: u64| now + Duration::from_secs(s);
    assert_eq!(
        outcomes[..7],
        [
            (
                ids[0],
                RunOutcome::Completed {
                    result: Some(json!({"echo": {"n": 1}}))
                }
            ),
            (
                ids[1],
                RunOutcome::Retried {
                    error: "upstream down".into(),
                    available_at: secs(30)
                }
            ),
            (
                ids[2],
                RunOutcome::Snoozed {
                    available_at: secs(10)
                }
            ),
            (
                ids[3],
                RunOutcome::Discarded {
                    reason: "bad address".into()
                }
            ),
            (
                ids[4],
                RunOutcome::Cancelled {
                    reason: "user left".into()
                }
            ),
            (
                ids[5],
                RunOutcome::Retried {
                    error: "handler panicked: boom".into(),
                    available_at: runs[5]
                        .outcome
                        .clone()
                        .retried_at()
                        .ok_or("panic not retried")?
                }
            ),
            (
                ids[6],
                RunOutcome::Completed {
                    result: Some(json!(7))
                }
            ),
        ]
    );
    assert_eq!(
        outcomes[7],
        (
            last_try,
            RunOutcome::Dead {
                error: "upstream down".into()
            }
        )
    );
    assert_eq!(outcomes[8].0, undecodable);
    assert!(
        matches!(&outcomes[8].1, RunOutcome::Dead { error } if error.contains("does not decode")),
        "{:?}",
        outcomes[8]
    );
    assert_eq!(runs.len(), 9);
    assert_eq!(
        runs[0].result::<serde_json::Value>()?,
        Some(json!({"echo": {"n": 1}}))
    );
    assert_eq!(runs[1].error(), Some("upstream down"));
    assert_eq!(
        (runs[1].kind.as_str(), runs[1].queue.as_str()),
        ("fail", "default")
    );
    assert_eq!(queue.get(ids[6])?.state, JobState::COMPLETED);

    // Nothing is due until the clock moves. Ten seconds on: the panicked
    // job's retry (the default policy's backoff, about a second) and the
    // snoozed job; the failure is due at 30 s.
    let worker = every_outcome(Worker::builder(queue.clone()));
    assert!(testing::drain(&worker)?.is_empty());
    clock.advance(Duration::from_secs(10));
    let again: Vec<(i64, u32)> = testing::drain(&worker)?
        .iter()
        .map(|r| (r.job_id, r.attempt))
        .collect();
    assert_eq!(
        again,
        [(ids[5], 2), (ids[2], 1)],
        "a snooze uses no attempt"
    );
    clock.advance(Duration::from_secs(20));
    let again: Vec<(i64, u32)> = testing::drain(&worker)?
        .iter()
        .map(|r| (r.job_id, r.attempt))
        .collect();
    assert!(again.contains(&(ids[1], 2)), "{again:?}");
    Ok(())
}

trait RetriedAt {
    fn retried_at(self) -> Option<SystemTime>;
}

impl RetriedAt for RunOutcome {
    fn retried_at(self) -> Option<SystemTime> {
        match self {
            RunOutcome::Retried { available_at, .. } => Some(available_at),
            _ => None,
        }
    }
}

#[test]
fn drain_runs_follow_up_jobs_and_stops_when_idle() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    queue.enqueue(NewJob::new("countdown", json!(3)))?;
    let q = queue.clone();
    let worker = Worker::builder(queue.clone()).handle_raw("countdown", move |n, _| {
        let n = n.as_u64().ok_or("not a number")?;
        if n > 0 {
            q.enqueue(NewJob::new("countdown", json!(n - 1)))?;
        }
        Ok(n)
    });
    let runs = testing::drain(&worker)?;
    let results: Vec<Option<u64>> = runs.iter().map(|r| r.result()).collect::<Result<_, _>>()?;
    assert_eq!(results, [Some(3), Some(2), Some(1), Some(0)]);
    assert!(testing::drain(&worker)?.is_empty());
    Ok(())
}

#[test]
fn drain_runs_only_the_worker_s_queues_and_kinds_by_priority() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let low = queue.enqueue(NewJob::new("k", json!(1)).queue("a"))?.id;
    let high = queue
        .enqueue(NewJob::new("k", json!(2)).queue("b").priority(9))?
        .id;
    let elsewhere = queue.enqueue(NewJob::new("k", json!(3)).queue("c"))?.id;
    let unhandled = queue.enqueue(NewJob::new("other", json!(4)).queue("a"))?.id;
    let worker = Worker::builder(queue.clone())
        .queues(["a", "b"])
        .handle_raw("k", |_, _| Ok(()));
    let ran: Vec<i64> = testing::drain(&worker)?.iter().map(|r| r.job_id).collect();
    assert_eq!(ran, [high, low]);
    assert_eq!(queue.get(elsewhere)?.state, JobState::Available);
    assert_eq!(queue.get(unhandled)?.state, JobState::Available);
    Ok(())
}

#[test]
fn a_scheduled_job_runs_once_the_manual_clock_reaches_it() -> TestResult {
    let db = Db::new()?;
    let (queue, clock) = clocked(&db)?;
    let id = queue
        .enqueue(NewJob::from_args(&email("a@b.c", "en"))?.delay(Duration::from_secs(3600)))?
        .id;
    testing::assert_enqueued(
        &queue,
        Expected::of::<SendEmail>().state(JobState::Scheduled),
    )?;
    let worker = Worker::builder(queue.clone()).handle(|args: SendEmail, _| Ok(args.to));
    assert!(testing::drain(&worker)?.is_empty());
    clock.advance(Duration::from_secs(3599));
    assert!(testing::drain(&worker)?.is_empty());
    clock.advance(Duration::from_secs(1));
    let runs = testing::drain(&worker)?;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].job_id, id);
    assert_eq!(runs[0].result::<String>()?.as_deref(), Some("a@b.c"));
    Ok(())
}

#[test]
fn drain_gives_up_on_a_job_that_never_stops_coming_due() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let id = queue.enqueue(NewJob::new("again", json!({})))?.id;
    let worker = Worker::builder(queue.clone())
        .handle_raw("again", |_, _| -> Result<(), JobError> {
            Err(JobError::snooze(Duration::ZERO))
        });
    match testing::drain(&worker) {
        Err(Error::InvalidState { job_id, .. }) => assert_eq!(job_id, id),
        other => return Err(format!("expected InvalidState, got {other:?}").into()),
    }
    // Given back, not left leased.
    assert_eq!(queue.get(id)?.state, JobState::Available);
    Ok(())
}

#[test]
fn drain_refuses_a_worker_that_could_not_start() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    match testing::drain(&Worker::builder(queue.clone())) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("handler"), "{why}"),
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    Ok(())
}
