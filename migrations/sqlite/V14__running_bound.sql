-- In step with migrations/mysql/V14__running_bound.sql, which keeps an upper
-- bound of a queue's running jobs on its row so that a limited lease on
-- MariaDB can skip counting them. SQLite needs none: its single writer counts
-- the running jobs through a partial index, in process. Nothing to do; the
-- version is kept so that the three schemas keep one numbering. (A
-- statement that returns no row: the migration runner refuses one that does.)
SELECT 1 WHERE 0;
