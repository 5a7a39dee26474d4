//! `copy`'s tables read and written as they are (see
//! [`crate::backend::rows`]): PostgreSQL's placeholders, casts and driver
//! calls.

use postgres::types::ToSql;
use postgres::GenericClient;

use super::connection::Tx;
use super::db::Db;
use super::queries::Queries;
use crate::backend::params::bigint;
use crate::backend::rows::{self, Cell, Dialect, Ids, Kind, Row, Rows, Table};
use crate::error::Result;

/// Differs from SQLite in that every value is cast to one type per kind
/// (the tables mix `INTEGER` and `BIGINT`, `TEXT` and `JSONB`, and the
/// driver decodes only the exact type), flags are `BOOLEAN`, and a skipped
/// row is `ON CONFLICT DO NOTHING`.
const DIALECT: Dialect = Dialect {
    param: |n, kind| match kind {
        Kind::Int => format!("${n}::BIGINT"),
        Kind::Bool => format!("${n}::BOOLEAN"),
        Kind::Text => format!("${n}::TEXT"),
        Kind::Json => format!("${n}::TEXT::JSONB"),
    },
    ident: |c| c.to_owned(),
    column: |c, kind| match kind {
        Kind::Int => format!("{c}::BIGINT"),
        Kind::Bool => c.to_owned(),
        Kind::Text | Kind::Json => format!("{c}::TEXT"),
    },
    insert: "INSERT INTO",
    skip: " ON CONFLICT DO NOTHING",
};

/// Moves a table's own sequence to `$1` at least, never backwards (as the
/// jobs' `RAISE_NEXT_ID`).
const RAISE_OWN_ID: &str = "
SELECT setval(s, GREATEST($1, COALESCE(pg_sequence_last_value(s), 0)))
FROM (SELECT pg_get_serial_sequence('{table}', 'id')::regclass AS s) AS seq";

fn name(q: &Queries, table: &Table) -> String {
    q.tables.render(&format!("{{{}}}", table.name))
}

fn read<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    table: &Table,
    after: &[i64],
    limit: usize,
) -> Result<Vec<Row>> {
    let sql = rows::select(table, &name(q, table), !after.is_empty(), &DIALECT);
    let limit = bigint(limit);
    let mut params: Vec<&(dyn ToSql + Sync)> = after.iter().map(|a| a as _).collect();
    params.push(&limit);
    let mut out = Vec::new();
    for r in tx.query(&sql, &params)? {
        let mut row = Vec::with_capacity(table.columns.len());
        for (i, (_, kind)) in table.columns.iter().enumerate() {
            row.push(match kind {
                Kind::Int => r
                    .try_get::<_, Option<i64>>(i)?
                    .map_or(Cell::Null, Cell::Int),
                Kind::Bool => r
                    .try_get::<_, Option<bool>>(i)?
                    .map_or(Cell::Null, |b| Cell::Int(i64::from(b))),
                Kind::Text | Kind::Json => r
                    .try_get::<_, Option<String>>(i)?
                    .map_or(Cell::Null, Cell::Text),
            });
        }
        out.push(row);
    }
    Ok(out)
}

fn write<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    q: &Queries,
    table: &Table,
    rows: &[Row],
) -> Result<usize> {
    let sql = rows::insert(table, &name(q, table), &DIALECT);
    let mut written = 0;
    for row in rows {
        let values: Vec<Box<dyn ToSql + Sync>> = row
            .iter()
            .zip(table.columns)
            .map(|(cell, (_, kind))| -> Box<dyn ToSql + Sync> {
                match kind {
                    Kind::Int => Box::new(cell.int()),
                    Kind::Bool => Box::new(cell.int().map(|i| i != 0)),
                    Kind::Text | Kind::Json => Box::new(match cell {
                        Cell::Text(t) => Some(t.clone()),
                        _ => None,
                    }),
                }
            })
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        written += tx.execute(&sql, &params)?;
    }
    let highest = rows::highest_id(rows);
    match table.ids {
        Ids::None => {}
        Ids::Jobs => {
            tx.query(&q.raise_next_id, &[&highest])?;
        }
        Ids::Own => {
            let sql = RAISE_OWN_ID.replace("{table}", &name(q, table));
            tx.query(&sql, &[&highest])?;
        }
    }
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

impl Rows for Db {
    fn read_rows(&self, table: &Table, after: &[i64], limit: usize) -> Result<Vec<Row>> {
        self.pool.read(|tx| read(tx, &self.q, table, after, limit))
    }

    fn write_rows(&self, table: &Table, rows: &[Row]) -> Result<usize> {
        self.pool.write(|tx| write(tx, &self.q, table, rows))
    }
}
