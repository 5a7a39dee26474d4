//! MariaDB's multi-row insert for `enqueue_many` (see `enqueue.rs`): built
//! for a number of rows and a [`RowShape`], then rendered for a queue's
//! tables once and kept ([`Sql::enqueue_rows`](super::Sql::enqueue_rows)).
//! Beside `templates.rs`, whose statements are constants.

use super::SERVER_NOW;

/// The `priority` column's default (`migrations/mysql/V1__initial.sql`): a
/// statement whose rows all have it leaves the column out.
pub const DEFAULT_PRIORITY: i32 = 0;

/// The `max_attempts` column's default (`migrations/mysql/V1__initial.sql`),
/// left out as [`DEFAULT_PRIORITY`] is.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// What the rows of one multi-row insert bind beyond queue, kind and
/// payload: each flag is one text of its own, so that the common rows (no
/// key, the defaults, due now, the server's clock) carry three values, as
/// near the raw row's four as the schema allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowShape {
    /// Some row has a unique key: every row binds one (NULL for none), and
    /// the inserted rows' queues and keys come back, to tell refused rows.
    pub keyed: bool,
    /// The clock is manual: every row binds the engine's now, where the
    /// text otherwise reads the server's clock.
    pub manual: bool,
    /// Some row has a priority or max attempts other than the columns'
    /// defaults, or a delay: every row binds all three. Otherwise the text
    /// leaves the two columns to their defaults and makes the rows due now.
    pub explicit: bool,
}

/// Inserts `rows` jobs in one statement and returns the inserted rows'
/// `id, queue, unique_key` in input order (only `id` unless `keyed`: with
/// no unique key among the rows none is refused, and the ids match the rows
/// one to one); a row refused for its unique key returns nothing. Only on
/// MariaDB (10.5+ has `INSERT .. RETURNING`; MySQL has no way to read the
/// ids of a multi-row insert, whose AUTO_INCREMENT values need not be
/// consecutive): one round trip for many jobs where MySQL takes one per job.
///
/// Parameters are positional (`?`), per row: queue, kind, payload, the
/// unique key (only when `keyed`), priority and max attempts (only when
/// `explicit`), the engine's now (only when `manual`), and the delay (µs
/// from now, only when `explicit`). A column left out takes its default
/// (`unique_key` NULL). Three values a row for plain jobs with the defaults
/// on the server's clock, where there were six. Each row reads the clock
/// once, as [`ENQUEUE`](super::ENQUEUE) does.
///
/// Positional because the driver matches named parameters to positions in
/// time quadratic in their number (each occurrence looks for a later one),
/// which for a 128-row statement (1,280 placeholders) cost more than the
/// insert.
pub fn enqueue_rows(rows: usize, shape: RowShape) -> String {
    format!(
        "{}\nRETURNING id{}",
        insert(rows, shape),
        if shape.keyed {
            ", queue, unique_key"
        } else {
            ""
        }
    )
}

/// One job, bound as a row of [`enqueue_rows`], without `RETURNING`: the
/// insert's own id (`LAST_INSERT_ID`) is the job's, and a row refused for
/// its unique key changes none. On MySQL too. A single enqueue's answer is
/// then an OK packet, not a result set: 13 % less time a statement by hand
/// on a tmpfs server (BENCHMARKS.md, issue 20's MariaDB enqueue).
pub fn enqueue_row(shape: RowShape) -> String {
    insert(1, shape)
}

/// `INSERT IGNORE` of `rows` rows of one shape.
fn insert(rows: usize, shape: RowShape) -> String {
    let mut columns = vec!["queue", "kind", "payload", "errors"];
    let mut values = vec!["?", "?", "?", "'[]'"];
    if shape.keyed {
        columns.push("unique_key");
        values.push("?");
    }
    if shape.explicit {
        columns.extend(["priority", "max_attempts"]);
        values.extend(["?", "?"]);
    }
    columns.extend(["created_at", "updated_at", "available_at"]);
    values.extend([
        if shape.manual { "?" } else { SERVER_NOW },
        "created_at",
        if shape.explicit {
            "created_at + ?"
        } else {
            "created_at"
        },
    ]);
    let row = format!("({})", values.join(", "));
    format!(
        "INSERT IGNORE INTO {{jobs}} ({})
VALUES {}",
        columns.join(", "),
        vec![row; rows].join(",\n       "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mysql::queries::NOW;

    /// `enqueue.rs` binds three values a row, plus the unique key when
    /// keyed, priority, max attempts and the delay when explicit, and the
    /// engine's now when manual: the text must ask for as many.
    #[test]
    fn enqueue_rows_asks_for_the_values_enqueue_binds() {
        for rows in [1, 5, 1000] {
            for keyed in [false, true] {
                for manual in [false, true] {
                    for explicit in [false, true] {
                        let shape = RowShape {
                            keyed,
                            manual,
                            explicit,
                        };
                        let text = enqueue_rows(rows, shape);
                        let per_row = 3
                            + usize::from(keyed)
                            + usize::from(manual)
                            + 3 * usize::from(explicit);
                        assert_eq!(text.matches('?').count(), rows * per_row);
                        assert_eq!(text.contains("UTC_TIMESTAMP"), !manual);
                        assert_eq!(text.contains("priority"), explicit);
                        assert_eq!(text.ends_with("unique_key"), keyed);
                        if rows == 1 {
                            let one = enqueue_row(shape);
                            assert_eq!(one.matches('?').count(), per_row);
                            assert!(text.starts_with(&one) && !one.contains("RETURNING"));
                        }
                    }
                }
            }
        }
        assert_eq!(NOW, format!("COALESCE(:now, {SERVER_NOW})"));
    }

    /// A text that leaves a column out relies on its default being the
    /// value the engine would have bound.
    #[test]
    fn the_left_out_defaults_are_the_engines() {
        assert_eq!(DEFAULT_MAX_ATTEMPTS, crate::job::DEFAULT_MAX_ATTEMPTS);
        let schema = include_str!("../../../../migrations/mysql/V1__initial.sql");
        assert!(schema.contains(&format!(
            "priority         INT            NOT NULL DEFAULT {DEFAULT_PRIORITY},"
        )));
        assert!(schema.contains(&format!(
            "max_attempts     INT            NOT NULL DEFAULT {DEFAULT_MAX_ATTEMPTS},"
        )));
    }
}
