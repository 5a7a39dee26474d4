//! What every database decides alike about a batch's rows, as SQL each
//! dialect splices into its own statements (`sqlite/batches.rs`,
//! `postgres/batches.rs`, `mysql/batches.rs`): which finished batch may be
//! pruned. The statements around it (locks, `RETURNING`, index hints) stay
//! each database's.

/// The condition, on a batch aliased `b`, under which a finished batch may
/// go: neither of its callback jobs (`complete_job_id`, `success_job_id`)
/// is still live, waiting on its dependencies or waiting in its group, as a
/// callback's handler may read its batch. Each argument is the database's
/// name for that table (SQLite's literal, the others' `{..}` template), a
/// literal, so that each database keeps its statement a constant.
macro_rules! callbacks_gone {
    ($jobs:literal, $pending:literal, $group_members:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM ",
            $jobs,
            " AS j WHERE j.id IN (b.complete_job_id, b.success_job_id))
  AND NOT EXISTS (SELECT 1 FROM ",
            $pending,
            " AS p WHERE p.id IN (b.complete_job_id, b.success_job_id))
  AND NOT EXISTS (SELECT 1 FROM ",
            $group_members,
            " AS g WHERE g.id IN (b.complete_job_id, b.success_job_id))"
        )
    };
}
pub(crate) use callbacks_gone;
