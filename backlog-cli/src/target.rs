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
    /// A SQLite file, and its key when it is encrypted (SQLCipher).
    Sqlite(PathBuf, Option<Key>),
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
                Ok(Target::Sqlite(PathBuf::from(path), None))
            }
        }
    }

    /// The same target, opened with `key` when it is a SQLite file (a
    /// server URL has no use for one).
    pub fn with_key(self, key: Option<Key>) -> Target {
        match self {
            Target::Sqlite(path, _) => Target::Sqlite(path, key),
            server => server,
        }
    }

    /// The options every open starts from: nothing migrated, the key given.
    fn options(&self) -> QueueOptions {
        let options = QueueOptions::new().migrate(false);
        match self {
            Target::Sqlite(_, Some(key)) => options.sqlite_key(key.0.clone()),
            _ => options,
        }
    }

    /// What to call the database in messages, JSON and pages: without its
    /// password. A path is redacted too: a `key=value` connection string or
    /// a URL of an unknown scheme given as `--db` is taken for a path.
    pub fn display(&self) -> String {
        match self {
            Target::Sqlite(path, _) => shown(path),
            Target::Server(url) => backlog::redact_url(url),
        }
    }

    /// Opens an existing backlog database, migrating nothing.
    pub fn open_existing(&self) -> Result<Queue, Failure> {
        let options = self.options();
        let queue = match self {
            Target::Sqlite(path, key) => {
                probe_sqlite(path, key.as_ref())?;
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
        if let Target::Sqlite(path, key) = self {
            match probe(path, key.as_ref())? {
                SqliteFile::WrongKey => return Err(wrong_key(path)),
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
        let options = self.options();
        let queue = match self {
            Target::Sqlite(path, _) => options.open(path),
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
            // A key given to a build without SQLCipher.
            backlog::Error::InvalidArgument(_) => Code::Usage,
            ref e if e.is_corrupt() => Code::NotBacklog,
            _ => Code::Unreachable,
        };
        Failure::new(code, format!("cannot open {}: {e}", self.display()))
    }
}

/// Checks, read-only, that `path` is a SQLite file with backlog's tables.
fn probe_sqlite(path: &Path, key: Option<&Key>) -> Result<(), Failure> {
    let (code, why) = match probe(path, key)? {
        SqliteFile::Backlog => return Ok(()),
        SqliteFile::WrongKey => return Err(wrong_key(path)),
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
        _ if key.is_some() => (
            Code::NotBacklog,
            format!(
                "{} is a SQLite database without backlog's tables, or not a SQLite database",
                shown(path)
            ),
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

fn wrong_key(path: &Path) -> Failure {
    Failure::new(
        Code::NotBacklog,
        format!(
            "{} does not open with the key given (--sqlite-key-file or BACKLOG_SQLITE_KEY): \
             the key is wrong, or the file is not encrypted with one",
            shown(path)
        ),
    )
}

fn probe(path: &Path, key: Option<&Key>) -> Result<SqliteFile, Failure> {
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
    let probed = match key {
        Some(key) => backlog::sqlite::probe_sqlite_file_with_key(path, &key.0),
        None => backlog::sqlite::probe_sqlite_file(path),
    };
    probed.map_err(|e| {
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

/// The key of an encrypted SQLite file, from `--sqlite-key-file` or
/// `BACKLOG_SQLITE_KEY`: shown as `***` by `Debug`, never printed.
#[derive(Clone)]
pub struct Key(String);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The environment variable that may hold the key instead of a file.
pub const KEY_VAR: &str = "BACKLOG_SQLITE_KEY";

impl Key {
    /// The key from `file` (its text, less a final line break) or from
    /// [`KEY_VAR`]; `None` when neither is given. Both at once is a usage
    /// error: which one would win is a guess.
    pub fn from_cli(file: Option<&Path>) -> Result<Option<Key>, Failure> {
        let var = std::env::var(KEY_VAR).ok().filter(|k| !k.is_empty());
        let key = match (file, var) {
            (Some(_), Some(_)) => {
                return Err(Failure::new(
                    Code::Usage,
                    format!("give the SQLite key once: --sqlite-key-file or {KEY_VAR}, not both"),
                ))
            }
            (None, var) => var,
            (Some(path), None) => {
                // Read as bytes: an error names the file, never its text.
                let bytes = std::fs::read(path).map_err(|e| {
                    Failure::new(
                        Code::InvalidInput,
                        format!("cannot read the key file {}: {e}", path.display()),
                    )
                })?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    Failure::new(
                        Code::InvalidInput,
                        format!("the key file {} is not UTF-8 text", path.display()),
                    )
                })?;
                let key = text.strip_suffix('\n').unwrap_or(&text);
                let key = key.strip_suffix('\r').unwrap_or(key);
                if key.is_empty() {
                    return Err(Failure::new(
                        Code::InvalidInput,
                        format!("the key file {} is empty", path.display()),
                    ));
                }
                Some(key.to_owned())
            }
        };
        Ok(key.map(Key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let target = Target::parse("q.db")
            .expect("a path")
            .with_key(Some(Key("correct horse".into())));
        let shown = format!("{target:?}");
        assert!(!shown.contains("horse"), "{shown}");
        assert!(shown.contains("Some(***)"), "{shown}");
    }
}
