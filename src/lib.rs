//! # backlog
//!
//! An embedded, durable background-job queue. Jobs live in the same SQLite
//! file as your application's data; enqueue them (inside your own transaction
//! if you like), run them on a [`Worker`]'s threads with plain blocking
//! closures, and complete them — again inside your own transaction when the
//! job's effects must happen exactly once.
//!
//! ## Quick start
//!
//! Typed arguments, a worker, and a clean shutdown:
//!
//! ```
//! use std::time::Duration;
//!
//! use backlog::{Event, JobArgs, JobError, Queue, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! /// A job's arguments: any serde type, with the name its handler is
//! /// registered under.
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail {
//!     to: String,
//! }
//!
//! impl JobArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #   let dir = tempfile::tempdir()?;
//! #   let path = dir.path().join("app.db");
//!     let queue = Queue::open(&path)?; // WAL, synchronous=FULL, migrated
//!     let events = queue.subscribe(); // to wait for the job below
//!     let id = queue.enqueue(SendEmail { to: "a@b.c".into() })?.id;
//!
//!     let worker = Worker::builder(queue.clone())
//!         .handle(|args: SendEmail, _ctx| {
//!             if args.to.is_empty() {
//!                 return Err(JobError::discard("no recipient")); // never retried
//!             }
//!             // ... send it; `?` on any error fails the attempt, retried later ...
//!             Ok(format!("sent to {}", args.to)) // stored as the job's result
//!         })
//!         .start()?;
//!
//!     // A real program runs on; this one waits for its one job.
//!     loop {
//!         match events.recv_timeout(Duration::from_secs(10))? {
//!             Event::Completed { job_id } if job_id == id => break,
//!             _ => {}
//!         }
//!     }
//!     worker.shutdown(Duration::from_secs(5))?; // running jobs get 5 s to finish
//!
//!     let record = queue.get(id)?;
//!     assert_eq!(record.state, backlog::JobState::COMPLETED);
//!     assert_eq!(record.result::<String>()?.as_deref(), Some("sent to a@b.c"));
//!     Ok(())
//! }
//! ```
//!
//! See [`worker`] for outcomes (retry, snooze, discard, cancel), timeouts,
//! transactional completion and shutdown, and [`sqlite`] for enqueueing and
//! completing inside your own transactions.
//!
//! ## Leasing by hand
//!
//! Without a worker, a program can lease jobs and settle them itself:
//!
//! ```
//! use backlog::{LeaseRequest, NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! let queue = Queue::open(&path)?;
//! let enqueued = queue.enqueue(NewJob::new("send_email", json!({"to": "a@b.c"})))?;
//!
//! let jobs = queue.lease(&LeaseRequest::new("worker-1", 10))?;
//! for job in &jobs {
//!     // ... do the work ...
//!     queue.complete(job, Some(json!({"sent": true})))?;
//! }
//! assert_eq!(queue.get(enqueued.id)?.state.as_str(), "completed");
//! # Ok(())
//! # }
//! ```
//!
//! See [`inspect`] for a job's life, [`Queue`] for every operation, and the
//! README for the guarantees.
//!
//! ## Logging
//!
//! backlog logs through [`tracing`](https://docs.rs/tracing) and prints
//! nothing itself: install a subscriber to see it. Each job runs inside a
//! `job` span (`id`, `kind`, `queue`, `attempt`), so a handler's own events
//! carry those fields; a `job started` event (debug) and a `job finished`
//! event (info; warn for a retry or a discard, error for a dead job) with
//! the run's `duration` and `outcome` frame it. Warnings report what an
//! operator should hear of: a lease lost, a job rescued after its worker
//! stopped heartbeating, a database error the worker retried or gave up on,
//! the write deadline passed under lock contention (`Error::Busy`), a
//! handler past its timeout, and a WAL over its bound. A worker's threads
//! log to the subscriber in force where it was started, a scoped one
//! (`tracing::subscriber::set_default`) included. See
//! `examples/tracing.rs`.
//!
//! ## Periodic jobs
//!
//! A [`Schedule`] enqueues a job at each tick of a cron expression or a
//! fixed interval, exactly once across every process that runs it: on a
//! worker ([`WorkerBuilder::periodic`]) or a [`Scheduler`]. See [`periodic`].
//!
//! ## Testing your code
//!
//! [`testing`] asserts what your code enqueued (inside an open transaction
//! too), runs the jobs inline with your worker's handlers, and moves a
//! [`ManualClock`] so scheduled jobs and retries come due.

#![warn(missing_docs)]

#[macro_use]
mod failpoint;

mod action;
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "diesel-postgres",
    feature = "diesel-mysql"
))]
mod adapter_flow;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod app_transaction;
#[cfg(feature = "async")]
pub mod async_queue;
mod backend;
pub mod batch;
pub mod clock;
mod copy;
#[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
pub mod diesel;
mod error;
mod events;
pub mod finished;
pub mod flow;
pub mod group;
pub mod inspect;
mod job;
mod lease;
pub mod limits;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "mysql")]
pub mod mysql;
mod options;
mod outcome;
pub mod periodic;
#[cfg(feature = "postgres")]
pub mod postgres;
mod queue;
mod redact;
mod retry;
mod sealed;
pub mod sequence;
pub mod sqlite;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-mysql"))]
pub mod sqlx;
mod sync;
pub mod testing;
mod validate;
pub mod worker;

pub use batch::{Batch, BatchBuilder, BatchStatus};
pub use clock::{Clock, ManualClock, SystemClock};
pub use copy::{copy, CopyReport};
pub use error::{Error, Result};
pub use events::Event;
pub use flow::{
    Dependency, EnqueuedWorkflow, JobLinks, StepOf, Workflow, WorkflowInfo, WorkflowRef,
    WorkflowStep,
};
pub use group::{AggregateReport, Group, MAX_GROUP_SIZE};
pub use inspect::{
    BulkReport, CancelOutcome, FinishedCount, JobFilter, JobRecord, JobState, JobUpdate, Page,
    QueueStats, Retention, StateCount,
};
pub use job::{
    Enqueued, IntoNewJob, JobArgs, NewJob, UniqueScope, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE,
};
pub use lease::{HeartbeatReport, Job, Lease, LeaseRequest, RescueReport, DEFAULT_LEASE_TTL};
pub use limits::{QueueLimits, Rate};
pub use options::{Durability, QueueOptions, DEFAULT_EVENT_CAPACITY, DEFAULT_TABLE_PREFIX};
pub use outcome::{AttemptError, FinalStatus, Outcome, MAX_ERRORS_KEPT};
pub use periodic::{Schedule, ScheduleInfo, Scheduler, SchedulerStats};
pub use queue::{Queue, FIND_UNIQUE_HISTORY, WAIT_MAX_POLL};
pub use redact::redact_url;
pub use retry::RetryPolicy;
pub use validate::{MAX_JSON_DEPTH, MAX_NAME_BYTES, MAX_PROGRESS_BYTES, MAX_UNIQUE_KEY_BYTES};
pub use worker::{
    Action, CancelReason, JobContext, JobError, RunningJob, ShutdownReport, UnhandledJobs, Worker,
    WorkerBuilder, WorkerInfo, DEFAULT_CONCURRENCY, EXPIRY_HEARTBEATS, MAX_CONCURRENCY,
    MAX_PREFETCH, SHUTDOWN_MARGIN,
};

/// The README's code blocks, compiled as doctests so the tour stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Builds only while every extension trait has [`Sealed`] as a supertrait:
/// a bound on one of them then implies `Sealed`.
#[cfg(test)]
#[allow(dead_code)]
mod each_extension_trait_is_sealed {
    use crate::sealed::Sealed;

    fn sealed<T: Sealed>() {}

    fn sqlite<Q: crate::sqlite::QueueExt, J: crate::sqlite::JobContextExt>() {
        sealed::<Q>();
        sealed::<J>();
    }

    #[cfg(feature = "postgres")]
    fn postgres<Q: crate::postgres::QueueExt, J: crate::postgres::JobContextExt>() {
        sealed::<Q>();
        sealed::<J>();
    }

    #[cfg(feature = "mysql")]
    fn mysql<Q: crate::mysql::QueueExt, J: crate::mysql::JobContextExt>() {
        sealed::<Q>();
        sealed::<J>();
    }

    #[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
    fn diesel<C, Q: crate::diesel::QueueExt<C>>() {
        sealed::<Q>();
    }

    #[cfg(any(feature = "sqlx-postgres", feature = "sqlx-mysql"))]
    fn sqlx<D: ::sqlx::Database, Q: crate::sqlx::QueueExt<D>>() {
        sealed::<Q>();
    }
}
