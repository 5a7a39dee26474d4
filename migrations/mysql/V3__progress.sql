-- In step with migrations/sqlite/V3__progress.sql: a running job's progress
-- or partial result, kept in history when the job finishes. LONGTEXT like
-- payloads and results (see V1).
ALTER TABLE {jobs} ADD COLUMN progress LONGTEXT;
ALTER TABLE {history} ADD COLUMN progress LONGTEXT;
