//! # backlog
//!
//! An embedded, durable background-job queue. Jobs live in the same SQLite
//! file as your application's data; enqueue them (inside your own transaction
//! if you like), lease them, and complete them — again inside your own
//! transaction when the job's effects must happen exactly once.
//!
//! ```
//! use backlog::{LeaseRequest, NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! let queue = Queue::open(&path)?; // WAL, synchronous=FULL, migrated
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
//! Applications usually run handlers on a [`Worker`] instead of leasing by
//! hand: see [`worker`] for registering closures, outcomes, transactional
//! completion and shutdown.
//!
//! See [`inspect`] for a job's life, [`Queue`] for every operation, and the
//! README for the guarantees.

#![warn(missing_docs)]

#[macro_use]
mod failpoint;

mod backend;
pub mod clock;
mod copy;
mod error;
mod events;
pub mod inspect;
mod job;
mod lease;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "mysql")]
pub mod mysql;
mod options;
mod outcome;
#[cfg(feature = "postgres")]
pub mod postgres;
mod queue;
mod retry;
pub mod sqlite;
mod validate;
pub mod worker;

pub use clock::{Clock, ManualClock, SystemClock};
pub use copy::{copy, CopyReport};
pub use error::{Error, Result};
pub use events::Event;
pub use inspect::{
    BulkReport, CancelOutcome, JobFilter, JobRecord, JobState, JobUpdate, Page, QueueStats,
    Retention, StateCount,
};
pub use job::{
    Enqueued, IntoNewJob, JobArgs, NewJob, UniqueScope, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE,
};
pub use lease::{HeartbeatReport, Job, Lease, LeaseRequest, RescueReport, DEFAULT_LEASE_TTL};
pub use options::{Durability, QueueOptions, DEFAULT_TABLE_PREFIX};
pub use outcome::{AttemptError, FinalStatus, Outcome, MAX_ERRORS_KEPT};
pub use queue::Queue;
pub use retry::RetryPolicy;
pub use validate::{MAX_JSON_DEPTH, MAX_NAME_BYTES, MAX_UNIQUE_KEY_BYTES};
pub use worker::{
    Action, CancelReason, JobContext, JobError, Worker, WorkerBuilder, DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY, MAX_PREFETCH,
};
