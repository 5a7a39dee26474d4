-- In step with migrations/sqlite/V6__schedules.sql: one row per periodic
-- schedule; a tick is claimed with a compare-and-set on `next_tick` in the
-- transaction that enqueues its job.
--
-- Ticks are BIGINT unix microseconds of the schedule's calendar, computed by
-- the engine from `expression`, not readings of the server's clock: the
-- claim compares them for equality, so every node agrees on a tick's
-- identity whatever its clock says. `updated_at` is the server's clock.
CREATE TABLE {schema}{prefix}schedules (
    name        TEXT   PRIMARY KEY,
    expression  TEXT   NOT NULL,
    next_tick   BIGINT NOT NULL,
    last_tick   BIGINT,
    updated_at  BIGINT NOT NULL
);
