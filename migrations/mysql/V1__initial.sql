-- backlog's schema on MySQL >= 8.0.1 and MariaDB >= 10.6, in step with
-- migrations/sqlite/V1__initial.sql: the same tables, columns and indexes.
-- `{jobs}`, `{history}` and `{queues}` are replaced by the table names under
-- the queue's prefix (`backlog_jobs` by default) before this runs, on a
-- connection whose default database is the one named in the URL.
--
-- Times are BIGINT unix microseconds, as on SQLite: one representation on all
-- three backends, so copying a queue between them is lossless; no session time
-- zone is involved (DATETIME/TIMESTAMP are read through it); no 2038 limit of
-- TIMESTAMP; and the engine's microsecond values bind as they are. "Now" is
-- read from the server's clock in each statement
-- (`TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))`, which no
-- session time zone changes), so nodes with skewed clocks agree.
--
-- Names (queue, kind, unique key, worker) are VARBINARY: compared byte for
-- byte like SQLite's BINARY collation. A text collation would make `Mail` and
-- `mail` one queue (`_ci`), or `mail` and `mail ` one queue (every PAD SPACE
-- collation, including `utf8mb4_bin`); the NO PAD binary collations are
-- spelled differently on MySQL (`utf8mb4_0900_bin`, 8.0.17+) and MariaDB
-- (`utf8mb4_nopad_bin`).
--
-- Payloads and results are LONGTEXT, not JSON: the engine has validated them
-- already (nesting up to 127 levels), while MariaDB's JSON (a LONGTEXT with a
-- JSON_VALID check) refuses documents nested deeper than 32 levels and
-- MySQL's binary JSON deeper than 100, and rewrites the text. `errors` is
-- JSON: it is only ever built and trimmed by the JSON functions here.
CREATE TABLE {jobs} (
    id               BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue            VARBINARY(128) NOT NULL DEFAULT 'default',
    kind             VARBINARY(128) NOT NULL,
    priority         INT            NOT NULL DEFAULT 0,
    unique_key       VARBINARY(1024),
    payload          LONGTEXT       NOT NULL,
    attempts         INT            NOT NULL DEFAULT 0,
    max_attempts     INT            NOT NULL DEFAULT 25,
    available_at     BIGINT         NOT NULL,
    lease_token      BIGINT,
    lease_until      BIGINT,
    locked_by        VARBINARY(128),
    first_leased_at  BIGINT,
    -- Differs from SQLite in that it has no default: MySQL before 8.0.13
    -- allows none on a JSON column. Every insert writes '[]'.
    errors           JSON           NOT NULL,
    cancel_requested BOOLEAN        NOT NULL DEFAULT FALSE,
    created_at       BIGINT         NOT NULL,
    updated_at       BIGINT         NOT NULL,
    -- MySQL has no partial indexes. The lease index below covers unleased
    -- jobs only through this column: NULL for a leased job, so a lease's seek
    -- on `lease_queue = ?` never reads a leased row.
    lease_queue      VARBINARY(128) AS (IF(lease_token IS NULL, queue, NULL)) STORED,
    -- A unique key can be 1 KiB, past what one index entry may hold with the
    -- queue beside it: its SHA-256 is indexed instead. NULL without a key.
    unique_hash      BINARY(32)     AS (UNHEX(SHA2(unique_key, 256))) STORED,

    -- The lease index: one queue's unleased jobs in exactly the order they
    -- are claimed, so a lease walks the index and stops after n rows, with no
    -- sort. (MariaDB honours DESC from 10.8 on; 10.6 and 10.7 parse and
    -- ignore it, and sort the candidates instead.)
    INDEX jobs_lease (lease_queue, priority DESC, available_at, id),

    -- The rescuer's index: leased jobs by expiry (NULL for the others, which
    -- `lease_until < now` never reads).
    INDEX jobs_expiry (lease_until),

    -- Unique keys are unique per queue among live jobs: finished jobs live in
    -- {history}, and rows without a key have a NULL hash, and NULLs never
    -- collide in a UNIQUE index.
    UNIQUE INDEX jobs_unique (queue, unique_hash)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per finished job, written in the transaction that deletes the live row.
CREATE TABLE {history} (
    id               BIGINT         NOT NULL PRIMARY KEY,
    queue            VARBINARY(128) NOT NULL,
    kind             VARBINARY(128) NOT NULL,
    priority         INT            NOT NULL,
    unique_key       VARBINARY(1024),
    payload          LONGTEXT       NOT NULL,
    attempts         INT            NOT NULL,
    max_attempts     INT            NOT NULL,
    available_at     BIGINT         NOT NULL,
    errors           JSON           NOT NULL,
    cancel_requested BOOLEAN        NOT NULL,
    created_at       BIGINT         NOT NULL,
    updated_at       BIGINT         NOT NULL,
    result           LONGTEXT,
    status           VARCHAR(16)    NOT NULL
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead')),
    processed_by     VARBINARY(128),
    started_at       BIGINT,
    finished_at      BIGINT         NOT NULL,
    unique_hash      BINARY(32)     AS (UNHEX(SHA2(unique_key, 256))) STORED,

    -- Retention prunes oldest-first per status.
    INDEX history_finished (status, finished_at),

    -- Unique keys scoped to recent history (periodic jobs) look back from
    -- here. Differs from SQLite in that rows without a key are indexed too
    -- (under a NULL hash): no partial indexes.
    INDEX history_unique (queue, unique_hash, finished_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Per-queue controls; a queue without a row uses the defaults.
CREATE TABLE {queues} (
    name              VARBINARY(128) NOT NULL PRIMARY KEY,
    paused            BOOLEAN        NOT NULL DEFAULT FALSE,
    concurrency_limit INT,
    rate_limit        INT,
    rate_period_ms    BIGINT,
    updated_at        BIGINT         NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
