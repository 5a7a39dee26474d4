//! What a lease hands out: a claimed [`Job`] and its fencing [`Lease`].

use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::Result;
use crate::job::decode_args;

/// The fence of one claim: a job id and the random token of this claim.
///
/// Every state change of a leased job is applied only where both still match,
/// so a caller whose lease expired and was re-claimed changes nothing and gets
/// [`Error::LeaseLost`](crate::Error::LeaseLost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The job's id.
    pub job_id: i64,
    /// The random token of this claim.
    pub token: i64,
}

/// A job claimed by [`Queue::lease`](crate::Queue::lease).
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The job's id.
    pub id: i64,
    /// This claim's fencing token.
    pub lease_token: i64,
    /// The queue.
    pub queue: String,
    /// The kind: the name its handler is registered under.
    pub kind: String,
    /// The priority; higher runs first.
    pub priority: i32,
    /// The unique key, if any.
    pub unique_key: Option<String>,
    /// The payload, JSON text.
    pub payload: String,
    /// Which claim this is, starting at 1.
    pub attempt: u32,
    /// Claims allowed before the job is dead-lettered.
    pub max_attempts: u32,
    /// When the job became (or was scheduled to become) available.
    pub available_at: SystemTime,
    /// When this lease expires unless extended by a heartbeat.
    pub lease_until: SystemTime,
    /// When the job was enqueued.
    pub created_at: SystemTime,
}

impl Job {
    /// Puts the jobs one lease claimed in the order they are handed out:
    /// higher priority first, then the earlier due, then the lower id. The
    /// lease statements of every backend claim in that order, but their rows
    /// come back in no order of their own.
    pub(crate) fn sort_claimed(jobs: &mut [Job]) {
        jobs.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.available_at.cmp(&b.available_at))
                .then(a.id.cmp(&b.id))
        });
    }

    /// The fence of this claim.
    pub fn lease(&self) -> Lease {
        Lease {
            job_id: self.id,
            token: self.lease_token,
        }
    }

    /// Decodes the payload into typed arguments.
    pub fn args<T: DeserializeOwned>(&self) -> Result<T> {
        decode_args(&self.payload)
    }

    /// The payload as a JSON value.
    pub fn payload_value(&self) -> Result<Value> {
        decode_args(&self.payload)
    }

    /// True when this is the last claim before the job is dead-lettered.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }
}

/// What to claim in one [`Queue::lease`](crate::Queue::lease) call.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    pub(crate) queues: Vec<String>,
    pub(crate) kinds: Option<Vec<String>>,
    pub(crate) limit: usize,
    pub(crate) worker_id: String,
    pub(crate) ttl: Duration,
    /// At most this many jobs of a queue in this lease.
    pub(crate) queue_caps: Vec<(String, usize)>,
}

/// How long a lease lasts unless extended. 30 seconds.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

impl LeaseRequest {
    /// Up to `limit` jobs of the `"default"` queue, any kind, for `worker_id`,
    /// with a lease of 30 seconds.
    pub fn new(worker_id: impl Into<String>, limit: usize) -> Self {
        LeaseRequest {
            queues: vec![crate::job::DEFAULT_QUEUE.to_owned()],
            kinds: None,
            limit,
            worker_id: worker_id.into(),
            ttl: DEFAULT_LEASE_TTL,
            queue_caps: Vec::new(),
        }
    }

    /// The queues to claim from. Defaults to `["default"]`.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Only jobs of these kinds. Defaults to every kind.
    pub fn kinds<I, S>(mut self, kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.kinds = Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    /// At most `n` jobs of `queue` in this lease (0: none of it); the rest
    /// of the limit is filled from the other queues. A worker's
    /// [`queue_concurrency`](crate::WorkerBuilder::queue_concurrency) sets
    /// this to what its cap leaves free. Applies on top of the queue's own
    /// limits ([`Queue::set_limits`](crate::Queue::set_limits)). Defaults to
    /// no cap.
    pub fn queue_limit(mut self, queue: impl Into<String>, n: usize) -> Self {
        let queue = queue.into();
        self.queue_caps.retain(|(q, _)| *q != queue);
        self.queue_caps.push((queue, n));
        self
    }

    /// How long the lease lasts unless extended by a heartbeat. Defaults to 30 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
}

/// What one heartbeat found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatReport {
    /// Leases that were extended.
    pub extended: Vec<Lease>,
    /// Leases no longer held (expired and re-claimed, deleted, or finished):
    /// their handlers should stop.
    pub lost: Vec<Lease>,
    /// Jobs among the extended ones whose cancellation was requested.
    pub cancel_requested: Vec<i64>,
}

impl HeartbeatReport {
    /// The report of a heartbeat of `asked`, of which `extended` were
    /// extended (each with whether its cancellation was requested): the
    /// others are lost.
    pub(crate) fn of(asked: &[Lease], extended: impl IntoIterator<Item = (Lease, bool)>) -> Self {
        let mut report = HeartbeatReport::default();
        for (lease, cancel) in extended {
            if cancel {
                report.cancel_requested.push(lease.job_id);
            }
            report.extended.push(lease);
        }
        report.lost = asked
            .iter()
            .filter(|l| !report.extended.contains(l))
            .copied()
            .collect();
        report
    }
}

/// What one rescue pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RescueReport {
    /// Jobs whose lease expired and that are available again.
    pub rescued: usize,
    /// Jobs whose lease expired on their last attempt, moved to history as `dead`.
    pub dead: usize,
    /// Jobs whose lease expired after a cancel was requested, moved to
    /// history as `cancelled`.
    pub cancelled: usize,
}
