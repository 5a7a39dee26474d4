-- In step with migrations/sqlite/V9__batches.sql: one counter row per batch,
-- updated in the transaction that finishes a member, and the live members.
--
-- Differs from SQLite in that times are the server's clock (unix µs), as in
-- the other tables, and `sealed` is a boolean.
CREATE TABLE {schema}{prefix}batches (
    id              BIGSERIAL PRIMARY KEY,
    sealed          BOOLEAN NOT NULL DEFAULT FALSE,
    total           BIGINT  NOT NULL DEFAULT 0,
    completed       BIGINT  NOT NULL DEFAULT 0,
    discarded       BIGINT  NOT NULL DEFAULT 0,
    cancelled       BIGINT  NOT NULL DEFAULT 0,
    dead            BIGINT  NOT NULL DEFAULT 0,
    on_complete     TEXT,
    on_success      TEXT,
    finished_at     BIGINT,
    complete_job_id BIGINT,
    success_job_id  BIGINT,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);

CREATE TABLE {schema}{prefix}batch_jobs (
    job_id   BIGINT PRIMARY KEY,
    batch_id BIGINT NOT NULL
);
