-- In step with migrations/sqlite/V12__open_batches_sequence_keys.sql: the open batches,
-- for the metrics' gauge, in a partial index that a batch leaves when it
-- finishes.
CREATE INDEX {prefix}batches_open
    ON {schema}{prefix}batches (id)
    WHERE finished_at IS NULL;

-- As SQLite's: each sequenced job's key, by job id.
CREATE TABLE {schema}{prefix}sequence_jobs (
    job_id       BIGINT PRIMARY KEY,
    sequence_key TEXT   NOT NULL
);
