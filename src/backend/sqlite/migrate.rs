//! The SQLite schema, applied with refinery from `migrations/sqlite/`.

use std::thread;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::error::{Error, Result};

mod embedded {
    refinery::embed_migrations!("migrations/sqlite");
}

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
        match embedded::migrations::runner().run(conn) {
            Ok(_) => return Ok(()),
            Err(_) if tries < MAX_TRIES && start.elapsed() < deadline => {
                thread::sleep(Duration::from_millis(rand::random_range(5..50)));
            }
            Err(e) => return Err(Error::Migration(e.to_string())),
        }
    }
}
