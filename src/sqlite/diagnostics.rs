//! SQLite-only diagnostics: the size of a queue's write-ahead log, how long
//! the engine's maintenance held its write gate, how its checkpoints ended,
//! and a look at a file that does not open or change it
//! ([`probe_sqlite_file`]).
//!
//! A queue on a server has none of these: the [`QueueExt`](super::QueueExt)
//! calls answer [`Error::InvalidArgument`] for it, as the other SQLite-only
//! calls do, and the metrics leave the SQLite series out.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::queue::Queue;

use super::connections;

/// See [`QueueExt::wal_size`](super::QueueExt::wal_size).
pub(super) fn wal_size(queue: &Queue) -> Result<u64> {
    connections(queue)?;
    let path = queue
        .path()
        .ok_or_else(|| Error::InvalidArgument("this queue has no database file".into()))?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    Ok(std::fs::metadata(wal).map_or(0, |m| m.len()))
}

/// See [`QueueExt::longest_maintenance_hold`](super::QueueExt::longest_maintenance_hold).
pub(super) fn longest_maintenance_hold(queue: &Queue) -> Result<Duration> {
    Ok(connections(queue)?.longest_maintenance_hold())
}

/// How this queue's WAL checkpoints ended so far, as `(complete, partial,
/// failed)`; `None` on a server (the metrics leave the series out).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn checkpoint_counts(queue: &Queue) -> Option<(u64, u64, u64)> {
    let s = &connections(queue).ok()?.checkpoint_stats;
    Some((
        s.complete.load(Relaxed),
        s.partial.load(Relaxed),
        s.failed.load(Relaxed),
    ))
}

/// What a file is, as [`probe_sqlite_file`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqliteFile {
    /// Nothing at the path.
    Missing,
    /// A file of zero bytes (SQLite would make it a new database).
    Empty,
    /// A file that is not a SQLite database, or not a regular file at all
    /// (a FIFO, socket, device or folder: never opened, as reading a FIFO
    /// would wait for a writer).
    NotSqlite,
    /// A SQLite database without backlog's tables: another application's.
    OtherDatabase,
    /// A SQLite database with backlog's tables.
    Backlog,
    /// A file that does not open with the key given to
    /// [`probe_sqlite_file_with_key`]: the key is wrong, or the file is not
    /// encrypted with one (or not SQLite at all).
    WrongKey,
}

/// Looks at the file at `path` without creating or changing anything, for
/// tools that must not harm a file they were pointed at: opening a queue
/// creates a missing file and switches a database to WAL mode, which must
/// not happen to another application's database.
pub fn probe_sqlite_file(path: &std::path::Path) -> Result<SqliteFile> {
    probe(path, None)
}

/// [`probe_sqlite_file`] for a file encrypted with SQLCipher (the
/// `sqlcipher` feature; [`QueueOptions::sqlite_key`](crate::QueueOptions::sqlite_key)):
/// read-only through `key`, creating and changing nothing. An encrypted
/// file has no readable header, so one that does not open with `key` is
/// [`SqliteFile::WrongKey`]. In a build without SQLCipher the key is
/// ignored, as plain SQLite ignores it: a plain file probes as it is, and
/// opening it with the key is then refused.
pub fn probe_sqlite_file_with_key(path: &std::path::Path, key: &str) -> Result<SqliteFile> {
    probe(path, Some(key))
}

fn probe(path: &std::path::Path, key: Option<&str>) -> Result<SqliteFile> {
    use std::io::Read;
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => return Ok(SqliteFile::NotSqlite),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SqliteFile::Missing),
        _ => {}
    }
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SqliteFile::Missing),
        Err(e) => return Err(Error::Database(Box::new(e))),
    };
    let mut header = [0u8; 16];
    let mut read = 0;
    while read < header.len() {
        match file.read(&mut header[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) => return Err(Error::Database(Box::new(e))),
        }
    }
    if read == 0 {
        return Ok(SqliteFile::Empty);
    }
    // Every SQLite database starts with this, unless encrypted: its first
    // page is then ciphertext, read through the key or not at all.
    if key.is_none() && &header != b"SQLite format 3\0" {
        return Ok(SqliteFile::NotSqlite);
    }
    Ok(
        match crate::backend::sqlite::inspect::probe_tables(path, key)? {
            None => SqliteFile::WrongKey,
            Some((3, _)) => SqliteFile::Backlog,
            Some(_) => SqliteFile::OtherDatabase,
        },
    )
}
