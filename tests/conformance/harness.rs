//! The harness: a fresh database per scenario on each backend, a manual
//! clock, and the few things a scenario must say in its database's own
//! dialect (raw counts, the application's transactions).
//!
//! SQLite gets a new file in a temporary directory. PostgreSQL gets a new
//! schema and MySQL a new database on the server named by
//! `BACKLOG_TEST_POSTGRES_URL` / `BACKLOG_TEST_MYSQL_URL`, dropped when the
//! scenario ends. A server whose URL is unset (or a build without its
//! feature) prints `SKIPPED: ...` and passes: a plain `cargo test` needs no
//! server.

#![allow(dead_code)]

use std::error::Error;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backlog::{
    Enqueued, Job, JobContext, JobError, JobRecord, JobState, LeaseRequest, ManualClock, NewJob,
    Queue, QueueOptions,
};
use tempfile::TempDir;

/// What every scenario returns.
pub type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// A round start time makes failing assertions easier to read.
const START: u64 = 1_700_000_000_000_000;

/// Generates one `#[test]` per backend for each scenario named:
/// `sqlite::NAME`, `postgres::NAME`, `mysql::NAME`.
#[allow(unused_macros)]
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Sqlite.run(super::$name)
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Postgres.run(super::$name)
            })*
        }
        mod mysql {
            $(#[test]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Mysql.run(super::$name)
            })*
        }
    };
}

/// The database a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

impl Backend {
    /// Runs `scenario` on this backend, or says why it was skipped.
    pub fn run(self, scenario: fn(&Backend) -> TestResult) -> TestResult {
        match self.skip_reason() {
            Some(why) => {
                println!("SKIPPED: {why}");
                Ok(())
            }
            None => scenario(&self),
        }
    }

    /// Why this backend cannot run here (its URL is not set, or its
    /// feature is not built), `None` when it can.
    pub fn skip_reason(self) -> Option<String> {
        let (var, feature, built) = match self {
            Backend::Sqlite => return None,
            Backend::Postgres => (
                "BACKLOG_TEST_POSTGRES_URL",
                "postgres",
                cfg!(feature = "postgres"),
            ),
            Backend::Mysql => ("BACKLOG_TEST_MYSQL_URL", "mysql", cfg!(feature = "mysql")),
        };
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            Some(format!("set {var} to run this scenario on {feature}"))
        } else if !built {
            Some(format!("build with --features {feature} to run it"))
        } else {
            None
        }
    }

    /// The server URL of this backend (servers only).
    fn url(self) -> TestResult<String> {
        let var = match self {
            Backend::Postgres => "BACKLOG_TEST_POSTGRES_URL",
            Backend::Mysql => "BACKLOG_TEST_MYSQL_URL",
            Backend::Sqlite => return Err("SQLite has no URL".into()),
        };
        Ok(std::env::var(var)?)
    }

    /// A queue with default options on a fresh database, on a manual clock.
    pub fn harness(&self) -> TestResult<Harness> {
        self.harness_with(QueueOptions::new())
    }

    /// A queue with `options` and the system clock on a fresh database, for
    /// scenarios about when things happen in real time.
    pub fn harness_on_real_time(&self, options: QueueOptions) -> TestResult<Harness> {
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_micros(START));
        let db = Db::create(*self)?;
        let queue = db.open(options)?;
        Ok(Harness { queue, clock, db })
    }

    /// A queue with `options` (its clock replaced by a manual one) on a
    /// fresh database.
    pub fn harness_with(&self, options: QueueOptions) -> TestResult<Harness> {
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_micros(START));
        let db = Db::create(*self)?;
        let queue = db.open(options.clock(clock.clone()))?;
        Ok(Harness { queue, clock, db })
    }
}

/// A scenario's queue, clock and database.
pub struct Harness {
    pub queue: Queue,
    pub clock: ManualClock,
    db: Db,
}

impl Harness {
    pub fn backend(&self) -> Backend {
        self.db.backend()
    }

    /// A second, independent queue handle on the same database and clock
    /// (its own connections: another process or node).
    pub fn second_handle(&self) -> TestResult<Queue> {
        self.db.open(QueueOptions::new().clock(self.clock.clone()))
    }

    /// Another handle on the same database with `options` (a clock of its own
    /// if the options carry one).
    pub fn handle_with(&self, options: QueueOptions) -> TestResult<Queue> {
        self.db.open(options)
    }

    pub fn now(&self) -> SystemTime {
        self.queue.now()
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Leases up to `n` jobs of the default queue as `worker`.
    pub fn lease(&self, worker: &str, n: usize) -> TestResult<Vec<Job>> {
        Ok(self.queue.lease(&LeaseRequest::new(worker, n))?)
    }

    /// Leases exactly one job of the default queue, failing the test otherwise.
    pub fn lease_one(&self, worker: &str) -> TestResult<Job> {
        let mut jobs = self.lease(worker, 1)?;
        jobs.pop()
            .ok_or_else(|| "expected a job to lease, found none".into())
    }

    pub fn state(&self, id: i64) -> TestResult<JobState> {
        Ok(self.queue.get(id)?.state)
    }

    pub fn record(&self, id: i64) -> TestResult<JobRecord> {
        Ok(self.queue.get(id)?)
    }

    pub fn live_rows(&self) -> TestResult<i64> {
        self.count("SELECT count(*) FROM backlog_jobs")
    }

    pub fn history_rows(&self) -> TestResult<i64> {
        self.count("SELECT count(*) FROM backlog_history")
    }

    /// The single integer `sql` returns, on a connection of the test's own.
    /// Keep `sql` portable: it runs on every backend.
    pub fn count(&self, sql: &str) -> TestResult<i64> {
        self.db.count(sql)
    }

    /// How many effect rows a job has (the application's `effects` table).
    pub fn effects_of(&self, job_id: i64) -> TestResult<i64> {
        self.count(&format!(
            "SELECT count(*) FROM effects WHERE job_id = {job_id}"
        ))
    }

    /// In one application transaction: an effect row for `job_id` and the
    /// `jobs` enqueued with `enqueue_many_in`; committed or rolled back.
    pub fn enqueue_in(
        &self,
        effect_for: i64,
        jobs: Vec<NewJob>,
        commit: bool,
    ) -> TestResult<backlog::Result<Vec<Enqueued>>> {
        self.db.enqueue_in(&self.queue, effect_for, jobs, commit)
    }

    /// In one application transaction: an effect row for `job` and its
    /// completion with `complete_in`; committed when both succeed and
    /// `commit`, rolled back otherwise. Returns what `complete_in` said.
    pub fn complete_in(&self, job: &Job, commit: bool) -> TestResult<backlog::Result<()>> {
        self.db.complete_in(&self.queue, job, commit)
    }

    /// The server's `host:port` (servers only), for a proxy in front of it.
    pub fn server_addr(&self) -> TestResult<String> {
        let host = split_url(&self.db.url()?)?.1;
        if host.contains(':') {
            return Ok(host);
        }
        let port = if self.backend() == Backend::Mysql {
            3306
        } else {
            5432
        };
        Ok(format!("{host}:{port}"))
    }

    /// Another handle on the same database (its own connections), reaching
    /// the server at `addr` instead (a proxy's): servers only. MariaDB's
    /// driver would take the Unix socket for 127.0.0.1, past the proxy.
    pub fn handle_through(&self, addr: &str, options: QueueOptions) -> TestResult<Queue> {
        let (head, _, tail) = split_url(&self.db.url()?)?;
        let mut url = format!("{head}{addr}{tail}");
        // MySQL's driver prefers the Unix socket on 127.0.0.1, which would
        // go around the proxy; PostgreSQL negotiates TLS when the server
        // offers it, and the proxy could not read the requests it marks.
        let plain = match self.backend() {
            Backend::Mysql => Some("prefer_socket=false"),
            Backend::Postgres => Some("sslmode=disable"),
            Backend::Sqlite => None,
        };
        if let Some(plain) = plain {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(plain);
        }
        Ok(match &self.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => options.schema(&s.name).connect(&url)?,
            _ => options.connect(&url)?,
        })
    }

    /// The environment a child process needs to open this scenario's
    /// database: see [`child_queue`].
    pub fn child_env(&self) -> Vec<(&'static str, String)> {
        let (target, schema) = match &self.db {
            Db::Sqlite { dir } => (
                format!("sqlite:{}", dir.path().join("backlog.db").display()),
                String::new(),
            ),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => (s.url.clone(), s.name.clone()),
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => (d.url.clone(), String::new()),
        };
        vec![
            (CHILD_BACKEND, format!("{:?}", self.backend())),
            (CHILD_TARGET, target),
            (CHILD_SCHEMA, schema),
        ]
    }

    /// What a transactional handler does: an effect row for its job and the
    /// completion, in `ctx.transaction(..)`.
    pub fn effects(&self) -> Effects {
        let table = match &self.db {
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => format!("{}.effects", s.name),
            _ => "effects".to_owned(),
        };
        Effects {
            backend: self.backend(),
            table,
        }
    }
}

/// Writes a handler's effect in `ctx.transaction(..)`, in the dialect of a
/// backend; `'static`, so a clone moves into a handler closure.
#[derive(Debug, Clone)]
pub struct Effects {
    backend: Backend,
    /// The effects table, qualified where the queue's tables are not on the
    /// connection's search path (PostgreSQL's scenario schema).
    table: String,
}

impl Effects {
    pub fn write(&self, ctx: &JobContext) -> Result<(), JobError> {
        let id = ctx.id();
        match self.backend {
            Backend::Sqlite => {
                use backlog::sqlite::JobContextExt;
                ctx.transaction(|tx| {
                    let sql = format!(
                        "INSERT INTO {} (job_id, note) VALUES (?1, 'ran')",
                        self.table
                    );
                    tx.execute(&sql, [id])?;
                    Ok(())
                })
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                use backlog::postgres::JobContextExt;
                ctx.transaction(|tx| {
                    let sql = format!(
                        "INSERT INTO {} (job_id, note) VALUES ($1, 'ran')",
                        self.table
                    );
                    tx.execute(sql.as_str(), &[&id])?;
                    Ok(())
                })
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                use backlog::mysql::mysql::prelude::Queryable;
                use backlog::mysql::JobContextExt;
                ctx.transaction(|tx| {
                    let sql = format!(
                        "INSERT INTO {} (job_id, note) VALUES (?, 'ran')",
                        self.table
                    );
                    tx.exec_drop(sql, (id,))?;
                    Ok(())
                })
            }
            #[allow(unreachable_patterns)]
            _ => Err(JobError::retry("backend not built")),
        }
    }
}

/// One of the queue's own transactions as a scenario holds it, whatever the
/// backend: the one `QueueExt::transaction` or `ctx.transaction` of the
/// backend's module hands to its closure. The `_in` calls join it.
pub enum QueueTx<'t, 'c> {
    Sqlite(&'t backlog::sqlite::Transaction<'c>),
    #[cfg(feature = "postgres")]
    Postgres(&'t mut backlog::postgres::Transaction<'c>),
    #[cfg(feature = "mysql")]
    Mysql(&'t mut backlog::mysql::Transaction<'c>),
}

impl QueueTx<'_, '_> {
    /// `enqueue_in` on this transaction.
    pub fn enqueue_in(&mut self, queue: &Queue, job: NewJob) -> backlog::Result<Enqueued> {
        match self {
            QueueTx::Sqlite(tx) => backlog::sqlite::QueueExt::enqueue_in(queue, tx, job),
            #[cfg(feature = "postgres")]
            QueueTx::Postgres(tx) => backlog::postgres::QueueExt::enqueue_in(queue, tx, job),
            #[cfg(feature = "mysql")]
            QueueTx::Mysql(tx) => backlog::mysql::QueueExt::enqueue_in(queue, tx, job),
        }
    }

    /// `enqueue_workflow_in` on this transaction.
    pub fn enqueue_workflow_in(
        &mut self,
        queue: &Queue,
        workflow: backlog::Workflow,
    ) -> backlog::Result<backlog::EnqueuedWorkflow> {
        match self {
            QueueTx::Sqlite(tx) => {
                backlog::sqlite::QueueExt::enqueue_workflow_in(queue, tx, workflow)
            }
            #[cfg(feature = "postgres")]
            QueueTx::Postgres(tx) => {
                backlog::postgres::QueueExt::enqueue_workflow_in(queue, tx, workflow)
            }
            #[cfg(feature = "mysql")]
            QueueTx::Mysql(tx) => {
                backlog::mysql::QueueExt::enqueue_workflow_in(queue, tx, workflow)
            }
        }
    }

    /// `seal_batch_in` on this transaction.
    pub fn seal_batch_in(&mut self, queue: &Queue, id: i64) -> backlog::Result<()> {
        match self {
            QueueTx::Sqlite(tx) => backlog::sqlite::QueueExt::seal_batch_in(queue, tx, id),
            #[cfg(feature = "postgres")]
            QueueTx::Postgres(tx) => backlog::postgres::QueueExt::seal_batch_in(queue, tx, id),
            #[cfg(feature = "mysql")]
            QueueTx::Mysql(tx) => backlog::mysql::QueueExt::seal_batch_in(queue, tx, id),
        }
    }

    /// `create_batch_in` on this transaction.
    pub fn create_batch_in(
        &mut self,
        queue: &Queue,
        batch: backlog::BatchBuilder<'_>,
    ) -> backlog::Result<backlog::Batch> {
        match self {
            QueueTx::Sqlite(tx) => backlog::sqlite::QueueExt::create_batch_in(queue, tx, batch),
            #[cfg(feature = "postgres")]
            QueueTx::Postgres(tx) => backlog::postgres::QueueExt::create_batch_in(queue, tx, batch),
            #[cfg(feature = "mysql")]
            QueueTx::Mysql(tx) => backlog::mysql::QueueExt::create_batch_in(queue, tx, batch),
        }
    }

    /// `complete_in` on this transaction, without a result.
    pub fn complete_in(&mut self, queue: &Queue, job: &Job) -> backlog::Result<()> {
        match self {
            QueueTx::Sqlite(tx) => backlog::sqlite::QueueExt::complete_in(queue, tx, job, None),
            #[cfg(feature = "postgres")]
            QueueTx::Postgres(tx) => backlog::postgres::QueueExt::complete_in(queue, tx, job, None),
            #[cfg(feature = "mysql")]
            QueueTx::Mysql(tx) => backlog::mysql::QueueExt::complete_in(queue, tx, job, None),
        }
    }
}

impl Backend {
    /// `queue.transaction(f)` with this backend's `QueueExt`: commits when
    /// `f` returns `Ok`, rolls back otherwise.
    pub fn in_queue_transaction<T>(
        self,
        queue: &Queue,
        f: impl FnOnce(&mut QueueTx<'_, '_>) -> TestResult<T>,
    ) -> TestResult<T> {
        match self {
            Backend::Sqlite => {
                backlog::sqlite::QueueExt::transaction(queue, |tx| f(&mut QueueTx::Sqlite(tx)))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                backlog::postgres::QueueExt::transaction(queue, |tx| f(&mut QueueTx::Postgres(tx)))
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                backlog::mysql::QueueExt::transaction(queue, |tx| f(&mut QueueTx::Mysql(tx)))
            }
            #[allow(unreachable_patterns)]
            _ => Err(format!("{self:?} is not built in").into()),
        }
    }

    /// `ctx.transaction(f)` with this backend's `JobContextExt`, in a
    /// handler: the job completes with the transaction. An error of `f`
    /// rolls back and comes back as a retry with its message.
    pub fn in_job_transaction(
        self,
        ctx: &JobContext,
        f: impl FnOnce(&mut QueueTx<'_, '_>) -> TestResult,
    ) -> Result<(), JobError> {
        let error = |e: Box<dyn Error>| JobError::retry(e.to_string());
        match self {
            Backend::Sqlite => backlog::sqlite::JobContextExt::transaction(ctx, |tx| {
                f(&mut QueueTx::Sqlite(tx)).map_err(error)
            }),
            #[cfg(feature = "postgres")]
            Backend::Postgres => backlog::postgres::JobContextExt::transaction(ctx, |tx| {
                f(&mut QueueTx::Postgres(tx)).map_err(error)
            }),
            #[cfg(feature = "mysql")]
            Backend::Mysql => backlog::mysql::JobContextExt::transaction(ctx, |tx| {
                f(&mut QueueTx::Mysql(tx)).map_err(error)
            }),
            #[allow(unreachable_patterns)]
            _ => Err(JobError::retry("backend not built")),
        }
    }
}

const CHILD_BACKEND: &str = "BACKLOG_TEST_CHILD_BACKEND";
const CHILD_TARGET: &str = "BACKLOG_TEST_CHILD_TARGET";
const CHILD_SCHEMA: &str = "BACKLOG_TEST_CHILD_SCHEMA";

/// In a child process started with [`Harness::child_env`]: a queue on the
/// parent's database with `options`, and its handlers' effects writer.
/// `None` when this process is not such a child.
pub fn child_queue(options: QueueOptions) -> TestResult<Option<(Queue, Effects)>> {
    let Ok(backend) = std::env::var(CHILD_BACKEND) else {
        return Ok(None);
    };
    let target = std::env::var(CHILD_TARGET)?;
    let schema = std::env::var(CHILD_SCHEMA).unwrap_or_default();
    let (backend, options, table) = match backend.as_str() {
        "Sqlite" => (Backend::Sqlite, options, "effects".to_owned()),
        "Postgres" => (
            Backend::Postgres,
            options.schema(schema.clone()),
            format!("{schema}.effects"),
        ),
        "Mysql" => (Backend::Mysql, options, "effects".to_owned()),
        other => return Err(format!("unknown backend {other}").into()),
    };
    let queue = options.connect(&target)?;
    Ok(Some((queue, Effects { backend, table })))
}

/// The database of one scenario, dropped with it.
enum Db {
    Sqlite {
        dir: TempDir,
    },
    #[cfg(feature = "postgres")]
    Postgres(pg::Schema),
    #[cfg(feature = "mysql")]
    Mysql(my::Database),
}

impl Db {
    fn create(backend: Backend) -> TestResult<Db> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let conn = rusqlite::Connection::open(dir.path().join("backlog.db"))?;
                conn.execute_batch(EFFECTS_TABLE)?;
                Ok(Db::Sqlite { dir })
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => Ok(Db::Postgres(pg::Schema::create(&backend.url()?)?)),
            #[cfg(feature = "mysql")]
            Backend::Mysql => Ok(Db::Mysql(my::Database::create(&backend.url()?)?)),
            #[allow(unreachable_patterns)]
            _ => Err(format!("{backend:?} is not built in").into()),
        }
    }

    fn backend(&self) -> Backend {
        match self {
            Db::Sqlite { .. } => Backend::Sqlite,
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            Db::Mysql(_) => Backend::Mysql,
        }
    }

    fn open(&self, options: QueueOptions) -> TestResult<Queue> {
        Ok(match self {
            Db::Sqlite { dir } => options.open(dir.path().join("backlog.db"))?,
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => options.schema(&s.name).connect(&s.url)?,
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => options.connect(&d.url)?,
        })
    }

    /// The URL the queue connects with (servers only).
    fn url(&self) -> TestResult<String> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => Ok(s.url.clone()),
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => Ok(d.url.clone()),
            _ => Err("SQLite has no URL".into()),
        }
    }

    fn sqlite(&self) -> TestResult<rusqlite::Connection> {
        match self {
            Db::Sqlite { dir } => {
                let conn = rusqlite::Connection::open(dir.path().join("backlog.db"))?;
                conn.busy_timeout(Duration::from_secs(10))?;
                Ok(conn)
            }
            #[allow(unreachable_patterns)]
            _ => Err("not SQLite".into()),
        }
    }

    fn count(&self, sql: &str) -> TestResult<i64> {
        match self {
            Db::Sqlite { .. } => Ok(self.sqlite()?.query_row(sql, [], |r| r.get(0))?),
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => s.count(sql),
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => d.count(sql),
        }
    }

    fn enqueue_in(
        &self,
        queue: &Queue,
        effect_for: i64,
        jobs: Vec<NewJob>,
        commit: bool,
    ) -> TestResult<backlog::Result<Vec<Enqueued>>> {
        match self {
            Db::Sqlite { .. } => {
                use backlog::sqlite::QueueExt;
                let mut conn = self.sqlite()?;
                let tx =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                tx.execute(
                    "INSERT INTO effects (job_id, note) VALUES (?1, 'order')",
                    [effect_for],
                )?;
                let result = queue.enqueue_many_in(&tx, jobs);
                if commit && result.is_ok() {
                    tx.commit()?;
                }
                Ok(result)
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => s.enqueue_in(queue, effect_for, jobs, commit),
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => d.enqueue_in(queue, effect_for, jobs, commit),
        }
    }

    fn complete_in(
        &self,
        queue: &Queue,
        job: &Job,
        commit: bool,
    ) -> TestResult<backlog::Result<()>> {
        match self {
            Db::Sqlite { .. } => {
                use backlog::sqlite::QueueExt;
                let mut conn = self.sqlite()?;
                let tx =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                tx.execute(
                    "INSERT INTO effects (job_id, note) VALUES (?1, 'ran')",
                    [job.id],
                )?;
                let result = queue.complete_in(&tx, job, None);
                if commit && result.is_ok() {
                    tx.commit()?;
                }
                Ok(result)
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(s) => s.complete_in(queue, job, commit),
            #[cfg(feature = "mysql")]
            Db::Mysql(d) => d.complete_in(queue, job, commit),
        }
    }
}

/// `scheme://user@` , `host:port`, and the rest of a server URL.
fn split_url(url: &str) -> TestResult<(String, String, String)> {
    let (scheme, rest) = url.split_once("://").ok_or("a URL without ://")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    Ok((
        format!("{scheme}://{user}"),
        host.to_owned(),
        tail.to_owned(),
    ))
}

/// The application's own table, next to the queue's.
const EFFECTS_TABLE: &str = "CREATE TABLE effects (job_id BIGINT NOT NULL, note TEXT NOT NULL)";

/// A random name for a scenario's schema or database.
fn fresh_name() -> String {
    format!("bt_{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(feature = "postgres")]
mod pg {
    use backlog::postgres::postgres::{Client, NoTls};
    use backlog::postgres::QueueExt;
    use backlog::{Enqueued, Job, NewJob, Queue};

    use super::{fresh_name, TestResult, EFFECTS_TABLE};

    /// A schema of its own on the test server, dropped at the end.
    pub struct Schema {
        pub url: String,
        pub name: String,
    }

    impl Schema {
        pub fn create(url: &str) -> TestResult<Schema> {
            let name = fresh_name();
            let mut client = Client::connect(url, NoTls)?;
            client.batch_execute(&format!(
                "CREATE SCHEMA {name}; {}",
                EFFECTS_TABLE.replace("TABLE effects", &format!("TABLE {name}.effects"))
            ))?;
            Ok(Schema {
                url: url.to_owned(),
                name,
            })
        }

        fn client(&self) -> TestResult<Client> {
            let mut client = Client::connect(&self.url, NoTls)?;
            client.batch_execute(&format!("SET search_path TO {}", self.name))?;
            Ok(client)
        }

        pub fn count(&self, sql: &str) -> TestResult<i64> {
            let row = self
                .client()?
                .query_one(&format!("SELECT ({sql})::bigint"), &[])?;
            Ok(row.get(0))
        }

        pub fn enqueue_in(
            &self,
            queue: &Queue,
            effect_for: i64,
            jobs: Vec<NewJob>,
            commit: bool,
        ) -> TestResult<backlog::Result<Vec<Enqueued>>> {
            let mut client = self.client()?;
            let mut tx = client.transaction()?;
            tx.execute(
                "INSERT INTO effects (job_id, note) VALUES ($1, 'order')",
                &[&effect_for],
            )?;
            let result = queue.enqueue_many_in(&mut tx, jobs);
            if commit && result.is_ok() {
                tx.commit()?;
            }
            Ok(result)
        }

        pub fn complete_in(
            &self,
            queue: &Queue,
            job: &Job,
            commit: bool,
        ) -> TestResult<backlog::Result<()>> {
            let mut client = self.client()?;
            let mut tx = client.transaction()?;
            tx.execute(
                "INSERT INTO effects (job_id, note) VALUES ($1, 'ran')",
                &[&job.id],
            )?;
            let result = queue.complete_in(&mut tx, job, None);
            if commit && result.is_ok() {
                tx.commit()?;
            }
            Ok(result)
        }
    }

    impl Drop for Schema {
        fn drop(&mut self) {
            if let Ok(mut client) = Client::connect(&self.url, NoTls) {
                let _ =
                    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
            }
        }
    }
}

#[cfg(feature = "mysql")]
mod my {
    use backlog::mysql::mysql::prelude::Queryable;
    use backlog::mysql::mysql::{Conn, Opts, TxOpts};
    use backlog::mysql::QueueExt;
    use backlog::{Enqueued, Job, NewJob, Queue};

    use super::{fresh_name, TestResult, EFFECTS_TABLE};

    /// A database of its own on the test server, dropped at the end.
    pub struct Database {
        admin: String,
        pub url: String,
        name: String,
    }

    impl Database {
        pub fn create(url: &str) -> TestResult<Database> {
            let name = fresh_name();
            let mut conn = Conn::new(Opts::from_url(url)?)?;
            conn.query_drop(format!("CREATE DATABASE {name}"))?;
            conn.query_drop(
                EFFECTS_TABLE.replace("TABLE effects", &format!("TABLE {name}.effects")),
            )?;
            // The same server and credentials, this database.
            let base = url.split('?').next().unwrap_or(url);
            let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
            let query = url
                .split_once('?')
                .map(|(_, q)| format!("?{q}"))
                .unwrap_or_default();
            Ok(Database {
                admin: url.to_owned(),
                url: format!("{root}/{name}{query}"),
                name,
            })
        }

        fn conn(&self) -> TestResult<Conn> {
            Ok(Conn::new(Opts::from_url(&self.url)?)?)
        }

        pub fn count(&self, sql: &str) -> TestResult<i64> {
            let value: Option<i64> = self
                .conn()?
                .query_first(format!("SELECT CAST(({sql}) AS SIGNED)"))?;
            value.ok_or_else(|| "no row".into())
        }

        pub fn enqueue_in(
            &self,
            queue: &Queue,
            effect_for: i64,
            jobs: Vec<NewJob>,
            commit: bool,
        ) -> TestResult<backlog::Result<Vec<Enqueued>>> {
            let mut conn = self.conn()?;
            let mut tx = conn.start_transaction(TxOpts::default())?;
            tx.exec_drop(
                "INSERT INTO effects (job_id, note) VALUES (?, 'order')",
                (effect_for,),
            )?;
            let result = queue.enqueue_many_in(&mut tx, jobs);
            if commit && result.is_ok() {
                tx.commit()?;
            }
            Ok(result)
        }

        pub fn complete_in(
            &self,
            queue: &Queue,
            job: &Job,
            commit: bool,
        ) -> TestResult<backlog::Result<()>> {
            let mut conn = self.conn()?;
            let mut tx = conn.start_transaction(TxOpts::default())?;
            tx.exec_drop(
                "INSERT INTO effects (job_id, note) VALUES (?, 'ran')",
                (job.id,),
            )?;
            let result = queue.complete_in(&mut tx, job, None);
            if commit && result.is_ok() {
                tx.commit()?;
            }
            Ok(result)
        }
    }

    impl Drop for Database {
        fn drop(&mut self) {
            if let Ok(opts) = Opts::from_url(&self.admin) {
                if let Ok(mut conn) = Conn::new(opts) {
                    let _ = conn.query_drop(format!("DROP DATABASE IF EXISTS {}", self.name));
                }
            }
        }
    }
}

/// Microseconds in `d`.
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).expect("duration fits in i64 µs")
}

/// `later - earlier` in µs (negative when `later` is earlier).
pub fn since(later: SystemTime, earlier: SystemTime) -> i64 {
    match later.duration_since(earlier) {
        Ok(d) => micros(d),
        Err(e) => -micros(e.duration()),
    }
}

/// Child processes of one scenario, killed (and reaped) when dropped, so a
/// failing assertion leaves no worker running.
pub struct Children(pub Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every completed job `filter` selects (paged), once there are `n` of
/// them, or an error after `limit`.
pub fn wait_for_completed(
    h: &Harness,
    filter: backlog::JobFilter,
    n: usize,
    limit: Duration,
) -> TestResult<Vec<backlog::JobRecord>> {
    let start = std::time::Instant::now();
    loop {
        let mut records = Vec::new();
        let mut page_filter = filter.clone();
        loop {
            let page = h.queue.list(&page_filter)?;
            records.extend(page.jobs);
            match page.next_after {
                Some(after) => page_filter = page_filter.after(after),
                None => break,
            }
        }
        if records.len() >= n {
            return Ok(records);
        }
        if start.elapsed() > limit {
            return Err(
                format!("only {} of {n} jobs completed in {limit:?}", records.len()).into(),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
