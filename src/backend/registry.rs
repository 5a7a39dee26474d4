//! What the backends store for the live-worker registry
//! (`backlog_workers`, V7): a worker's row, the jobs it holds, and the due
//! jobs per queue and kind that the engine checks against the live workers.
//! The statements are in each database's `workers.rs`; the four on a
//! worker's own row are one template ([`worker_statements!`]) each fills in
//! its dialect's words.

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

/// A worker's columns in [`WorkerRow`]'s order: the ones each database's
/// `REGISTER` writes and its `LIVE` reads back by position. A literal, so
/// that each database keeps its statements constants.
macro_rules! worker_columns {
    () => {
        "id, host, pid, queues, kinds, concurrency, started_at, heartbeat_at, expires_at"
    };
}
pub(crate) use worker_columns;

/// A register's refresh of a row already there (the upsert's update):
/// every column but `id` takes the value the insert proposed, as the same
/// statement starts a worker and beats its heartbeat (and brings back a
/// row pruned while the worker stalled). Each database names that
/// value its own way; a column's name goes between `$open` and `$close`:
/// `excluded.col` on PostgreSQL and SQLite, `VALUES(col)` on MySQL.
macro_rules! worker_refresh {
    ($open:literal, $close:literal) => {
        $crate::backend::registry::worker_refresh!($open, $close;
            host, pid, queues, kinds, concurrency, started_at, heartbeat_at, expires_at)
    };
    ($open:literal, $close:literal; $first:ident $(, $column:ident)*) => {
        concat!(
            stringify!($first), " = ", $open, stringify!($first), $close
            $(, ", ", stringify!($column), " = ", $open, stringify!($column), $close)*
        )
    };
}
pub(crate) use worker_refresh;

/// The registry's statements on the worker's own row, the same four on
/// every database, in one dialect's words: `$table` the registry's table,
/// `$id` a worker's id and `$now` the time to compare expiries with (each a
/// placeholder in that dialect), `$values` the row `REGISTER` proposes (in
/// [`WorkerRow`]'s order) and `$upsert` how the dialect says "on a
/// conflict on `id`, update", whose refresh names the proposed value of a
/// column between `$open` and `$close` (see [`worker_refresh!`]).
macro_rules! worker_statements {
    (table: $table:literal, id: $id:literal, now: $now:literal, values: $values:literal,
        upsert: $upsert:literal, refresh: ($open:literal, $close:literal)) => {
        /// Inserts a worker's row, or refreshes every column of it: the same
        /// statement starts a worker and beats its heartbeat, so a row pruned
        /// while the worker was stalled comes back at its next tick.
        pub const REGISTER: &str = concat!(
            "INSERT INTO ",
            $table,
            " (",
            $crate::backend::registry::worker_columns!(),
            ") VALUES ",
            $values,
            "\n",
            $upsert,
            " ",
            $crate::backend::registry::worker_refresh!($open, $close)
        );

        /// Removes a worker's row (a clean shutdown).
        pub const DEREGISTER: &str = concat!("DELETE FROM ", $table, " WHERE id = ", $id);

        /// The workers whose row has not expired at now, by id.
        pub const LIVE: &str = concat!(
            "SELECT ",
            $crate::backend::registry::worker_columns!(),
            " FROM ",
            $table,
            " WHERE expires_at > ",
            $now,
            " ORDER BY id"
        );

        /// Deletes the rows of workers gone without deregistering (crashed).
        pub const PRUNE: &str = concat!("DELETE FROM ", $table, " WHERE expires_at <= ", $now);
    };
}
pub(crate) use worker_statements;

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

#[cfg(test)]
mod tests {
    #[test]
    fn a_refresh_sets_every_column_but_id_in_each_databases_words() {
        assert_eq!(
            worker_refresh!("excluded.", ""),
            "host = excluded.host, pid = excluded.pid, queues = excluded.queues, \
             kinds = excluded.kinds, concurrency = excluded.concurrency, \
             started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, \
             expires_at = excluded.expires_at"
        );
        assert_eq!(
            worker_refresh!("VALUES(", ")"),
            "host = VALUES(host), pid = VALUES(pid), queues = VALUES(queues), \
             kinds = VALUES(kinds), concurrency = VALUES(concurrency), \
             started_at = VALUES(started_at), heartbeat_at = VALUES(heartbeat_at), \
             expires_at = VALUES(expires_at)"
        );
    }
}
