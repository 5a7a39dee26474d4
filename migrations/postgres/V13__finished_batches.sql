-- In step with migrations/sqlite/V13__finished_batches.sql: the finished
-- batches by when they finished, for history's prune, in a partial index an
-- open batch is not in.
CREATE INDEX {prefix}batches_finished
    ON {schema}{prefix}batches (finished_at)
    WHERE finished_at IS NOT NULL;
