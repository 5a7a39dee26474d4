-- The live-worker registry: one row per running `Worker`, written when it
-- starts, refreshed with every heartbeat tick, deleted on a clean shutdown.
-- A worker that crashed leaves its row behind; it counts as gone once
-- `expires_at` (its last heartbeat plus three heartbeat intervals, decided by
-- the engine) has passed, and maintenance deletes it.
--
-- The jobs a worker runs are not stored here: they are the live jobs whose
-- `locked_by` is its id. `queues` and `kinds` are JSON arrays of names,
-- written and read by the engine only. Times are unix microseconds.
-- A handful of rows at most: no index beyond the key.
CREATE TABLE backlog_workers (
    id           TEXT    PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT    NOT NULL,
    kinds        TEXT    NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
