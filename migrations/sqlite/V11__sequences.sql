-- Sequences: jobs of one sequence key (per queue) run one at a time, in the
-- order they were enqueued. One row per sequence: `tail` is the job enqueued
-- last into it. An enqueue swaps its own id in and waits on the old tail
-- with a run-anyway edge of V8 (`backlog_dependencies`), unless that tail
-- has finished or is gone. `prev` is the tail the last enqueue replaced:
-- the upsert hands it back in the same statement (RETURNING shows the new
-- row only). Rows are kept: one small row per key ever used.
CREATE TABLE backlog_sequences (
    queue TEXT    NOT NULL,
    key   TEXT    NOT NULL,
    tail  INTEGER NOT NULL,
    prev  INTEGER,
    PRIMARY KEY (queue, key)
) WITHOUT ROWID;

-- Marks the edge from a job to the next of its sequence. When a job that
-- waits in a sequence ends without running (an operator's cancel or
-- delete, a cancelling dependency), the next one is handed its place: it
-- waits on the job before it instead, so the sequence still runs one at a
-- time.
ALTER TABLE backlog_dependencies ADD COLUMN in_sequence INTEGER NOT NULL DEFAULT 0;
