//! Opening the database a command names, without harming it: a SQLite file
//! is never created unless the command writes a new database (`migrate`, the
//! target of `copy`), never migrated unless asked, and checked to be a
//! backlog database before backlog touches it (opening switches a file to
//! WAL mode, which must not happen to some other application's database).

use std::io::Read;
use std::path::{Path, PathBuf};

use backlog::{Queue, QueueOptions};

use crate::fail::{Code, Failure};

/// Where a `--db` value points.
#[derive(Debug, Clone)]
pub enum Target {
    Sqlite(PathBuf),
    /// A server URL (`postgres://`, `mysql://`); `Queue::connect` parses it.
    Server(String),
}

impl Target {
    pub fn parse(db: &str) -> Target {
        let scheme = db
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default();
        match scheme.as_str() {
            "postgres" | "postgresql" | "mysql" | "mariadb" => Target::Server(db.to_owned()),
            _ => {
                let path = db
                    .strip_prefix("sqlite://")
                    .or_else(|| db.strip_prefix("sqlite:"))
                    .unwrap_or(db);
                Target::Sqlite(PathBuf::from(path))
            }
        }
    }

    /// What to call the database in messages (a URL without its password).
    pub fn display(&self) -> String {
        match self {
            Target::Sqlite(path) => path.display().to_string(),
            Target::Server(url) => redact(url),
        }
    }

    /// Opens an existing backlog database, migrating nothing.
    pub fn open_existing(&self) -> Result<Queue, Failure> {
        let options = QueueOptions::new().migrate(false);
        let queue = match self {
            Target::Sqlite(path) => {
                probe_sqlite(path)?;
                options.open(path).map_err(|e| self.unreachable(e))?
            }
            Target::Server(url) => options.connect(url).map_err(|e| self.unreachable(e))?,
        };
        // A server database without backlog's tables fails here.
        let pending = queue.pending_migrations().and_then(|pending| {
            queue.paused_queues()?;
            Ok(pending)
        });
        let pending = pending.map_err(|e| {
            Failure::new(
                Code::NotBacklog,
                format!(
                    "{} is not a backlog database ({e}); `backlog migrate` creates the tables",
                    self.display()
                ),
            )
        })?;
        if !pending.is_empty() {
            return Err(Failure::new(
                Code::SchemaBehind,
                format!(
                    "{} was created by an older backlog: its schema lacks {}; \
                     `backlog migrate` brings it up to date (stop old workers first)",
                    self.display(),
                    pending.join(", ")
                ),
            ));
        }
        Ok(queue)
    }

    /// Opens the database, creating (SQLite) and migrating it as needed:
    /// for commands asked to write a database (`migrate`, `copy`'s target).
    pub fn open_and_migrate(&self) -> Result<Queue, Failure> {
        if let Target::Sqlite(path) = self {
            if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
                check_header(path)?;
                if !has_backlog_tables(path)? && has_any_table(path)? {
                    return Err(Failure::new(
                        Code::NotBacklog,
                        format!(
                            "{} is a SQLite database of another application; backlog adds its \
                             tables only to a new file or one that already has them (it would \
                             switch the file to WAL mode)",
                            path.display()
                        ),
                    ));
                }
            }
        }
        let queue = match self {
            Target::Sqlite(path) => QueueOptions::new().open(path),
            Target::Server(url) => QueueOptions::new().connect(url),
        };
        queue.map_err(|e| self.unreachable(e))
    }

    fn unreachable(&self, e: backlog::Error) -> Failure {
        let code = match e {
            backlog::Error::FeatureDisabled { .. } => Code::Usage,
            _ => Code::Unreachable,
        };
        Failure::new(code, format!("cannot open {}: {e}", self.display()))
    }
}

/// Checks, read-only, that `path` is a SQLite file with backlog's tables.
fn probe_sqlite(path: &Path) -> Result<(), Failure> {
    if !path.exists() {
        return Err(Failure::new(
            Code::Unreachable,
            format!(
                "no database at {} (backlog does not create a file it was asked to read; \
                 `backlog migrate --db {}` creates a new queue)",
                path.display(),
                path.display()
            ),
        ));
    }
    check_header(path)?;
    if !has_backlog_tables(path)? {
        return Err(Failure::new(
            Code::NotBacklog,
            format!(
                "{} is a SQLite database without backlog's tables",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Every SQLite database starts with this.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

fn check_header(path: &Path) -> Result<(), Failure> {
    let mut header = [0u8; 16];
    let read = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut header))
        .map_err(|e| {
            Failure::new(
                Code::Unreachable,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
    if read == 0 {
        return Err(Failure::new(
            Code::NotBacklog,
            format!(
                "{} is an empty file, not a backlog database",
                path.display()
            ),
        ));
    }
    if read < header.len() || &header != SQLITE_HEADER {
        return Err(Failure::new(
            Code::NotBacklog,
            format!("{} is not a SQLite database", path.display()),
        ));
    }
    Ok(())
}

fn read_only(path: &Path) -> Result<rusqlite::Connection, Failure> {
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = rusqlite::Connection::open_with_flags(path, flags).map_err(|e| {
        Failure::new(
            Code::Unreachable,
            format!("cannot open {}: {e}", path.display()),
        )
    })?;
    let _ = conn.busy_timeout(std::time::Duration::from_secs(5));
    Ok(conn)
}

fn count_tables(path: &Path, only_backlog: bool) -> Result<i64, Failure> {
    let conn = read_only(path)?;
    let sql = if only_backlog {
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
         AND name IN ('backlog_jobs', 'backlog_history', 'backlog_queues')"
    } else {
        "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
    };
    conn.query_row(sql, [], |r| r.get(0)).map_err(|e| {
        Failure::new(
            Code::NotBacklog,
            format!("{} is not a readable SQLite database: {e}", path.display()),
        )
    })
}

fn has_backlog_tables(path: &Path) -> Result<bool, Failure> {
    Ok(count_tables(path, true)? == 3)
}

fn has_any_table(path: &Path) -> Result<bool, Failure> {
    Ok(count_tables(path, false)? > 0)
}

/// `scheme://user:secret@host` → `scheme://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}
