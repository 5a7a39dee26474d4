//! MariaDB's multi-row insert for `enqueue_many` (see `enqueue.rs`): built
//! for a number of rows, then rendered for a queue's tables once and kept
//! ([`Sql::enqueue_rows`](super::Sql::enqueue_rows)). Beside
//! `templates.rs`, whose statements are constants.

use super::SERVER_NOW;

/// Inserts `rows` jobs in one statement and returns the inserted rows'
/// `id, queue, unique_key` in input order (only `id` unless `keyed`: with
/// no unique key among the rows none is refused, and the ids match the rows
/// one to one); a row refused for its unique key returns nothing. Only on
/// MariaDB (10.5+ has `INSERT .. RETURNING`; MySQL has no way to read the
/// ids of a multi-row insert, whose AUTO_INCREMENT values need not be
/// consecutive): one round trip for many jobs where MySQL takes one per job.
///
/// Parameters are positional (`?`), per row: queue, kind, priority, the
/// unique key (only when `keyed`: otherwise the text says `NULL`), payload,
/// max attempts, the engine's now (only when `manual`: otherwise the text
/// reads the server's clock), and the delay (µs from now). Six a row for
/// plain jobs on the server's clock, where there were ten. Each row reads
/// the clock once, as [`ENQUEUE`] does.
///
/// Positional because the driver matches named parameters to positions in
/// time quadratic in their number (each occurrence looks for a later one),
/// which for a 128-row statement (1,280 placeholders) cost more than the
/// insert.
pub fn enqueue_rows(rows: usize, keyed: bool, manual: bool) -> String {
    let key = if keyed { "?" } else { "NULL" };
    let now = if manual { "?" } else { SERVER_NOW };
    let row = format!("(?, ?, ?, {key}, ?, '[]', ?, {now}, created_at, created_at + ?)");
    format!(
        "INSERT IGNORE INTO {{jobs}}
    (queue, kind, priority, unique_key, payload, errors, max_attempts, created_at,
     updated_at, available_at)
VALUES {}
RETURNING id{}",
        vec![row; rows].join(",\n       "),
        if keyed { ", queue, unique_key" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mysql::queries::NOW;

    /// `enqueue.rs` binds six values a row, plus the unique key when keyed
    /// and the engine's now when manual: the text must ask for as many.
    #[test]
    fn enqueue_rows_asks_for_the_values_enqueue_binds() {
        for rows in [1, 5, 1000] {
            for keyed in [false, true] {
                for manual in [false, true] {
                    let text = enqueue_rows(rows, keyed, manual);
                    let per_row = 6 + usize::from(keyed) + usize::from(manual);
                    assert_eq!(text.matches('?').count(), rows * per_row);
                    assert_eq!(text.contains("UTC_TIMESTAMP"), !manual);
                    assert_eq!(text.ends_with("unique_key"), keyed);
                }
            }
        }
        assert_eq!(NOW, format!("COALESCE(:now, {SERVER_NOW})"));
    }
}
