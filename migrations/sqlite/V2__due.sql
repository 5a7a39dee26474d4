-- A lease never walks past what it cannot run. Jobs not due yet (delayed,
-- retrying, snoozed) wait outside the lease indexes, in backlog_jobs_scheduled;
-- each lease first promotes the ones whose time has come (`due = 1`), so the
-- lease indexes hold only jobs that can run now. The kind index lets a worker
-- seek straight to the kinds it handles: jobs of other kinds are never walked.
-- State is still derived from available_at; `due` only says which index a
-- waiting job is in.
ALTER TABLE backlog_jobs ADD COLUMN due INTEGER NOT NULL DEFAULT 0;

-- Jobs already due when this migration runs; the rest are promoted when due.
UPDATE backlog_jobs SET due = 1
WHERE available_at <= CAST(unixepoch('subsec') * 1000000 AS INTEGER);

DROP INDEX backlog_jobs_lease;

-- One queue's runnable jobs in exactly the order they are claimed.
CREATE INDEX backlog_jobs_lease
    ON backlog_jobs (queue, priority DESC, available_at, id)
    WHERE lease_token IS NULL AND due;

-- The same per kind: a worker walks only the kinds it has handlers for.
CREATE INDEX backlog_jobs_lease_kind
    ON backlog_jobs (queue, kind, priority DESC, available_at, id)
    WHERE lease_token IS NULL AND due;

-- Jobs waiting for their time, by when it comes: the lease's promotion and
-- the fetcher's "when is the next one due" both seek here.
CREATE INDEX backlog_jobs_scheduled
    ON backlog_jobs (available_at)
    WHERE lease_token IS NULL AND NOT due;
