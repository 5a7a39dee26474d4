-- In step with migrations/sqlite/V12__open_batches_sequence_keys.sql. Differs in that
-- MySQL and MariaDB have no partial index: this one holds every batch, and
-- the gauge seeks its NULL range (the open batches) only.
CREATE INDEX batches_open ON {batches} (finished_at);

-- As SQLite's: each sequenced job's key, by job id. VARBINARY as V11's
-- keys.
CREATE TABLE {sequence_jobs} (
    job_id       BIGINT         NOT NULL PRIMARY KEY,
    sequence_key VARBINARY(128) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
