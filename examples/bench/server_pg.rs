//! The ceiling on PostgreSQL: the minimal SQL per job on backlog's tables,
//! through the `postgres` crate directly. The same statements, in the same
//! order, as `server_mysql.rs`; differences are commented there.
//!
//! Times are bound from this process's clock (backlog reads the server's
//! instead, in the statement): the least work a statement can do.

use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls, Statement};

use crate::db::{now_micros, payload, BoxResult};
use crate::server_db::{Counts, Driver, Raw, Target};

/// One job, its times all "now".
const INSERT: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, available_at, created_at, updated_at)
VALUES ('default', 'noop', $1::text::jsonb, $2, $2, $2)";

/// Many jobs in one statement: one round trip per batch, as backlog's
/// `enqueue_many` does on PostgreSQL.
const INSERT_BATCH: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, available_at, created_at, updated_at)
SELECT 'default', 'noop', p::jsonb, $2, $2, $2 FROM unnest($1::text[]) AS p";

/// Claims up to `$2` jobs in claim order (a walk of the partial lease index
/// that stops after `$2` rows), skipping rows another transaction holds,
/// and moves them to history: one statement, one commit. `MATERIALIZED`
/// for the same reason as backlog's lease: a `LIMIT` sub-select may be run
/// more than once.
const CLAIM_AND_FINISH: &str = "
WITH picked AS MATERIALIZED (
    SELECT id FROM backlog_jobs
    WHERE queue = 'default' AND lease_token IS NULL AND available_at <= $1
    ORDER BY priority DESC, available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
moved AS (
    DELETE FROM backlog_jobs WHERE id IN (SELECT id FROM picked) RETURNING *)
INSERT INTO backlog_history
    (id, queue, kind, priority, unique_key, payload, attempts, max_attempts, available_at,
     errors, cancel_requested, created_at, updated_at, status, processed_by, started_at,
     finished_at)
SELECT id, queue, kind, priority, unique_key, payload, attempts + 1, max_attempts,
       available_at, errors, cancel_requested, created_at, $1, 'completed', 'raw', $1, $1
FROM moved
RETURNING id, payload::text";

/// backlog's lease minus the paused-queue and kind filters: one statement.
const LEASE: &str = "
WITH picked AS MATERIALIZED (
    SELECT id FROM backlog_jobs
    WHERE queue = 'default' AND lease_token IS NULL AND available_at <= $1
    ORDER BY priority DESC, available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE backlog_jobs
SET attempts = attempts + 1, lease_token = $3, lease_until = $1 + 30000000, locked_by = 'raw'
WHERE id IN (SELECT id FROM picked)
RETURNING id, kind, payload::text";

const RELEASE: &str = "
UPDATE backlog_jobs
SET attempts = attempts - 1, lease_token = NULL, lease_until = NULL, locked_by = NULL
WHERE id = ANY($1)";

/// [`INSERT`] and its wake-up on channel `bench_raw` ([`LISTEN`]) in one
/// statement: one round trip, one commit; the notification is delivered
/// when it commits.
const PRODUCE: &str = "
WITH job AS (
    INSERT INTO backlog_jobs (queue, kind, payload, available_at, created_at, updated_at)
    VALUES ('default', 'noop', $1::text::jsonb, $2, $2, $2)
    RETURNING id)
SELECT pg_notify('bench_raw', '') FROM job";

const LISTEN: &str = "LISTEN bench_raw";

const PREFILL: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, available_at, created_at, updated_at)
SELECT 'default', 'noop', jsonb_build_object('n', n), $1 + n, $1 + n, $1 + n
FROM generate_series($2::int8, $3::int8) AS n";

const COUNT_COMPLETED: &str = "
SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempts <> 1)
FROM backlog_history WHERE status = 'completed'";

const COUNT_OTHER: &str = "SELECT count(*) FROM backlog_history WHERE status <> 'completed'";

const COUNT_LIVE: &str = "SELECT count(*), count(lease_token) FROM backlog_jobs";

/// Namespaces are schemas.
pub struct PgDriver;

impl Driver for PgDriver {
    fn create(&self, url: &str, name: &str) -> BoxResult<()> {
        Client::connect(url, NoTls)?.batch_execute(&format!("CREATE SCHEMA {name}"))?;
        Ok(())
    }

    fn drop_namespace(&self, url: &str, name: &str) -> BoxResult<()> {
        Client::connect(url, NoTls)?
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))?;
        Ok(())
    }

    fn settings(&self, url: &str) -> BoxResult<Vec<(String, String)>> {
        settings(url)
    }

    fn open(&self, target: &Target) -> BoxResult<Box<dyn Raw>> {
        let schema = target.schema.as_deref().ok_or("a schema")?;
        Ok(Box::new(Pg::open(&target.url, schema)?))
    }
}

fn settings(url: &str) -> BoxResult<Vec<(String, String)>> {
    let mut client = Client::connect(url, NoTls)?;
    let mut out = vec![(
        "version".to_owned(),
        client
            .query_one("SHOW server_version", &[])?
            .get::<_, String>(0),
    )];
    for name in [
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
        "shared_buffers",
        "autovacuum",
        "max_connections",
    ] {
        let value: String = client.query_one(&format!("SHOW {name}"), &[])?.get(0);
        out.push((name.to_owned(), value));
    }
    Ok(out)
}

/// One raw connection whose `search_path` is the namespace's schema.
pub struct Pg {
    client: Client,
    insert: Statement,
    insert_batch: Statement,
    claim_and_finish: Statement,
    lease: Statement,
    release: Statement,
    produce: Statement,
}

impl Pg {
    pub fn open(url: &str, schema: &str) -> BoxResult<Pg> {
        let mut client = Client::connect(url, NoTls)?;
        client.batch_execute(&format!("SET search_path TO {schema}"))?;
        Ok(Pg {
            insert: client.prepare(INSERT)?,
            insert_batch: client.prepare(INSERT_BATCH)?,
            claim_and_finish: client.prepare(CLAIM_AND_FINISH)?,
            lease: client.prepare(LEASE)?,
            release: client.prepare(RELEASE)?,
            produce: client.prepare(PRODUCE)?,
            client,
        })
    }
}

impl Raw for Pg {
    fn insert(&mut self, first: usize, count: usize, batch: usize) -> BoxResult<Duration> {
        let start = Instant::now();
        let end = first + count;
        let mut n = first;
        while n < end {
            let upto = (n + batch).min(end);
            if batch == 1 {
                self.client
                    .execute(&self.insert, &[&payload(n), &now_micros()])?;
            } else {
                let payloads: Vec<String> = (n..upto).map(payload).collect();
                self.client
                    .execute(&self.insert_batch, &[&payloads, &now_micros()])?;
            }
            n = upto;
        }
        Ok(start.elapsed())
    }

    fn insert_rows(&mut self, first: usize, count: usize, batch: usize) -> BoxResult<Duration> {
        let start = Instant::now();
        let end = first + count;
        let mut n = first;
        while n < end {
            let upto = (n + batch).min(end);
            let mut tx = self.client.transaction()?;
            let now = now_micros();
            for i in n..upto {
                tx.execute(&self.insert, &[&payload(i), &now])?;
            }
            tx.commit()?;
            n = upto;
        }
        Ok(start.elapsed())
    }

    fn claim_and_finish(&mut self, batch: usize) -> BoxResult<Vec<(i64, String)>> {
        let rows = self
            .client
            .query(&self.claim_and_finish, &[&now_micros(), &(batch as i64)])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn lease(&mut self, batch: usize) -> BoxResult<Vec<i64>> {
        let token = (rand::random::<u64>() >> 1) as i64;
        let rows = self
            .client
            .query(&self.lease, &[&now_micros(), &(batch as i64), &token])?;
        Ok(rows
            .iter()
            .map(|r| {
                // What a handler needs: fetch it as one would.
                let _kind: &str = r.get(1);
                let _payload: &str = r.get(2);
                r.get(0)
            })
            .collect())
    }

    fn release(&mut self, ids: &[i64]) -> BoxResult<()> {
        self.client.execute(&self.release, &[&ids])?;
        Ok(())
    }

    fn produce(&mut self, payload: &str) -> BoxResult<()> {
        self.client
            .execute(&self.produce, &[&payload, &now_micros()])?;
        Ok(())
    }

    fn listen(&mut self) -> BoxResult<()> {
        self.client.batch_execute(LISTEN)?;
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> BoxResult<()> {
        let mut notifications = self.client.notifications();
        if notifications.timeout_iter(timeout).next()?.is_some() {
            // Several commits may have notified: one claim loop serves them all.
            while notifications.iter().next()?.is_some() {}
        }
        Ok(())
    }

    fn prefill(&mut self, count: usize) -> BoxResult<()> {
        // Due an hour ago, in id order.
        let base = now_micros() - 3_600_000_000;
        let mut n = 0;
        while n < count {
            let upto = (n + 100_000).min(count);
            self.client
                .execute(PREFILL, &[&base, &(n as i64), &(upto as i64 - 1)])?;
            n = upto;
        }
        Ok(())
    }

    fn analyze(&mut self) -> BoxResult<()> {
        // One statement per call: VACUUM cannot run in the implicit
        // transaction of a multi-statement string.
        self.client.batch_execute("VACUUM ANALYZE backlog_jobs")?;
        self.client
            .batch_execute("VACUUM ANALYZE backlog_history")?;
        Ok(())
    }

    fn counts(&mut self) -> BoxResult<Counts> {
        let done = self.client.query_one(COUNT_COMPLETED, &[])?;
        let other = self.client.query_one(COUNT_OTHER, &[])?;
        let live = self.client.query_one(COUNT_LIVE, &[])?;
        Ok(Counts {
            completed: done.get(0),
            distinct: done.get(1),
            reclaimed: done.get(2),
            other: other.get(0),
            live: live.get(0),
            leased: live.get(1),
        })
    }
}
