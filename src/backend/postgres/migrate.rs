//! The PostgreSQL schema, applied with refinery from `migrations/postgres/`.
//!
//! The migration files name their tables through placeholders (the schema
//! and the table prefix are the queue's options), so they are read with
//! `include_str!`, filled in, and handed to refinery as unapplied migrations
//! instead of being embedded as they are. Refinery's history table carries
//! the same prefix, so several queues can share one database.

use postgres::{Client, GenericClient};
use refinery::{Migration, Runner};

use super::connection::Tx;
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
    (
        "V3__progress",
        include_str!("../../../migrations/postgres/V3__progress.sql"),
    ),
    (
        "V4__groups",
        include_str!("../../../migrations/postgres/V4__groups.sql"),
    ),
    (
        "V5__limits",
        include_str!("../../../migrations/postgres/V5__limits.sql"),
    ),
    (
        "V6__schedules",
        include_str!("../../../migrations/postgres/V6__schedules.sql"),
    ),
    (
        "V7__workers",
        include_str!("../../../migrations/postgres/V7__workers.sql"),
    ),
    (
        "V8__dependencies",
        include_str!("../../../migrations/postgres/V8__dependencies.sql"),
    ),
    (
        "V9__batches",
        include_str!("../../../migrations/postgres/V9__batches.sql"),
    ),
    (
        "V10__finished_counts",
        include_str!("../../../migrations/postgres/V10__finished_counts.sql"),
    ),
    (
        "V11__sequences",
        include_str!("../../../migrations/postgres/V11__sequences.sql"),
    ),
    (
        "V12__open_batches_sequence_keys",
        include_str!("../../../migrations/postgres/V12__open_batches_sequence_keys.sql"),
    ),
    (
        "V13__finished_batches",
        include_str!("../../../migrations/postgres/V13__finished_batches.sql"),
    ),
    (
        "V14__running_bound",
        include_str!("../../../migrations/postgres/V14__running_bound.sql"),
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

/// The migrations of this build the database has not applied (`V2__due`),
/// oldest first, read from refinery's history table of this schema and
/// prefix (none yet: all are pending). Reads only: for tools that must not
/// migrate on their own.
pub(crate) fn pending<C: GenericClient>(
    tx: &mut Tx<'_, C>,
    tables: &Tables,
) -> Result<Vec<String>> {
    let history = tables.schema_history();
    // `to_regclass` resolves the name as refinery's `CREATE TABLE` did
    // (unquoted, so folded to lower case), and gives NULL, not an error,
    // for a table that is not there. Both statements bypass the statement
    // cache: a tool asks once.
    let found = tx
        .query_text("SELECT to_regclass($1) IS NOT NULL", &[&history])?
        .first()
        .map(|r| r.try_get::<_, bool>(0))
        .transpose()?
        .unwrap_or(false);
    let applied: Vec<i32> = if found {
        // The name is made of checked identifiers (`validate::identifier`).
        tx.query_text(&format!("SELECT version FROM {history}"), &[])?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<std::result::Result<_, _>>()?
    } else {
        Vec::new()
    };
    Ok(MIGRATIONS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| version(name).is_none_or(|v| !applied.contains(&v)))
        .map(str::to_owned)
        .collect())
}

/// The version of a migration name: 2 for `V2__due`.
fn version(name: &str) -> Option<i32> {
    name.strip_prefix('V')?.split_once("__")?.0.parse().ok()
}
