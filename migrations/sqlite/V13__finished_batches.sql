-- The finished batches by when they finished, for history's prune: a
-- finished batch is deleted once it is older than the longest retention
-- and its callbacks are finished too (`Queue::prune_history`), oldest
-- first, so each pass seeks this index for at most its limit. Partial, so an
-- open batch is not in it; one index write per batch, at finish.
CREATE INDEX backlog_batches_finished ON backlog_batches (finished_at)
    WHERE finished_at IS NOT NULL;
