//! How a worker notices changes on MySQL, which has no LISTEN/NOTIFY: its
//! own process's reschedules by a counter, other nodes' enqueues by polling
//! the newest job id.

use std::sync::atomic::{AtomicU64, Ordering};
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

/// After a failed probe (the server unreachable), how long until the next,
/// and how long connecting may take: the fetcher waits on the probe.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Reports a change when this process committed a reschedule (a failed
/// job's retry, a rescue, a retry or run-now, a resumed queue: its
/// fetcher then asks again when the next job comes due), or when `MAX(id)`
/// of the jobs table moved (another node enqueued). `MAX(id)` is read on a
/// connection of its own (not one of the pool's, which handler transactions
/// may all hold), at most every [`PROBE_INTERVAL`]. Other nodes'
/// reschedules are seen at the fetcher's next lease or idle poll.
pub(crate) struct Poller {
    opts: Opts,
    sql: Arc<Sql>,
    rescheduled: Arc<AtomicU64>,
    seen_rescheduled: u64,
    conn: Option<Conn>,
    /// No probe before this.
    next_probe: Option<Instant>,
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
    pub(crate) fn new(opts: Opts, sql: Arc<Sql>, rescheduled: Arc<AtomicU64>) -> Poller {
        Poller {
            seen_rescheduled: rescheduled.load(Ordering::Relaxed),
            opts,
            sql,
            rescheduled,
            conn: None,
            next_probe: None,
            latest: None,
        }
    }

    /// True when this process rescheduled a job, or a job was inserted
    /// since the last probe. An error drops the
    /// connection (the next probe opens another) and counts as a change, so
    /// the fetcher looks at once.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        let rescheduled = self.rescheduled.load(Ordering::Relaxed);
        if rescheduled != self.seen_rescheduled {
            self.seen_rescheduled = rescheduled;
            return Ok(true);
        }
        let now = Instant::now();
        if self.next_probe.is_some_and(|at| now < at) {
            return Ok(false);
        }
        match self.probe() {
            Ok(latest) => {
                self.next_probe = Some(now + PROBE_INTERVAL);
                let changed = latest != self.latest;
                self.latest = latest;
                Ok(changed)
            }
            Err(e) => {
                self.next_probe = Some(now + RETRY_AFTER);
                self.conn = None;
                Err(e)
            }
        }
    }

    fn probe(&mut self) -> Result<Option<i64>> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot => {
                let opts = mysql::OptsBuilder::from_opts(self.opts.clone())
                    .tcp_connect_timeout(Some(RETRY_AFTER));
                slot.insert(Conn::new(opts)?)
            }
        };
        let latest: Option<Option<i64>> = conn.query_first(&self.sql.latest_job)?;
        Ok(latest.flatten())
    }
}
