//! The MySQL schema, applied with refinery from `migrations/mysql/`, with
//! the queue's table prefix filled in.

use mysql::prelude::Queryable;
use refinery::{Migration, Runner};

use super::db::Db;
use crate::error::{Error, Result};

/// The migrations in order, as templates.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "V1__initial",
        include_str!("../../../migrations/mysql/V1__initial.sql"),
    ),
    (
        "V2__due",
        include_str!("../../../migrations/mysql/V2__due.sql"),
    ),
    (
        "V3__progress",
        include_str!("../../../migrations/mysql/V3__progress.sql"),
    ),
    (
        "V4__groups",
        include_str!("../../../migrations/mysql/V4__groups.sql"),
    ),
    (
        "V5__limits",
        include_str!("../../../migrations/mysql/V5__limits.sql"),
    ),
    (
        "V6__schedules",
        include_str!("../../../migrations/mysql/V6__schedules.sql"),
    ),
    (
        "V7__workers",
        include_str!("../../../migrations/mysql/V7__workers.sql"),
    ),
    (
        "V8__dependencies",
        include_str!("../../../migrations/mysql/V8__dependencies.sql"),
    ),
    (
        "V9__batches",
        include_str!("../../../migrations/mysql/V9__batches.sql"),
    ),
    (
        "V10__finished_counts",
        include_str!("../../../migrations/mysql/V10__finished_counts.sql"),
    ),
    (
        "V11__sequences",
        include_str!("../../../migrations/mysql/V11__sequences.sql"),
    ),
    (
        "V12__open_batches_sequence_keys",
        include_str!("../../../migrations/mysql/V12__open_batches_sequence_keys.sql"),
    ),
    (
        "V13__finished_batches",
        include_str!("../../../migrations/mysql/V13__finished_batches.sql"),
    ),
    (
        "V14__running_bound",
        include_str!("../../../migrations/mysql/V14__running_bound.sql"),
    ),
];

/// Applies pending migrations.
///
/// DDL commits by itself in MySQL, so nodes migrating at once are kept apart
/// by a named server lock (`GET_LOCK`) held for the run, rather than by a
/// transaction: the second finds the migrations applied.
pub(crate) fn migrate(db: &Db) -> Result<()> {
    let migrations = MIGRATIONS
        .iter()
        .map(|(name, template)| {
            Migration::unapplied(name, &render(template, &db.prefix))
                .map_err(|e| Error::Migration(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut runner = Runner::new(&migrations);
    runner.set_migration_table_name(format!("{}schema_history", db.prefix));

    let mut conn = db.conn()?;
    let lock = lock_name(&db.sql.tables.jobs);
    let wait = db.write_deadline.as_secs().max(1);
    let got: Option<i64> = conn.exec_first("SELECT GET_LOCK(?, ?)", (&lock, wait))?;
    if got != Some(1) {
        return Err(Error::Busy);
    }
    let ran = runner.run(&mut conn);
    // Released before anything can fail; the lock also ends with the session.
    let released = conn.exec_drop("DO RELEASE_LOCK(?)", (&lock,));
    ran.map_err(|e| Error::Migration(e.to_string()))?;
    released?;
    Ok(())
}

/// The migrations of this build the database has not applied (`V2__due`),
/// oldest first, from refinery's table under the queue's prefix; all of them
/// when that table does not exist (ER_NO_SUCH_TABLE). Reads only: for tools
/// that must not migrate on their own.
pub(crate) fn pending(db: &Db) -> Result<Vec<String>> {
    let read = format!("SELECT version FROM {}", db.sql.tables.schema_history);
    let applied: Vec<i64> = db.read(|conn| match conn.query(&read) {
        Ok(versions) => Ok(versions),
        Err(mysql::Error::MySqlError(e)) if e.code == 1146 => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    })?;
    let ours = MIGRATIONS
        .iter()
        .map(|(name, template)| {
            Migration::unapplied(name, template).map_err(|e| Error::Migration(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ours
        .iter()
        .filter(|m| !applied.contains(&i64::from(m.version())))
        .map(|m| format!("V{}__{}", m.version(), m.name()))
        .collect())
}

/// A migration with its tables named. Unqualified: it runs on a connection
/// to the URL's database, and its checksum must not change with that name.
fn render(template: &str, prefix: &str) -> String {
    template
        .replace("{jobs}", &format!("{prefix}jobs"))
        .replace("{history}", &format!("{prefix}history"))
        .replace("{queues}", &format!("{prefix}queues"))
        .replace("{groups}", &format!("{prefix}groups"))
        .replace("{group_members}", &format!("{prefix}group_members"))
        .replace("{schedules}", &format!("{prefix}schedules"))
        .replace("{workers}", &format!("{prefix}workers"))
        .replace("{pending}", &format!("{prefix}pending"))
        .replace("{dependencies}", &format!("{prefix}dependencies"))
        .replace("{workflows}", &format!("{prefix}workflows"))
        .replace("{workflow_steps}", &format!("{prefix}workflow_steps"))
        .replace("{releases}", &format!("{prefix}releases"))
        .replace("{batches}", &format!("{prefix}batches"))
        .replace("{batch_jobs}", &format!("{prefix}batch_jobs"))
        .replace("{finished_counts}", &format!("{prefix}finished_counts"))
        .replace("{sequences}", &format!("{prefix}sequences"))
        .replace("{sequence_jobs}", &format!("{prefix}sequence_jobs"))
}

/// The server lock's name for one queue's tables. Names are at most 64
/// characters: a long database name is hashed (FNV-1a, stable across builds,
/// so every node computes the same name).
fn lock_name(qualified_jobs_table: &str) -> String {
    let name = format!("backlog migrate {qualified_jobs_table}");
    if name.chars().count() <= 64 {
        return name;
    }
    let hash = qualified_jobs_table
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("backlog migrate {hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_lock_names_fit_the_server_limit() {
        assert_eq!(
            lock_name("`test`.`backlog_jobs`"),
            "backlog migrate `test`.`backlog_jobs`"
        );
        let long = format!("`{}`.`backlog_jobs`", "d".repeat(64));
        let name = lock_name(&long);
        assert!(name.len() <= 64, "{name}");
        assert_eq!(name, lock_name(&long));
        assert_ne!(
            name,
            lock_name(&format!("`{}`.`backlog_jobs`", "e".repeat(64)))
        );
    }

    #[test]
    fn the_migration_names_every_table_under_the_prefix() {
        let sql = render(MIGRATIONS[0].1, "app1_");
        assert!(sql.contains("CREATE TABLE app1_jobs"));
        assert!(sql.contains("CREATE TABLE app1_history"));
        assert!(sql.contains("CREATE TABLE app1_queues"));
        assert!(render(MIGRATIONS[1].1, "app1_").contains("ON app1_jobs"));
        for (name, template) in MIGRATIONS {
            assert!(
                !render(template, "app1_").contains('{'),
                "{name}: a placeholder is left"
            );
        }
    }
}
