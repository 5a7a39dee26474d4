-- In step with migrations/sqlite/V11__sequences.sql: one row per sequence,
-- its tail the job enqueued last; the enqueue's upsert locks the row, so
-- two enqueues of one key chain one after the other. Names are VARBINARY
-- as in V1.
CREATE TABLE {sequences} (
    queue VARBINARY(128) NOT NULL,
    `key` VARBINARY(128) NOT NULL,
    tail  BIGINT         NOT NULL,
    prev  BIGINT         NULL,
    PRIMARY KEY (queue, `key`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- As SQLite's: the edge from a job to the next of its sequence.
ALTER TABLE {dependencies} ADD COLUMN in_sequence BOOLEAN NOT NULL DEFAULT FALSE;
