-- In step with migrations/sqlite/V8__dependencies.sql: a job waiting for
-- its dependencies sits in {prefix}pending, outside the jobs table and its
-- lease index; edges are written once at enqueue and kept for the results.
--
-- Differs from SQLite in that times are the server's clock, and payloads
-- JSONB as in the jobs table.
CREATE TABLE {schema}{prefix}pending (
    id           BIGINT  PRIMARY KEY,
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    payload      JSONB   NOT NULL,
    max_attempts INTEGER NOT NULL,
    available_at BIGINT  NOT NULL,
    remaining    INTEGER NOT NULL,
    created_at   BIGINT  NOT NULL
);

CREATE INDEX {prefix}pending_queue ON {schema}{prefix}pending (queue, id);

CREATE TABLE {schema}{prefix}dependencies (
    dependency BIGINT  NOT NULL,
    dependent  BIGINT  NOT NULL,
    run_anyway BOOLEAN NOT NULL,
    cancelled  BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (dependency, dependent)
);

CREATE INDEX {prefix}dependencies_dependent
    ON {schema}{prefix}dependencies (dependent, dependency);

CREATE TABLE {schema}{prefix}workflows (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT      NOT NULL,
    created_at BIGINT    NOT NULL
);

CREATE INDEX {prefix}workflows_name ON {schema}{prefix}workflows (name, id);

CREATE TABLE {schema}{prefix}workflow_steps (
    workflow_id BIGINT NOT NULL,
    step        TEXT   NOT NULL,
    job_id      BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, step)
);

CREATE UNIQUE INDEX {prefix}workflow_steps_job ON {schema}{prefix}workflow_steps (job_id);
