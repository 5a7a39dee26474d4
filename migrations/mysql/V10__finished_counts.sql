-- In step with migrations/sqlite/V10__finished_counts.sql: finished jobs
-- counted per bucket of time, queue, kind and status as they finish.
--
-- Differs from SQLite in that times are the server's clock (unix µs), as in
-- the other tables, and names are VARBINARY as in `{history}`. No trigger:
-- MySQL with binary logging refuses CREATE TRIGGER to users without SUPER
-- unless `log_bin_trust_function_creators` is set, as managed servers do.
CREATE TABLE {finished_counts} (
    span   INT            NOT NULL,
    bucket BIGINT         NOT NULL,
    queue  VARBINARY(128) NOT NULL,
    kind   VARBINARY(128) NOT NULL,
    status VARCHAR(16)    NOT NULL,
    n      BIGINT         NOT NULL,
    PRIMARY KEY (span, bucket, queue, kind, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO {finished_counts} (span, bucket, queue, kind, status, n)
SELECT 3600, finished_at - finished_at % 3600000000, queue, kind, status, COUNT(*)
FROM {history}
GROUP BY 2, 3, 4, 5;
