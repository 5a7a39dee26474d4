-- Queue limits (see src/limits.rs). V1 has the limits themselves
-- (concurrency_limit, rate_limit, rate_period_ms); the rate limit's
-- fixed-window counter needs where its window began (unix µs) and how many
-- jobs started in it.
ALTER TABLE {queues}
    ADD COLUMN rate_window_start BIGINT,
    ADD COLUMN rate_window_count BIGINT NOT NULL DEFAULT 0;

-- A limited queue's lease counts its running jobs. Differs from SQLite and
-- PostgreSQL in that MySQL has no partial index: the token follows the
-- queue, and the count reads the range `lease_token IS NOT NULL`.
CREATE INDEX jobs_running ON {jobs} (queue, lease_token);
