-- In step with migrations/sqlite/V3__progress.sql: a running job's progress
-- or partial result, kept in history when the job finishes.
--
-- Differs from SQLite in nothing but the schema placeholders. TEXT, not
-- JSONB: the engine validated it, it is rewritten at every heartbeat and
-- read back as it was written.
ALTER TABLE {schema}{prefix}jobs ADD COLUMN progress TEXT;
ALTER TABLE {schema}{prefix}history ADD COLUMN progress TEXT;
