//! Finished-job counts on PostgreSQL, in the order of `sqlite/counts.rs`.
//!
//! Times follow the rule of the other tables: buckets are aligned on the
//! server's clock, which stamped `finished_at` (`$1`: a manual clock's now,
//! or NULL). The queue's `Tables` render the counts table with the
//! others; the finish statement counts what it moves itself
//! (`FINISH_TO_HISTORY`'s `tallied`).
//!
//! Differs from SQLite in that a key's count may be spread over several
//! rows, read as their sum: writers append delta rows (no unique key, so
//! concurrent finishes wait on no one's bucket row) and maintenance merges
//! them (`MERGE_DELTAS`).

use postgres::GenericClient;

use super::connection::Tx;
use super::db::Db;
use super::queries::Queries;
use crate::backend::counts::{BucketRow, Counts, TotalRow};
use crate::error::Result;

/// As SQLite's `COUNT_MANY`: the history rows whose ids are `$1`. Differs
/// in that it appends delta rows, which lock nothing another writer needs.
pub const COUNT_MOVED: &str = "
INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
SELECT s.span, h.finished_at - h.finished_at % (s.span * 1000000), h.queue, h.kind, h.status,
       count(*)
FROM {history} AS h CROSS JOIN (VALUES (60::int8), (3600::int8)) AS s (span)
WHERE h.id = ANY($1::int8[])
GROUP BY 1, 2, 3, 4, 5";

/// As SQLite's `BUCKETS`: `$2` span, `$3` its width in µs, `$4` how many.
/// Differs in that a bucket's deltas are summed.
pub const BUCKETS: &str = "
SELECT queue, kind, status, ({now} - {now} % $3::int8 - bucket) / $3::int8, sum(n)::int8
FROM {finished_counts}
WHERE span = $2 AND bucket >= {now} - {now} % $3::int8 - ($4::int8 - 1) * $3::int8
GROUP BY queue, kind, status, bucket";

/// As SQLite's `TOTALS`.
pub const TOTALS: &str = "
SELECT queue, kind, status, sum(n)::int8 FROM {finished_counts}
WHERE span IN (0, 3600) GROUP BY queue, kind, status";

/// As SQLite's `PRUNE_MINUTES`; `$2` is the cutoff as an offset from now.
pub const PRUNE_MINUTES: &str = "
DELETE FROM {finished_counts} WHERE span = 60 AND bucket < {now} + $2";

/// As SQLite's `FOLD_HOURS` and `PRUNE_HOURS` in one statement: the hours
/// deleted are the hours added up.
pub const FOLD_HOURS: &str = "
WITH folded AS (
    DELETE FROM {finished_counts} WHERE span = 3600 AND bucket < {now} + $2
    RETURNING queue, kind, status, n)
INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
SELECT 0, 0, queue, kind, status, sum(n) FROM folded GROUP BY 3, 4, 5";

/// Merges the rows of every key that has several into one, and returns how
/// many rows fewer there are. A row is deleted by one transaction only (a
/// second waits for the first and then finds it gone), and the rows a
/// transaction adds up are the rows it deleted, so a merge run from two
/// nodes at once counts nothing twice; a finish not yet committed is not
/// seen and waits for the next run.
pub const MERGE_DELTAS: &str = "
WITH merged AS (
    DELETE FROM {finished_counts}
    WHERE (span, bucket, queue, kind, status) IN (
        SELECT span, bucket, queue, kind, status FROM {finished_counts}
        GROUP BY 1, 2, 3, 4, 5 HAVING count(*) > 1)
    RETURNING span, bucket, queue, kind, status, n),
added AS (
    INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
    SELECT span, bucket, queue, kind, status, sum(n) FROM merged GROUP BY 1, 2, 3, 4, 5
    RETURNING 1)
SELECT (SELECT count(*) FROM merged) - (SELECT count(*) FROM added)";

/// Counts the jobs `ids`, just moved to history in this transaction.
pub(crate) fn count_moved<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    ids: impl IntoIterator<Item = i64>,
) -> Result<()> {
    let ids: Vec<i64> = ids.into_iter().collect();
    if ids.is_empty() {
        return Ok(());
    }
    tx.execute(&q.tables.render(COUNT_MOVED), &[&ids])?;
    Ok(())
}

impl Counts for Db {
    fn finished_buckets(&self, span: i64, buckets: i64, now: i64) -> Result<Vec<BucketRow>> {
        let sql = self.q.tables.render(BUCKETS);
        let now = self.q.now_override(now);
        let span32 = i32::try_from(span).unwrap_or(i32::MAX);
        let width = span.saturating_mul(1_000_000);
        self.pool.read(|tx| {
            tx.query(&sql, &[&now, &span32, &width, &buckets])?
                .iter()
                .map(|r| {
                    Ok(BucketRow {
                        queue: r.try_get(0)?,
                        kind: r.try_get(1)?,
                        status: r.try_get(2)?,
                        buckets_ago: r.try_get(3)?,
                        count: r.try_get(4)?,
                    })
                })
                .collect()
        })
    }

    fn finished_totals(&self) -> Result<Vec<TotalRow>> {
        let sql = self.q.tables.render(TOTALS);
        self.pool.read(|tx| {
            tx.query(&sql, &[])?
                .iter()
                .map(|r| {
                    Ok(TotalRow {
                        queue: r.try_get(0)?,
                        kind: r.try_get(1)?,
                        status: r.try_get(2)?,
                        count: r.try_get(3)?,
                    })
                })
                .collect()
        })
    }

    fn compact_counts(&self, minutes_before: i64, hours_before: i64, now: i64) -> Result<usize> {
        let (prune, fold, merge) = (
            self.q.tables.render(PRUNE_MINUTES),
            self.q.tables.render(FOLD_HOURS),
            self.q.tables.render(MERGE_DELTAS),
        );
        let over = self.q.now_override(now);
        let (minutes, hours) = (
            minutes_before.saturating_sub(now),
            hours_before.saturating_sub(now),
        );
        self.pool.write(|tx| {
            let pruned = tx.execute(&prune, &[&over, &minutes])?;
            let folded = tx.execute(&fold, &[&over, &hours])?;
            let merged: i64 = match tx.query(&merge, &[])?.first() {
                Some(r) => r.try_get(0)?,
                None => 0,
            };
            let changed = pruned
                .saturating_add(folded)
                .saturating_add(u64::try_from(merged).unwrap_or(0));
            Ok(usize::try_from(changed).unwrap_or(usize::MAX))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::queries::Tables;
    use crate::options::QueueOptions;

    /// The finish statement counts what it moves, under the queue's own
    /// table names, with every placeholder filled.
    #[test]
    fn the_finish_statement_counts_what_it_moves() {
        let tables = Tables::new(&QueueOptions::new().table_prefix("app_"));
        let finish = tables.render(super::super::queries::FINISH_TO_HISTORY);
        assert_eq!(
            finish.matches("INSERT INTO app_finished_counts").count(),
            1,
            "{finish}"
        );
        assert!(finish.contains("FROM copied AS i"), "{finish}");
        for placeholder in [
            "{history}",
            "{finished_counts}",
            "{jobs}",
            "{now}",
            "{batches}",
        ] {
            assert!(
                !finish.contains(placeholder),
                "{placeholder} is left: {finish}"
            );
        }
    }
}
