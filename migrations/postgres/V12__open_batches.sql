-- In step with migrations/sqlite/V12__open_batches.sql: the open batches,
-- for the metrics' gauge, in a partial index that a batch leaves when it
-- finishes.
CREATE INDEX {prefix}batches_open
    ON {schema}{prefix}batches (id)
    WHERE finished_at IS NULL;
