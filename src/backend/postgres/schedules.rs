//! Periodic schedules on PostgreSQL, in the order of `sqlite/schedules.rs`.
//!
//! Ticks are BIGINT microseconds of the schedule's calendar, computed by the
//! engine and bound as they are (not as offsets from the server's clock, as
//! job times are): the claim compares them for equality, so every node
//! names a tick alike whatever its own clock says. `updated_at` follows the
//! time rule of the other tables (`$1`: a manual clock's now, or NULL).

use postgres::GenericClient;

use super::connection::Tx;
use super::db::Db;
use super::jobs;
use super::queries::Queries;
use crate::backend::params::{ClaimTickParams, Claimed, RegisterScheduleParams, ScheduleRow};
use crate::backend::Schedules;
use crate::error::Result;

/// As SQLite's `REGISTER`.
pub const REGISTER: &str = "
INSERT INTO {schedules} AS s (name, expression, next_tick, updated_at)
VALUES ($2, $3, $4, {now})
ON CONFLICT (name) DO UPDATE SET
    expression = excluded.expression,
    next_tick = excluded.next_tick,
    updated_at = excluded.updated_at
WHERE s.expression <> excluded.expression";

/// As SQLite's `CLAIM_TICK`. Differs in that two nodes may run it at once:
/// the second waits on the first's row lock, then (READ COMMITTED) checks
/// its `WHERE` against the committed row, finds `next_tick` moved on, and
/// changes nothing.
pub const CLAIM_TICK: &str = "
UPDATE {schedules}
SET next_tick = $5, last_tick = COALESCE($6, last_tick), updated_at = {now}
WHERE name = $2 AND expression = $3 AND next_tick = $4";

/// As SQLite's `LIST`.
pub const LIST: &str = "
SELECT name, expression, next_tick, last_tick, updated_at
FROM {schedules} ORDER BY name";

/// As SQLite's `REMOVE`.
pub const REMOVE: &str = "DELETE FROM {schedules} WHERE name = $1";

impl Schedules for Db {
    fn register_schedule(&self, p: &RegisterScheduleParams<'_>) -> Result<()> {
        let sql = self.q.tables.render(REGISTER);
        self.pool.write(|tx| {
            tx.execute(
                &sql,
                &[
                    &self.q.now_override(p.now),
                    &p.name,
                    &p.expression,
                    &p.next_tick,
                ],
            )?;
            Ok(())
        })
    }

    /// The claim and the enqueue commit together; a retried transaction
    /// (a lost connection) finds the tick claimed and enqueues nothing.
    fn claim_tick(&self, p: &ClaimTickParams<'_>) -> Result<Claimed> {
        let sql = self.q.tables.render(CLAIM_TICK);
        self.pool.write(|tx| claim_tick(tx, &self.q, &sql, p))
    }

    fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        let sql = self.q.tables.render(LIST);
        self.pool.read(|tx| {
            tx.query(&sql, &[])?
                .iter()
                .map(|r| {
                    Ok(ScheduleRow {
                        name: r.try_get(0)?,
                        expression: r.try_get(1)?,
                        next_tick: r.try_get(2)?,
                        last_tick: r.try_get(3)?,
                        updated_at: r.try_get(4)?,
                    })
                })
                .collect()
        })
    }

    fn remove_schedule(&self, name: &str) -> Result<bool> {
        let sql = self.q.tables.render(REMOVE);
        self.pool.write(|tx| Ok(tx.execute(&sql, &[&name])? > 0))
    }
}

fn claim_tick<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    sql: &str,
    p: &ClaimTickParams<'_>,
) -> Result<Claimed> {
    let moved = tx.execute(
        sql,
        &[
            &q.now_override(p.now),
            &p.name,
            &p.expression,
            &p.seen,
            &p.next_tick,
            &p.last_tick(),
        ],
    )?;
    p.claimed(moved, |job| {
        jobs::enqueue_all(tx, q, std::slice::from_ref(job))
    })
}
