//! The statements of `sequences.rs` (sequences on MySQL/MariaDB, in the
//! order of `sqlite/sequences.rs`): the ones both servers run as MySQL's
//! [`SequenceTexts`], then MySQL's own, which [`OwnSequences`] renders once
//! at connect, below the file that runs them.

use super::Sql;
use crate::backend::statements::SequenceTexts;

impl SequenceTexts for Sql {
    /// As SQLite's, without the `RETURNING`. The assignments of `ON DUPLICATE
    /// KEY UPDATE` run left to right, each seeing the ones before it: `prev`
    /// takes the old tail, then `tail` the new one.
    const SWAP_TAIL: &'static str = "
INSERT INTO {sequences} (queue, `key`, tail) VALUES (:queue, :key, :tail)
ON DUPLICATE KEY UPDATE prev = tail, tail = VALUES(tail)";

    /// As SQLite's.
    const RECORD_KEY: &'static str =
        "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES (:id, :key)";

    /// As SQLite's: the ids drive the join on the primary key (as the
    /// `JSON_TABLE` joins of `templates.rs`).
    const KEYS_OF: &'static str = "
SELECT k.job_id, k.sequence_key
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

    /// As SQLite's, joined as [`Self::KEYS_OF`].
    const FORGET_KEYS: &'static str = "
DELETE k
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

    /// As SQLite's.
    const RESTORE_TAIL: &'static str = "
UPDATE {sequences} SET tail = :prev WHERE queue = :queue AND `key` = :key AND tail = :tail";

    /// As SQLite's.
    const LINK: &'static str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)
ON DUPLICATE KEY UPDATE in_sequence = TRUE";

    /// As SQLite's.
    const PREDECESSORS: &'static str =
        "SELECT dependency FROM {dependencies} WHERE dependent = :id AND in_sequence";

    /// As SQLite's.
    const IS_NEXT: &'static str = "
SELECT 1 FROM {dependencies} WHERE dependency = :ended AND dependent = :next AND in_sequence";

    /// As SQLite's.
    const HAND_OVER: &'static str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)";
}

// ---- MySQL's own -------------------------------------------------------------

/// The tail [`Sql::SWAP_TAIL`] replaced, NULL for a new sequence.
pub const PREV: &str = "SELECT prev FROM {sequences} WHERE queue = :queue AND `key` = :key";

/// MySQL's own statement of sequences, rendered once at connect, beside its
/// `SequenceStatements`.
#[derive(Debug)]
pub struct OwnSequences {
    pub prev: String,
}

impl OwnSequences {
    pub fn new(r: impl Fn(&str) -> String) -> OwnSequences {
        OwnSequences { prev: r(PREV) }
    }
}
