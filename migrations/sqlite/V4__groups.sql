-- Grouped jobs (asynq's aggregation). A job enqueued with a group key waits
-- in backlog_group_members, outside backlog_jobs and so outside every lease
-- index: a lease never walks a waiting member. When its group is ready (it
-- reached max_size, or grace passed since the last addition, or max_delay
-- since the first: ready_at), one transaction inserts one job of the same
-- kind whose payload is the array of the members' payloads, and moves the
-- members to history as `aggregated`, each with the id of that job.

-- One row per group with members waiting: its policy, as the last enqueue
-- into it gave it (so any process can aggregate it), and when it is ready.
-- Times are unix µs; grace and max delay are µs.
CREATE TABLE backlog_groups (
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    group_key    TEXT    NOT NULL,
    max_size     INTEGER NOT NULL,
    grace_us     INTEGER NOT NULL,
    max_delay_us INTEGER NOT NULL,
    size         INTEGER NOT NULL,
    first_at     INTEGER NOT NULL,
    last_at      INTEGER NOT NULL,
    ready_at     INTEGER NOT NULL,
    PRIMARY KEY (queue, kind, group_key)
);

-- The aggregator's seek: groups by when they are ready.
CREATE INDEX backlog_groups_ready ON backlog_groups (ready_at);

-- The waiting members. Their ids come from backlog_jobs' sequence (a row
-- inserted there and moved here in the enqueue's transaction), so a member
-- keeps one id from enqueue to history.
CREATE TABLE backlog_group_members (
    id           INTEGER PRIMARY KEY,
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    group_key    TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    payload      TEXT    NOT NULL,
    max_attempts INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
);

-- A group's members, oldest first.
CREATE INDEX backlog_group_members_group
    ON backlog_group_members (queue, kind, group_key, id);

-- History gains the `aggregated` status, and for an aggregated member its
-- group and the job it went into. SQLite cannot change a CHECK constraint in
-- place: the table is rebuilt (in this migration's transaction).
CREATE TABLE backlog_history_v4 (
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
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead', 'aggregated')),
    processed_by     TEXT,
    started_at       INTEGER,
    finished_at      INTEGER NOT NULL,
    progress         TEXT,
    group_key        TEXT,
    aggregated_into  INTEGER
);

INSERT INTO backlog_history_v4
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, result, status, processed_by,
     started_at, finished_at, progress)
SELECT id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
       errors, cancel_requested, created_at, updated_at, result, status, processed_by,
       started_at, finished_at, progress
FROM backlog_history;

DROP TABLE backlog_history;
ALTER TABLE backlog_history_v4 RENAME TO backlog_history;

CREATE INDEX backlog_history_finished ON backlog_history (status, finished_at);
CREATE INDEX backlog_history_unique
    ON backlog_history (queue, unique_key, finished_at)
    WHERE unique_key IS NOT NULL;
