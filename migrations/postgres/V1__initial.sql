-- The PostgreSQL schema, in step with migrations/sqlite/V1__initial.sql: the
-- same tables, columns and indexes, in native types.
--
-- `{schema}` is the schema with a trailing dot (or nothing) and `{prefix}` the
-- table prefix (`backlog_` by default); both are checked identifiers,
-- substituted when the queue connects (see src/backend/postgres/migrate.rs).
--
-- Times are BIGINT unix microseconds, not TIMESTAMPTZ: one representation on
-- all three backends, so copying a queue between them is lossless; no session
-- time zone to get wrong; no 2038 limit (MySQL's TIMESTAMP has one); and the
-- engine's microsecond values bind as they are. "Now" is the server's clock,
-- (extract(epoch from now()) * 1000000)::bigint, exact in PostgreSQL >= 14.

-- Live jobs only. State is derived from the lease and schedule columns:
-- available = not leased and available_at <= now, scheduled = not leased and
-- available_at > now, running = leased. Finished jobs move to {prefix}history.
CREATE TABLE {schema}{prefix}jobs (
    -- A sequence never hands out an id twice, so a finished job's id (kept in
    -- history) is never reused.
    id               BIGSERIAL PRIMARY KEY,
    queue            TEXT    NOT NULL DEFAULT 'default',
    kind             TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    unique_key       TEXT,
    payload          JSONB   NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 25,
    available_at     BIGINT  NOT NULL,
    lease_token      BIGINT,
    lease_until      BIGINT,
    locked_by        TEXT,
    first_leased_at  BIGINT,
    errors           JSONB   NOT NULL DEFAULT '[]',
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

-- The lease index: one queue's unleased jobs in exactly the order they are
-- claimed, so a lease walks the index and stops after n rows, with no sort.
-- Partial: a leased row leaves it, so the walk never steps over running jobs.
CREATE INDEX {prefix}jobs_lease
    ON {schema}{prefix}jobs (queue, priority DESC, available_at, id)
    WHERE lease_token IS NULL;

-- The rescuer's index: leased jobs by expiry.
CREATE INDEX {prefix}jobs_expiry
    ON {schema}{prefix}jobs (lease_until)
    WHERE lease_token IS NOT NULL;

-- Unique keys are unique per queue among live jobs.
CREATE UNIQUE INDEX {prefix}jobs_unique
    ON {schema}{prefix}jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL;

-- One row per finished job, written in the transaction that deletes the live row.
CREATE TABLE {schema}{prefix}history (
    id               BIGINT  PRIMARY KEY,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    priority         INTEGER NOT NULL,
    unique_key       TEXT,
    payload          JSONB   NOT NULL,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    available_at     BIGINT  NOT NULL,
    errors           JSONB   NOT NULL,
    cancel_requested BOOLEAN NOT NULL,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    result           JSONB,
    status           TEXT    NOT NULL
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead')),
    processed_by     TEXT,
    started_at       BIGINT,
    finished_at      BIGINT  NOT NULL
);

-- Retention prunes oldest-first per status.
CREATE INDEX {prefix}history_finished ON {schema}{prefix}history (status, finished_at);

-- Unique keys scoped to recent history (periodic jobs) look back from here.
CREATE INDEX {prefix}history_unique
    ON {schema}{prefix}history (queue, unique_key, finished_at)
    WHERE unique_key IS NOT NULL;

-- Per-queue controls; a queue without a row uses the defaults.
CREATE TABLE {schema}{prefix}queues (
    name              TEXT    PRIMARY KEY,
    paused            BOOLEAN NOT NULL DEFAULT FALSE,
    concurrency_limit INTEGER,
    rate_limit        INTEGER,
    rate_period_ms    INTEGER,
    updated_at        BIGINT  NOT NULL
);
