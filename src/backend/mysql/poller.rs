//! How a worker notices changes on MySQL, which has no LISTEN/NOTIFY: its
//! own process's reschedules by a bell, other nodes' enqueues by polling
//! the newest job id, adaptively.
//!
//! A thread of its own (`backlog-probe`) reads `MAX(id)` of the jobs table
//! on a connection of its own (not one of the pool's, which handler
//! transactions may all hold): every [`FAST`] right after a new job,
//! backing off (doubling) to [`FLOWING`] while jobs keep coming (the last
//! one less than [`STAY`] ago), and on to [`SLOW`] once they stopped. While
//! jobs flow, even a few a second, a job another node enqueued is seen
//! within [`FLOWING`]; an idle worker costs the server one primary-key seek
//! every [`SLOW`]. The thread signals the fetcher only when something
//! changed, and is joined when the poller is dropped (`backend/watcher.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mysql::prelude::Queryable;
use mysql::{Conn, Opts};

use super::queries::Sql;
use crate::backend::watcher::{Notifier, Watcher};
use crate::error::Result;
use crate::sync;

/// The probe interval while jobs flow: right after a probe saw a new job.
pub(crate) const FAST: Duration = Duration::from_millis(2);

/// The longest probe interval while jobs flow: between two jobs of a
/// trickle (say 20 a second), the probe backs off no further, so the next
/// one waits at most this long to be seen (a plain 10 ms poll: 10 ms).
pub(crate) const FLOWING: Duration = Duration::from_millis(5);

/// How long after the last new job the probe stays within [`FLOWING`]:
/// jobs a second or less apart count as flowing.
pub(crate) const STAY: Duration = Duration::from_secs(1);

/// The probe interval when idle (no new job for [`STAY`]), reached by
/// doubling after each probe that saw nothing new.
pub(crate) const SLOW: Duration = Duration::from_millis(25);

/// After a failed probe (the server unreachable), how long until the next;
/// also the longest a connect, a read or a write of a probe may take, and
/// so what bounds dropping a poller.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The bells of this process's pollers: a commit of this process that makes
/// a job runnable at some time (a failed job's retry, a rescue, a retry or
/// run-now, a resumed queue) rings them all, so their fetchers ask at once
/// when the next job comes due, without asking the server.
#[derive(Debug, Default)]
pub(crate) struct Bells(Mutex<Vec<Sender<()>>>);

impl Bells {
    /// Rings every live poller's bell; forgets the dropped ones.
    pub(crate) fn ring(&self) {
        let mut bells = sync::lock(&self.0);
        bells.retain(|b| {
            !matches!(
                b.try_send(()),
                Err(crossbeam_channel::TrySendError::Disconnected(_))
            )
        });
    }

    pub(super) fn add(&self) -> Receiver<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        sync::lock(&self.0).push(tx);
        rx
    }
}

/// Reports a change when this process committed a reschedule, or when
/// `MAX(id)` of the jobs table moved (another node enqueued). Other nodes'
/// reschedules are seen at the fetcher's next lease or idle poll.
pub(crate) struct Poller(Watcher);

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mysql::Poller").finish_non_exhaustive()
    }
}

impl Poller {
    /// Starts the probing thread; it connects at its first probe.
    pub(crate) fn start(opts: Opts, sql: Arc<Sql>, bells: &Bells) -> Result<Poller> {
        let opts = mysql::OptsBuilder::from_opts(opts)
            .tcp_connect_timeout(Some(RETRY_AFTER))
            .read_timeout(Some(RETRY_AFTER))
            .write_timeout(Some(RETRY_AFTER));
        let (opts, bell) = (opts.into(), bells.add());
        // Dropping the poller stops the thread at once between probes,
        // within [`RETRY_AFTER`] when a probe is waiting on an unresponsive
        // server.
        let watcher = Watcher::spawn("backlog-probe", move |notifier| {
            Prober {
                opts,
                sql,
                conn: None,
                latest: None,
                notifier,
                bell,
            }
            .run();
        })?;
        Ok(Poller(watcher))
    }

    /// True when this process rescheduled a job, a job was inserted, or a
    /// probe failed (so the fetcher looks at once) since the last call.
    /// Never blocks.
    pub(crate) fn changed(&mut self) -> Result<bool> {
        Ok(self.0.changed())
    }

    /// Fires (coalesced) when [`Poller::changed`] has news.
    pub(crate) fn signal(&self) -> Receiver<Instant> {
        self.0.signal()
    }
}

/// The thread's side.
struct Prober {
    opts: Opts,
    sql: Arc<Sql>,
    conn: Option<Conn>,
    latest: Option<Latest>,
    notifier: Notifier,
    bell: Receiver<()>,
}

/// The newest job id and the release count (see `LATEST_JOB`).
type Latest = (Option<i64>, Option<i64>);

impl Prober {
    fn run(mut self) {
        let mut interval = Duration::ZERO;
        let mut last_new = Instant::now();
        loop {
            crossbeam_channel::select! {
                recv(self.notifier.stopped()) -> _ => return,
                recv(self.bell) -> _ => {
                    self.notifier.notify();
                    continue;
                }
                default(interval) => {}
            }
            interval = match self.probe() {
                Ok(latest) if self.latest.is_some_and(|l| l == latest) => {
                    let max = if last_new.elapsed() < STAY {
                        FLOWING
                    } else {
                        SLOW
                    };
                    interval.saturating_mul(2).clamp(FAST, max)
                }
                Ok(latest) => {
                    self.latest = Some(latest);
                    last_new = Instant::now();
                    self.notifier.notify();
                    FAST
                }
                Err(error) => {
                    tracing::debug!(%error, "probing for new jobs failed");
                    self.conn = None;
                    self.notifier.notify();
                    RETRY_AFTER
                }
            };
        }
    }

    fn probe(&mut self) -> Result<Latest> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot => slot.insert(Conn::new(self.opts.clone())?),
        };
        let latest: Option<Latest> = conn.query_first(&self.sql.latest_job)?;
        Ok(latest.unwrap_or_default())
    }
}
