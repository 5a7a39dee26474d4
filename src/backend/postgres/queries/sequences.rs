//! The statements of `sequences.rs` (sequences on PostgreSQL, in the order
//! of `sqlite/sequences.rs`): PostgreSQL's [`SequenceTexts`], which
//! `queries/mod.rs` renders once at connect, below the file that runs them.
//! PostgreSQL has none of its own.

use super::Queries;
use crate::backend::statements::SequenceTexts;

impl SequenceTexts for Queries {
    /// As SQLite's, `$1` queue, `$2` key, `$3` the new tail. Every `SET`
    /// expression reads the row as it was, so `prev` takes the old tail.
    const SWAP_TAIL: &'static str = "
INSERT INTO {sequences} AS s (queue, key, tail) VALUES ($1, $2, $3)
ON CONFLICT (queue, key) DO UPDATE SET prev = s.tail, tail = EXCLUDED.tail
RETURNING prev";

    /// As SQLite's.
    const RECORD_KEY: &'static str =
        "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES ($1, $2)";

    /// As SQLite's, `$1` an array of ids.
    const KEYS_OF: &'static str =
        "SELECT job_id, sequence_key FROM {sequence_jobs} WHERE job_id = ANY($1)";

    /// As SQLite's, `$1` an array of ids.
    const FORGET_KEYS: &'static str = "DELETE FROM {sequence_jobs} WHERE job_id = ANY($1)";

    /// As SQLite's.
    const RESTORE_TAIL: &'static str =
        "UPDATE {sequences} SET tail = $4 WHERE queue = $1 AND key = $2 AND tail = $3";

    /// As SQLite's.
    const LINK: &'static str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT (dependency, dependent) DO UPDATE SET in_sequence = TRUE";

    /// As SQLite's.
    const PREDECESSORS: &'static str =
        "SELECT dependency FROM {dependencies} WHERE dependent = $1 AND in_sequence";

    /// As SQLite's.
    const IS_NEXT: &'static str =
        "SELECT 1 FROM {dependencies} WHERE dependency = $1 AND dependent = $2 AND in_sequence";

    /// As SQLite's.
    const HAND_OVER: &'static str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT DO NOTHING";
}
