-- In step with migrations/sqlite/V7__workers.sql: one row per running
-- worker, refreshed with its heartbeat, deleted on a clean shutdown, and by
-- maintenance once `expires_at` has passed (a crashed worker).
--
-- Differs from SQLite in that times are the server's clock (unix µs), as in
-- the other tables.
CREATE TABLE {schema}{prefix}workers (
    id           TEXT    PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          BIGINT  NOT NULL,
    queues       TEXT    NOT NULL,
    kinds        TEXT    NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   BIGINT  NOT NULL,
    heartbeat_at BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL
);
