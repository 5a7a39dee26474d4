-- A running job's progress or partial result (JSON text), written by its
-- handler through `ctx.set_progress(..)` and flushed with the worker's
-- heartbeats and before it settles; kept in history when the job finishes.
-- NULL until a handler reports one.
ALTER TABLE backlog_jobs ADD COLUMN progress TEXT;
ALTER TABLE backlog_history ADD COLUMN progress TEXT;
