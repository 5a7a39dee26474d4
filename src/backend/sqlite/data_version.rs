//! Noticing other connections' commits through `PRAGMA data_version`.
//!
//! The pragma reads a counter from the WAL index in shared memory: no table is
//! touched, so checking it every few milliseconds costs next to nothing. It
//! changes when any *other* connection commits, including the write
//! connection of this process, so the watcher keeps a connection of its own.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::connection::OPEN_FLAGS;
use super::queries;
use crate::error::Result;

/// A dedicated connection that reports whether the database changed since it
/// last looked.
pub(crate) struct DataVersion {
    conn: Connection,
    last: i64,
}

impl std::fmt::Debug for DataVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataVersion")
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl DataVersion {
    /// Opens a watcher on the (existing) database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open_with_flags(path, OPEN_FLAGS)?;
        // A read only waits while another connection recovers the WAL.
        conn.busy_timeout(Duration::from_millis(100))?;
        let last = read(&conn)?;
        Ok(DataVersion { conn, last })
    }

    /// True when another connection committed since the last call.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        let now = read(&self.conn)?;
        let changed = now != self.last;
        self.last = now;
        Ok(changed)
    }
}

fn read(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached(queries::DATA_VERSION)?
        .query_row([], |r| r.get(0))?)
}
