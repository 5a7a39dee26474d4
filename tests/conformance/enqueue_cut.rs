//! Enqueue across a broken connection: an enqueue whose answer the network
//! loses is never written twice, and an `Ok` is always a job that is there.
//! A connection the server closed while it sat idle in the pool is replaced
//! before anything is sent on it, so the enqueue still succeeds.
//!
//! Servers only: a SQLite queue has no network between the caller and its
//! database. The network is a TCP proxy in this process that can lose the
//! answer to one request, or close every connection at once; the test's
//! own handle goes straight to the server.

use std::thread;
use std::time::Duration;

use backlog::{NewJob, Queue, QueueOptions};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};
use crate::proxy::{Cut, Proxy};

/// The moment a retry could write twice: the server has the insert (and,
/// for a single job on MariaDB, has committed it: one autocommit
/// statement), and its answer never reaches the caller. Every `Ok` is a job
/// that exists once; an `Err` leaves at most one.
fn an_enqueue_whose_answer_is_lost_is_never_written_twice(b: &Backend) -> TestResult {
    let Some((h, proxy, queue)) = through_proxy(b)? else {
        return Ok(());
    };
    queue.enqueue(NewJob::new("warm_up", json!(null)))?;
    for (round, jobs) in [1, 5, 2, 1, 3].into_iter().enumerate() {
        // The kind is in the request's bytes: the proxy loses the answer to
        // the request that carries it.
        let kind = format!("lost_answer_{round}");
        proxy.lose_answer_to(&kind);
        let result = queue.enqueue_many((0..jobs).map(|n| NewJob::new(&kind, json!(n))));
        let rows = h.count(&format!(
            "SELECT count(*) FROM backlog_jobs WHERE kind = '{kind}'"
        ))?;
        println!("enqueue of {jobs} whose answer was lost ({b:?}): {result:?}; {rows} rows");
        match result {
            Ok(ids) => {
                assert_eq!(rows, jobs, "an acknowledged enqueue is there exactly once");
                for e in ids {
                    let found = h.count(&format!(
                        "SELECT count(*) FROM backlog_jobs WHERE id = {} AND kind = '{kind}'",
                        e.id
                    ))?;
                    assert_eq!(found, 1, "job {} was acknowledged", e.id);
                }
            }
            Err(e) => {
                // All or none: an enqueue_many is one transaction.
                assert!(
                    rows == 0 || rows == jobs,
                    "an enqueue of {jobs} with an unknown outcome left {rows} rows: {e}"
                );
            }
        }
        // The next enqueue works, on another connection.
        queue.enqueue(NewJob::new("after", json!(round)))?;
    }
    assert_eq!(
        h.count("SELECT count(*) FROM backlog_jobs WHERE kind = 'after'")?,
        5
    );
    Ok(())
}

/// A server restart (here: the proxy closing every connection) leaves the
/// pool full of closed connections; the next enqueues find them closed
/// before sending anything and take fresh ones: no error, and each job
/// once.
fn an_enqueue_after_the_server_closed_idle_connections_succeeds(b: &Backend) -> TestResult {
    let Some((h, proxy, queue)) = through_proxy(b)? else {
        return Ok(());
    };
    for round in 0..3 {
        fill_pool(&queue, 6)?;
        proxy.close_all();
        // The FINs reach the pool's sockets.
        thread::sleep(Duration::from_millis(50));
        for n in 0..8 {
            let e = queue.enqueue(NewJob::new("after_close", json!([round, n])))?;
            assert!(!e.existed);
        }
    }
    assert_eq!(
        h.count("SELECT count(*) FROM backlog_jobs WHERE kind = 'after_close'")?,
        24
    );
    Ok(())
}

/// A fresh database, a proxy to its server and a queue through the proxy;
/// `None` on SQLite, which has no network between a caller and its database.
pub fn through_proxy(b: &Backend) -> TestResult<Option<(Harness, Proxy, Queue)>> {
    if *b == Backend::Sqlite {
        println!("not applicable on SQLite: no network between a caller and its database");
        return Ok(None);
    }
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let proxy = Proxy::start(&h.server_addr()?, Cut::Drop)?;
    let queue = h.handle_through(&proxy.addr, QueueOptions::new())?;
    Ok(Some((h, proxy, queue)))
}

/// Leaves up to `n` idle connections in the queue's pool: `n` threads
/// enqueue at once, several times.
fn fill_pool(queue: &Queue, n: usize) -> TestResult {
    thread::scope(|s| {
        let threads: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    (0..5)
                        .try_for_each(|_| queue.enqueue(NewJob::new("fill", json!(null))).map(drop))
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().expect("an enqueueing thread panicked"))
    })?;
    Ok(())
}

conformance!(
    an_enqueue_whose_answer_is_lost_is_never_written_twice,
    an_enqueue_after_the_server_closed_idle_connections_succeeds,
);
