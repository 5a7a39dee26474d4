//! The PostgreSQL schema, applied with refinery from `migrations/postgres/`.
//!
//! The migration files name their tables through placeholders (the schema
//! and the table prefix are the queue's options), so they are read with
//! `include_str!`, filled in, and handed to refinery as unapplied migrations
//! instead of being embedded as they are. Refinery's history table carries
//! the same prefix, so several queues can share one database.

use postgres::Client;
use refinery::{Migration, Runner};

use super::queries::Tables;
use crate::error::{Error, Result};

/// The migrations, in version order: (refinery name, SQL template).
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "V1__initial",
        include_str!("../../../migrations/postgres/V1__initial.sql"),
    ),
    (
        "V2__due",
        include_str!("../../../migrations/postgres/V2__due.sql"),
    ),
];

/// The key of the advisory lock that serialises migrations of one schema and
/// prefix across nodes.
fn lock_key(tables: &Tables) -> String {
    format!("backlog migrate {}{}", tables.schema, tables.prefix)
}

/// Applies pending migrations on `client`. Nodes starting together take
/// turns: a session advisory lock (held while refinery runs, released after,
/// and by the server if this connection dies) makes the later ones find the
/// schema migrated.
pub(crate) fn migrate(client: &mut Client, tables: &Tables) -> Result<()> {
    let key = lock_key(tables);
    client.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&key])?;
    let result = run(client, tables);
    let unlocked = client.execute(
        "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
        &[&key],
    );
    result?;
    unlocked?;
    Ok(())
}

fn run(client: &mut Client, tables: &Tables) -> Result<()> {
    if let Some(schema) = tables.schema.strip_suffix('.') {
        // The name is a checked identifier (`validate::identifier`).
        client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
    }
    let migrations = MIGRATIONS
        .iter()
        .map(|(name, sql)| {
            let sql = sql
                .replace("{schema}", &tables.schema)
                .replace("{prefix}", &tables.prefix);
            Migration::unapplied(name, &sql).map_err(|e| Error::Migration(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    Runner::new(&migrations)
        .set_migration_table_name(tables.schema_history())
        .run(client)
        .map_err(|e| Error::Migration(e.to_string()))?;
    Ok(())
}
