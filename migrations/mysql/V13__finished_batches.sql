-- In step with migrations/sqlite/V13__finished_batches.sql, which adds an
-- index on the batches' `finished_at` for history's prune. MySQL and
-- MariaDB have one already: V12's `batches_open` holds every batch by
-- `finished_at` (no partial index here), and the prune seeks its range
-- below the cutoff, past the NULLs of the open batches. Nothing to do; the
-- version is kept so that the three schemas keep one numbering.
DO 0;
