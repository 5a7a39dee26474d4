//! The tables `copy` moves row by row as they are (see `src/copy.rs`):
//! what waits for dependencies, the dependency edges, workflows and their
//! steps, batches and their live members. Jobs themselves go through
//! [`Store::import`](super::Store::import), which knows their states.
//!
//! These tables hold only integers and text, so one description of each
//! ([`Table`]) and one statement shape serve every database: the [`Rows`]
//! part of the [`Store`](super::Store), whose implementations (each
//! database's `rows.rs`) differ only in placeholders, casts, the
//! skip-if-there clause ([`Dialect`]) and their driver calls.

use crate::error::Result;

/// How a column's values travel between databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integer (`BIGINT`, `INTEGER`).
    Int,
    /// A flag: an integer 0/1 on SQLite and MySQL, a `BOOLEAN` on
    /// PostgreSQL. Carried as [`Cell::Int`].
    Bool,
    /// Text.
    Text,
    /// JSON text (`JSONB` on PostgreSQL).
    Json,
}

/// Where a table's ids come from, raised on the target after a copy so
/// that new rows get ids above the copied ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ids {
    /// Not an id-generating table.
    None,
    /// The jobs' id sequence (a waiting job keeps its id into `jobs`).
    Jobs,
    /// The table's own `id` sequence (`AUTOINCREMENT`, `BIGSERIAL`,
    /// `AUTO_INCREMENT`).
    Own,
}

/// A table `copy` moves as it is. The key is the first `key` columns, all
/// integers: rows are read in key order, paged after the last key read, and
/// a row whose key the target has is skipped.
#[derive(Debug)]
pub(crate) struct Table {
    /// The table's name after the prefix (`pending`: `backlog_pending`).
    pub name: &'static str,
    /// What one row of it is, in the report's and errors' words.
    pub what: &'static str,
    pub columns: &'static [(&'static str, Kind)],
    pub key: usize,
    pub ids: Ids,
}

/// Jobs waiting for their dependencies, with how many they still wait for.
pub(crate) const PENDING: Table = Table {
    name: "pending",
    what: "waiting job",
    columns: &[
        ("id", Kind::Int),
        ("queue", Kind::Text),
        ("kind", Kind::Text),
        ("priority", Kind::Int),
        ("payload", Kind::Json),
        ("max_attempts", Kind::Int),
        ("available_at", Kind::Int),
        ("remaining", Kind::Int),
        ("created_at", Kind::Int),
    ],
    key: 1,
    ids: Ids::Jobs,
};

/// Every dependency edge, kept after its release for the results.
pub(crate) const DEPENDENCIES: Table = Table {
    name: "dependencies",
    what: "dependency",
    columns: &[
        ("dependent", Kind::Int),
        ("dependency", Kind::Int),
        ("run_anyway", Kind::Bool),
        ("cancelled", Kind::Bool),
        ("in_sequence", Kind::Bool),
    ],
    key: 2,
    ids: Ids::None,
};

/// Workflows.
pub(crate) const WORKFLOWS: Table = Table {
    name: "workflows",
    what: "workflow",
    columns: &[
        ("id", Kind::Int),
        ("created_at", Kind::Int),
        ("name", Kind::Text),
    ],
    key: 1,
    ids: Ids::Own,
};

/// Each workflow step's job.
pub(crate) const WORKFLOW_STEPS: Table = Table {
    name: "workflow_steps",
    what: "workflow step",
    columns: &[
        ("job_id", Kind::Int),
        ("workflow_id", Kind::Int),
        ("step", Kind::Text),
    ],
    key: 1,
    ids: Ids::None,
};

/// Batches, with their counters and callbacks.
pub(crate) const BATCHES: Table = Table {
    name: "batches",
    what: "batch",
    columns: &[
        ("id", Kind::Int),
        ("created_at", Kind::Int),
        ("sealed", Kind::Bool),
        ("total", Kind::Int),
        ("completed", Kind::Int),
        ("discarded", Kind::Int),
        ("cancelled", Kind::Int),
        ("dead", Kind::Int),
        ("on_complete", Kind::Text),
        ("on_success", Kind::Text),
        ("finished_at", Kind::Int),
        ("complete_job_id", Kind::Int),
        ("success_job_id", Kind::Int),
        ("updated_at", Kind::Int),
    ],
    key: 1,
    ids: Ids::Own,
};

/// The batches' unfinished members.
pub(crate) const BATCH_JOBS: Table = Table {
    name: "batch_jobs",
    what: "batch member",
    columns: &[("job_id", Kind::Int), ("batch_id", Kind::Int)],
    key: 1,
    ids: Ids::None,
};

/// Each sequence's tail (and the job before it), keyed here by the tail: a
/// job is the tail of one sequence at most. Without it a job enqueued on
/// the target would not wait for the copied jobs of its sequence.
pub(crate) const SEQUENCES: Table = Table {
    name: "sequences",
    what: "sequence",
    columns: &[
        ("tail", Kind::Int),
        ("prev", Kind::Int),
        ("queue", Kind::Text),
        ("key", Kind::Text),
    ],
    key: 1,
    ids: Ids::None,
};

/// Each sequenced job's key, for its record.
pub(crate) const SEQUENCE_JOBS: Table = Table {
    name: "sequence_jobs",
    what: "sequence key",
    columns: &[("job_id", Kind::Int), ("sequence_key", Kind::Text)],
    key: 1,
    ids: Ids::None,
};

/// One value of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
}

impl Cell {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// A row, its cells in [`Table::columns`]' order.
pub(crate) type Row = Vec<Cell>;

/// `copy`'s part of the [`Store`](super::Store): tables read and written
/// row by row, as they are.
pub(crate) trait Rows {
    /// Up to `limit` rows of `table` in key order, after key `after` (empty:
    /// from the first). Reads only.
    fn read_rows(&self, table: &Table, after: &[i64], limit: usize) -> Result<Vec<Row>>;

    /// Inserts `rows` into `table` in one transaction, skipping each whose
    /// key the table has; how many were written. Raises the table's ids
    /// ([`Table::ids`]) above the highest written.
    fn write_rows(&self, table: &Table, rows: &[Row]) -> Result<usize>;
}

/// What differs between the databases' statements.
pub(crate) struct Dialect {
    /// The `n`th parameter (from 1), bound for a column of this kind.
    pub param: fn(usize, Kind) -> String,
    /// A column's name as a statement writes it (MySQL quotes `key`, a
    /// reserved word there).
    pub ident: fn(&str) -> String,
    /// A column read (its [`Dialect::ident`]), as its driver decodes it.
    pub column: fn(&str, Kind) -> String,
    /// How an insert starts (`INSERT OR IGNORE INTO`).
    pub insert: &'static str,
    /// What follows its values (`ON CONFLICT DO NOTHING`).
    pub skip: &'static str,
}

/// `SELECT` of `table` (named `name` on this database) after a key, or
/// from the first row when `after` is false; the key's parameters, then
/// the limit's.
pub(crate) fn select(table: &Table, name: &str, after: bool, d: &Dialect) -> String {
    let columns: Vec<String> = table
        .columns
        .iter()
        .map(|(c, k)| (d.column)(&(d.ident)(c), *k))
        .collect();
    let key: Vec<String> = table.columns[..table.key]
        .iter()
        .map(|c| (d.ident)(c.0))
        .collect();
    let key = key.join(", ");
    let (filter, limit) = if after {
        let params: Vec<String> = (1..=table.key).map(|i| (d.param)(i, Kind::Int)).collect();
        (
            format!(" WHERE ({key}) > ({})", params.join(", ")),
            (d.param)(table.key + 1, Kind::Int),
        )
    } else {
        (String::new(), (d.param)(1, Kind::Int))
    };
    format!(
        "SELECT {} FROM {name}{filter} ORDER BY {key} LIMIT {limit}",
        columns.join(", ")
    )
}

/// `INSERT` of one row of `table` (named `name`), skipped when its key is
/// there.
pub(crate) fn insert(table: &Table, name: &str, d: &Dialect) -> String {
    let columns: Vec<String> = table.columns.iter().map(|c| (d.ident)(c.0)).collect();
    let params: Vec<String> = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, (_, k))| (d.param)(i + 1, *k))
        .collect();
    format!(
        "{} {name} ({}) VALUES ({}){}",
        d.insert,
        columns.join(", "),
        params.join(", "),
        d.skip
    )
}

/// The highest id among `rows` (their first column), for [`Table::ids`].
pub(crate) fn highest_id(rows: &[Row]) -> i64 {
    rows.iter()
        .filter_map(|r| r.first().and_then(Cell::int))
        .max()
        .unwrap_or(0)
}
