//! SQLite's diagnostics (`backlog::sqlite::QueueExt::wal_size` and
//! `longest_maintenance_hold`) answer on SQLite, and a queue on a server
//! answers them with a typed `InvalidArgument`, never a silent zero.

use backlog::sqlite::QueueExt;
use backlog::{Error, NewJob};
use serde_json::json;

use crate::harness::{Backend, TestResult};

fn sqlite_diagnostics_answer_on_sqlite_and_invalid_argument_on_a_server(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let q = &h.queue;
    q.enqueue(NewJob::new("k", json!(1)))?;
    let answers = [
        ("wal_size", q.wal_size().map(|_| ())),
        (
            "longest_maintenance_hold",
            q.longest_maintenance_hold().map(|_| ()),
        ),
        ("synchronous", q.synchronous().map(|_| ())),
    ];
    for (call, answer) in answers {
        match (b, answer) {
            (Backend::Sqlite, Ok(())) => {}
            (Backend::Postgres | Backend::Mysql, Err(Error::InvalidArgument(_))) => {}
            (_, other) => return Err(format!("{call} on {b:?} answered {other:?}").into()),
        }
    }
    if *b == Backend::Sqlite {
        // The WAL holds the enqueue's commit until a checkpoint copies it
        // back; either way the answer is the file's size.
        let mut wal = q.path().ok_or("no path")?.as_os_str().to_owned();
        wal.push("-wal");
        let on_disk = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert_eq!(q.wal_size()?, on_disk);
    }
    Ok(())
}

conformance!(sqlite_diagnostics_answer_on_sqlite_and_invalid_argument_on_a_server);
