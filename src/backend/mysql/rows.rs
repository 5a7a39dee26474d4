//! `copy`'s tables read and written as they are (see
//! [`crate::backend::rows`]): MySQL's placeholders and driver calls.

use mysql::prelude::Queryable;
use mysql::{params, Params, Row, Value};

use super::db::{take, Db};
use super::queries::Sql;
use crate::backend::rows::{self, Cell, Dialect, Ids, Kind, Rows, Table};
use crate::error::{Error, Result};

/// Differs from SQLite in that a skipped row is `INSERT IGNORE`: of the
/// two ways MySQL skips a duplicate key, the one whose affected-rows count
/// says whether the row was written.
const DIALECT: Dialect = Dialect {
    param: |_, _| "?".to_owned(),
    ident: |c| format!("`{c}`"),
    column: |c, _| c.to_owned(),
    insert: "INSERT IGNORE INTO",
    skip: "",
};

fn name(sql: &Sql, table: &Table) -> String {
    sql.tables.render(&format!("{{{}}}", table.name))
}

fn read(
    sql: &Sql,
    q: &mut impl Queryable,
    table: &Table,
    after: &[i64],
    limit: usize,
) -> Result<Vec<rows::Row>> {
    let text = rows::select(table, &name(sql, table), !after.is_empty(), &DIALECT);
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let mut params: Vec<Value> = after.iter().map(|a| Value::from(*a)).collect();
    params.push(Value::from(limit));
    let found: Vec<Row> = q.exec(text, Params::Positional(params))?;
    let mut out = Vec::with_capacity(found.len());
    for mut r in found {
        let mut row = Vec::with_capacity(table.columns.len());
        for (i, (_, kind)) in table.columns.iter().enumerate() {
            row.push(match kind {
                Kind::Int | Kind::Bool => {
                    take::<Option<i64>>(&mut r, i)?.map_or(Cell::Null, Cell::Int)
                }
                Kind::Text | Kind::Json => match take::<Option<Vec<u8>>>(&mut r, i)? {
                    None => Cell::Null,
                    Some(bytes) => Cell::Text(
                        String::from_utf8(bytes)
                            .map_err(|e| Error::Database(format!("column {i}: {e}").into()))?,
                    ),
                },
            });
        }
        out.push(row);
    }
    Ok(out)
}

fn write(sql: &Sql, q: &mut impl Queryable, table: &Table, rows: &[rows::Row]) -> Result<usize> {
    let text = rows::insert(table, &name(sql, table), &DIALECT);
    let mut written = 0;
    for row in rows {
        let values: Vec<Value> = row
            .iter()
            .map(|cell| match cell {
                Cell::Null => Value::NULL,
                Cell::Int(i) => Value::from(*i),
                Cell::Text(t) => Value::from(t.as_str()),
            })
            .collect();
        written += q
            .exec_iter(text.as_str(), Params::Positional(values))?
            .affected_rows();
    }
    // `AUTO_INCREMENT` follows an explicit id by itself; the jobs' counter
    // does not see ids that stay out of the jobs table.
    if table.ids == Ids::Jobs {
        let highest = rows::highest_id(rows);
        q.exec_drop(&sql.raise_next_id, params! { "id" => highest })?;
        q.exec_drop(&sql.drop_id_placeholder, params! { "id" => highest })?;
    }
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

impl Rows for Db {
    fn read_rows(&self, table: &Table, after: &[i64], limit: usize) -> Result<Vec<rows::Row>> {
        self.read(|conn| read(&self.sql, conn, table, after, limit))
    }

    fn write_rows(&self, table: &Table, rows: &[rows::Row]) -> Result<usize> {
        self.write(|tx| write(&self.sql, tx, table, rows))
    }
}
