//! The connection budget: 24 worker processes with default options share a
//! server that refuses connections past a limit well under their combined
//! budget. No process dies, every job runs once, the queue drains.
//!
//! Changing a server's `max_connections` takes a restart, so the limit is
//! simulated with one the server enforces the same way: a login of its own
//! with a connection limit (PostgreSQL `CREATE ROLE .. CONNECTION LIMIT`,
//! refused with SQLSTATE 53300; MariaDB `CREATE USER .. WITH
//! MAX_USER_CONNECTIONS`, refused with error 1226). The limit, 36 for 24
//! nodes ([`limit`]), is far below their default budget (five each: the
//! pool and the listener or probe), so the nodes cannot all hold theirs at
//! once, and must wait for room instead of failing; it leaves each the one
//! connection it needs to make progress.
//!
//! The parent sets the queue up and enqueues as the limited login, then
//! watches as an unlimited one (the server's superuser or root). A child is
//! this test binary re-run as `budget_child` with the node's URL in
//! `BACKLOG_BUDGET_URL`. The servers run when `BACKLOG_TEST_POSTGRES_URL` /
//! `BACKLOG_TEST_MYSQL_URL` are set (and the features built); otherwise
//! they print `SKIPPED`. Knobs: `BACKLOG_BUDGET_JOBS` (default 3000),
//! `BACKLOG_BUDGET_NODES` (24), `BACKLOG_BUDGET_LIMIT` (1.5 per node); one
//! node under a limit of 100 measures what a default node holds.

// Without a server feature the scenarios only print SKIPPED and the servers'
// helpers go unused; a plain `cargo test` should not warn about them.
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use backlog::{NewJob, QueueOptions, Worker};
use serde_json::{json, Value};

use harness::{Backend, Children, TestResult};

const URL: &str = "BACKLOG_BUDGET_URL";
const SCHEMA: &str = "BACKLOG_BUDGET_SCHEMA";
/// How long the queue may take to drain, starts included.
const DRAIN_BOUND: Duration = Duration::from_secs(150);

/// The children's entry point; without a URL (a plain `--ignored` run) it
/// returns at once.
#[test]
#[ignore = "a child process of the connection budget suite"]
fn budget_child() -> TestResult {
    let Ok(url) = std::env::var(URL) else {
        return Ok(());
    };
    let mut options = QueueOptions::new();
    if let Ok(schema) = std::env::var(SCHEMA) {
        options = options.schema(schema);
    }
    // Default options throughout: the budget under test is the default one.
    let queue = options.connect(&url)?;
    let _worker = Worker::builder(queue)
        .handle_raw("tick", |_: Value, _| {
            thread::sleep(Duration::from_millis(2));
            Ok(())
        })
        .start()?;
    // Until the parent kills this process.
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// A limited login on one server, with a place for the queue's tables, and
/// an unlimited one to watch with; dropped at the end.
trait Server {
    /// The URL the nodes connect with (the limited login).
    fn node_url(&self) -> String;
    /// The schema the nodes' tables live in (PostgreSQL), if any.
    fn schema(&self) -> Option<String>;
    /// Connections the limited login holds now.
    fn held(&mut self) -> TestResult<i64>;
    /// (completed, completed with more than one attempt, live) jobs.
    fn progress(&mut self) -> TestResult<(i64, i64, i64)>;
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn jobs() -> usize {
    knob("BACKLOG_BUDGET_JOBS", 3000)
}

/// Worker processes.
fn nodes() -> usize {
    knob("BACKLOG_BUDGET_NODES", 24)
}

/// The login's connection limit: one and a half per node, the minimum a
/// node needs to make progress (one pooled connection) and some room, well
/// under its default budget of five (see README, "Connection budget").
fn limit() -> usize {
    knob("BACKLOG_BUDGET_LIMIT", nodes() * 3 / 2)
}

/// 24 default nodes on a server limited to [`limit`] connections for them.
fn nodes_wait_for_room_and_drain_the_queue(
    backend: Backend,
    server: &mut dyn Server,
) -> TestResult {
    let jobs = jobs();
    {
        // Set up as the limited login (so its tables are its own), then let
        // go of its connections before the nodes start.
        let mut options = QueueOptions::new();
        if let Some(schema) = server.schema() {
            options = options.schema(schema);
        }
        let queue = options.connect(&server.node_url())?;
        queue.enqueue_many((0..jobs).map(|i| NewJob::new("tick", json!({ "i": i }))))?;
    }

    let start = Instant::now();
    let mut children = Children(Vec::new());
    for _ in 0..nodes() {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "budget_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(URL, server.node_url())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(schema) = server.schema() {
            command.env(SCHEMA, schema);
        }
        children.0.push(command.spawn()?);
    }

    let mut most_held = 0;
    let (completed, twice) = loop {
        for (i, child) in children.0.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                return Err(
                    format!("node {i} exited ({status}) after {:?}", start.elapsed()).into(),
                );
            }
        }
        most_held = most_held.max(server.held()?);
        let (completed, twice, live) = server.progress()?;
        if live == 0 && completed >= jobs as i64 {
            break (completed, twice);
        }
        if start.elapsed() > DRAIN_BOUND {
            return Err(format!(
                "{completed} of {jobs} jobs completed, {live} live, in {DRAIN_BOUND:?}"
            )
            .into());
        }
        thread::sleep(Duration::from_millis(100));
    };
    let drained_in = start.elapsed();
    // Still alive after the drain, too.
    for (i, child) in children.0.iter_mut().enumerate() {
        if let Some(status) = child.try_wait()? {
            return Err(format!("node {i} exited ({status})").into());
        }
    }
    println!(
        "connection budget ({backend:?}): nodes={} limit={} jobs={jobs} completed={completed} \
         run_twice={twice} most_held={most_held} held_after_drain={} drained_in={:.1}s",
        nodes(),
        limit(),
        server.held()?,
        drained_in.as_secs_f64()
    );
    assert_eq!(completed, jobs as i64);
    assert_eq!(twice, 0, "a job ran more than once");
    Ok(())
}

/// A random name for the login and its schema or database.
fn fresh_name() -> String {
    format!("bt_budget_{:012x}", rand::random::<u64>() >> 16)
}

/// `url` with its user replaced by `user` (no password).
fn with_user(url: &str, user: &str) -> TestResult<String> {
    let (scheme, rest) = url.split_once("://").ok_or("a URL without ://")?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    Ok(format!("{scheme}://{user}@{host}"))
}

#[cfg(feature = "postgres")]
mod pg {
    use backlog::postgres::postgres::{Client, NoTls};

    use super::{fresh_name, with_user, Server, TestResult};

    /// A role limited to `limit` connections, owning a schema of its own.
    pub struct Limited {
        admin: Client,
        admin_url: String,
        name: String,
        url: String,
    }

    impl Limited {
        pub fn create(admin_url: &str, limit: usize) -> TestResult<Limited> {
            let name = fresh_name();
            let mut admin = Client::connect(admin_url, NoTls)?;
            let database: String = admin.query_one("SELECT current_database()", &[])?.get(0);
            admin.batch_execute(&format!(
                "CREATE ROLE {name} LOGIN CONNECTION LIMIT {limit}; \
                 GRANT CREATE ON DATABASE {database} TO {name}; \
                 CREATE SCHEMA {name} AUTHORIZATION {name}",
                limit = limit
            ))?;
            Ok(Limited {
                admin,
                admin_url: admin_url.to_owned(),
                url: with_user(admin_url, &name)?,
                name,
            })
        }
    }

    impl Server for Limited {
        fn node_url(&self) -> String {
            self.url.clone()
        }

        fn schema(&self) -> Option<String> {
            Some(self.name.clone())
        }

        fn held(&mut self) -> TestResult<i64> {
            let row = self.admin.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                &[&self.name],
            )?;
            Ok(row.get(0))
        }

        fn progress(&mut self) -> TestResult<(i64, i64, i64)> {
            let name = &self.name;
            let row = self.admin.query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM {name}.backlog_history \
                             WHERE status = 'completed'), \
                            (SELECT count(*) FROM {name}.backlog_history WHERE attempts <> 1), \
                            (SELECT count(*) FROM {name}.backlog_jobs)"
                ),
                &[],
            )?;
            Ok((row.get(0), row.get(1), row.get(2)))
        }
    }

    impl Drop for Limited {
        fn drop(&mut self) {
            let name = &self.name;
            let drop = format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'; \
                 DROP SCHEMA IF EXISTS {name} CASCADE; DROP OWNED BY {name}; DROP ROLE {name}"
            );
            if self.admin.batch_execute(&drop).is_err() {
                if let Ok(mut admin) = Client::connect(&self.admin_url, NoTls) {
                    let _ = admin.batch_execute(&drop);
                }
            }
        }
    }
}

#[cfg(feature = "mysql")]
mod my {
    use backlog::mysql::mysql::prelude::Queryable;
    use backlog::mysql::mysql::{Conn, Opts};

    use super::{fresh_name, with_user, Server, TestResult};

    /// A user limited to `limit` connections, with a database of its own.
    pub struct Limited {
        admin: Conn,
        name: String,
        url: String,
    }

    impl Limited {
        pub fn create(admin_url: &str, limit: usize) -> TestResult<Limited> {
            let name = fresh_name();
            let mut admin = Conn::new(Opts::from_url(admin_url)?)?;
            admin.query_drop(format!("CREATE DATABASE {name}"))?;
            admin.query_drop(format!(
                "CREATE USER '{name}'@'%' WITH MAX_USER_CONNECTIONS {limit}"
            ))?;
            admin.query_drop(format!("GRANT ALL ON {name}.* TO '{name}'@'%'"))?;
            // Over TCP, so that the user's host '%' is the one that matches.
            let host = with_user(admin_url, &name)?;
            let root = host.split('?').next().unwrap_or(&host);
            let root = root.rsplit_once('/').map_or(root, |(root, _)| root);
            Ok(Limited {
                admin,
                url: format!("{root}/{name}?prefer_socket=false"),
                name,
            })
        }
    }

    impl Server for Limited {
        fn node_url(&self) -> String {
            self.url.clone()
        }

        fn schema(&self) -> Option<String> {
            None
        }

        fn held(&mut self) -> TestResult<i64> {
            let n: Option<i64> = self.admin.exec_first(
                "SELECT count(*) FROM information_schema.processlist WHERE user = ?",
                (&self.name,),
            )?;
            Ok(n.unwrap_or(0))
        }

        fn progress(&mut self) -> TestResult<(i64, i64, i64)> {
            let name = &self.name;
            let row: Option<(i64, i64, i64)> = self.admin.query_first(format!(
                "SELECT (SELECT count(*) FROM {name}.backlog_history WHERE status = 'completed'), \
                        (SELECT count(*) FROM {name}.backlog_history WHERE attempts <> 1), \
                        (SELECT count(*) FROM {name}.backlog_jobs)"
            ))?;
            row.ok_or_else(|| "no row".into())
        }
    }

    impl Drop for Limited {
        fn drop(&mut self) {
            let name = &self.name;
            let _ = self
                .admin
                .query_drop(format!("DROP USER IF EXISTS '{name}'@'%'"));
            let _ = self
                .admin
                .query_drop(format!("DROP DATABASE IF EXISTS {name}"));
        }
    }
}

/// Opening a queue on a server with no room waits up to the connect
/// deadline and then returns the refusal; an unknown database fails at
/// once. `full` is the limited login's URL, with its one connection taken.
fn refusals_wait_up_to_the_connect_deadline(full: &str, unknown: &str) -> TestResult {
    let deadline = Duration::from_secs(2);
    let start = Instant::now();
    let refused = QueueOptions::new().connect_deadline(deadline).connect(full);
    let waited = start.elapsed();
    let error = refused.err().ok_or("connected to a full server")?;
    println!("refused after {waited:?}: {error}");
    assert!(waited >= deadline, "gave up after {waited:?}: {error}");
    assert!(waited < deadline * 3, "waited {waited:?}: {error}");

    let start = Instant::now();
    let error = QueueOptions::new()
        .connect(unknown)
        .err()
        .ok_or("connected to an unknown database")?;
    assert!(
        start.elapsed() < deadline,
        "an unknown database took {:?}: {error}",
        start.elapsed()
    );
    Ok(())
}

/// `url` naming the database `database` instead.
fn on_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
    if query.is_empty() {
        format!("{root}/{database}")
    } else {
        format!("{root}/{database}?{query}")
    }
}

mod postgres {
    use super::*;

    #[test]
    fn refusals_wait_up_to_the_connect_deadline() -> TestResult {
        Backend::Postgres.run(|_| {
            #[cfg(feature = "postgres")]
            {
                let url = std::env::var("BACKLOG_TEST_POSTGRES_URL")?;
                // A role allowed no connection at all: always refused (53300).
                let server = super::pg::Limited::create(&url, 0)?;
                let unknown = on_database(&url, "bt_budget_no_such_database");
                super::refusals_wait_up_to_the_connect_deadline(&server.node_url(), &unknown)
            }
            #[cfg(not(feature = "postgres"))]
            Ok(())
        })
    }

    #[test]
    fn nodes_wait_for_room_and_drain_the_queue() -> TestResult {
        Backend::Postgres.run(|_| {
            #[cfg(feature = "postgres")]
            {
                let url = std::env::var("BACKLOG_TEST_POSTGRES_URL")?;
                let mut server = super::pg::Limited::create(&url, limit())?;
                // The nodes are killed before the role is dropped.
                super::nodes_wait_for_room_and_drain_the_queue(Backend::Postgres, &mut server)
            }
            #[cfg(not(feature = "postgres"))]
            Ok(())
        })
    }
}

mod mysql {
    use super::*;

    #[test]
    fn refusals_wait_up_to_the_connect_deadline() -> TestResult {
        Backend::Mysql.run(|_| {
            #[cfg(feature = "mysql")]
            {
                use backlog::mysql::mysql::{Conn, Opts};
                let url = std::env::var("BACKLOG_TEST_MYSQL_URL")?;
                // One connection allowed (0 would be unlimited), and taken.
                let server = super::my::Limited::create(&url, 1)?;
                let _taken = Conn::new(Opts::from_url(&server.node_url())?)?;
                let unknown = on_database(&url, "bt_budget_no_such_database");
                super::refusals_wait_up_to_the_connect_deadline(&server.node_url(), &unknown)
            }
            #[cfg(not(feature = "mysql"))]
            Ok(())
        })
    }

    #[test]
    fn nodes_wait_for_room_and_drain_the_queue() -> TestResult {
        Backend::Mysql.run(|_| {
            #[cfg(feature = "mysql")]
            {
                let url = std::env::var("BACKLOG_TEST_MYSQL_URL")?;
                let mut server = super::my::Limited::create(&url, limit())?;
                super::nodes_wait_for_room_and_drain_the_queue(Backend::Mysql, &mut server)
            }
            #[cfg(not(feature = "mysql"))]
            Ok(())
        })
    }
}
