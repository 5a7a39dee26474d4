-- In step with migrations/sqlite/V4__groups.sql: grouped jobs wait in
-- {prefix}group_members, outside the jobs table and its lease index, until
-- their group is ready; then one transaction combines them into one job and
-- moves them to history as `aggregated`.
--
-- Differs from SQLite in that history's CHECK constraint is replaced in
-- place (no rebuild), and in that times are the server's clock.
CREATE TABLE {schema}{prefix}groups (
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    group_key    TEXT    NOT NULL,
    max_size     INTEGER NOT NULL,
    grace_us     BIGINT  NOT NULL,
    max_delay_us BIGINT  NOT NULL,
    size         INTEGER NOT NULL,
    first_at     BIGINT  NOT NULL,
    last_at      BIGINT  NOT NULL,
    ready_at     BIGINT  NOT NULL,
    PRIMARY KEY (queue, kind, group_key)
);

CREATE INDEX {prefix}groups_ready ON {schema}{prefix}groups (ready_at);

-- Ids come from the jobs table's sequence (nextval), so a member keeps one
-- id from enqueue to history.
CREATE TABLE {schema}{prefix}group_members (
    id           BIGINT  PRIMARY KEY,
    queue        TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    group_key    TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    payload      JSONB   NOT NULL,
    max_attempts INTEGER NOT NULL,
    created_at   BIGINT  NOT NULL
);

CREATE INDEX {prefix}group_members_group
    ON {schema}{prefix}group_members (queue, kind, group_key, id);

ALTER TABLE {schema}{prefix}history
    DROP CONSTRAINT {prefix}history_status_check,
    ADD CONSTRAINT {prefix}history_status_check
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead', 'aggregated')),
    ADD COLUMN group_key TEXT,
    ADD COLUMN aggregated_into BIGINT;
