//! `copy`'s tables read and written as they are (see
//! [`crate::backend::rows`]): SQLite's placeholders and driver calls.

use rusqlite::types::{Value, ValueRef};
use rusqlite::{params_from_iter, Connection};

use super::connection::Connections;
use super::queries;
use crate::backend::params::bigint;
use crate::backend::rows::{self, Cell, Dialect, Ids, Row, Rows, Table};
use crate::error::Result;

/// Differs from the servers in that flags are plain integers and a skipped
/// row is `INSERT OR IGNORE`.
const DIALECT: Dialect = Dialect {
    param: |n, _| format!("?{n}"),
    ident: |c| c.to_owned(),
    column: |c, _| c.to_owned(),
    insert: "INSERT OR IGNORE INTO",
    skip: "",
};

fn name(table: &Table) -> String {
    format!("backlog_{}", table.name)
}

fn cell(value: ValueRef<'_>) -> Cell {
    match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(i) => Cell::Int(i),
        ValueRef::Real(f) => Cell::Int(f as i64),
        ValueRef::Text(t) | ValueRef::Blob(t) => Cell::Text(String::from_utf8_lossy(t).into()),
    }
}

fn value(cell: &Cell) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Int(i) => Value::Integer(*i),
        Cell::Text(t) => Value::Text(t.clone()),
    }
}

fn read(conn: &Connection, table: &Table, after: &[i64], limit: usize) -> Result<Vec<Row>> {
    let sql = rows::select(table, &name(table), !after.is_empty(), &DIALECT);
    let limit = bigint(limit);
    let mut stmt = conn.prepare(&sql)?;
    let params = after.iter().copied().chain([limit]);
    let mut found = stmt.query(params_from_iter(params))?;
    let mut out = Vec::new();
    while let Some(r) = found.next()? {
        let mut row = Vec::with_capacity(table.columns.len());
        for i in 0..table.columns.len() {
            row.push(cell(r.get_ref(i)?));
        }
        out.push(row);
    }
    Ok(out)
}

fn write(conn: &Connection, table: &Table, rows: &[Row]) -> Result<usize> {
    let mut stmt = conn.prepare(&rows::insert(table, &name(table), &DIALECT))?;
    let mut written = 0;
    for row in rows {
        written += stmt.execute(params_from_iter(row.iter().map(value)))?;
    }
    // `AUTOINCREMENT` follows an explicit id by itself; the jobs' does not
    // see ids that stay out of `backlog_jobs`.
    if table.ids == Ids::Jobs {
        let highest = rows::highest_id(rows);
        conn.execute(queries::ENSURE_NEXT_ID, [highest])?;
        conn.execute(queries::RAISE_NEXT_ID, [highest])?;
    }
    Ok(written)
}

impl Rows for Connections {
    fn read_rows(&self, table: &Table, after: &[i64], limit: usize) -> Result<Vec<Row>> {
        self.read(|c| read(c, table, after, limit))
    }

    fn write_rows(&self, table: &Table, rows: &[Row]) -> Result<usize> {
        self.write(|tx| write(tx, table, rows))
    }
}
