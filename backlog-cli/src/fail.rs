//! Why a command failed, as a message and an exit code a script can test.

use std::fmt;

/// The exit codes, one per kind of failure (`backlog --help` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Anything else: a database error, an I/O error.
    Other = 1,
    /// Bad command line (clap's own errors exit 2 as well), or a URL for a
    /// backend this build does not include.
    Usage = 2,
    /// No job (or workflow, or batch) has this id.
    NotFound = 3,
    /// A value was rejected: bad JSON, a bad name, time or number.
    InvalidInput = 4,
    /// The job's state does not allow the operation (retrying a completed job).
    InvalidState = 5,
    /// No queue of this name has jobs, history or settings.
    UnknownQueue = 6,
    /// The database cannot be reached: a missing file, a server down or
    /// refusing the login.
    Unreachable = 7,
    /// The file or database is not a backlog database: another
    /// application's, a corrupted SQLite file, a FIFO, device or folder.
    NotBacklog = 8,
    /// A bulk operation was not confirmed.
    Aborted = 9,
    /// The database's schema is older than this backlog: `backlog migrate`.
    SchemaBehind = 10,
}

/// A failed command.
#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<backlog::Error> for Failure {
    fn from(e: backlog::Error) -> Failure {
        let code = match &e {
            backlog::Error::NotFound { .. } => Code::NotFound,
            backlog::Error::InvalidState { .. } => Code::InvalidState,
            e if e.is_invalid_input() => Code::InvalidInput,
            backlog::Error::Busy => Code::Unreachable,
            backlog::Error::FeatureDisabled { .. } => Code::Usage,
            _ => Code::Other,
        };
        // The library names its calls; an operator knows the commands.
        let message = e.to_string().replace("run_now", "`backlog run-now`");
        Failure::new(code, message)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::new(Code::Other, e.to_string())
    }
}

/// The exit codes as `backlog --help` shows them.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  other error (database, I/O)
  2  bad command line
  3  unknown job, workflow or batch
  4  invalid input (bad JSON, name, time or number, or one out of range)
  5  the job's state does not allow it
  6  unknown queue
  7  database unreachable (missing file, server down)
  8  not a backlog database (another application's, corrupted, not a file)
  9  bulk operation not confirmed
 10  the database's schema is older than this backlog (run `backlog migrate`)";
