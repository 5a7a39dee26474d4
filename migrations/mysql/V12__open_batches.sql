-- In step with migrations/sqlite/V12__open_batches.sql. Differs in that
-- MySQL and MariaDB have no partial index: this one holds every batch, and
-- the gauge seeks its NULL range (the open batches) only.
CREATE INDEX batches_open ON {batches} (finished_at);
