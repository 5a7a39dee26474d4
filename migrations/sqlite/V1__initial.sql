-- Live jobs only. State is derived from the lease and schedule columns:
-- available = not leased and available_at <= now, scheduled = not leased and
-- available_at > now, running = leased. Finished jobs move to backlog_history.
-- Times are unix microseconds from the queue's clock.
CREATE TABLE backlog_jobs (
    -- AUTOINCREMENT: a finished job's id lives on in backlog_history, so ids
    -- must never be reused after the highest live row is deleted.
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL DEFAULT 'default',
    kind             TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    unique_key       TEXT,
    payload          TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 25,
    available_at     INTEGER NOT NULL,
    lease_token      INTEGER,
    lease_until      INTEGER,
    locked_by        TEXT,
    first_leased_at  INTEGER,
    errors           TEXT    NOT NULL DEFAULT '[]',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- The lease index: one queue's unleased jobs in exactly the order they are
-- claimed, so a lease walks the index and stops after n rows, with no sort.
CREATE INDEX backlog_jobs_lease
    ON backlog_jobs (queue, priority DESC, available_at, id)
    WHERE lease_token IS NULL;

-- The rescuer's index: leased jobs by expiry.
CREATE INDEX backlog_jobs_expiry
    ON backlog_jobs (lease_until)
    WHERE lease_token IS NOT NULL;

-- Unique keys are unique per queue among live jobs.
CREATE UNIQUE INDEX backlog_jobs_unique
    ON backlog_jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL;

-- One row per finished job, written in the transaction that deletes the live row.
CREATE TABLE backlog_history (
    id               INTEGER PRIMARY KEY,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    priority         INTEGER NOT NULL,
    unique_key       TEXT,
    payload          TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    available_at     INTEGER NOT NULL,
    errors           TEXT    NOT NULL,
    cancel_requested INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    result           TEXT,
    status           TEXT    NOT NULL
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead')),
    processed_by     TEXT,
    started_at       INTEGER,
    finished_at      INTEGER NOT NULL
);

-- Retention prunes oldest-first per status.
CREATE INDEX backlog_history_finished ON backlog_history (status, finished_at);

-- Unique keys scoped to recent history (periodic jobs) look back from here.
CREATE INDEX backlog_history_unique
    ON backlog_history (queue, unique_key, finished_at)
    WHERE unique_key IS NOT NULL;

-- Per-queue controls; a queue without a row uses the defaults.
CREATE TABLE backlog_queues (
    name              TEXT    PRIMARY KEY,
    paused            INTEGER NOT NULL DEFAULT 0,
    concurrency_limit INTEGER,
    rate_limit        INTEGER,
    rate_period_ms    INTEGER,
    updated_at        INTEGER NOT NULL
);
