//! Periodic schedules on SQLite: registering a schedule, claiming its due
//! tick together with the tick's job, listing and removing schedules.
//!
//! Statements here are in the order of `postgres/schedules.rs` and
//! `mysql/schedules.rs`. Ticks are unix microseconds of the schedule's
//! calendar, computed by the engine.

use rusqlite::{params, Connection, Row};

use super::connection::Connections;
use super::jobs;
use crate::backend::params::{ClaimTickParams, Claimed, RegisterScheduleParams, ScheduleRow};
use crate::backend::Schedules;
use crate::error::Result;

/// Inserts a schedule, or replaces its expression and next tick when the
/// stored expression differs; a row with the same expression keeps its next
/// tick (a tick missed while no scheduler ran stays visible as missed).
pub const REGISTER: &str = "
INSERT INTO backlog_schedules (name, expression, next_tick, updated_at)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (name) DO UPDATE SET
    expression = excluded.expression,
    next_tick = excluded.next_tick,
    updated_at = excluded.updated_at
WHERE backlog_schedules.expression <> excluded.expression";

/// The compare-and-set that claims a tick: the row moves on only if it still
/// holds the tick the scheduler saw (`?6`) and its expression (`?2`).
/// `?4` NULL (a skipped tick) keeps the last tick.
pub const CLAIM_TICK: &str = "
UPDATE backlog_schedules
SET next_tick = ?3, last_tick = COALESCE(?4, last_tick), updated_at = ?5
WHERE name = ?1 AND expression = ?2 AND next_tick = ?6";

/// Every schedule, by name.
pub const LIST: &str = "
SELECT name, expression, next_tick, last_tick, updated_at
FROM backlog_schedules ORDER BY name";

/// Removes a schedule.
pub const REMOVE: &str = "DELETE FROM backlog_schedules WHERE name = ?1";

pub(crate) fn register(conn: &Connection, p: &RegisterScheduleParams<'_>) -> Result<()> {
    conn.prepare_cached(REGISTER)?
        .execute(params![p.name, p.expression, p.next_tick, p.now])?;
    Ok(())
}

/// Claims the tick and enqueues its job in the caller's transaction. The
/// write lock is held from `BEGIN IMMEDIATE`, so no other scheduler can move
/// the row between the compare-and-set and the enqueue.
pub(crate) fn claim_tick(conn: &Connection, p: &ClaimTickParams<'_>) -> Result<Claimed> {
    let moved = conn.prepare_cached(CLAIM_TICK)?.execute(params![
        p.name,
        p.expression,
        p.next_tick,
        p.last_tick(),
        p.now,
        p.seen
    ])?;
    p.claimed(moved as u64, |job| {
        jobs::enqueue_all(conn, std::slice::from_ref(job))
    })
}

pub(crate) fn list(conn: &Connection) -> Result<Vec<ScheduleRow>> {
    let mut stmt = conn.prepare_cached(LIST)?;
    let rows = stmt.query_map([], row)?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

pub(crate) fn remove(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn.prepare_cached(REMOVE)?.execute([name])? > 0)
}

fn row(r: &Row<'_>) -> rusqlite::Result<ScheduleRow> {
    Ok(ScheduleRow {
        name: r.get(0)?,
        expression: r.get(1)?,
        next_tick: r.get(2)?,
        last_tick: r.get(3)?,
        updated_at: r.get(4)?,
    })
}

impl Schedules for Connections {
    fn register_schedule(&self, p: &RegisterScheduleParams<'_>) -> Result<()> {
        self.write(|tx| register(tx, p))
    }

    fn claim_tick(&self, p: &ClaimTickParams<'_>) -> Result<Claimed> {
        self.write(|tx| {
            let claimed = claim_tick(tx, p)?;
            failpoint!("claim-tick-before-commit");
            Ok(claimed)
        })
    }

    fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        self.read(list)
    }

    fn remove_schedule(&self, name: &str) -> Result<bool> {
        self.write(|tx| remove(tx, name))
    }
}
