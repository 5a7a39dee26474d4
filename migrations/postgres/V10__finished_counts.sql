-- In step with migrations/sqlite/V10__finished_counts.sql: finished jobs
-- counted per bucket of time, queue, kind and status as they finish.
--
-- Differs from SQLite in that times are the server's clock (unix µs), as in
-- the other tables, and in that a key may have several rows, read as their
-- sum: each finishing transaction appends its own (deltas), so concurrent
-- finishes share no row lock, and maintenance merges them
-- (`postgres/counts.rs`' `MERGE_DELTAS`). An upsert into one row per key
-- cost a quarter of the completion throughput.
CREATE TABLE {schema}{prefix}finished_counts (
    span   INTEGER NOT NULL,
    bucket BIGINT  NOT NULL,
    queue  TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    status TEXT    NOT NULL,
    n      BIGINT  NOT NULL
);
CREATE INDEX {prefix}finished_counts_key
    ON {schema}{prefix}finished_counts (span, bucket, queue, kind, status);

INSERT INTO {schema}{prefix}finished_counts (span, bucket, queue, kind, status, n)
SELECT 3600, finished_at - finished_at % 3600000000, queue, kind, status, count(*)
FROM {schema}{prefix}history
GROUP BY 2, 3, 4, 5;
