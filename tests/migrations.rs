//! backlog's migrations record themselves in `backlog_schema_history`, so an
//! application that runs refinery for its own schema in the same file keeps
//! `refinery_schema_history` to itself; a file whose backlog rows are in
//! refinery's table (written by an earlier backlog) is carried over.

use std::path::Path;

use backlog::sqlite::rusqlite::Connection;
use backlog::{JobState, NewJob, Queue};
use refinery::{Migration, Runner};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The application's own migrations, as it would embed them.
fn app_migrations(upto: usize) -> TestResult<Vec<Migration>> {
    let all = [
        (
            "V1__users",
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);",
        ),
        (
            "V2__orders",
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER);",
        ),
        (
            "V3__paid",
            "ALTER TABLE orders ADD COLUMN paid INTEGER NOT NULL DEFAULT 0;",
        ),
    ];
    Ok(all[..upto]
        .iter()
        .map(|(name, sql)| Migration::unapplied(name, sql))
        .collect::<Result<_, _>>()?)
}

/// Runs the application's migrations with refinery's defaults (its default
/// table, aborting on divergent or unknown rows).
fn migrate_app(path: &Path, upto: usize) -> TestResult {
    let mut conn = Connection::open(path)?;
    Runner::new(&app_migrations(upto)?).run(&mut conn)?;
    Ok(())
}

/// (version, name) of each row of a history table, by version.
fn history(path: &Path, table: &str) -> TestResult<Vec<(i64, String)>> {
    let conn = Connection::open(path)?;
    let mut stmt = conn.prepare(&format!(
        "SELECT version, name FROM {table} ORDER BY version"
    ))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

fn table_exists(path: &Path, table: &str) -> TestResult<bool> {
    let n: i64 = Connection::open(path)?.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

fn backlog_rows() -> Vec<(i64, String)> {
    vec![
        (1, "initial".to_owned()),
        (2, "due".to_owned()),
        (3, "progress".to_owned()),
        (4, "groups".to_owned()),
        (5, "limits".to_owned()),
        (6, "schedules".to_owned()),
        (7, "workers".to_owned()),
        (8, "dependencies".to_owned()),
        (9, "batches".to_owned()),
        (10, "finished_counts".to_owned()),
        (11, "sequences".to_owned()),
        (12, "open_batches_sequence_keys".to_owned()),
        (13, "finished_batches".to_owned()),
        (14, "running_bound".to_owned()),
    ]
}

fn app_rows(upto: usize) -> Vec<(i64, String)> {
    [(1, "users"), (2, "orders"), (3, "paid")][..upto]
        .iter()
        .map(|(v, n)| (*v, (*n).to_owned()))
        .collect()
}

#[test]
fn a_fresh_queue_records_its_migrations_in_backlog_schema_history() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    Queue::open(&path)?;
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    assert!(!table_exists(&path, "refinery_schema_history")?);
    Ok(())
}

#[test]
fn the_applications_refinery_migrations_run_before_and_after_backlogs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");

    migrate_app(&path, 2)?;
    let queue = Queue::open(&path)?;
    let id = queue.enqueue(NewJob::new("k", json!({})))?.id;
    // A new version of the application adds a migration; refinery finds
    // only its own rows, so nothing diverges and nothing is missing.
    migrate_app(&path, 3)?;
    drop(queue);
    let queue = Queue::open(&path)?;

    assert_eq!(history(&path, "refinery_schema_history")?, app_rows(3));
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    assert_eq!(queue.get(id)?.state, JobState::Available);
    Connection::open(&path)?.execute("INSERT INTO orders (user_id, paid) VALUES (1, 1)", [])?;
    Ok(())
}

#[test]
fn backlog_first_then_the_applications_refinery_migrations() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");

    Queue::open(&path)?;
    migrate_app(&path, 3)?;
    Queue::open(&path)?;

    assert_eq!(history(&path, "refinery_schema_history")?, app_rows(3));
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    Ok(())
}

/// A file as an earlier backlog left it: its rows in refinery's table,
/// here next to an application's row (at a version backlog does not use,
/// or the two could never have shared the table).
fn legacy_file(path: &Path, with_app_row: bool) -> TestResult<i64> {
    let queue = Queue::open(path)?;
    let id = queue
        .enqueue(NewJob::new("k", json!({"before": "upgrade"})))?
        .id;
    drop(queue);
    let conn = Connection::open(path)?;
    conn.execute_batch("ALTER TABLE backlog_schema_history RENAME TO refinery_schema_history")?;
    if with_app_row {
        // A version backlog's own migrations will not reach soon.
        let app = Migration::unapplied("V100__audit", "CREATE TABLE audit (line TEXT);")?;
        conn.execute_batch("CREATE TABLE audit (line TEXT);")?;
        conn.execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES (100, 'audit', '2025-01-01T00:00:00Z', ?1)",
            [app.checksum().to_string()],
        )?;
    }
    Ok(id)
}

#[test]
fn backlogs_rows_in_refinery_schema_history_are_carried_over_and_the_apps_stay() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let id = legacy_file(&path, true)?;
    let applied_on: String = Connection::open(&path)?.query_row(
        "SELECT applied_on FROM refinery_schema_history WHERE version = 1",
        [],
        |r| r.get(0),
    )?;

    // V1 would fail on its existing tables if it ran again.
    let queue = Queue::open(&path)?;
    assert_eq!(
        queue.get(id)?.args::<serde_json::Value>()?,
        json!({"before": "upgrade"})
    );
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    assert_eq!(
        history(&path, "refinery_schema_history")?,
        [(100, "audit".to_owned())]
    );
    let carried: String = Connection::open(&path)?.query_row(
        "SELECT applied_on FROM backlog_schema_history WHERE version = 1",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(carried, applied_on, "the row moved, V1 did not run again");

    // The application's runner now finds only its own row.
    let mut conn = Connection::open(&path)?;
    Runner::new(&[Migration::unapplied(
        "V100__audit",
        "CREATE TABLE audit (line TEXT);",
    )?])
    .run(&mut conn)?;
    Queue::open(&path)?;
    Ok(())
}

#[test]
fn a_refinery_table_that_held_only_backlogs_rows_is_dropped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let id = legacy_file(&path, false)?;

    let queue = Queue::open(&path)?;
    assert_eq!(queue.get(id)?.state, JobState::Available);
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    assert!(!table_exists(&path, "refinery_schema_history")?);
    Ok(())
}

#[test]
fn an_applications_row_named_like_backlogs_but_with_another_checksum_stays() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let mut conn = Connection::open(&path)?;
    Runner::new(&[Migration::unapplied(
        "V1__initial",
        "CREATE TABLE app_things (x);",
    )?])
    .run(&mut conn)?;

    Queue::open(&path)?;
    assert_eq!(
        history(&path, "refinery_schema_history")?,
        [(1, "initial".to_owned())]
    );
    assert_eq!(history(&path, "backlog_schema_history")?, backlog_rows());
    Ok(())
}

/// V10 starts the finished counts from the history a file already holds:
/// per hour, so the totals and the week's chart include it.
#[test]
fn migrating_to_v10_counts_the_history_already_there() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    let queue = Queue::open(&path)?;
    for kind in ["a", "a", "b"] {
        queue.enqueue(NewJob::new(kind, json!({})))?;
    }
    for job in queue.lease(&backlog::LeaseRequest::new("w", 3))? {
        queue.complete(&job, None)?;
    }
    drop(queue);
    // Back to V9: no counts yet (nor V11's sequences, V12's index and
    // V13's, which come after).
    Connection::open(&path)?.execute_batch(
        "DROP TABLE backlog_finished_counts;
         DROP TABLE backlog_sequences;
         DROP INDEX backlog_batches_open;
         DROP INDEX backlog_batches_finished;
         DROP TABLE backlog_sequence_jobs;
         ALTER TABLE backlog_dependencies DROP COLUMN in_sequence;
         DELETE FROM backlog_schema_history WHERE version >= 10;",
    )?;
    let queue = Queue::open(&path)?;
    let totals: Vec<(String, u64)> = queue
        .finished_totals()?
        .into_iter()
        .map(|t| (t.kind, t.totals.completed))
        .collect();
    assert_eq!(totals, [("a".to_owned(), 2), ("b".to_owned(), 1)]);
    let week = queue.finished_buckets(backlog::finished::Window::Week)?;
    assert_eq!(week.iter().map(|b| b.count).sum::<u64>(), 3);
    // This hour (or the one before, should the clock have just turned).
    assert!(week.iter().all(|b| b.buckets_ago <= 1), "{week:?}");
    Ok(())
}
