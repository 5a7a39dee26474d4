//! Opening the database a command names, without harming it: a SQLite file
//! is never created unless the command writes a new database (`migrate`, the
//! target of `copy`), never migrated unless asked, and checked to be a
//! backlog database before backlog touches it (opening switches a file to
//! WAL mode, which must not happen to some other application's database).

use std::path::{Path, PathBuf};

use backlog::sqlite::SqliteFile;
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
    pub fn parse(db: &str) -> Result<Target, Failure> {
        let scheme = db
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default();
        match scheme.as_str() {
            "postgres" | "postgresql" | "mysql" | "mariadb" => Ok(Target::Server(db.to_owned())),
            _ if looks_like_key_value(db) => Err(Failure::new(
                Code::Usage,
                format!(
                    "{} is a key=value connection string: give a URL \
                     (postgres://USER:PASSWORD@HOST/DB), not a file to create",
                    backlog::redact_url(db)
                ),
            )),
            _ => {
                let path = db
                    .strip_prefix("sqlite://")
                    .or_else(|| db.strip_prefix("sqlite:"))
                    .unwrap_or(db);
                Ok(Target::Sqlite(PathBuf::from(path)))
            }
        }
    }

    /// What to call the database in messages, JSON and pages: without its
    /// password. A path is redacted too: a `key=value` connection string or
    /// a URL of an unknown scheme given as `--db` is taken for a path.
    pub fn display(&self) -> String {
        match self {
            Target::Sqlite(path) => shown(path),
            Target::Server(url) => backlog::redact_url(url),
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
    /// Returns the migrations it applied, oldest first (all of them on a
    /// new database, none on a current one).
    pub fn open_and_migrate(&self) -> Result<(Queue, Vec<String>), Failure> {
        if let Target::Sqlite(path) = self {
            match probe(path)? {
                SqliteFile::NotSqlite => {
                    return Err(Failure::new(
                        Code::NotBacklog,
                        format!("{} is not a SQLite database", shown(path)),
                    ))
                }
                SqliteFile::OtherDatabase => {
                    return Err(Failure::new(
                        Code::NotBacklog,
                        format!(
                            "{} is a SQLite database of another application; backlog adds its \
                             tables only to a new file or one that already has them (it would \
                             switch the file to WAL mode)",
                            shown(path)
                        ),
                    ))
                }
                // Missing, empty, or a backlog database: create or migrate.
                _ => {}
            }
        }
        let options = QueueOptions::new().migrate(false);
        let queue = match self {
            Target::Sqlite(path) => options.open(path),
            Target::Server(url) => options.connect(url),
        }
        .map_err(|e| self.unreachable(e))?;
        let pending = queue.pending_migrations()?;
        queue.migrate()?;
        Ok((queue, pending))
    }

    fn unreachable(&self, e: backlog::Error) -> Failure {
        let code = match e {
            backlog::Error::FeatureDisabled { .. } => Code::Usage,
            ref e if e.is_corrupt() => Code::NotBacklog,
            _ => Code::Unreachable,
        };
        Failure::new(code, format!("cannot open {}: {e}", self.display()))
    }
}

/// Checks, read-only, that `path` is a SQLite file with backlog's tables.
fn probe_sqlite(path: &Path) -> Result<(), Failure> {
    let (code, why) = match probe(path)? {
        SqliteFile::Backlog => return Ok(()),
        SqliteFile::Missing => (
            Code::Unreachable,
            format!(
                "no database at {} (backlog does not create a file it was asked to read; \
                 `backlog migrate --db {}` creates a new queue)",
                shown(path),
                shown(path)
            ),
        ),
        SqliteFile::Empty => (
            Code::NotBacklog,
            format!("{} is an empty file, not a backlog database", shown(path)),
        ),
        SqliteFile::NotSqlite => (
            Code::NotBacklog,
            format!("{} is not a SQLite database", shown(path)),
        ),
        _ => (
            Code::NotBacklog,
            format!(
                "{} is a SQLite database without backlog's tables",
                shown(path)
            ),
        ),
    };
    Err(Failure::new(code, why))
}

fn probe(path: &Path) -> Result<SqliteFile, Failure> {
    // Opening a FIFO for reading waits for a writer, forever: only regular
    // files (or links to one) are read. A missing path is the probe's to
    // report.
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            let what = if meta.is_dir() {
                "a folder"
            } else {
                "not a regular file (a FIFO, socket or device)"
            };
            return Err(Failure::new(
                Code::NotBacklog,
                format!("{} is {what}, not a backlog database", shown(path)),
            ));
        }
    }
    backlog::sqlite::probe_sqlite_file(path).map_err(|e| {
        let code = if e.is_corrupt() {
            Code::NotBacklog
        } else {
            Code::Unreachable
        };
        Failure::new(code, format!("cannot read {}: {e}", shown(path)))
    })
}

/// `host=db user=app ...`: libpq's other form, which would otherwise be
/// taken for the name of a SQLite file to create, password and all.
fn looks_like_key_value(db: &str) -> bool {
    db.split_whitespace().any(|word| {
        let key = word.split_once('=').map_or("", |(k, _)| k);
        matches!(
            key,
            "host" | "hostaddr" | "dbname" | "user" | "password" | "port"
        )
    })
}

/// A path as messages show it: redacted like a URL, since whatever `--db`
/// names that is not a known URL is taken for a path.
fn shown(path: &Path) -> String {
    backlog::redact_url(&path.display().to_string())
}
