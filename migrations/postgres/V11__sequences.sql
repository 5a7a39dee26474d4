-- In step with migrations/sqlite/V11__sequences.sql: one row per sequence,
-- its tail the job enqueued last; the enqueue's upsert locks the row, so
-- two enqueues of one key chain one after the other.
CREATE TABLE {schema}{prefix}sequences (
    queue TEXT   NOT NULL,
    key   TEXT   NOT NULL,
    tail  BIGINT NOT NULL,
    prev  BIGINT,
    PRIMARY KEY (queue, key)
);

-- As SQLite's: the edge from a job to the next of its sequence.
ALTER TABLE {schema}{prefix}dependencies ADD COLUMN in_sequence BOOLEAN NOT NULL DEFAULT FALSE;
