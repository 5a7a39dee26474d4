//! How a worker notices another node's enqueue on MySQL, which has no
//! LISTEN/NOTIFY: by polling the newest job id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, Opts};

use super::queries::Sql;
use crate::error::Result;

/// The fetcher asks every watch interval (10 ms by default); the server is
/// asked at most this often. A job enqueued on another node is seen within
/// it; other changes (a retry, a resumed queue) wait for the fetcher's idle
/// poll.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// Reads `MAX(id)` of the jobs table on a connection of its own (not one of
/// the pool's, which handler transactions may all hold), at most every
/// [`PROBE_INTERVAL`], and reports a change when it moved.
pub(crate) struct Poller {
    opts: Opts,
    sql: Arc<Sql>,
    conn: Option<Conn>,
    last_probe: Option<Instant>,
    latest: Option<i64>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mysql::Poller")
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// Connects lazily, at the first probe.
    pub(crate) fn new(opts: Opts, sql: Arc<Sql>) -> Poller {
        Poller {
            opts,
            sql,
            conn: None,
            last_probe: None,
            latest: None,
        }
    }

    /// True when a job was inserted since the last probe. An error drops the
    /// connection (the next probe opens another) and counts as a change, so
    /// the fetcher looks at once.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        if self
            .last_probe
            .is_some_and(|at| at.elapsed() < PROBE_INTERVAL)
        {
            return Ok(false);
        }
        self.last_probe = Some(Instant::now());
        match self.probe() {
            Ok(latest) => {
                let changed = self.latest.is_some_and(|before| latest != Some(before))
                    || (self.latest.is_none() && latest.is_some());
                self.latest = latest;
                Ok(changed)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    fn probe(&mut self) -> Result<Option<i64>> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot => slot.insert(Conn::new(self.opts.clone())?),
        };
        let latest: Option<Option<i64>> = conn.query_first(&self.sql.latest_job)?;
        Ok(latest.flatten())
    }
}
