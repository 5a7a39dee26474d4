//! Sequences: jobs of one sequence key run one at a time, in the order they
//! were enqueued, across every worker and process (River Pro's sequences).
//!
//! A job enqueued with [`NewJob::sequence`] joins the sequence of that key
//! in its queue. It runs once the job enqueued into the sequence before it
//! has finished, however that one ended: completed, discarded, cancelled or
//! dead (a failed job that is retried still holds the next one until its
//! retries end). Different keys run in parallel.
//!
//! ```
//! use backlog::{JobState, NewJob, Queue};
//! use serde_json::json;
//!
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let queue = Queue::open(dir.path().join("seq.db"))?;
//! let first = queue.enqueue(NewJob::new("sync", json!({"n": 1})).sequence("account-7"))?;
//! let second = queue.enqueue(NewJob::new("sync", json!({"n": 2})).sequence("account-7"))?;
//! let other = queue.enqueue(NewJob::new("sync", json!({"n": 1})).sequence("account-8"))?;
//! assert_eq!(queue.get(first.id)?.state, JobState::Available);
//! assert_eq!(queue.get(second.id)?.state, JobState::Pending, "waits for the first");
//! assert_eq!(queue.get(other.id)?.state, JobState::Available, "another key");
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! A sequence is a chain of dependencies (see [`crate::flow`]) built one
//! link per enqueue. Each sequence has one row (`backlog_sequences`: queue,
//! key, tail) naming the job enqueued into it last. An enqueue, in its own
//! transaction, swaps its job's id in as the tail with one upsert that
//! locks the row (SQLite's single writer; PostgreSQL's `ON CONFLICT DO
//! UPDATE` and MySQL's `ON DUPLICATE KEY UPDATE` hold the row lock until
//! commit), so two enqueues of one key, from any process, chain one after
//! the other and never on the same tail. When the old tail has not
//! finished, the new job waits on it with a run-anyway edge, as
//! [`JobState::Pending`](crate::JobState::Pending); the transaction that
//! finishes the tail releases it, as it releases any dependent. A tail that
//! has finished, or is gone (deleted, or pruned from history), counts at
//! once: the new job is available immediately.
//!
//! Cost: one sequence-row write and at most one edge per job, and the
//! release's one write; enqueues of different keys never wait on each
//! other. Sequence rows are kept after their jobs finish: one small row per
//! key ever used in a queue (a key is at most
//! [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES)), so growth is bounded by the
//! number of keys, not of jobs.
//!
//! # Combinations
//!
//! - With [`NewJob::depends_on`]: the job waits for its dependencies *and*
//!   for the sequence's previous job; a dependency's policy is its own (a
//!   dependency that fails cancels the job, unless
//!   [`NewJob::run_anyway`]). A cancelled job counts as finished for the
//!   next one in the sequence.
//! - Workflows, [`Queue::enqueue_many`](crate::Queue::enqueue_many), the
//!   `_in` forms of `backlog::sqlite`, `backlog::postgres` and
//!   `backlog::mysql`, and periodic schedules: each job chains in the order
//!   it is enqueued. An `_in` enqueue rolled back leaves the chain as it
//!   was. On the servers, one transaction that enqueues into several keys
//!   holds each key's row until it commits: two such transactions taking
//!   the keys in opposite orders can deadlock (backlog's own transactions
//!   retry; an application's gets the database's error).
//! - A unique key, a group or a batch cannot be combined with a sequence
//!   ([`Error::InvalidArgument`], nothing written): a waiting job is
//!   outside the live jobs a unique key or a group applies to.
//! - The sqlx and diesel adapters refuse sequenced jobs
//!   ([`Error::InvalidArgument`]): use the queue's own `_in` forms.
//! - An operator's [`Queue::retry`](crate::Queue::retry) of a finished job
//!   of a sequence runs it again outside the sequence's order: the jobs
//!   after it have already been let go.

use crate::backend::params::EnqueueParams;
use crate::error::{Error, Result};
use crate::flow::Waiting;
use crate::job::NewJob;
use crate::validate;

/// Checks a job's sequence key and what it is combined with; nothing is
/// written before this passes.
pub(crate) fn check(job: &NewJob) -> Result<()> {
    let Some(key) = &job.sequence else {
        return Ok(());
    };
    validate::name("sequence key", key)?;
    if job.unique_key.is_some() || job.group.is_some() || job.batch.is_some() {
        return Err(Error::InvalidArgument(
            "a sequenced job can have neither a unique key, a group nor a batch: it may wait \
             outside the live jobs their rules apply to"
                .into(),
        ));
    }
    Ok(())
}

/// What the engine reads and writes of a sequence in a database, inside the
/// transaction of an enqueue or of a job's end: each backend's
/// `sequences.rs` implements it with its statements; [`swap`], [`write()`]
/// and [`handoff`] decide what to run.
pub(crate) trait Chain {
    /// Where job `id` is: `pending`, `live`, a history status, or `None`
    /// (on a server, its row share-locked, as for a dependency).
    fn state_of(&mut self, id: i64) -> Result<Option<String>>;
    /// The jobs before `id` in its sequence that it waits (or waited) on:
    /// the one enqueued before it, and those handed over to it since.
    fn predecessors(&mut self, id: i64) -> Result<Vec<i64>>;
    /// Makes job `id` the tail of `queue`'s sequence `key` and records the
    /// job's key; the tail it replaced, `None` for a new sequence.
    fn swap_tail(&mut self, queue: &str, key: &str, id: i64) -> Result<Option<i64>>;
    /// Sets `queue`'s sequence `key` back to `tail` where `job` is its tail.
    fn restore_tail(&mut self, queue: &str, key: &str, job: i64, tail: i64) -> Result<()>;
    /// Records the sequence's edge from `dependency` to `dependent`, or
    /// marks a dependency edge between them as the sequence's.
    fn link(&mut self, dependency: i64, dependent: i64) -> Result<()>;
    /// Whether `next` waits on `ended` as the next of its sequence.
    fn is_next(&mut self, ended: i64, next: i64) -> Result<bool>;
    /// The sequence's edge from `before` to `next`, unless an edge between
    /// them is there already; whether it was inserted.
    fn hand_over(&mut self, before: i64, next: i64) -> Result<bool>;
}

/// For a sequenced job `id` just inserted: makes it its sequence's tail,
/// and returns the job it is to wait on and whether that one has not
/// finished ([`wait_on`]). `None` for a job of no sequence or a new
/// sequence.
pub(crate) fn swap(
    chain: &mut impl Chain,
    p: &EnqueueParams<'_>,
    id: i64,
) -> Result<Option<(i64, bool)>> {
    let Some(key) = p.sequence else {
        return Ok(None);
    };
    let tail = chain.swap_tail(p.queue, key, id)?;
    wait_on(chain, tail)
}

/// Runs what [`link`] decided an enqueue writes of its sequence.
pub(crate) fn write(chain: &mut impl Chain, link: Link<'_>) -> Result<()> {
    match link {
        Link::RestoreTail {
            queue,
            key,
            job,
            tail,
        } => chain.restore_tail(queue, key, job, tail),
        Link::Edge {
            dependency,
            dependent,
        } => chain.link(dependency, dependent),
    }
}

/// When `ended` finished other than completed and `next` waits on it as
/// the next of its sequence: if the job before `ended` has not finished
/// (`ended` never ran), makes `next` wait on that one instead. Whether it
/// did (then `next` is not counted down).
pub(crate) fn handoff(chain: &mut impl Chain, ended: i64, next: i64) -> Result<bool> {
    if !chain.is_next(ended, next)? {
        return Ok(false);
    }
    let Some(before) = holding_predecessor(chain, ended)? else {
        return Ok(false);
    };
    chain.hand_over(before, next)
}

/// The job a sequenced job waits on, given the tail it replaced, and
/// whether that job has not finished: the tail, or, when the tail ended
/// without running, the job before it that has not finished (so a
/// cancelled tail does not let the next run beside an earlier one). A tail
/// that finished counts at once.
pub(crate) fn wait_on(chain: &mut impl Chain, tail: Option<i64>) -> Result<Option<(i64, bool)>> {
    let Some(tail) = tail else {
        return Ok(None);
    };
    if holds(chain.state_of(tail)?.as_deref()) {
        return Ok(Some((tail, true)));
    }
    Ok(Some(match holding_predecessor(chain, tail)? {
        Some(before) => (before, true),
        None => (tail, false),
    }))
}

/// The job before `id` in its sequence that has not finished, if any: the
/// one a job after `id` waits on once `id` has ended without running.
pub(crate) fn holding_predecessor(chain: &mut impl Chain, id: i64) -> Result<Option<i64>> {
    for before in chain.predecessors(id)? {
        if holds(chain.state_of(before)?.as_deref()) {
            return Ok(Some(before));
        }
    }
    Ok(None)
}

/// Whether the sequence's previous job, found where `state` says
/// (`pending`, `live`, a history status, or `None`: gone), still holds the
/// next one. Whatever way it ended, it lets the next one run.
pub(crate) fn holds(state: Option<&str>) -> bool {
    matches!(state, Some("pending" | "live"))
}

/// What an enqueue writes of its sequence once `flow::waiting` has decided
/// how job `id` stands, with `tail` what [`wait_on`] found: the sequence's
/// edge when the job waits on an unfinished predecessor; the old tail given
/// back when the job was cancelled at enqueue (a job that never runs must
/// not hold the next one); nothing for a job outside a sequence, or one
/// whose sequence had no tail. Each backend's `sequences.rs` only runs it.
pub(crate) fn link<'a>(
    p: &EnqueueParams<'a>,
    id: i64,
    tail: Option<(i64, bool)>,
    waiting: &Waiting,
) -> Option<Link<'a>> {
    let (Some(key), Some((tail, _))) = (p.sequence, tail) else {
        return None;
    };
    if waiting.cancelled_by.is_some() {
        Some(Link::RestoreTail {
            queue: p.queue,
            key,
            job: id,
            tail,
        })
    } else {
        waiting.tail.map(|dependency| Link::Edge {
            dependency,
            dependent: id,
        })
    }
}

/// A sequence's write at enqueue ([`link`]).
pub(crate) enum Link<'a> {
    /// Sets `queue`'s sequence `key` back to `tail` where `job` is its tail.
    RestoreTail {
        queue: &'a str,
        key: &'a str,
        job: i64,
        tail: i64,
    },
    /// The run-anyway sequence edge: `dependent` waits on `dependency`.
    Edge { dependency: i64, dependent: i64 },
}
