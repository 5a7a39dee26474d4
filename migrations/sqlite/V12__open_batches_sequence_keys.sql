-- The batches not finished yet, for the metrics' open-batch gauge: a
-- scrape counts this index, never the batch rows, which are kept after
-- their batch finishes. Partial, so a batch leaves it when it finishes and
-- the index holds only the open ones; one index write per batch at create
-- and one at finish, none per member.
CREATE INDEX backlog_batches_open ON backlog_batches (id) WHERE finished_at IS NULL;

-- Each sequenced job's key, for its record (`Queue::get`, `backlog show`,
-- the dashboard): written by the enqueue that swaps the job in as its
-- sequence's tail, in that transaction; deleted with the job (an
-- operator's delete, history's prune). Keyed by the job's id, so the row
-- stays where it is while the job moves from waiting to live to history.
-- Jobs enqueued before V12 have none.
CREATE TABLE backlog_sequence_jobs (
    job_id       INTEGER PRIMARY KEY,
    sequence_key TEXT    NOT NULL
);
