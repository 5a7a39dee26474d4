//! The SQLite schema, applied with refinery from `migrations/sqlite/`.
//!
//! Applied migrations are recorded in `backlog_schema_history`, not in
//! refinery's default `refinery_schema_history`: the file is the
//! application's, and an application that runs refinery for its own schema
//! owns that table (refinery aborts on rows it does not know).

use std::thread;
use std::time::{Duration, Instant};

use rusqlite::{params_from_iter, Connection, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

/// Where backlog records its applied migrations.
pub(crate) const HISTORY_TABLE: &str = "backlog_schema_history";

/// Where files written by earlier versions of backlog recorded them:
/// refinery's default table, perhaps shared with the application's own rows.
const LEGACY_HISTORY_TABLE: &str = "refinery_schema_history";

/// Applies pending migrations.
///
/// Several processes may open a new file at once: the loser of that race
/// fails on a lock or on the history row the winner wrote, and simply runs
/// again, now finding the migration applied.
pub(crate) fn migrate(conn: &mut Connection, deadline: Duration) -> Result<()> {
    const MAX_TRIES: u32 = 20;
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match migrate_once(conn) {
            Ok(()) => return Ok(()),
            Err(_) if tries < MAX_TRIES && start.elapsed() < deadline => {
                thread::sleep(Duration::from_millis(rand::random_range(5..50)));
            }
            Err(why) => return Err(Error::Migration(why)),
        }
    }
}

fn migrate_once(conn: &mut Connection) -> std::result::Result<(), String> {
    let mut runner = embedded::migrations::runner();
    runner.set_migration_table_name(HISTORY_TABLE);
    adopt_legacy_history(conn, runner.get_migrations()).map_err(|e| e.to_string())?;
    runner.run(conn).map_err(|e| e.to_string())?;
    Ok(())
}

/// Moves backlog's own rows out of `refinery_schema_history` into
/// `backlog_schema_history`, for a file whose backlog migrations were
/// recorded there, so they are not applied a second time. Rows are
/// backlog's when version, name and checksum all match one of its
/// migrations; every other row is the application's and stays. The legacy
/// table is dropped when nothing is left in it.
///
/// Once `backlog_schema_history` exists there is nothing to do: the common
/// case costs one read.
fn adopt_legacy_history(
    conn: &mut Connection,
    ours: &[refinery::Migration],
) -> rusqlite::Result<()> {
    if table_exists(conn, HISTORY_TABLE)? || !table_exists(conn, LEGACY_HISTORY_TABLE)? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Another process may have moved them meanwhile.
    if table_exists(&tx, HISTORY_TABLE)? || !table_exists(&tx, LEGACY_HISTORY_TABLE)? {
        return Ok(());
    }
    let rows: Vec<(i64, Option<String>, Option<String>)> = tx
        .prepare(&format!(
            "SELECT version, name, checksum FROM {LEGACY_HISTORY_TABLE}"
        ))?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let backlogs: Vec<i64> = rows
        .into_iter()
        .filter(|(version, name, checksum)| {
            ours.iter().any(|m| {
                i64::from(m.version()) == *version
                    && name.as_deref() == Some(m.name())
                    && checksum.as_deref() == Some(m.checksum().to_string().as_str())
            })
        })
        .map(|(version, _, _)| version)
        .collect();
    if backlogs.is_empty() {
        return Ok(()); // the application's table alone: backlog never ran here
    }
    let versions = vec!["?"; backlogs.len()].join(", ");
    // The same columns as refinery's own table.
    tx.execute_batch(&format!(
        "CREATE TABLE {HISTORY_TABLE} (
             version INT4 PRIMARY KEY,
             name VARCHAR(255),
             applied_on VARCHAR(255),
             checksum VARCHAR(255));"
    ))?;
    tx.execute(
        &format!(
            "INSERT INTO {HISTORY_TABLE} (version, name, applied_on, checksum)
             SELECT version, name, applied_on, checksum FROM {LEGACY_HISTORY_TABLE}
             WHERE version IN ({versions})"
        ),
        params_from_iter(&backlogs),
    )?;
    tx.execute(
        &format!("DELETE FROM {LEGACY_HISTORY_TABLE} WHERE version IN ({versions})"),
        params_from_iter(&backlogs),
    )?;
    let left: Option<i64> = tx
        .query_row(
            &format!("SELECT 1 FROM {LEGACY_HISTORY_TABLE} LIMIT 1"),
            [],
            |r| r.get(0),
        )
        .optional()?;
    if left.is_none() {
        tx.execute_batch(&format!("DROP TABLE {LEGACY_HISTORY_TABLE}"))?;
    }
    tx.commit()
}

/// The migrations of this build the file has not applied (`V2__due`),
/// oldest first. Reads only: for tools that must not migrate on their own.
pub(crate) fn pending(conn: &Connection) -> Result<Vec<String>> {
    let table = [HISTORY_TABLE, LEGACY_HISTORY_TABLE]
        .into_iter()
        .map(|t| table_exists(conn, t).map(|found| found.then_some(t)))
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .next();
    let applied: Vec<i64> = match table {
        Some(table) => conn
            .prepare(&format!("SELECT version FROM {table}"))?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?,
        None => Vec::new(),
    };
    // Embedded in file-name order, where V10 sorts before V2.
    let mut migrations = embedded::migrations::runner().get_migrations().clone();
    migrations.sort_by_key(|m| m.version());
    Ok(migrations
        .iter()
        .filter(|m| !applied.contains(&i64::from(m.version())))
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect())
}

fn table_exists(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}
