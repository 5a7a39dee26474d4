//! Finished-job counts on SQLite (`backlog_finished_counts`, V10; see
//! [`crate::backend::counts`]). [`count_moved`] is the one call each path
//! that moves jobs to history makes, after its insert, in its own
//! transaction; the rest is the [`Counts`] part of the store.

use rusqlite::{params, Connection};

use super::connection::Connections;
use crate::backend::counts::{BucketRow, Counts, TotalRow, ALL_TIME, HOUR, MINUTE};
use crate::error::Result;

/// Counts the history row `?1` into its minute and hour buckets: an upsert
/// of two rows, read from the row just written (its primary key).
pub const COUNT_ONE: &str = "
INSERT INTO backlog_finished_counts (span, bucket, queue, kind, status, n)
SELECT s.span, h.finished_at - h.finished_at % (s.span * 1000000), h.queue, h.kind, h.status, 1
FROM backlog_history AS h, (SELECT 60 AS span UNION ALL SELECT 3600) AS s
WHERE h.id = ?1
ON CONFLICT (span, bucket, queue, kind, status) DO UPDATE SET n = n + excluded.n";

/// As [`COUNT_ONE`] for the history rows whose ids are the JSON array `?1`
/// (a group's members).
pub const COUNT_MANY: &str = "
INSERT INTO backlog_finished_counts (span, bucket, queue, kind, status, n)
SELECT s.span, h.finished_at - h.finished_at % (s.span * 1000000), h.queue, h.kind, h.status,
       count(*)
FROM backlog_history AS h, (SELECT 60 AS span UNION ALL SELECT 3600) AS s
WHERE h.id IN (SELECT value FROM json_each(?1))
GROUP BY 1, 2, 3, 4, 5
ON CONFLICT (span, bucket, queue, kind, status) DO UPDATE SET n = n + excluded.n";

/// The buckets of span `?1` µs-wide `?2` from the one holding `?3` back,
/// `?4` of them.
pub const BUCKETS: &str = "
SELECT queue, kind, status, (?3 - ?3 % ?2 - bucket) / ?2, n FROM backlog_finished_counts
WHERE span = ?1 AND bucket >= ?3 - ?3 % ?2 - (?4 - 1) * ?2";

/// All-time counts: the folded row plus the hours.
pub const TOTALS: &str = "
SELECT queue, kind, status, sum(n) FROM backlog_finished_counts
WHERE span IN (0, 3600) GROUP BY queue, kind, status";

/// Deletes minute buckets that started before `?1`.
pub const PRUNE_MINUTES: &str = "
DELETE FROM backlog_finished_counts WHERE span = 60 AND bucket < ?1";

/// Adds hour buckets that started before `?1` to the all-time row.
pub const FOLD_HOURS: &str = "
INSERT INTO backlog_finished_counts (span, bucket, queue, kind, status, n)
SELECT 0, 0, queue, kind, status, sum(n) FROM backlog_finished_counts
WHERE span = 3600 AND bucket < ?1
GROUP BY queue, kind, status
ON CONFLICT (span, bucket, queue, kind, status) DO UPDATE SET n = n + excluded.n";

/// Deletes the hour buckets [`FOLD_HOURS`] added up.
pub const PRUNE_HOURS: &str = "
DELETE FROM backlog_finished_counts WHERE span = 3600 AND bucket < ?1";

/// Counts the jobs `ids`, just moved to history in this transaction.
pub(crate) fn count_moved(conn: &Connection, ids: &[i64]) -> Result<()> {
    match ids {
        [] => {}
        [id] => {
            conn.prepare_cached(COUNT_ONE)?.execute([id])?;
        }
        _ => {
            conn.prepare_cached(COUNT_MANY)?
                .execute([serde_json::to_string(ids)?])?;
        }
    }
    Ok(())
}

impl Counts for Connections {
    fn finished_buckets(&self, span: i64, buckets: i64, now: i64) -> Result<Vec<BucketRow>> {
        debug_assert!(span == MINUTE || span == HOUR);
        self.read(|c| {
            let mut stmt = c.prepare_cached(BUCKETS)?;
            let rows = stmt.query_map(params![span, span * 1_000_000, now, buckets], |r| {
                Ok(BucketRow {
                    queue: r.get(0)?,
                    kind: r.get(1)?,
                    status: r.get(2)?,
                    buckets_ago: r.get(3)?,
                    count: r.get(4)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    fn finished_totals(&self) -> Result<Vec<TotalRow>> {
        debug_assert_eq!(ALL_TIME, 0);
        self.read(|c| {
            let mut stmt = c.prepare_cached(TOTALS)?;
            let rows = stmt.query_map([], |r| {
                Ok(TotalRow {
                    queue: r.get(0)?,
                    kind: r.get(1)?,
                    status: r.get(2)?,
                    count: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    fn compact_counts(&self, minutes_before: i64, hours_before: i64, _now: i64) -> Result<usize> {
        self.write(|tx| {
            let minutes = tx
                .prepare_cached(PRUNE_MINUTES)?
                .execute([minutes_before])?;
            tx.prepare_cached(FOLD_HOURS)?.execute([hours_before])?;
            let hours = tx.prepare_cached(PRUNE_HOURS)?.execute([hours_before])?;
            Ok(minutes + hours)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::QueueOptions;

    /// Counting a finish reads the history row by its key, and the charts
    /// and totals read ranges of the counts' key: never a scan of history.
    #[test]
    fn counting_and_reading_walk_primary_keys_only() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::Database(Box::new(e)))?;
        let db = Connections::open(&dir.path().join("q.db"), &QueueOptions::new())?;
        super::super::migrate::migrate(&mut *db.writer()?, std::time::Duration::from_secs(5))?;
        let plan = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<String> {
            let conn = db.writer()?;
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let rows = stmt.query_map(args, |r| r.get::<_, String>(3))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
        };
        let ids = "[1,2]";
        for (sql, args) in [
            (COUNT_ONE, &[&1_i64 as &dyn rusqlite::ToSql][..]),
            (COUNT_MANY, &[&ids]),
        ] {
            let plan = plan(sql, args)?;
            assert!(
                plan.contains("SEARCH h USING INTEGER PRIMARY KEY"),
                "{sql}\n{plan}"
            );
            assert!(!plan.contains("SCAN h"), "{sql}\n{plan}");
        }
        let (span, width, now, n) = (60_i64, 60_000_000_i64, 0_i64, 60_i64);
        let plan = plan(BUCKETS, &[&span, &width, &now, &n])?;
        assert!(
            plan.contains("SEARCH backlog_finished_counts USING PRIMARY KEY (span=? AND bucket>?)"),
            "{plan}"
        );
        Ok(())
    }
}
