-- In step with migrations/sqlite/V8__dependencies.sql: a job waiting for
-- its dependencies sits in {pending}, outside the jobs table and its lease
-- index; edges are written once at enqueue and kept for the results.
-- Names are VARBINARY as in V1.
CREATE TABLE {pending} (
    id           BIGINT         NOT NULL PRIMARY KEY,
    queue        VARBINARY(128) NOT NULL,
    kind         VARBINARY(128) NOT NULL,
    priority     INT            NOT NULL,
    payload      LONGTEXT       NOT NULL,
    max_attempts INT            NOT NULL,
    available_at BIGINT         NOT NULL,
    remaining    INT            NOT NULL,
    created_at   BIGINT         NOT NULL,
    INDEX pending_queue (queue, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE {dependencies} (
    dependency BIGINT  NOT NULL,
    dependent  BIGINT  NOT NULL,
    run_anyway BOOLEAN NOT NULL,
    cancelled  BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (dependency, dependent),
    INDEX dependencies_dependent (dependent, dependency)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE {workflows} (
    id         BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name       VARBINARY(128) NOT NULL,
    created_at BIGINT         NOT NULL,
    INDEX workflows_name (name, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE {workflow_steps} (
    workflow_id BIGINT         NOT NULL,
    step        VARBINARY(128) NOT NULL,
    job_id      BIGINT         NOT NULL,
    PRIMARY KEY (workflow_id, step),
    UNIQUE INDEX workflow_steps_job (job_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Differs from SQLite in this table: MySQL has no LISTEN/NOTIFY, and other
-- nodes' pollers watch the newest job id, which a released job (keeping the
-- id it got at enqueue) does not move. Each transaction that releases jobs
-- bumps `n`, which the pollers read with the id.
CREATE TABLE {releases} (
    one TINYINT NOT NULL PRIMARY KEY,
    n   BIGINT  NOT NULL
) ENGINE = InnoDB;

INSERT INTO {releases} (one, n) VALUES (1, 0);
