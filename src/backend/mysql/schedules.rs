//! Periodic schedules on MySQL/MariaDB, in the order of
//! `sqlite/schedules.rs`.
//!
//! Ticks are BIGINT microseconds of the schedule's calendar, computed by the
//! engine and bound as they are (not as offsets from the server's clock, as
//! job times are): the claim compares them for equality, so every node
//! names a tick alike whatever its own clock says. `updated_at` follows the
//! time rule of the other tables (`:now`).

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Db};
use super::jobs;
use crate::backend::params::{ClaimTickParams, Claimed, RegisterScheduleParams, ScheduleRow};
use crate::backend::Schedules;
use crate::error::Result;

/// As SQLite's `REGISTER`. Differs in that MySQL has no `ON CONFLICT ..
/// WHERE`: each column keeps its value unless the expression differs, and
/// `expression` is assigned last, since MySQL applies the assignments left
/// to right and the others compare against the old one. (`VALUES(col)` is
/// deprecated in MySQL 8.0.20 in favour of a row alias that MariaDB lacks;
/// both still accept it.)
pub const REGISTER: &str = "
INSERT INTO {schedules} (name, expression, next_tick, updated_at)
VALUES (:name, :expression, :next_tick, {now})
ON DUPLICATE KEY UPDATE
    next_tick = IF(expression = VALUES(expression), next_tick, VALUES(next_tick)),
    updated_at = IF(expression = VALUES(expression), updated_at, VALUES(updated_at)),
    expression = VALUES(expression)";

/// As SQLite's `CLAIM_TICK`. Differs in that two nodes may run it at once:
/// InnoDB's `UPDATE` reads the latest committed row under its lock (not the
/// transaction's snapshot), so the second waits for the first, finds
/// `next_tick` moved on, and changes nothing. Every claim changes
/// `next_tick`, so the affected-row count (rows changed) is the rows matched.
pub const CLAIM_TICK: &str = "
UPDATE {schedules}
SET next_tick = :next_tick, last_tick = COALESCE(:last_tick, last_tick), updated_at = {now}
WHERE name = :name AND expression = :expression AND next_tick = :seen";

/// As SQLite's `LIST`.
pub const LIST: &str = "
SELECT name, expression, next_tick, last_tick, updated_at
FROM {schedules} ORDER BY name";

/// As SQLite's `REMOVE`.
pub const REMOVE: &str = "DELETE FROM {schedules} WHERE name = :name";

impl Schedules for Db {
    fn register_schedule(&self, p: &RegisterScheduleParams<'_>) -> Result<()> {
        let sql = self.sql.tables.render(REGISTER);
        let now = self.now(p.now);
        self.write(|tx| {
            tx.exec_drop(
                &sql,
                params! {
                    "name" => p.name,
                    "expression" => p.expression,
                    "next_tick" => p.next_tick,
                    "now" => now.param(),
                },
            )?;
            Ok(())
        })
    }

    /// The claim and the enqueue commit together; a retried transaction
    /// finds the tick claimed and enqueues nothing.
    fn claim_tick(&self, p: &ClaimTickParams<'_>) -> Result<Claimed> {
        let sql = self.sql.tables.render(CLAIM_TICK);
        let now = self.now(p.now);
        self.write(|tx| {
            let moved = tx
                .exec_iter(
                    &sql,
                    params! {
                        "name" => p.name,
                        "expression" => p.expression,
                        "seen" => p.seen,
                        "next_tick" => p.next_tick,
                        "last_tick" => p.last_tick(),
                        "now" => now.param(),
                    },
                )?
                .affected_rows();
            p.claimed(moved, |job| {
                jobs::enqueue_all(&self.sql, tx, std::slice::from_ref(job), now)
            })
        })
    }

    fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        let sql = self.sql.tables.render(LIST);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(&sql, ())?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(ScheduleRow {
                        name: take(&mut r, 0)?,
                        expression: take(&mut r, 1)?,
                        next_tick: take(&mut r, 2)?,
                        last_tick: take(&mut r, 3)?,
                        updated_at: take(&mut r, 4)?,
                    })
                })
                .collect()
        })
    }

    fn remove_schedule(&self, name: &str) -> Result<bool> {
        let sql = self.sql.tables.render(REMOVE);
        self.write(|tx| {
            let removed = tx
                .exec_iter(&sql, params! { "name" => name })?
                .affected_rows();
            Ok(removed > 0)
        })
    }
}
