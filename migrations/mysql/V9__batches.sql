-- In step with migrations/sqlite/V9__batches.sql: one counter row per batch,
-- updated in the transaction that finishes a member, and the live members.
--
-- Differs from SQLite in that times are the server's clock (unix µs), as in
-- the other tables.
CREATE TABLE {batches} (
    id              BIGINT     NOT NULL AUTO_INCREMENT PRIMARY KEY,
    sealed          TINYINT(1) NOT NULL DEFAULT 0,
    total           BIGINT     NOT NULL DEFAULT 0,
    completed       BIGINT     NOT NULL DEFAULT 0,
    discarded       BIGINT     NOT NULL DEFAULT 0,
    cancelled       BIGINT     NOT NULL DEFAULT 0,
    dead            BIGINT     NOT NULL DEFAULT 0,
    on_complete     LONGTEXT,
    on_success      LONGTEXT,
    finished_at     BIGINT,
    complete_job_id BIGINT,
    success_job_id  BIGINT,
    created_at      BIGINT     NOT NULL,
    updated_at      BIGINT     NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE {batch_jobs} (
    job_id   BIGINT NOT NULL PRIMARY KEY,
    batch_id BIGINT NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
