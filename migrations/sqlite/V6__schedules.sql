-- Periodic jobs: one row per schedule, shared by every process that runs a
-- scheduler on this file. A tick is claimed by moving `next_tick` on with a
-- compare-and-set (`WHERE next_tick = <the tick seen>`) in the transaction
-- that enqueues the tick's job, so each tick is enqueued once however many
-- schedulers run, and a crash between the two loses or repeats nothing.
--
-- Ticks are unix microseconds of the schedule's calendar, computed by the
-- engine from `expression` (a cron expression and its time zone, or a fixed
-- interval); `last_tick` is the last one enqueued (NULL: none yet). A
-- scheduler whose registration has another expression leaves the row alone:
-- the last registration wins.
CREATE TABLE backlog_schedules (
    name        TEXT    PRIMARY KEY,
    expression  TEXT    NOT NULL,
    next_tick   INTEGER NOT NULL,
    last_tick   INTEGER,
    updated_at  INTEGER NOT NULL
);
