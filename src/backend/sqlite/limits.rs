//! Queue limits on SQLite: stored in `backlog_queues`, read by every lease
//! in its write transaction. The single writer makes the check and the claim
//! atomic: no two leases interleave, so a limit is exact without locks.

use rusqlite::{params, Connection};

use super::queries;
use crate::error::Result;
use crate::limits::{LimitState, QueueLimits, WindowUpdate};

/// Sets or clears (all `None`) a queue's limits.
pub(crate) fn set_limits(
    conn: &Connection,
    queue: &str,
    limits: &QueueLimits,
    now: i64,
) -> Result<()> {
    let (concurrency, rate, period) = limits.to_stored();
    conn.prepare_cached(queries::SET_LIMITS)?.execute(params![
        queue,
        concurrency,
        rate,
        period,
        now
    ])?;
    Ok(())
}

/// Every queue with a limit, by name.
pub(crate) fn limits(conn: &Connection) -> Result<Vec<(String, QueueLimits)>> {
    let mut stmt = conn.prepare_cached(queries::LIMITS)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(name, c, r, p)| Ok((name, QueueLimits::from_stored(c, r, p)?)))
        .collect()
}

/// What a lease must know of the queues: the paused ones, and the limited
/// ones (not paused) with their running jobs and rate window.
pub(crate) fn controls(conn: &Connection) -> Result<(Vec<String>, Vec<LimitState>)> {
    let mut stmt = conn.prepare_cached(queries::QUEUE_CONTROLS)?;
    type Row = (
        String,
        bool,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        i64,
    );
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<Row>>>()?;
    let mut paused = Vec::new();
    let mut limited = Vec::new();
    for (name, is_paused, c, r, p, window_start, window_count) in rows {
        if is_paused {
            paused.push(name);
            continue;
        }
        limited.push(LimitState {
            queue: name,
            limits: QueueLimits::from_stored(c, r, p)?,
            window_start,
            window_count,
            running: 0,
        });
    }
    Ok((paused, limited))
}

/// Fills in the running jobs of each limited queue.
pub(crate) fn count_running(conn: &Connection, limited: &mut [LimitState]) -> Result<()> {
    let mut stmt = conn.prepare_cached(queries::COUNT_QUEUE_RUNNING)?;
    for state in limited {
        state.running = stmt.query_row(params![state.queue], |r| r.get(0))?;
    }
    Ok(())
}

/// Stores the rate windows a lease moved.
pub(crate) fn store_windows(conn: &Connection, windows: &[WindowUpdate]) -> Result<()> {
    let mut stmt = conn.prepare_cached(queries::SET_RATE_WINDOW)?;
    for w in windows {
        stmt.execute(params![w.queue, w.start, w.count])?;
    }
    Ok(())
}
