-- Queue limits (see src/limits.rs). V1 has the limits themselves
-- (concurrency_limit, rate_limit, rate_period_ms); the rate limit's
-- fixed-window counter needs where its window began (unix µs) and how many
-- jobs started in it.
ALTER TABLE {schema}{prefix}queues
    ADD COLUMN rate_window_start BIGINT,
    ADD COLUMN rate_window_count BIGINT NOT NULL DEFAULT 0;

-- A limited queue's lease counts its running jobs: one seek here, over
-- leased rows only.
CREATE INDEX {prefix}jobs_running
    ON {schema}{prefix}jobs (queue)
    WHERE lease_token IS NOT NULL;
