//! Finished-job counts on MySQL/MariaDB, in the order of
//! `sqlite/counts.rs`.
//!
//! Times follow the rule of the other tables: buckets are aligned on the
//! server's clock, which stamped `finished_at` (`:now`: a manual clock's
//! now, or NULL). Its statements are rendered per call by the queue's
//! `Tables`, which know the counts table with the others.

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Db};
use super::queries::Sql;
use crate::backend::counts::{BucketRow, Counts, TotalRow};
use crate::error::Result;

/// As SQLite's `BUCKETS`: `:span`, `:width` its width in µs, `:buckets` how
/// many.
pub const BUCKETS: &str = "
SELECT queue, kind, status, ({now} - {now} % :width - bucket) DIV :width, n
FROM {finished_counts}
WHERE span = :span AND bucket >= {now} - {now} % :width - (:buckets - 1) * :width";

/// As SQLite's `TOTALS`. Differs in that the sum is cast back to an
/// integer (MySQL sums to DECIMAL).
pub const TOTALS: &str = "
SELECT queue, kind, status, CAST(SUM(n) AS SIGNED) FROM {finished_counts}
WHERE span IN (0, 3600) GROUP BY queue, kind, status";

/// As SQLite's `PRUNE_MINUTES`; `:before` is the cutoff as an offset from
/// now.
pub const PRUNE_MINUTES: &str = "
DELETE FROM {finished_counts} WHERE span = 60 AND bucket < {now} + :before";

/// As SQLite's `FOLD_HOURS`.
pub const FOLD_HOURS: &str = "
INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
SELECT 0, 0, queue, kind, status, SUM(n) FROM {finished_counts}
WHERE span = 3600 AND bucket < {now} + :before
GROUP BY queue, kind, status
ORDER BY queue, kind, status
ON DUPLICATE KEY UPDATE n = n + VALUES(n)";

/// As SQLite's `PRUNE_HOURS`.
pub const PRUNE_HOURS: &str = "
DELETE FROM {finished_counts} WHERE span = 3600 AND bucket < {now} + :before";

/// Counts the jobs `ids`, just moved to history in this transaction.
pub(crate) fn count_moved(sql: &Sql, q: &mut impl Queryable, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    q.exec_drop(
        &sql.count_moved,
        params! { "ids" => serde_json::to_string(ids)? },
    )?;
    Ok(())
}

impl Counts for Db {
    fn finished_buckets(&self, span: i64, buckets: i64, now: i64) -> Result<Vec<BucketRow>> {
        let sql = self.sql.tables.render(BUCKETS);
        let now = self.now(now);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(
                &sql,
                params! {
                    "now" => now.param(), "span" => span,
                    "width" => span.saturating_mul(1_000_000), "buckets" => buckets,
                },
            )?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(BucketRow {
                        queue: take(&mut r, 0)?,
                        kind: take(&mut r, 1)?,
                        status: take(&mut r, 2)?,
                        buckets_ago: take(&mut r, 3)?,
                        count: take(&mut r, 4)?,
                    })
                })
                .collect()
        })
    }

    fn finished_totals(&self) -> Result<Vec<TotalRow>> {
        let sql = self.sql.tables.render(TOTALS);
        self.read(|conn| {
            let rows: Vec<Row> = conn.exec(&sql, ())?;
            rows.into_iter()
                .map(|mut r| {
                    Ok(TotalRow {
                        queue: take(&mut r, 0)?,
                        kind: take(&mut r, 1)?,
                        status: take(&mut r, 2)?,
                        count: take(&mut r, 3)?,
                    })
                })
                .collect()
        })
    }

    fn compact_counts(&self, minutes_before: i64, hours_before: i64, now: i64) -> Result<usize> {
        let (prune_minutes, fold, prune_hours) = (
            self.sql.tables.render(PRUNE_MINUTES),
            self.sql.tables.render(FOLD_HOURS),
            self.sql.tables.render(PRUNE_HOURS),
        );
        let now = self.now(now);
        let (minutes, hours) = (now.offset(minutes_before), now.offset(hours_before));
        self.write(|tx| {
            let mut gone = tx
                .exec_iter(
                    &prune_minutes,
                    params! { "now" => now.param(), "before" => minutes },
                )?
                .affected_rows();
            tx.exec_drop(&fold, params! { "now" => now.param(), "before" => hours })?;
            gone += tx
                .exec_iter(
                    &prune_hours,
                    params! { "now" => now.param(), "before" => hours },
                )?
                .affected_rows();
            Ok(usize::try_from(gone).unwrap_or(usize::MAX))
        })
    }
}
