//! A fresh database per scenario on PostgreSQL (a schema) and MariaDB/MySQL
//! (a database), named by `BACKLOG_TEST_POSTGRES_URL` /
//! `BACKLOG_TEST_MYSQL_URL`, with the application's sqlx pool and the
//! queue on it; dropped when the scenario ends. A server whose URL is unset
//! prints `SKIPPED: ...` and passes (CI fails on any `SKIPPED`).
//!
//! The scenarios are written once against [`AppTx`], which hides only the
//! dialect: the sqlx transaction type and its `QueueExt`.

#![allow(dead_code)]

use std::error::Error;
use std::sync::atomic::{AtomicU32, Ordering};

use backlog::{Enqueued, IntoNewJob, Queue, QueueOptions};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, MySql, Postgres, Transaction};

pub type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// One `#[tokio::test]` per server for each scenario named:
/// `postgres::NAME`, `mysql::NAME`.
#[macro_export]
macro_rules! on_servers {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::common::TestResult {
                match $crate::common::Fixture::new($crate::common::Server::Postgres).await? {
                    Some(f) => super::$name(f).await,
                    None => Ok(()),
                }
            })*
        }
        mod mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::common::TestResult {
                match $crate::common::Fixture::new($crate::common::Server::Mysql).await? {
                    Some(f) => super::$name(f).await,
                    None => Ok(()),
                }
            })*
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Mysql,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A scenario's database, its application pool, and the queue's URL.
pub struct Fixture {
    pub server: Server,
    /// The schema (PostgreSQL) or database (MySQL) of this scenario.
    pub name: String,
    /// The URL the queue connects to (MySQL: naming this database).
    pub url: String,
    /// The server's URL as given (for admin connections).
    admin_url: String,
    pub app: AppPool,
}

pub enum AppPool {
    Pg(PgPool),
    My(MySqlPool),
}

impl Fixture {
    pub async fn new(server: Server) -> TestResult<Option<Fixture>> {
        let var = match server {
            Server::Postgres => "BACKLOG_TEST_POSTGRES_URL",
            Server::Mysql => "BACKLOG_TEST_MYSQL_URL",
        };
        let admin_url = match std::env::var(var) {
            Ok(url) if !url.is_empty() => url,
            _ => {
                println!("SKIPPED: set {var} to run this scenario");
                return Ok(None);
            }
        };
        let name = format!(
            "sqlx_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let orders = "(id BIGINT PRIMARY KEY, note TEXT)";
        let (url, app) = match server {
            Server::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(6)
                    .connect(&admin_url)
                    .await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE SCHEMA {name}; CREATE TABLE {name}.orders {orders}"
                )))
                .execute(&pool)
                .await?;
                (admin_url.clone(), AppPool::Pg(pool))
            }
            Server::Mysql => {
                let admin = MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect(&admin_url)
                    .await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE DATABASE {name}; CREATE TABLE {name}.orders {orders}"
                )))
                .execute(&admin)
                .await?;
                admin.close().await;
                let base = admin_url.split('?').next().unwrap_or(&admin_url);
                let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
                let url = format!("{root}/{name}");
                let pool = MySqlPoolOptions::new()
                    .max_connections(6)
                    .connect(&url)
                    .await?;
                (url, AppPool::My(pool))
            }
        };
        Ok(Some(Fixture {
            server,
            name,
            url,
            admin_url,
            app,
        }))
    }

    /// A queue handle of its own connections on this scenario's database
    /// (another node, as far as the database can tell), opened off the
    /// runtime's threads.
    pub async fn queue(&self) -> TestResult<Queue> {
        let (server, url, name) = (self.server, self.url.clone(), self.name.clone());
        let queue = tokio::task::spawn_blocking(move || {
            let options = QueueOptions::new();
            match server {
                Server::Postgres => options.schema(&name).connect(&url),
                Server::Mysql => options.connect(&url),
            }
        })
        .await??;
        Ok(queue)
    }

    /// The table `name` of this scenario, qualified.
    pub fn table(&self, name: &str) -> String {
        format!("{}.{name}", self.name)
    }

    pub async fn begin(&self) -> TestResult<AppTx> {
        Ok(match &self.app {
            AppPool::Pg(pool) => AppTx::Pg(pool.begin().await?),
            AppPool::My(pool) => AppTx::My(pool.begin().await?),
        })
    }

    /// The single integer `sql` returns, on the application's pool.
    pub async fn count(&self, sql: &str) -> TestResult<i64> {
        let sql = AssertSqlSafe(sql.to_owned());
        Ok(match &self.app {
            AppPool::Pg(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await?,
            AppPool::My(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await?,
        })
    }

    /// Jobs live or finished, in this scenario's tables.
    pub async fn all_jobs(&self) -> TestResult<i64> {
        let live = self
            .count(&format!(
                "SELECT count(*) FROM {}",
                self.table("backlog_jobs")
            ))
            .await?;
        let done = self
            .count(&format!(
                "SELECT count(*) FROM {}",
                self.table("backlog_history")
            ))
            .await?;
        Ok(live + done)
    }

    pub async fn orders(&self) -> TestResult<i64> {
        self.count(&format!("SELECT count(*) FROM {}", self.table("orders")))
            .await
    }

    /// The PostgreSQL channel the queue's workers listen on.
    pub fn channel(&self) -> String {
        format!("{}.backlog_jobs", self.name)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A plain thread: the runtime may be gone or busy by now.
        let (server, name, admin) = (self.server, self.name.clone(), self.admin_url.clone());
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                match server {
                    Server::Postgres => {
                        if let Ok(pool) = PgPoolOptions::new()
                            .max_connections(1)
                            .connect(&admin)
                            .await
                        {
                            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                                "DROP SCHEMA IF EXISTS {name} CASCADE"
                            )))
                            .execute(&pool)
                            .await;
                        }
                    }
                    Server::Mysql => {
                        if let Ok(pool) = MySqlPoolOptions::new()
                            .max_connections(1)
                            .connect(&admin)
                            .await
                        {
                            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name}"
                            )))
                            .execute(&pool)
                            .await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// The application's open transaction, on either server.
pub enum AppTx {
    Pg(Transaction<'static, Postgres>),
    My(Transaction<'static, MySql>),
}

impl AppTx {
    /// `queue.enqueue_in(&mut tx, job)` through the server's adapter.
    pub async fn enqueue(
        &mut self,
        queue: &Queue,
        job: impl IntoNewJob,
    ) -> backlog::Result<Enqueued> {
        match self {
            AppTx::Pg(tx) => {
                use backlog::sqlx::postgres::QueueExt;
                queue.enqueue_in(tx, job).await
            }
            AppTx::My(tx) => {
                use backlog::sqlx::mysql::QueueExt;
                queue.enqueue_in(tx, job).await
            }
        }
    }

    pub async fn enqueue_many<J: IntoNewJob>(
        &mut self,
        queue: &Queue,
        jobs: Vec<J>,
    ) -> backlog::Result<Vec<Enqueued>> {
        match self {
            AppTx::Pg(tx) => {
                use backlog::sqlx::postgres::QueueExt;
                queue.enqueue_many_in(tx, jobs).await
            }
            AppTx::My(tx) => {
                use backlog::sqlx::mysql::QueueExt;
                queue.enqueue_many_in(tx, jobs).await
            }
        }
    }

    /// The application's own write: an order row.
    pub async fn insert_order(&mut self, f: &Fixture, id: i64) -> TestResult {
        let sql = format!(
            "INSERT INTO {} (id, note) VALUES ({id}, 'new')",
            f.table("orders")
        );
        match self {
            AppTx::Pg(tx) => {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut **tx).await?;
            }
            AppTx::My(tx) => {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut **tx).await?;
            }
        }
        Ok(())
    }

    pub async fn commit(self) -> TestResult {
        match self {
            AppTx::Pg(tx) => tx.commit().await?,
            AppTx::My(tx) => tx.commit().await?,
        }
        Ok(())
    }

    pub async fn rollback(self) -> TestResult {
        match self {
            AppTx::Pg(tx) => tx.rollback().await?,
            AppTx::My(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}
