-- The batches not finished yet, for the metrics' open-batch gauge: a
-- scrape counts this index, never the batch rows, which are kept after
-- their batch finishes. Partial, so a batch leaves it when it finishes and
-- the index holds only the open ones; one index write per batch at create
-- and one at finish, none per member.
CREATE INDEX backlog_batches_open ON backlog_batches (id) WHERE finished_at IS NULL;
