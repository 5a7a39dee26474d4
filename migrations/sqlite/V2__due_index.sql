-- When the next job that is not due yet comes due: the fetcher sleeps until
-- then instead of polling. Unleased jobs by available_at; the seek starts at
-- now, so due jobs are never walked.
CREATE INDEX backlog_jobs_due
    ON backlog_jobs (available_at)
    WHERE lease_token IS NULL;
