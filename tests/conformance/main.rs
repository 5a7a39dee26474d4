//! The conformance suite: every behaviour of the queue is a scenario written
//! once, and each runs on SQLite, PostgreSQL and MySQL (`sqlite::NAME`,
//! `postgres::NAME`, `mysql::NAME`). The server runs need
//! `BACKLOG_TEST_POSTGRES_URL` / `BACKLOG_TEST_MYSQL_URL` and the cargo
//! features; without them they print `SKIPPED: ...` and pass.
//!
//! What only one database has (SQLite's pragmas, files and query plans; a
//! server's TLS or LISTEN/NOTIFY) is tested in that database's own files.

#[macro_use]
mod harness;

mod bad_input;
mod batches;
mod copy;
mod dependencies;
mod enqueue;
mod enqueue_cut;
mod events;
mod find_unique;
mod finished_counts;
mod finished_per_minute;
mod flow_pruning;
mod group_commit;
mod groups;
mod heartbeat_rescue;
mod inside_transaction;
mod inspect;
mod job_links;
mod lease;
mod limits;
mod limits_bound;
mod limits_hand_on;
mod limits_wake;
mod lookahead;
mod on_time;
mod operate;
mod periodic;
mod progress;
mod proxy;
mod read_cut;
mod reconnect;
mod sequences;
mod settle;
mod sqlite_diagnostics;
mod test_helpers;
mod transactional;
mod unheld;
mod unique_period;
mod wait;
mod wake_up;
mod workers;
mod workflows;
