//! The statements of `sequences.rs` (sequences on PostgreSQL, in the order
//! of `sqlite/sequences.rs`), and [`SequenceQueries`], which renders them
//! once at connect, below the file that runs them.

/// As SQLite's, `$1` queue, `$2` key, `$3` the new tail. Every `SET`
/// expression reads the row as it was, so `prev` takes the old tail.
pub const SWAP_TAIL: &str = "
INSERT INTO {sequences} AS s (queue, key, tail) VALUES ($1, $2, $3)
ON CONFLICT (queue, key) DO UPDATE SET prev = s.tail, tail = EXCLUDED.tail
RETURNING prev";

/// As SQLite's.
pub const RECORD_KEY: &str = "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES ($1, $2)";

/// As SQLite's, `$1` an array of ids.
pub const KEYS_OF: &str = "SELECT job_id, sequence_key FROM {sequence_jobs} WHERE job_id = ANY($1)";

/// As SQLite's, `$1` an array of ids.
pub const FORGET_KEYS: &str = "DELETE FROM {sequence_jobs} WHERE job_id = ANY($1)";

/// As SQLite's.
pub const RESTORE_TAIL: &str =
    "UPDATE {sequences} SET tail = $4 WHERE queue = $1 AND key = $2 AND tail = $3";

/// As SQLite's.
pub const LINK: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT (dependency, dependent) DO UPDATE SET in_sequence = TRUE";

/// As SQLite's.
pub const PREDECESSORS: &str =
    "SELECT dependency FROM {dependencies} WHERE dependent = $1 AND in_sequence";

/// As SQLite's.
pub const IS_NEXT: &str =
    "SELECT 1 FROM {dependencies} WHERE dependency = $1 AND dependent = $2 AND in_sequence";

/// As SQLite's.
pub const HAND_OVER: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES ($1, $2, TRUE, FALSE, TRUE)
ON CONFLICT DO NOTHING";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub(crate) struct SequenceQueries {
    pub swap_tail: String,
    pub record_key: String,
    pub keys_of: String,
    pub forget_keys: String,
    pub restore_tail: String,
    pub link: String,
    pub predecessors: String,
    pub is_next: String,
    pub hand_over: String,
}

impl SequenceQueries {
    pub(crate) fn render(r: impl Fn(&str) -> String) -> SequenceQueries {
        SequenceQueries {
            swap_tail: r(SWAP_TAIL),
            record_key: r(RECORD_KEY),
            keys_of: r(KEYS_OF),
            forget_keys: r(FORGET_KEYS),
            restore_tail: r(RESTORE_TAIL),
            link: r(LINK),
            predecessors: r(PREDECESSORS),
            is_next: r(IS_NEXT),
            hand_over: r(HAND_OVER),
        }
    }
}
