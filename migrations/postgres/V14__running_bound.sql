-- In step with migrations/mysql/V14__running_bound.sql, which keeps an upper
-- bound of a queue's running jobs on its row so that a limited lease on
-- MariaDB can skip counting them. PostgreSQL needs none: its limited lease
-- counts a partial index of the running jobs alone. Nothing to do; the
-- version is kept so that the three schemas keep one numbering.
DO $$ BEGIN END $$;
