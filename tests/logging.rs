//! What backlog logs through `tracing`: a span per job run with its start and
//! finish events, and warnings for what an operator should hear of. Each test
//! captures with its own scoped subscriber, which the worker's threads
//! inherit from the thread that started the worker.

mod worker_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backlog::{Clock, Error, JobError, ManualClock, NewJob, QueueOptions, SystemClock, Worker};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use worker_common::*;

/// One captured event: its level, message, fields, and the spans it was in
/// (outermost first), each with its fields.
#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
    spans: Vec<(String, BTreeMap<String, String>)>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    fn span(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.spans.iter().find(|(n, _)| n == name).map(|(_, f)| f)
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

/// A layer that keeps every event, with its spans' fields.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl Capture {
    /// Installs this capture for the current thread (and, through the
    /// worker, its threads) until the guard drops.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    fn events(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until an event matches; returns it.
    fn wait_for(&self, what: &str, f: impl Fn(&Captured) -> bool) -> TestResult<Captured> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(e) = self.events().into_iter().find(|e| f(e)) {
                return Ok(e);
            }
            if Instant::now() > deadline {
                return Err(format!("no event: {what}; got {:#?}", self.events()).into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let fields = span
                            .extensions()
                            .get::<Fields>()
                            .map(|f| f.0.clone())
                            .unwrap_or_default();
                        (span.name().to_owned(), fields)
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
            spans,
        });
    }
}

/// The `job` span of an event carries the job's id, kind, queue and attempt.
fn in_job(e: &Captured, id: i64, attempt: u32) -> bool {
    e.span("job").is_some_and(|s| {
        s.get("id").map(String::as_str) == Some(id.to_string().as_str())
            && s.get("attempt").map(String::as_str) == Some(attempt.to_string().as_str())
    })
}

#[test]
fn a_job_run_has_a_span_with_start_and_finish_events() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    let queue = db.queue()?;
    let ok = queue
        .enqueue(NewJob::new("greet", json!({"name": "Ada"})))?
        .id;
    let failing = queue.enqueue(NewJob::new("greet", json!({"name": ""})))?.id;

    let worker = Worker::builder(queue.clone())
        .handle_raw("greet", |args, _ctx| {
            tracing::info!(name = %args["name"], "inside the handler");
            if args["name"] == "" {
                return Err(JobError::retry_after(Duration::from_secs(60), "no name"));
            }
            Ok(json!("hello"))
        })
        .start()?;
    capture.wait_for("both jobs finished", |e| {
        e.message.starts_with("job f") && in_job(e, failing, 1)
    })?;
    capture.wait_for("the first job finished", |e| {
        e.message == "job finished" && in_job(e, ok, 1)
    })?;
    worker.shutdown(PATIENCE)?;

    let events = capture.events();
    let of = |id: i64| -> Vec<&Captured> { events.iter().filter(|e| in_job(e, id, 1)).collect() };

    let run = of(ok);
    let messages: Vec<&str> = run.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        ["job started", "inside the handler", "job finished"],
        "{run:#?}"
    );
    let span = run[0].span("job").ok_or("no job span")?;
    assert_eq!(span.get("kind").map(String::as_str), Some("greet"));
    assert_eq!(span.get("queue").map(String::as_str), Some("default"));
    assert_eq!(run[0].level, Level::DEBUG);
    let finished = run[2];
    assert_eq!(finished.level, Level::INFO);
    assert_eq!(finished.field("outcome"), Some("completed"));
    assert!(finished.field("duration").is_some(), "{finished:?}");

    let failed = of(failing);
    let last = failed.last().ok_or("no events of the failing job")?;
    assert_eq!(last.level, Level::WARN);
    assert_eq!(last.field("outcome"), Some("retry"));
    assert_eq!(last.field("error"), Some("no name"));
    assert_eq!(last.field("retry_in"), Some("Some(60s)"));
    Ok(())
}

#[test]
fn a_lost_lease_and_the_rescue_are_warnings() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    // The stale worker's clock runs a minute behind: the leases it takes end
    // in the past for a queue on the right clock, which rescues the job.
    let behind = ManualClock::at(SystemClock.now() - Duration::from_secs(60));
    let stale_queue = db.queue_with(QueueOptions::new().clock(behind))?;
    let queue = db.queue()?;
    let id = stale_queue.enqueue(NewJob::new("work", json!({})))?.id;

    let (started_tx, started) = crossbeam_channel::bounded(1);
    let worker = Worker::builder(stale_queue.clone())
        .concurrency(1)
        .heartbeat_interval(Duration::from_millis(20))
        .handle_raw("work", move |_, ctx| -> Result<(), JobError> {
            let _ = started_tx.try_send(());
            let deadline = Instant::now() + PATIENCE;
            while ctx.attempt() == 1 && !ctx.is_cancelled() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
        .start()?;
    started.recv_timeout(PATIENCE)?;
    assert_eq!(queue.rescue(10)?.rescued, 1);
    let lost = capture.wait_for("the lease lost warning", |e| {
        e.message.starts_with("lease lost") && e.field("job_id") == Some(&id.to_string())
    })?;
    worker.shutdown(PATIENCE)?;

    assert_eq!(lost.level, Level::WARN);
    let rescued = capture.wait_for("the rescue warning", |e| {
        e.message.starts_with("rescued a job") && e.field("job_id") == Some(&id.to_string())
    })?;
    assert_eq!(rescued.level, Level::WARN);
    assert_eq!(rescued.field("became"), Some("available"));
    assert_eq!(rescued.field("attempt"), Some("1"));
    Ok(())
}

#[test]
fn a_handler_past_its_timeout_is_a_warning() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    let queue = db.queue()?;
    let id = queue.enqueue(NewJob::new("slow", json!({})))?.id;
    let worker = Worker::builder(queue.clone())
        .timeout(Duration::from_millis(50))
        .handle_raw("slow", |_, ctx| -> Result<(), JobError> {
            let deadline = Instant::now() + PATIENCE;
            while !ctx.is_cancelled() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(JobError::discard("gave up"))
        })
        .start()?;
    let timeout = capture.wait_for("the timeout warning", |e| {
        e.message.contains("past its timeout") && e.field("job_id") == Some(&id.to_string())
    })?;
    capture.wait_for("the discard", |e| {
        e.message == "job discarded" && in_job(e, id, 1)
    })?;
    worker.shutdown(PATIENCE)?;
    assert_eq!(timeout.level, Level::WARN);
    assert_eq!(timeout.field("kind"), Some("slow"));
    Ok(())
}

#[test]
fn a_write_that_passes_its_deadline_under_a_lock_is_a_warning() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    let queue = db.queue_with(
        QueueOptions::new()
            .busy_timeout(Duration::from_millis(5))
            .write_deadline(Duration::from_millis(100)),
    )?;
    // The lock is held on another thread: on this one the queue would
    // refuse at once (InsideTransaction) instead of waiting for it.
    let other = db.connect()?;
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || -> rusqlite::Result<()> {
        other.execute_batch("BEGIN IMMEDIATE")?;
        let _ = locked.send(());
        let _ = released.recv();
        other.execute_batch("ROLLBACK")
    });
    is_locked.recv_timeout(Duration::from_secs(10))?;
    let refused = queue.enqueue(NewJob::new("k", json!({})));
    drop(release);
    holder.join().map_err(|_| "the lock holder panicked")??;
    assert!(matches!(refused, Err(Error::Busy)), "{refused:?}");
    let busy = capture.wait_for("the busy warning", |e| {
        e.message.contains("past the write deadline")
    })?;
    assert_eq!(busy.level, Level::WARN);
    assert!(busy.field("retries").is_some_and(|n| n != "0"), "{busy:?}");
    Ok(())
}

#[test]
fn a_job_run_inline_by_drain_logs_the_same_span_and_events() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    let queue = db.queue()?;
    let id = queue.enqueue(NewJob::new("k", json!({})))?.id;
    let runs =
        backlog::testing::drain(&Worker::builder(queue.clone()).handle_raw("k", |_, _| Ok(())))?;
    assert_eq!(runs.len(), 1);
    let messages: Vec<String> = capture
        .events()
        .into_iter()
        .filter(|e| in_job(e, id, 1))
        .map(|e| e.message)
        .collect();
    assert_eq!(messages, ["job started", "job finished"]);
    Ok(())
}

#[test]
fn a_worker_warns_once_about_due_jobs_no_live_worker_handles() -> TestResult {
    let capture = Capture::default();
    let _guard = capture.install();
    let db = Db::new()?;
    let queue = db.queue()?;
    queue.enqueue(NewJob::new("orphan", json!({})))?;
    let worker = Worker::builder(queue.clone())
        .lease_ttl(Duration::from_millis(600))
        .heartbeat_interval(Duration::from_millis(30))
        .handle_raw("k", |_, _| Ok(()))
        .start()?;
    let unhandled = |e: &Captured| e.message.contains("no live worker handles");
    let warned = capture.wait_for("the unhandled warning", unhandled)?;
    assert_eq!(warned.level, Level::WARN);
    assert_eq!(warned.field("queue"), Some("default"));
    assert_eq!(warned.field("kind"), Some("orphan"));
    assert_eq!(warned.field("due"), Some("1"));
    // Many more ticks, still one warning.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(capture.events().iter().filter(|e| unhandled(e)).count(), 1);
    worker.shutdown(PATIENCE)?;
    Ok(())
}
