//! The enqueue statements of `enqueue.rs` (one job, a batch of jobs, the
//! look-ups of a unique key already held, the wake-up), the first part of a
//! job's life; `templates.rs` holds the rest, from the lease on. Templates
//! as those are, rendered once at connect by [`Queries::render`].
//!
//! [`Queries::render`]: super::Queries::render

/// Inserts one job; a unique-key conflict inserts nothing (no row returned).
/// Parameters: `$1` now override, `$2` queue, `$3` kind, `$4` priority, `$5`
/// unique key, `$6` payload JSON text, `$7` max attempts, `$8` delay (µs from
/// now).
///
/// Differs from SQLite in that the id comes back with `RETURNING` (there is
/// no `last_insert_rowid`), the payload is parsed into JSONB, and the times
/// are the server's.
pub const ENQUEUE: &str = "
INSERT INTO {jobs}
    (queue, kind, priority, unique_key, payload, max_attempts, available_at, created_at, updated_at)
VALUES ($2, $3, $4, $5, $6::text::jsonb, $7, {now} + $8, {now}, {now})
ON CONFLICT DO NOTHING
RETURNING id";

/// [`ENQUEUE`] that also notifies the queue's channel (`$9`) when it
/// inserted the job, in the same statement: one round trip fewer than a
/// separate [`NOTIFY`]. A conflict inserts nothing and notifies nobody.
pub const ENQUEUE_NOTIFY: &str = "
WITH inserted AS (
INSERT INTO {jobs}
    (queue, kind, priority, unique_key, payload, max_attempts, available_at, created_at, updated_at)
VALUES ($2, $3, $4, $5, $6::text::jsonb, $7, {now} + $8, {now}, {now})
ON CONFLICT DO NOTHING
RETURNING id
), notified AS MATERIALIZED (
    SELECT pg_notify($9, '') WHERE EXISTS (SELECT 1 FROM inserted)
)
SELECT inserted.id FROM inserted, notified";

/// [`ENQUEUE_NOTIFY`] for a job without a unique key, which no row can
/// conflict with: [`ENQUEUE`] without its `ON CONFLICT` (whose speculative
/// insertion costs more), notifying the queue's channel (`$9`) from its
/// `RETURNING`, once for its one row. Parameters as `ENQUEUE_NOTIFY`'s
/// (`$5` is NULL). Derived, not copied, so a change to the insert reaches
/// both.
pub(crate) fn enqueue_plain() -> String {
    ENQUEUE.replacen(
        "ON CONFLICT DO NOTHING\nRETURNING id",
        "RETURNING id, pg_notify($9, '')",
        1,
    )
}

/// The two batch inserts below ([`ENQUEUE_BATCH`], [`ENQUEUE_BATCH_UNIFORM`]),
/// from their columns (`$values`: queue to max attempts, and `$delay`) and
/// their rows (`$rows`, numbered `n`).
///
/// The clock is read once per statement (a sub-select, which PostgreSQL runs
/// once), not three times per row: it is the transaction's start either
/// way. The notification's CTE is materialized, so it runs once however
/// many rows.
///
/// It may commit by itself (`connection.rs`' `Pool::autocommit_once`), so
/// the check that every job went in is its own, before the commit: a count
/// short of the payloads (`$5`) makes it fail, by a cast of the counts' text
/// that cannot succeed, and nothing is inserted. (Only a trigger or rule
/// someone added to the table could make the count differ.)
macro_rules! enqueue_batch {
    ($values:literal, $delay:literal, $rows:literal) => {
        concat!(
            "
WITH inserted AS (
INSERT INTO {jobs}
    (queue, kind, priority, payload, max_attempts, available_at, created_at, updated_at)
SELECT ",
            $values,
            ", (SELECT {now}) + ",
            $delay,
            ", (SELECT {now}), (SELECT {now})
FROM ",
            $rows,
            "
ORDER BY n
RETURNING id
), notified AS MATERIALIZED (
    SELECT pg_notify($8, '') WHERE EXISTS (SELECT 1 FROM inserted)
)
SELECT CASE WHEN count(*) = cardinality($5::text[]) THEN array_agg(inserted.id)
            ELSE ('inserted ' || count(*) || ' of ' || cardinality($5::text[]) || ' jobs')::int8[]
       END
FROM inserted, notified"
        )
    };
}

/// Inserts a batch of jobs without unique keys and notifies the queue's
/// channel (`$8`) once, in one statement, and returns their ids as one
/// array, in no particular order: the rows are inserted in `n` order, so
/// the sequence hands them increasing ids, and the caller sorts them into
/// input order. Parameters: `$1` now override, then arrays of queue, kind,
/// priority, payload, max attempts, delay, then the channel.
///
/// PostgreSQL only: one round trip per batch instead of one per job (SQLite
/// runs in-process, where a cached statement per job costs nothing).
pub const ENQUEUE_BATCH: &str = enqueue_batch!(
    "queue, kind, priority, payload::jsonb, max_attempts",
    "delay",
    "unnest($2::text[], $3::text[], $4::int4[], $5::text[], $6::int4[], $7::int8[])
    WITH ORDINALITY AS j (queue, kind, priority, payload, max_attempts, delay, n)"
);

/// [`ENQUEUE_BATCH`] for a batch whose jobs differ in their payloads alone
/// (`NewJob::new` in a loop): queue `$2`, kind `$3`, priority `$4`, max
/// attempts `$6` and delay `$7` are bound once, as scalars, and only the
/// payloads (`$5`) as an array. Five arrays fewer to encode, send and
/// unnest per batch.
pub const ENQUEUE_BATCH_UNIFORM: &str = enqueue_batch!(
    "$2::text, $3::text, $4::int4, payload::jsonb, $6::int4",
    "$7::int8",
    "unnest($5::text[]) WITH ORDINALITY AS j (payload, n)"
);

/// The live job holding a unique key. Parameters: `$1` queue, `$2` key.
pub const FIND_LIVE_UNIQUE: &str = "SELECT id FROM {jobs} WHERE queue = $1 AND unique_key = $2";

/// The most recent finished job holding a unique key since a time.
/// Parameters: `$1` now override, `$2` queue, `$3` key, `$4` how far back
/// (a negative offset from now).
pub const FIND_HISTORY_UNIQUE: &str = "
SELECT id FROM {history}
WHERE queue = $2 AND unique_key = $3 AND finished_at >= {now} + $4
  AND ($5::text IS NULL OR status IN (SELECT jsonb_array_elements_text($5::jsonb)))
ORDER BY finished_at DESC LIMIT 1";

/// Wakes the workers listening on this queue's channel (`$1`), delivered
/// when the enqueuing transaction commits and never if it rolls back.
///
/// PostgreSQL only: SQLite's workers notice commits through the file.
pub const NOTIFY: &str = "SELECT pg_notify($1, '')";

#[cfg(test)]
mod tests {
    #[test]
    fn the_plain_enqueue_is_the_enqueue_without_its_conflict_clause() {
        let plain = super::enqueue_plain();
        let (insert, _) = super::ENQUEUE
            .split_once("ON CONFLICT")
            .expect("ENQUEUE has a conflict clause");
        assert!(plain.starts_with(insert), "{plain}");
        assert!(!plain.contains("ON CONFLICT"), "{plain}");
        assert!(
            plain.ends_with("RETURNING id, pg_notify($9, '')"),
            "{plain}"
        );
    }
}
