//! The ceiling on MySQL/MariaDB: the minimal SQL per job on backlog's
//! tables, through the `mysql` crate directly. The same statements, in the
//! same order, as `server_pg.rs`; each difference is commented.
//!
//! Every connection runs READ COMMITTED, as backlog's do.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder, Params, Statement, TxOpts, Value};

use crate::db::{now_micros, payload, BoxResult};
use crate::server_db::{Counts, Driver, Raw, Target};

/// One job, its times all "now". Differs from PostgreSQL in that `errors`
/// has no default on MySQL (none is allowed on a JSON column before 8.0.13).
const INSERT: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, errors, available_at, created_at, updated_at)
VALUES ('default', 'noop', ?, '[]', ?, ?, ?)";

/// Many jobs in one statement. Differs from PostgreSQL in that the rows are
/// spelled out (no arrays): the statement for `n` rows is made once.
fn insert_batch(rows: usize) -> String {
    let row = "('default', 'noop', ?, '[]', ?, ?, ?)";
    format!(
        "INSERT INTO backlog_jobs (queue, kind, payload, errors, available_at, created_at, \
         updated_at) VALUES {}",
        vec![row; rows].join(", ")
    )
}

/// The claim: a walk of the lease index in claim order that stops after `?`
/// rows. Differs from PostgreSQL in that there is no partial index:
/// `lease_queue` is the queue of an unleased job and NULL otherwise; that
/// the index is forced, as backlog's lease forces it (a scan would lock what
/// it reads); and that there is no `RETURNING`, so the move to history is
/// two more statements on the ids this one locked ([`to_history`],
/// [`delete`]), in the same transaction.
const CLAIM: &str = "
SELECT id, kind, payload FROM backlog_jobs FORCE INDEX (jobs_lease)
WHERE lease_queue = 'default' AND available_at <= ?
ORDER BY priority DESC, available_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED";

fn to_history(ids: &str, now: i64) -> String {
    format!(
        "INSERT INTO backlog_history
            (id, queue, kind, priority, unique_key, payload, attempts, max_attempts,
             available_at, errors, cancel_requested, created_at, updated_at, status,
             processed_by, started_at, finished_at)
         SELECT id, queue, kind, priority, unique_key, payload, attempts + 1, max_attempts,
                available_at, errors, cancel_requested, created_at, {now}, 'completed', 'raw',
                {now}, {now}
         FROM backlog_jobs WHERE id IN ({ids})"
    )
}

fn delete(ids: &str) -> String {
    format!("DELETE FROM backlog_jobs WHERE id IN ({ids})")
}

/// The lease: [`CLAIM`], then the update, in one transaction (backlog's
/// MySQL lease is the same three steps: lock, update, read).
fn lease_update(ids: &str, now: i64, token: i64) -> String {
    format!(
        "UPDATE backlog_jobs
         SET attempts = attempts + 1, lease_token = {token}, lease_until = {now} + 30000000,
             locked_by = 'raw'
         WHERE id IN ({ids})"
    )
}

fn release(ids: &str) -> String {
    format!(
        "UPDATE backlog_jobs
         SET attempts = attempts - 1, lease_token = NULL, lease_until = NULL, locked_by = NULL
         WHERE id IN ({ids})"
    )
}

/// Differs from PostgreSQL in that there is no `generate_series`: a cross
/// join of four digit tables numbers 10,000 rows per statement.
const PREFILL: &str = "
INSERT INTO backlog_jobs (queue, kind, payload, errors, available_at, created_at, updated_at)
SELECT 'default', 'noop', CONCAT('{\"n\":', n, '}'), '[]', ? + n, ? + n, ? + n
FROM (SELECT ? + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n
      FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
            UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
            UNION ALL SELECT 8 UNION ALL SELECT 9) AS a,
           (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
            UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
            UNION ALL SELECT 8 UNION ALL SELECT 9) AS b,
           (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
            UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
            UNION ALL SELECT 8 UNION ALL SELECT 9) AS c,
           (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
            UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
            UNION ALL SELECT 8 UNION ALL SELECT 9) AS e) AS s
WHERE n < ?
ORDER BY n";

/// Differs from PostgreSQL in that `SUM` and `COUNT` come back as DECIMAL
/// and BIGINT: cast to one type.
const COUNT_COMPLETED: &str = "
SELECT CAST(count(*) AS SIGNED), CAST(count(DISTINCT id) AS SIGNED),
       CAST(COALESCE(SUM(attempts <> 1), 0) AS SIGNED)
FROM backlog_history WHERE status = 'completed'";

const COUNT_OTHER: &str =
    "SELECT CAST(count(*) AS SIGNED) FROM backlog_history WHERE status <> 'completed'";

const COUNT_LIVE: &str =
    "SELECT CAST(count(*) AS SIGNED), CAST(count(lease_token) AS SIGNED) FROM backlog_jobs";

fn admin(url: &str) -> BoxResult<Conn> {
    Ok(Conn::new(Opts::from_url(url)?)?)
}

/// Namespaces are databases.
pub struct MyDriver;

impl Driver for MyDriver {
    fn create(&self, url: &str, name: &str) -> BoxResult<()> {
        admin(url)?.query_drop(format!("CREATE DATABASE {name}"))?;
        Ok(())
    }

    fn drop_namespace(&self, url: &str, name: &str) -> BoxResult<()> {
        admin(url)?.query_drop(format!("DROP DATABASE IF EXISTS {name}"))?;
        Ok(())
    }

    fn settings(&self, url: &str) -> BoxResult<Vec<(String, String)>> {
        settings(url)
    }

    fn open(&self, target: &Target) -> BoxResult<Box<dyn Raw>> {
        Ok(Box::new(My::open(&target.url)?))
    }
}

fn settings(url: &str) -> BoxResult<Vec<(String, String)>> {
    let mut conn = admin(url)?;
    let mut out = Vec::new();
    for (name, expr) in [
        ("version", "VERSION()"),
        (
            "innodb_flush_log_at_trx_commit",
            "@@innodb_flush_log_at_trx_commit",
        ),
        ("innodb_flush_method", "@@innodb_flush_method"),
        ("innodb_buffer_pool_size", "@@innodb_buffer_pool_size"),
        ("innodb_doublewrite", "@@innodb_doublewrite"),
        ("log_bin", "@@log_bin"),
        ("max_connections", "@@max_connections"),
    ] {
        let value: Option<String> = conn.query_first(format!("SELECT CAST({expr} AS CHAR)"))?;
        out.push((name.to_owned(), value.unwrap_or_default()));
    }
    Ok(out)
}

fn id_list(ids: &[i64]) -> String {
    let list: Vec<String> = ids.iter().map(i64::to_string).collect();
    list.join(",")
}

/// One raw connection to the namespace's database.
pub struct My {
    conn: Conn,
    insert: Statement,
    insert_batch: HashMap<usize, Statement>,
    claim: Statement,
    retries: u64,
}

impl My {
    pub fn open(url: &str) -> BoxResult<My> {
        let mut conn = Conn::new(OptsBuilder::from_opts(Opts::from_url(url)?))?;
        conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
        Ok(My {
            insert: conn.prep(INSERT)?,
            claim: conn.prep(CLAIM)?,
            insert_batch: HashMap::new(),
            retries: 0,
            conn,
        })
    }

    /// Claims up to `batch` rows in a transaction and runs `then` on their
    /// ids before committing. Differs from PostgreSQL in that claims on
    /// several connections deadlock now and then (InnoDB locks the lease
    /// index entry and the row in turn): the transaction is run again, as
    /// backlog does.
    fn claim_then(
        &mut self,
        batch: usize,
        then: impl Fn(&str, i64) -> Vec<String>,
    ) -> BoxResult<Vec<(i64, String)>> {
        loop {
            match self.try_claim_then(batch, &then) {
                Err(mysql::Error::MySqlError(e)) if e.code == 1213 || e.code == 1205 => {
                    self.retries += 1;
                }
                result => return Ok(result?),
            }
        }
    }

    fn try_claim_then(
        &mut self,
        batch: usize,
        then: &impl Fn(&str, i64) -> Vec<String>,
    ) -> mysql::Result<Vec<(i64, String)>> {
        let mut tx = self.conn.start_transaction(TxOpts::default())?;
        let now = now_micros();
        let rows: Vec<(i64, Vec<u8>, String)> = tx.exec(&self.claim, (now, batch as u64))?;
        let jobs: Vec<(i64, String)> = rows.into_iter().map(|(id, _kind, p)| (id, p)).collect();
        if !jobs.is_empty() {
            let ids: Vec<i64> = jobs.iter().map(|j| j.0).collect();
            for sql in then(&id_list(&ids), now) {
                tx.query_drop(sql)?;
            }
        }
        tx.commit()?;
        Ok(jobs)
    }
}

impl Raw for My {
    fn insert(&mut self, first: usize, count: usize, batch: usize) -> BoxResult<Duration> {
        let start = Instant::now();
        let end = first + count;
        let mut n = first;
        while n < end {
            let upto = (n + batch).min(end);
            let now = now_micros();
            if batch == 1 {
                self.conn
                    .exec_drop(&self.insert, (payload(n), now, now, now))?;
            } else {
                let rows = upto - n;
                if !self.insert_batch.contains_key(&rows) {
                    let stmt = self.conn.prep(insert_batch(rows))?;
                    self.insert_batch.insert(rows, stmt);
                }
                let mut values = Vec::with_capacity(rows * 4);
                for i in n..upto {
                    values.push(Value::from(payload(i)));
                    values.extend([Value::from(now), Value::from(now), Value::from(now)]);
                }
                let mut tx = self.conn.start_transaction(TxOpts::default())?;
                tx.exec_drop(&self.insert_batch[&rows], Params::Positional(values))?;
                tx.commit()?;
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
            let mut tx = self.conn.start_transaction(TxOpts::default())?;
            let now = now_micros();
            for i in n..upto {
                tx.exec_drop(&self.insert, (payload(i), now, now, now))?;
            }
            tx.commit()?;
            n = upto;
        }
        Ok(start.elapsed())
    }

    fn claim_and_finish(&mut self, batch: usize) -> BoxResult<Vec<(i64, String)>> {
        self.claim_then(batch, |ids, now| vec![to_history(ids, now), delete(ids)])
    }

    fn lease(&mut self, batch: usize) -> BoxResult<Vec<i64>> {
        let token = (rand::random::<u64>() >> 1) as i64;
        let jobs = self.claim_then(batch, |ids, now| vec![lease_update(ids, now, token)])?;
        Ok(jobs.into_iter().map(|j| j.0).collect())
    }

    fn release(&mut self, ids: &[i64]) -> BoxResult<()> {
        if !ids.is_empty() {
            self.conn.query_drop(release(&id_list(ids)))?;
        }
        Ok(())
    }

    /// Differs from PostgreSQL in that nothing is notified: MySQL has no
    /// LISTEN/NOTIFY, its consumers poll.
    fn produce(&mut self, payload: &str) -> BoxResult<()> {
        let now = now_micros();
        self.conn
            .exec_drop(&self.insert, (payload, now, now, now))?;
        Ok(())
    }

    fn listen(&mut self) -> BoxResult<()> {
        Ok(())
    }

    fn retries(&self) -> u64 {
        self.retries
    }

    fn wait(&mut self, timeout: Duration) -> BoxResult<()> {
        thread::sleep(timeout);
        Ok(())
    }

    fn prefill(&mut self, count: usize) -> BoxResult<()> {
        let base = now_micros() - 3_600_000_000;
        let stmt = self.conn.prep(PREFILL)?;
        let mut n = 0;
        while n < count {
            let upto = (n + 10_000).min(count);
            self.conn
                .exec_drop(&stmt, (base, base, base, n as u64, upto as u64))?;
            n = upto;
        }
        Ok(())
    }

    fn analyze(&mut self) -> BoxResult<()> {
        self.conn
            .query_drop("ANALYZE TABLE backlog_jobs, backlog_history")?;
        Ok(())
    }

    fn counts(&mut self) -> BoxResult<Counts> {
        let (completed, distinct, reclaimed): (i64, i64, i64) =
            self.conn.query_first(COUNT_COMPLETED)?.ok_or("no row")?;
        let other: i64 = self.conn.query_first(COUNT_OTHER)?.ok_or("no row")?;
        let (live, leased): (i64, i64) = self.conn.query_first(COUNT_LIVE)?.ok_or("no row")?;
        Ok(Counts {
            completed,
            distinct,
            reclaimed,
            other,
            live,
            leased,
        })
    }
}
