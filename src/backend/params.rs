//! What the engine hands a database and what it gets back: one `*Params`
//! struct per operation, its times already decided by the engine (unix µs of
//! the queue's clock; see the time rule in `backend/mod.rs`), and the small
//! rows the operations return. Every backend imports these from here; none
//! defines its own.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::job::Enqueued;
// A job's dependencies are the job's own data (`NewJob::depends_on`); the
// engine's plans and the backends name them here, beside the params that
// carry them.
pub(crate) use crate::job::{DependsOn, Edge};
use crate::lease::{Job, Lease};
use crate::outcome::{FinalStatus, Transition};

/// A count or a `limit` of the params (a `usize`) as the databases'
/// 64-bit integer: one past `i64::MAX` saturates, which no table reaches.
pub(crate) fn bigint(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One job to insert, validated and encoded by the engine.
#[derive(Debug)]
pub(crate) struct EnqueueParams<'a> {
    pub queue: &'a str,
    pub kind: &'a str,
    pub priority: i32,
    pub unique_key: Option<&'a str>,
    /// With a unique key: also match history rows finished at or after this
    /// time (unix µs).
    pub unique_history_since: Option<i64>,
    /// With `unique_history_since`: only history rows of these statuses (a
    /// JSON array of status names); `None` matches any.
    pub unique_statuses: Option<&'a str>,
    pub payload: &'a str,
    pub max_attempts: u32,
    pub available_at: i64,
    pub now: i64,
    /// A grouped job: it waits in its group instead of being inserted live.
    pub group: Option<GroupParams<'a>>,
    /// The jobs it waits for (`flows.rs` of each backend); empty for a job
    /// that runs on its own.
    pub depends_on: &'a [Edge],
    /// The open batch the job joins ([`NewJob::batch`](crate::NewJob::batch)).
    pub batch: Option<i64>,
    /// The sequence key (in `queue`) the job joins
    /// ([`NewJob::sequence`](crate::NewJob::sequence); each
    /// backend's `sequences.rs`).
    pub sequence: Option<&'a str>,
}

impl EnqueueParams<'_> {
    /// What this job carries that only backlog's own enqueue path applies
    /// (a group's bookkeeping, dependency edges, batch membership, a
    /// sequence's tail), named for an adapter on another driver to refuse;
    /// `None` for a job whose own insert is all its enqueue writes (the
    /// servers then send it as one autocommit statement).
    #[cfg(any(
        feature = "postgres",
        feature = "mysql",
        feature = "sqlx-postgres",
        feature = "sqlx-mysql",
        feature = "diesel-postgres",
        feature = "diesel-mysql"
    ))]
    pub(crate) fn own_path_only(&self) -> Option<&'static str> {
        if self.group.is_some() {
            Some("grouped jobs")
        } else if !self.depends_on.is_empty() {
            Some("jobs with dependencies")
        } else if self.batch.is_some() {
            Some("batch members")
        } else if self.sequence.is_some() {
            Some("sequenced jobs")
        } else {
            None
        }
    }
}

/// A workflow's row and each job's step name, in the batch's order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkflowParams<'a> {
    pub name: &'a str,
    pub steps: &'a [String],
    pub now: i64,
}

/// A job's dependency as its handler reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DependencyRow {
    pub job_id: i64,
    /// Its step name, when both are steps of one workflow.
    pub step: Option<String>,
    /// `completed`, `cancelled`, ...; `None` while not finished.
    pub status: Option<String>,
    /// Its result JSON text, when it completed with one.
    pub result: Option<String>,
}

/// Where a job stands among others: its workflow and step, its batch, what
/// depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct JobLinksRow {
    /// Its workflow's id and name, and its step name.
    pub workflow: Option<(i64, String, String)>,
    /// The batch it is a live member of.
    pub batch: Option<i64>,
    /// The jobs that depend on it, by id.
    pub dependents: Vec<i64>,
}

/// A workflow as stored: id, name, and its steps' names and job ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkflowRow {
    pub id: i64,
    pub name: String,
    pub created_at: i64,
    pub steps: Vec<(String, i64)>,
}

/// The group a job joins, and the group's policy (µs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupParams<'a> {
    pub key: &'a str,
    pub max_size: u32,
    pub grace_us: i64,
    pub max_delay_us: i64,
}

/// A group combined into one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Aggregated {
    pub job_id: i64,
    pub queue: String,
    pub kind: String,
    pub members: usize,
}

/// One claim of up to `limit` jobs.
#[derive(Debug)]
pub(crate) struct LeaseParams<'a> {
    pub queues: &'a [String],
    /// `None` claims any kind.
    pub kinds: Option<&'a [String]>,
    pub limit: usize,
    pub worker_id: &'a str,
    pub now: i64,
    pub lease_until: i64,
    /// At most this many jobs of these queues (the caller's own cap, on top
    /// of the queues' limits).
    pub caps: &'a [(String, usize)],
}

/// Many decided state changes, then a claim of more jobs when `lease` is
/// given, in one transaction: one commit for both halves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SettleAndLeaseParams<'a> {
    pub items: &'a [&'a SettleParams],
    /// The queue each item's job was leased from, as the lease returned it
    /// (only the worker's completer leases here, with its own jobs): the
    /// places of a limited queue that the settled items free, which the
    /// servers' lease may hand on (see [`crate::limits`]). SQLite's single
    /// writer needs no hand-over and does not read it.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub queues: &'a [&'a str],
    pub lease: Option<&'a LeaseParams<'a>>,
    /// SQLite gives up then (`Busy`) however long another process holds the
    /// write lock; the servers have no such lock and keep their own bounds.
    pub until: Option<Instant>,
}

/// Each settle's result (`Ok(true)`: a cancel requested while the job ran
/// won over its reschedule), and the jobs the claim leased.
pub(crate) type SettledAndLeased = (Vec<Result<bool>>, Vec<Job>);

/// One decided state change of a leased job, fenced on its lease.
#[derive(Debug)]
pub(crate) struct SettleParams {
    pub lease: Lease,
    pub transition: Transition,
    pub now: i64,
}

/// A finishing outcome as the engine decided it, encoded for the
/// statements: the only kind the diesel adapters settle (`settle_in` of
/// `backlog::diesel`, whose database halves are each backend's
/// `via_diesel.rs`).
#[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
pub(crate) struct Finishing<'a> {
    pub lease: Lease,
    pub status: &'static str,
    pub result: Option<&'a str>,
    /// The attempt's error as the history's JSON.
    pub error: Option<String>,
    pub now: i64,
}

/// Extends these leases to `lease_until`.
#[derive(Debug)]
pub(crate) struct HeartbeatParams<'a> {
    pub leases: &'a [Lease],
    pub lease_until: i64,
    pub now: i64,
}

/// A running job's progress to write, fenced on its lease.
#[derive(Debug, Clone)]
pub(crate) struct ProgressWrite {
    pub lease: Lease,
    /// JSON text, validated and size-capped by the engine.
    pub progress: String,
}

/// A leased job as the rescuer (its lease expired) or a release of unheld
/// leases (its worker never got it) sees it: no payload.
#[derive(Debug)]
pub(crate) struct ExpiredLease {
    pub lease: Lease,
    pub attempts: u32,
    pub max_attempts: u32,
    /// When the job was due before it was claimed: its place in line.
    pub available_at: i64,
    /// `cancel(id)` was called while it ran: the rescue finishes it as
    /// cancelled instead of running it again.
    pub cancel_requested: bool,
}

/// Rescues up to `limit` leases expired at `now`, each settled as the
/// engine's `decide` says, in one transaction.
pub(crate) struct RescueParams<'a> {
    pub now: i64,
    pub limit: usize,
    pub decide: &'a dyn Fn(&ExpiredLease) -> SettleParams,
}

impl std::fmt::Debug for RescueParams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RescueParams")
            .field("now", &self.now)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// An expired lease and the settle the engine decided for it.
pub(crate) type Rescued = (ExpiredLease, SettleParams);

/// Gives back every live job leased by `worker_id` whose id is not in
/// `held`, each settled as the engine's `decide` says, in one transaction:
/// the claims of a lease whose commit reached the server but whose answer
/// never reached the worker. Fenced twice: a held job is left alone, and so
/// is a job another worker id leased (`locked_by` differs). Server backends
/// lock the rows, skipping one another transaction holds.
pub(crate) struct ReleaseUnheldParams<'a> {
    pub worker_id: &'a str,
    pub held: &'a [i64],
    pub now: i64,
    pub decide: &'a dyn Fn(&ExpiredLease) -> SettleParams,
}

impl std::fmt::Debug for ReleaseUnheldParams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseUnheldParams")
            .field("worker_id", &self.worker_id)
            .field("held", &self.held)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// A decided change to a job that is not leased; `None` fields keep their
/// value. The engine validated every value.
#[derive(Debug)]
pub(crate) struct UpdateParams<'a> {
    pub id: i64,
    pub priority: Option<i32>,
    pub available_at: Option<i64>,
    pub queue: Option<&'a str>,
    pub now: i64,
}

/// Completed jobs per queue since two points in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecentCompletions {
    pub queue: String,
    /// Completed at or after `recent_completions`' `hour_since`.
    pub hour: u64,
    /// Completed at or after `recent_completions`' `minute_since`.
    pub minute: u64,
}

/// A periodic schedule as stored (`backlog_schedules`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScheduleRow {
    pub name: String,
    pub expression: String,
    /// The next tick not yet claimed (unix µs of the schedule's calendar).
    pub next_tick: i64,
    /// The last tick enqueued.
    pub last_tick: Option<i64>,
    pub updated_at: i64,
}

/// Registers a schedule: inserts its row, or when the stored expression
/// differs, replaces it and its next tick (the last registration wins). A
/// row with the same expression is left as it is, its next tick included:
/// a tick missed while no scheduler ran is still seen as missed.
#[derive(Debug)]
pub(crate) struct RegisterScheduleParams<'a> {
    pub name: &'a str,
    pub expression: &'a str,
    pub next_tick: i64,
    pub now: i64,
}

/// Claims the due tick of a schedule: moves `next_tick` on from `seen`, only
/// if the row still holds `seen` and `expression` (the compare-and-set that
/// makes a tick once across schedulers), and in the same transaction
/// enqueues `job` and records `tick` as the last tick; without a job the
/// missed tick is skipped.
#[derive(Debug)]
pub(crate) struct ClaimTickParams<'a> {
    pub name: &'a str,
    pub expression: &'a str,
    pub seen: i64,
    pub next_tick: i64,
    pub tick: i64,
    pub job: Option<EnqueueParams<'a>>,
    pub now: i64,
}

impl ClaimTickParams<'_> {
    /// The tick the claim records as the schedule's last one: this tick when
    /// it enqueues a job, none when it skips one.
    pub(crate) fn last_tick(&self) -> Option<i64> {
        self.job.as_ref().map(|_| self.tick)
    }

    /// What the claim did, read the same way on every backend: `moved`
    /// rows of the compare-and-set (none: another scheduler, or a changed
    /// schedule, got there first); then, in the claim's transaction, the
    /// tick's job is enqueued by `enqueue` (a skipped tick enqueues none).
    pub(crate) fn claimed(
        &self,
        moved: u64,
        enqueue: impl FnOnce(&EnqueueParams<'_>) -> Result<Vec<Enqueued>>,
    ) -> Result<Claimed> {
        if moved == 0 {
            return Ok(Claimed::Lost);
        }
        let Some(job) = &self.job else {
            return Ok(Claimed::Skipped);
        };
        enqueue(job)?
            .pop()
            .map(Claimed::Enqueued)
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    }
}

/// What a claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Another scheduler claimed it first, or the schedule was removed or
    /// registered again with another expression: nothing was written.
    Lost,
    /// The tick was skipped (missed during downtime).
    Skipped,
    /// The tick's job was enqueued (or, `existed`, its unique key was held).
    Enqueued(Enqueued),
}

/// Jobs of one queue that finished with one status in one minute: a row of
/// `Store::finished_per_minute`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FinishedInMinute {
    pub queue: String,
    pub status: String,
    /// Whole minutes between `finished_at` and now (0: the last minute).
    pub minutes_ago: i64,
    pub count: i64,
}

/// Where an operator's action (retry, run_now, cancel, discard, update)
/// found its job, read in the action's own transaction (on the servers with
/// the live row locked), so the engine's verdict is about the job the
/// action saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// No live or finished job has this id.
    Nothing,
    /// Live and leased: a worker runs it.
    Running,
    /// Live and not leased: available, scheduled or retrying.
    Waiting,
    /// In history, finished with this status.
    Finished(FinalStatus),
}

/// What an operator's action did. A backend applies an action only to a
/// job the engine says it applies to
/// (`Action::act`); `applied` is false then
/// only when a live job holds the unique key the change needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acted {
    pub found: Found,
    pub applied: bool,
}
