-- Batches (issue 23): a set of jobs with callback jobs enqueued once every
-- member has finished (`on_complete`) and once every member has completed
-- (`on_success`).
--
-- One row per batch holds its counters. The transaction that moves a member
-- to history adds it to its status's counter (one write per finished
-- member, no scan), and when the counters say the batch is done, inserts the
-- callbacks and sets `finished_at` in that same transaction: a batch whose
-- `finished_at` is set never fires again. A batch is created open
-- (`sealed` 0): members may join; it can only finish once sealed.
--
-- `on_complete` / `on_success` are the callback jobs, encoded by the engine
-- (JSON), or NULL. Times are unix microseconds.
CREATE TABLE backlog_batches (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    sealed          INTEGER NOT NULL DEFAULT 0,
    total           INTEGER NOT NULL DEFAULT 0,
    completed       INTEGER NOT NULL DEFAULT 0,
    discarded       INTEGER NOT NULL DEFAULT 0,
    cancelled       INTEGER NOT NULL DEFAULT 0,
    dead            INTEGER NOT NULL DEFAULT 0,
    on_complete     TEXT,
    on_success      TEXT,
    finished_at     INTEGER,
    complete_job_id INTEGER,
    success_job_id  INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

-- The live members of each batch: a row is written when a job joins and
-- deleted when it finishes (or is deleted), so a member is counted once,
-- and a job that finished and was retried runs outside its batch.
CREATE TABLE backlog_batch_jobs (
    job_id   INTEGER PRIMARY KEY,
    batch_id INTEGER NOT NULL
);
