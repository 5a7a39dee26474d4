-- Queue limits (see src/limits.rs). V1 has the limits themselves
-- (concurrency_limit, rate_limit, rate_period_ms); the rate limit's
-- fixed-window counter needs where its window began (unix µs) and how many
-- jobs started in it.
ALTER TABLE backlog_queues ADD COLUMN rate_window_start INTEGER;
ALTER TABLE backlog_queues ADD COLUMN rate_window_count INTEGER NOT NULL DEFAULT 0;

-- A limited queue's lease counts its running jobs: one seek here, over
-- leased rows only.
CREATE INDEX backlog_jobs_running
    ON backlog_jobs (queue)
    WHERE lease_token IS NOT NULL;
