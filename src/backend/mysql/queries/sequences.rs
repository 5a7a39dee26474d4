//! The statements of `sequences.rs` (sequences on MySQL/MariaDB, in the
//! order of `sqlite/sequences.rs`), and [`SequenceSql`], which renders them
//! once at connect, below the file that runs them.

/// As SQLite's, without the `RETURNING`. The assignments of `ON DUPLICATE
/// KEY UPDATE` run left to right, each seeing the ones before it: `prev`
/// takes the old tail, then `tail` the new one.
pub const SWAP_TAIL: &str = "
INSERT INTO {sequences} (queue, `key`, tail) VALUES (:queue, :key, :tail)
ON DUPLICATE KEY UPDATE prev = tail, tail = VALUES(tail)";

/// As SQLite's.
pub const RECORD_KEY: &str =
    "INSERT INTO {sequence_jobs} (job_id, sequence_key) VALUES (:id, :key)";

/// As SQLite's: the ids drive the join on the primary key (as the
/// `JSON_TABLE` joins of `templates.rs`).
pub const KEYS_OF: &str = "
SELECT k.job_id, k.sequence_key
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

/// As SQLite's, joined as [`KEYS_OF`].
pub const FORGET_KEYS: &str = "
DELETE k
FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS g
STRAIGHT_JOIN {sequence_jobs} AS k ON k.job_id = g.id";

/// The tail [`SWAP_TAIL`] replaced, NULL for a new sequence.
pub const PREV: &str = "SELECT prev FROM {sequences} WHERE queue = :queue AND `key` = :key";

/// As SQLite's.
pub const RESTORE_TAIL: &str = "
UPDATE {sequences} SET tail = :prev WHERE queue = :queue AND `key` = :key AND tail = :tail";

/// As SQLite's.
pub const LINK: &str = "
INSERT INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)
ON DUPLICATE KEY UPDATE in_sequence = TRUE";

/// As SQLite's.
pub const PREDECESSORS: &str =
    "SELECT dependency FROM {dependencies} WHERE dependent = :id AND in_sequence";

/// As SQLite's.
pub const IS_NEXT: &str = "
SELECT 1 FROM {dependencies} WHERE dependency = :ended AND dependent = :next AND in_sequence";

/// As SQLite's.
pub const HAND_OVER: &str = "
INSERT IGNORE INTO {dependencies} (dependency, dependent, run_anyway, cancelled, in_sequence)
VALUES (:dependency, :dependent, TRUE, FALSE, TRUE)";

/// The statements above, rendered once at connect.
#[derive(Debug)]
pub struct SequenceSql {
    pub swap_tail: String,
    pub prev: String,
    pub record_key: String,
    pub keys_of: String,
    pub forget_keys: String,
    pub restore_tail: String,
    pub link: String,
    pub predecessors: String,
    pub is_next: String,
    pub hand_over: String,
}

impl SequenceSql {
    pub fn new(r: impl Fn(&str) -> String) -> SequenceSql {
        SequenceSql {
            swap_tail: r(SWAP_TAIL),
            prev: r(PREV),
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
