//! The server fixtures, without backlog: which server a URL names, a fresh
//! namespace per measurement (a schema on PostgreSQL, a database on
//! MySQL/MariaDB, dropped with it), the raw connection every ceiling and
//! check runs on, and the exactly-once counts.
//!
//! Each dialect's SQL lives in its own file, in the same order:
//! `server_pg.rs` and `server_mysql.rs`.

use std::time::{Duration, Instant};

use crate::db::BoxResult;

/// Which server a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Mysql,
}

impl Dialect {
    pub fn of_url(url: &str) -> BoxResult<Dialect> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        match scheme {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "mysql" | "mariadb" => Ok(Dialect::Mysql),
            _ => Err(format!("not a postgres:// or mysql:// URL: {}", redact(url)).into()),
        }
    }

    /// The cargo feature this dialect needs.
    pub fn feature(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
        }
    }

    /// Whether this build can talk to it.
    pub fn built(self) -> bool {
        match self {
            Dialect::Postgres => cfg!(feature = "postgres"),
            Dialect::Mysql => cfg!(feature = "mysql"),
        }
    }
}

/// A URL without its user and password, for anything printed.
pub fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let host = host.split('?').next().unwrap_or(host);
            format!("{scheme}://{host}")
        }
        None => "<not a URL>".into(),
    }
}

/// What a queue (in this process or a child) opens for one namespace: the
/// URL, and on PostgreSQL the schema.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub schema: Option<String>,
}

/// One server, named by a URL.
#[derive(Debug, Clone)]
pub struct Server {
    pub dialect: Dialect,
    pub url: String,
}

impl Server {
    pub fn new(url: &str) -> BoxResult<Server> {
        Ok(Server {
            dialect: Dialect::of_url(url)?,
            url: url.to_owned(),
        })
    }

    /// A new, empty namespace on this server, dropped with the value. Its
    /// tables are made by whoever opens a queue on it first.
    pub fn namespace(&self, tag: &str) -> BoxResult<Namespace> {
        let name = format!("bench_{tag}_{:012x}", unique() & 0xffff_ffff_ffff);
        self.dialect.driver()?.create(&self.url, &name)?;
        Ok(Namespace {
            server: self.clone(),
            name,
        })
    }

    /// The server's version and the settings that decide commit cost.
    pub fn settings(&self) -> BoxResult<Vec<(String, String)>> {
        self.dialect.driver()?.settings(&self.url)
    }

    /// The name the report files its figures under: `postgres`, `mariadb`
    /// or `mysql`.
    pub fn label(&self) -> BoxResult<&'static str> {
        Ok(match self.dialect {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => {
                let version = self
                    .settings()?
                    .into_iter()
                    .find(|(k, _)| k == "version")
                    .map(|(_, v)| v)
                    .unwrap_or_default();
                if version.to_ascii_lowercase().contains("mariadb") {
                    "mariadb"
                } else {
                    "mysql"
                }
            }
        })
    }
}

/// What the benchmark needs of a database besides the ceiling: namespaces,
/// settings, raw connections. One per dialect, in its own file.
pub trait Driver: Sync {
    /// Creates an empty namespace.
    fn create(&self, url: &str, name: &str) -> BoxResult<()>;
    fn drop_namespace(&self, url: &str, name: &str) -> BoxResult<()>;
    /// The server's version (`version`) and commit-related settings.
    fn settings(&self, url: &str) -> BoxResult<Vec<(String, String)>>;
    /// A raw connection whose unqualified table names are the target's.
    fn open(&self, target: &Target) -> BoxResult<Box<dyn Raw>>;
}

impl Dialect {
    /// This dialect's driver, if this build has it.
    pub fn driver(self) -> BoxResult<&'static dyn Driver> {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Ok(&crate::server_pg::PgDriver),
            #[cfg(feature = "mysql")]
            Dialect::Mysql => Ok(&crate::server_mysql::MyDriver),
            #[allow(unreachable_patterns)]
            d => Err(format!("built without --features {}", d.feature()).into()),
        }
    }
}

/// A schema (PostgreSQL) or database (MySQL) of one measurement.
#[derive(Debug)]
pub struct Namespace {
    server: Server,
    pub name: String,
}

impl Namespace {
    pub fn target(&self) -> BoxResult<Target> {
        match self.server.dialect {
            Dialect::Postgres => Ok(Target {
                url: self.server.url.clone(),
                schema: Some(self.name.clone()),
            }),
            Dialect::Mysql => Ok(Target {
                url: with_database(&self.server.url, &self.name)?,
                schema: None,
            }),
        }
    }

    /// A raw connection whose unqualified table names are this namespace's.
    pub fn raw(&self) -> BoxResult<Box<dyn Raw>> {
        open_raw(self.server.dialect, &self.target()?)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let dropped = self
            .server
            .dialect
            .driver()
            .and_then(|d| d.drop_namespace(&self.server.url, &self.name));
        if let Err(e) = dropped {
            eprintln!("could not drop {}: {e}", self.name);
        }
    }
}

/// A raw connection to `target` (what a child process opens too).
pub fn open_raw(dialect: Dialect, target: &Target) -> BoxResult<Box<dyn Raw>> {
    dialect.driver()?.open(target)
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> BoxResult<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let (scheme, rest) = base.split_once("://").ok_or("not a URL")?;
    let host = rest.split('/').next().unwrap_or(rest);
    Ok(format!("{scheme}://{host}/{database}{query}"))
}

/// A number that differs between calls and between processes.
fn unique() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// The ceiling's operations and the checks, in one database's dialect, on
/// backlog's tables (`backlog_jobs`, `backlog_history`). Every statement is
/// prepared once per connection. Job `n`'s payload is `{"n": n}`.
pub trait Raw: Send {
    /// Inserts `count` jobs numbered from `first`: with `batch` 1 one
    /// autocommitted single-row statement per job, otherwise one multi-row
    /// statement of `batch` rows per transaction.
    fn insert(&mut self, first: usize, count: usize, batch: usize) -> BoxResult<Duration>;

    /// As [`Raw::insert`], but `batch` single-row statements per transaction:
    /// one round trip per job.
    fn insert_rows(&mut self, first: usize, count: usize, batch: usize) -> BoxResult<Duration>;

    /// In one transaction: claims up to `batch` available jobs in claim order
    /// (`FOR UPDATE SKIP LOCKED`), moves them to history as completed, and
    /// returns their ids and payloads.
    fn claim_and_finish(&mut self, batch: usize) -> BoxResult<Vec<(i64, String)>>;

    /// Leases up to `batch` jobs, committed (the cost backlog's lease is
    /// compared with); returns their ids.
    fn lease(&mut self, batch: usize) -> BoxResult<Vec<i64>>;

    /// Makes leased jobs available again, as if never leased.
    fn release(&mut self, ids: &[i64]) -> BoxResult<()>;

    /// Inserts one job with this payload, committed, waking listeners
    /// (PostgreSQL: `NOTIFY` in the inserting transaction).
    fn produce(&mut self, payload: &str) -> BoxResult<()>;

    /// Subscribes to the wake-ups [`Raw::produce`] sends (nothing on MySQL).
    fn listen(&mut self) -> BoxResult<()>;

    /// Waits up to `timeout` for a wake-up; on MySQL, which has none,
    /// sleeps `timeout` (the poll interval).
    fn wait(&mut self, timeout: Duration) -> BoxResult<()>;

    /// Claims run again after a deadlock (MySQL) so far.
    fn retries(&self) -> u64 {
        0
    }

    /// Inserts `count` available jobs numbered from 0 in a few big
    /// statements: setup only, never timed.
    fn prefill(&mut self, count: usize) -> BoxResult<()>;

    /// Refreshes the planner's statistics (and on PostgreSQL, whose
    /// autovacuum is off here, the visibility map).
    fn analyze(&mut self) -> BoxResult<()>;

    /// Completed history rows, their distinct ids, rows claimed more than
    /// once, other statuses, live rows, leased live rows.
    fn counts(&mut self) -> BoxResult<Counts>;
}

/// What [`Raw::counts`] reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub completed: i64,
    pub distinct: i64,
    pub reclaimed: i64,
    pub other: i64,
    pub live: i64,
    pub leased: i64,
}

impl Counts {
    /// Every one of `expected` jobs completed exactly once, each claimed
    /// once, nothing left live; and the detail line.
    pub fn exactly_once(&self, expected: usize) -> (bool, String) {
        let e = expected as i64;
        let ok = self.completed == e
            && self.distinct == e
            && self.reclaimed == 0
            && self.other == 0
            && self.live == 0;
        (
            ok,
            format!(
                "expected {e}: completed {}, distinct ids {}, claimed more than once {}, \
                 other statuses {}, still live {}",
                self.completed, self.distinct, self.reclaimed, self.other, self.live
            ),
        )
    }
}

/// Claims and finishes `batch` at a time until nothing is left; the time
/// taken and the jobs done.
pub fn drain(raw: &mut dyn Raw, batch: usize) -> BoxResult<(Duration, usize)> {
    let start = Instant::now();
    let mut done = 0;
    loop {
        let jobs = raw.claim_and_finish(batch)?;
        if jobs.is_empty() {
            return Ok((start.elapsed(), done));
        }
        done += jobs.len();
    }
}
