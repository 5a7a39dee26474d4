-- In step with migrations/sqlite/V4__groups.sql: grouped jobs wait in
-- {group_members}, outside the jobs table and its lease index, until their
-- group is ready; then one transaction combines them into one job and moves
-- them to history as `aggregated`. Names are VARBINARY as in V1.
CREATE TABLE {groups} (
    queue        VARBINARY(128) NOT NULL,
    kind         VARBINARY(128) NOT NULL,
    group_key    VARBINARY(128) NOT NULL,
    max_size     INT            NOT NULL,
    grace_us     BIGINT         NOT NULL,
    max_delay_us BIGINT         NOT NULL,
    size         INT            NOT NULL,
    first_at     BIGINT         NOT NULL,
    last_at      BIGINT         NOT NULL,
    ready_at     BIGINT         NOT NULL,
    PRIMARY KEY (queue, kind, group_key),
    INDEX groups_ready (ready_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Ids come from the jobs table's AUTO_INCREMENT (a row inserted there and
-- moved here in the enqueue's transaction; InnoDB never hands an id out
-- twice), so a member keeps one id from enqueue to history.
CREATE TABLE {group_members} (
    id           BIGINT         NOT NULL PRIMARY KEY,
    queue        VARBINARY(128) NOT NULL,
    kind         VARBINARY(128) NOT NULL,
    group_key    VARBINARY(128) NOT NULL,
    priority     INT            NOT NULL,
    payload      LONGTEXT       NOT NULL,
    max_attempts INT            NOT NULL,
    created_at   BIGINT         NOT NULL,
    INDEX group_members_group (queue, kind, group_key, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Differs from SQLite in that the column's CHECK is replaced in place: on
-- MariaDB a column's CHECK belongs to its definition, which MODIFY rewrites.
ALTER TABLE {history}
    MODIFY status VARCHAR(16) NOT NULL
        CHECK (status IN ('completed', 'discarded', 'cancelled', 'dead', 'aggregated')),
    ADD COLUMN group_key VARBINARY(128),
    ADD COLUMN aggregated_into BIGINT;
