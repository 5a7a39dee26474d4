//! What the backends store for the live-worker registry
//! (`backlog_workers`, V7): a worker's row, the jobs it holds, and the due
//! jobs per queue and kind that the engine checks against the live workers.
//! The statements are in each database's `workers.rs`.

/// A worker's registration, written when it starts and at every heartbeat
/// tick: an upsert on `id`, so a row that maintenance deleted (the worker
/// was stalled past its expiry) comes back. Times are the engine's (unix
/// µs); the servers apply them as offsets from `now`.
#[derive(Debug)]
pub(crate) struct RegisterWorkerParams<'a> {
    pub id: &'a str,
    pub host: &'a str,
    pub pid: i64,
    /// JSON array of queue names.
    pub queues: &'a str,
    /// JSON array of the kinds with a handler.
    pub kinds: &'a str,
    pub concurrency: i64,
    pub started_at: i64,
    /// When the row counts as gone without another heartbeat.
    pub expires_at: i64,
    pub now: i64,
}

/// A worker's row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerRow {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub queues: String,
    pub kinds: String,
    pub concurrency: i64,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub expires_at: i64,
}

/// A leased job, by the worker holding it (`locked_by`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldJob {
    pub locked_by: String,
    pub id: i64,
    pub queue: String,
    pub kind: String,
}

/// How many jobs of one queue and kind are due (not leased, `available_at`
/// at or before now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DueCount {
    pub queue: String,
    pub kind: String,
    pub count: i64,
}
