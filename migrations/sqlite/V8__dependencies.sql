-- Job dependencies and workflows. A job enqueued with dependencies that
-- have not all finished waits in backlog_pending, outside backlog_jobs and
-- so outside every lease index, as V4's group members do: no lease walks
-- it. Its id comes from backlog_jobs' sequence (a row inserted there and
-- moved here in the enqueue's transaction), so it keeps one id from enqueue
-- to history. `remaining` counts the dependencies that have not finished;
-- the transaction that finishes one of them decrements it (one write per
-- edge), and the one that brings it to 0 moves the job into backlog_jobs.
CREATE TABLE backlog_pending (
    id           INTEGER PRIMARY KEY,
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    payload      TEXT    NOT NULL,
    max_attempts INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    remaining    INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
);

-- Counts per queue and lists by queue walk this, not the payloads.
CREATE INDEX backlog_pending_queue ON backlog_pending (queue, id);

-- One row per edge, written once at enqueue: `dependent` waits for
-- `dependency`. Kept after the release, so a handler can read the results
-- of what it depended on. `run_anyway` 1: any end of the dependency counts;
-- 0: a dependency that ends other than completed cancels the dependent
-- (and so what waits on it). `cancelled` 1: this edge cancelled its
-- dependent, so a retry of the dependency brings the dependent back.
-- The primary key is the release's seek (what waits on a finished job).
CREATE TABLE backlog_dependencies (
    dependency INTEGER NOT NULL,
    dependent  INTEGER NOT NULL,
    run_anyway INTEGER NOT NULL,
    cancelled  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (dependency, dependent)
) WITHOUT ROWID;

-- A job's dependencies: its handler's results, a retry's recount.
CREATE INDEX backlog_dependencies_dependent ON backlog_dependencies (dependent, dependency);

-- A workflow: a graph of named steps enqueued in one transaction.
CREATE TABLE backlog_workflows (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE INDEX backlog_workflows_name ON backlog_workflows (name, id);

-- Each step's job, and the workflow a job belongs to.
CREATE TABLE backlog_workflow_steps (
    workflow_id INTEGER NOT NULL,
    step        TEXT    NOT NULL,
    job_id      INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, step)
);

CREATE UNIQUE INDEX backlog_workflow_steps_job ON backlog_workflow_steps (job_id);
