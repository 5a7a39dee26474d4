-- Finished jobs counted as they finish, so totals and charts never scan
-- history (which retention prunes anyway). One row per bucket of time,
-- queue, kind and final status; `n` jobs moved to history in it.
--
-- `span` is the bucket's width in seconds: 60 (minutes, for the last hour's
-- chart; maintenance deletes them after two hours) and 3600 (hours, for the
-- 24 h and 7 d charts; maintenance folds those older than eight days into
-- the span-0 row). Span 0 holds everything folded, under bucket 0: a
-- queue's all-time total is its span-0 row plus its hour rows. `bucket` is
-- the start of the bucket, unix µs, on the clock that stamped `finished_at`.
--
-- Written by the engine in the transaction that moves jobs to history (see
-- `src/backend/sqlite/counts.rs`), not by a trigger: a trigger is refused
-- on managed MySQL servers with binary logging, and one mechanism serves
-- the three databases alike.
CREATE TABLE backlog_finished_counts (
    span   INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    queue  TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    status TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (span, bucket, queue, kind, status)
) WITHOUT ROWID;

-- The jobs already in history, per hour: the totals start from what the
-- file holds, not from zero.
INSERT INTO backlog_finished_counts (span, bucket, queue, kind, status, n)
SELECT 3600, finished_at - finished_at % 3600000000, queue, kind, status, count(*)
FROM backlog_history
GROUP BY 2, 3, 4, 5;
