-- In step with migrations/sqlite/V2__due.sql: a fetcher with nothing to
-- lease sleeps until the next job of its queues comes due, and asks when
-- that is (`NEXT_DUE`). This index answers it with one seek per queue: the
-- first unleased job after now, by `available_at`.
--
-- Differs from SQLite's V2 in that jobs not due yet stay in the lease index
-- (SQLite moves them out with a `due` flag that each lease promotes): here
-- many nodes lease at once, and a promotion written by every claim would
-- make the claims wait on one another. A lease's walk skips the jobs of its
-- queue scheduled at a higher priority than the runnable ones.
CREATE INDEX {prefix}jobs_scheduled
    ON {schema}{prefix}jobs (queue, available_at)
    WHERE lease_token IS NULL;
