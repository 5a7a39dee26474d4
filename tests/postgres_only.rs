//! What only PostgreSQL has, tested against a real server: the server's
//! clock (nodes with skewed clocks), TLS and `sslmode`, LISTEN/NOTIFY,
//! connections dropped by the server, the lease plan, schemas and prefixes,
//! concurrent migrations, and passwords kept out of messages.
//!
//! Each test runs in a schema of its own, dropped at the end. Without
//! `BACKLOG_TEST_POSTGRES_URL` each prints `SKIPPED: ...` and passes.
#![cfg(feature = "postgres")]

use std::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backlog::postgres::postgres::fallible_iterator::FallibleIterator;
use backlog::postgres::postgres::{self, NoTls};
use backlog::postgres::QueueExt;
use backlog::{
    Clock, JobState, LeaseRequest, ManualClock, NewJob, Queue, QueueOptions, SystemClock, Worker,
};
use serde_json::json;

type TestResult<T = ()> = Result<T, Box<dyn Error>>;

const SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

/// A fresh schema (and application name, to find this test's connections)
/// on the test server, dropped when this is.
struct Server {
    url: String,
    schema: String,
}

impl Server {
    /// `None` (after saying so) when no server is configured.
    fn new() -> TestResult<Option<Server>> {
        let url = match std::env::var("BACKLOG_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                println!("SKIPPED: set BACKLOG_TEST_POSTGRES_URL");
                return Ok(None);
            }
        };
        let schema = format!("bt_{:016x}", rand_u64());
        Ok(Some(Server { url, schema }))
    }

    /// The test URL with these query parameters added; the application
    /// name is the schema, so the test's connections can be found.
    fn url_with(&self, params: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let mut url = format!("{}{sep}application_name={}", self.url, self.schema);
        if !params.is_empty() {
            url.push('&');
            url.push_str(params);
        }
        url
    }

    fn options(&self) -> QueueOptions {
        QueueOptions::new().schema(self.schema.clone())
    }

    /// A queue on a manual clock.
    fn manual_queue(&self) -> TestResult<(Queue, ManualClock)> {
        let clock = ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        let queue = self
            .options()
            .clock(clock.clone())
            .connect(&self.url_with(""))?;
        Ok((queue, clock))
    }

    /// A queue on `clock`.
    fn queue(&self, clock: impl Clock + 'static) -> TestResult<Queue> {
        Ok(self.options().clock(clock).connect(&self.url_with(""))?)
    }

    /// A connection of the test's own, outside the queue.
    fn client(&self) -> TestResult<postgres::Client> {
        Ok(postgres::Client::connect(&self.url, NoTls)?)
    }

    /// Closes every connection of this test's queues from the server's side.
    fn terminate_connections(&self) -> TestResult<u64> {
        let rows = self.client()?.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&self.schema],
        )?;
        Ok(rows.len() as u64)
    }

    /// The server's clock, unix µs.
    fn server_now(&self) -> TestResult<i64> {
        let row = self.client()?.query_one(
            "SELECT (extract(epoch from clock_timestamp()) * 1000000)::int8",
            &[],
        )?;
        Ok(row.try_get(0)?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// A host clock that is `offset_secs` off (not a manual clock: the server's
/// clock rules).
#[derive(Debug)]
struct SkewedClock {
    offset_secs: i64,
}

impl Clock for SkewedClock {
    fn now(&self) -> SystemTime {
        let by = Duration::from_secs(self.offset_secs.unsigned_abs());
        if self.offset_secs >= 0 {
            SystemClock.now() + by
        } else {
            SystemClock.now() - by
        }
    }
}

/// Waits until `done` holds, polling; false after `limit`.
fn wait_until(limit: Duration, mut done: impl FnMut() -> TestResult<bool>) -> TestResult<bool> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done()? {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

// ---- the server's clock ----------------------------------------------------

#[test]
fn a_node_whose_clock_is_minutes_ahead_leases_heartbeats_and_is_rescued_on_time() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let ahead = server.queue(SkewedClock { offset_secs: 300 })?;
    let normal = server.queue(SystemClock)?;
    let ttl = Duration::from_secs(2);

    // Enqueued by the fast node, due now by the server's clock: leasable at
    // once by both.
    let id = ahead.enqueue(NewJob::new("k", json!(1)))?.id;
    let record = normal.get(id)?;
    assert_eq!(record.state, JobState::Available);
    assert!((us(record.available_at) - server.server_now()?).abs() < 5_000_000);

    let jobs = ahead.lease(&LeaseRequest::new("ahead", 1).ttl(ttl))?;
    assert_eq!(jobs.len(), 1, "the fast node leases the job at once");
    let job = &jobs[0];
    let until = us(job.lease_until) - server.server_now()?;
    assert!(
        until > 0 && until <= 2_000_000,
        "lease expiry is server now + TTL, {until} µs away"
    );

    // Neither node rescues it early: not the normal one, not the fast one
    // (whose own clock says the lease expired minutes ago).
    assert_eq!(normal.rescue(10)?.rescued, 0);
    assert_eq!(ahead.rescue(10)?.rescued, 0);

    // Heartbeats keep it past its first TTL.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(800));
        let report = ahead.heartbeat(&[job.lease()], ttl)?;
        assert_eq!(report.extended, vec![job.lease()]);
        assert_eq!(normal.rescue(10)?.rescued, 0, "a held lease is not rescued");
    }

    // Once heartbeats stop, the normal node rescues it after the TTL.
    let rescued = wait_until(Duration::from_secs(5), || {
        Ok(normal.rescue(10)?.rescued == 1)
    })?;
    assert!(rescued, "rescued after the TTL");
    assert_eq!(normal.get(id)?.state, JobState::Available);
    assert!(ahead.complete(job, None).unwrap_err().is_lease_lost());
    Ok(())
}

#[test]
fn a_node_whose_clock_is_minutes_behind_never_runs_delayed_jobs_early() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let behind = server.queue(SkewedClock { offset_secs: -300 })?;
    let normal = server.queue(SystemClock)?;
    // A delay is an offset from the server's now, whoever enqueues it.
    normal.enqueue(NewJob::new("k", json!(1)).delay(Duration::from_secs(60)))?;
    behind.enqueue(NewJob::new("k", json!(2)).delay(Duration::from_secs(60)))?;
    assert!(behind.lease(&LeaseRequest::new("b", 10))?.is_empty());
    assert!(normal.lease(&LeaseRequest::new("n", 10))?.is_empty());

    let id = behind.enqueue(NewJob::new("k", json!(3)))?.id;
    let jobs = normal.lease(&LeaseRequest::new("n", 10))?;
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
    Ok(())
}

#[test]
fn a_heartbeat_does_not_wait_for_a_job_locked_by_its_transactional_completion() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    queue.enqueue_many([NewJob::new("k", json!(1)), NewJob::new("k", json!(2))])?;
    let jobs = queue.lease(&LeaseRequest::new("w", 2))?;
    let leases: Vec<_> = jobs.iter().map(|j| j.lease()).collect();
    let ttl = Duration::from_secs(60);

    queue.transaction(|tx| {
        // Locks job 0's row until this transaction ends.
        queue.complete_in(tx, &jobs[0], None)?;
        let (send, recv) = std::sync::mpsc::channel();
        let (other, leases) = (queue.clone(), leases.clone());
        std::thread::spawn(move || {
            let _ = send.send(other.heartbeat(&leases, ttl).map_err(|e| e.to_string()));
        });
        let report = recv
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| backlog::Error::InvalidArgument("the heartbeat waited".into()))?
            .map_err(backlog::Error::InvalidArgument)?;
        assert!(report.lost.is_empty(), "{report:?}");
        assert_eq!(report.extended.len(), 2, "{report:?}");
        Ok::<(), backlog::Error>(())
    })?;
    let report = queue.heartbeat(&leases, ttl)?;
    assert_eq!(report.lost, vec![leases[0]], "completed once committed");
    Ok(())
}

// ---- TLS ---------------------------------------------------------------------

/// Whether the queue's own connection is encrypted, as the server sees it.
fn connection_is_encrypted(queue: &Queue) -> TestResult<bool> {
    let ssl = queue.transaction(|tx| {
        tx.query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .and_then(|r| r.try_get::<_, bool>(0))
        .map_err(backlog::Error::from)
    })?;
    Ok(ssl)
}

#[test]
fn sslmode_require_encrypts_and_disable_does_not() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let tls = server
        .options()
        .connect(&server.url_with("sslmode=require"))?;
    assert!(connection_is_encrypted(&tls)?);
    tls.enqueue(NewJob::new("k", json!(1)))?;
    assert_eq!(tls.lease(&LeaseRequest::new("w", 1))?.len(), 1);

    let plain = server
        .options()
        .connect(&server.url_with("sslmode=disable"))?;
    assert!(!connection_is_encrypted(&plain)?);
    Ok(())
}

#[test]
fn verify_full_checks_the_certificate_and_the_host_name() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    if !std::path::Path::new(SNAKEOIL).exists() {
        println!("SKIPPED: no {SNAKEOIL}");
        return Ok(());
    }
    // The snakeoil certificate is self-signed for `localhost`.
    let localhost = server.url.replace("127.0.0.1", "localhost");
    let sep = if localhost.contains('?') { '&' } else { '?' };
    let trusted = format!("{localhost}{sep}sslmode=verify-full&sslrootcert={SNAKEOIL}");
    let queue = server.options().connect(&trusted)?;
    assert!(connection_is_encrypted(&queue)?);

    // verify-ca checks the chain only: any host name will do.
    let ca = server
        .options()
        .connect(&server.url_with(&format!("sslmode=verify-ca&sslrootcert={SNAKEOIL}")))?;
    assert!(connection_is_encrypted(&ca)?);

    // The certificate does not name 127.0.0.1.
    let wrong_host = server
        .options()
        .connect(&server.url_with(&format!("sslmode=verify-full&sslrootcert={SNAKEOIL}")));
    assert!(
        wrong_host.is_err(),
        "a certificate for another host is refused"
    );

    // `sslrootcert` replaces the system's roots (as libpq): with another
    // root, the snakeoil certificate is not trusted, even where the system
    // trusts it.
    let other_root = "/etc/ssl/certs/ISRG_Root_X1.pem";
    if !std::path::Path::new(other_root).exists() {
        println!("SKIPPED (the untrusted case): no {other_root}");
        return Ok(());
    }
    let untrusted = server.options().connect(&format!(
        "{localhost}{sep}sslmode=verify-full&sslrootcert={other_root}"
    ));
    assert!(untrusted.is_err(), "an untrusted certificate is refused");
    Ok(())
}

/// Whether a client's connection is encrypted, as the server sees it.
fn client_is_encrypted(client: &mut postgres::Client) -> TestResult<bool> {
    let row = client.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )?;
    Ok(row.try_get(0)?)
}

#[test]
fn the_applications_client_connects_with_the_queues_tls() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let url = server.url_with("sslmode=require");
    let queue = server.options().connect(&url)?;
    assert!(connection_is_encrypted(&queue)?);

    // The trap: `sslmode=require` with `NoTls` cannot connect at all.
    let no_tls = postgres::Client::connect(&url, NoTls);
    assert!(no_tls.is_err(), "NoTls cannot honour sslmode=require");

    // The same URL through backlog's settings: encrypted, and the
    // application's transaction enqueues.
    let mut client = backlog::postgres::connect(&url)?;
    assert!(client_is_encrypted(&mut client)?);
    let mut tx = client.transaction()?;
    let job = queue.enqueue_in(&mut tx, NewJob::new("k", json!(1)))?;
    tx.commit()?;
    assert_eq!(queue.get(job.id)?.state, JobState::Available);

    // For a pool of the application's own: the config and the connector.
    let (config, tls) = backlog::postgres::client_config(&url)?;
    let mut pooled = config.connect(tls)?;
    assert!(client_is_encrypted(&mut pooled)?);

    // `sslmode=disable` is honoured too.
    let mut plain = backlog::postgres::connect(&server.url_with("sslmode=disable"))?;
    assert!(!client_is_encrypted(&mut plain)?);

    // verify-full with the server's (snakeoil, `localhost`) certificate,
    // which rust-postgres alone cannot parse.
    if std::path::Path::new(SNAKEOIL).exists() {
        let localhost = server.url.replace("127.0.0.1", "localhost");
        let sep = if localhost.contains('?') { '&' } else { '?' };
        let trusted = format!("{localhost}{sep}sslmode=verify-full&sslrootcert={SNAKEOIL}");
        assert!(postgres::Client::connect(&trusted, NoTls).is_err());
        let mut verified = backlog::postgres::connect(&trusted)?;
        assert!(client_is_encrypted(&mut verified)?);
        let wrong_host = server.url_with(&format!("sslmode=verify-full&sslrootcert={SNAKEOIL}"));
        assert!(backlog::postgres::connect(&wrong_host).is_err());
    } else {
        println!("SKIPPED (verify-full): no {SNAKEOIL}");
    }

    // Bad settings are typed errors, without the password.
    let bad = backlog::postgres::connect("postgres://u:s3cret@127.0.0.1/db?sslmode=sometimes");
    match bad {
        Err(backlog::Error::InvalidArgument(why)) => assert!(!why.contains("s3cret"), "{why}"),
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    }
    // The application's connections are its own, not named `backlog`.
    let name: String = backlog::postgres::connect(&server.url)?
        .query_one("SHOW application_name", &[])?
        .try_get(0)?;
    assert_ne!(name, "backlog");
    Ok(())
}

// ---- passwords -----------------------------------------------------------------

#[test]
fn a_url_password_never_shows_in_errors_or_debug_output() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let secret = "s3cret-Pa55";
    // Nothing listens on port 1: the connection is refused.
    let refused = QueueOptions::new()
        .connect_timeout(Duration::from_secs(2))
        .connect(&format!("postgres://postgres:{secret}@127.0.0.1:1/test"));
    let e = refused.expect_err("nothing listens on port 1");
    assert!(!e.to_string().contains(secret), "{e}");
    assert!(!format!("{e:?}").contains(secret), "{e:?}");

    let bad = QueueOptions::new().connect(&format!(
        "postgres://postgres:{secret}@127.0.0.1/test?sslmode=bogus"
    ));
    let e = bad.expect_err("bad sslmode");
    assert!(!format!("{e} {e:?}").contains(secret), "{e:?}");

    // Trust authentication ignores the password: the queue opens.
    let with_password =
        server
            .url_with("")
            .replacen("://postgres@", &format!("://postgres:{secret}@"), 1);
    let queue = server.options().connect(&with_password)?;
    assert!(!format!("{queue:?}").contains(secret), "{queue:?}");
    Ok(())
}

// ---- errors --------------------------------------------------------------------

/// rust-postgres's own `Display` says only `db error`; the server's reason
/// is in its `DbError`, which only this backend has.
#[test]
fn a_server_error_says_its_severity_code_and_message() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (base, query) = server.url.split_once('?').unwrap_or((&server.url, ""));
    let (host, _) = base.rsplit_once('/').ok_or("no database in the URL")?;
    let missing = format!("{host}/backlog_no_such_db_{}?{query}", server.schema);
    let e = QueueOptions::new()
        .connect(&missing)
        .expect_err("the database does not exist");
    let shown = e.to_string();
    assert!(shown.contains("FATAL 3D000"), "{shown}");
    assert!(shown.contains("does not exist"), "{shown}");
    assert!(!shown.contains("db error"), "{shown}");
    Ok(())
}

// ---- LISTEN/NOTIFY -------------------------------------------------------------

/// Collects the notifications on the schema's channel for `wait`.
fn notifications(client: &mut postgres::Client, wait: Duration) -> TestResult<usize> {
    let mut n = 0;
    let mut all = client.notifications();
    let mut iter = all.timeout_iter(wait);
    while iter.next()?.is_some() {
        n += 1;
    }
    Ok(n)
}

#[test]
fn enqueue_in_notifies_listeners_only_when_its_transaction_commits() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    let mut listener = server.client()?;
    listener.batch_execute(&format!("LISTEN \"{}.backlog_jobs\"", server.schema))?;

    let mut app = server.client()?;
    let mut tx = app.transaction()?;
    queue.enqueue_in(&mut tx, NewJob::new("k", json!(1)))?;
    tx.rollback()?;
    assert_eq!(notifications(&mut listener, Duration::from_millis(300))?, 0);

    let mut tx = app.transaction()?;
    queue.enqueue_in(&mut tx, NewJob::new("k", json!(2)))?;
    assert_eq!(
        notifications(&mut listener, Duration::from_millis(200))?,
        0,
        "nothing before the commit"
    );
    tx.commit()?;
    assert!(notifications(&mut listener, Duration::from_secs(2))? >= 1);

    queue.enqueue(NewJob::new("k", json!(3)))?;
    assert!(notifications(&mut listener, Duration::from_secs(2))? >= 1);
    Ok(())
}

/// The notification rides in the inserting statement: one per committed
/// enqueue or batch, none for a unique key already held (nothing inserted).
#[test]
fn an_enqueue_notifies_once_and_a_held_unique_key_not_at_all() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    let mut listener = server.client()?;
    listener.batch_execute(&format!("LISTEN \"{}.backlog_jobs\"", server.schema))?;

    queue.enqueue(NewJob::new("k", json!(1)).unique_key("once"))?;
    assert_eq!(notifications(&mut listener, Duration::from_millis(500))?, 1);
    let again = queue.enqueue(NewJob::new("k", json!(2)).unique_key("once"))?;
    assert!(again.existed);
    assert_eq!(
        notifications(&mut listener, Duration::from_millis(300))?,
        0,
        "nothing was inserted"
    );
    queue.enqueue_many((0..50).map(|i| NewJob::new("k", json!(i))))?;
    assert_eq!(
        notifications(&mut listener, Duration::from_millis(500))?,
        1,
        "one per batch"
    );
    Ok(())
}

/// A worker with an hour-long idle poll, so only a wake-up can start a job.
fn sleepy_worker(queue: Queue, ran: Arc<AtomicUsize>) -> backlog::Result<Worker> {
    Worker::builder(queue)
        .poll_interval(Duration::from_secs(3600))
        .handle_raw("k", move |_, _| {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .start()
}

#[test]
fn a_worker_wakes_at_another_nodes_enqueue_through_notify() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let ran = Arc::new(AtomicUsize::new(0));
    let worker = sleepy_worker(server.queue(SystemClock)?, ran.clone())?;
    // Let the worker's first lease find nothing and go to sleep.
    std::thread::sleep(Duration::from_millis(300));
    let producer = server.queue(SystemClock)?;
    let start = Instant::now();
    producer.enqueue(NewJob::new("k", json!(1)))?;
    assert!(wait_until(Duration::from_secs(5), || Ok(ran
        .load(Ordering::SeqCst)
        == 1))?);
    let latency = start.elapsed();
    assert!(latency < Duration::from_secs(2), "woken after {latency:?}");
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

#[test]
fn queues_with_other_prefixes_or_schemas_neither_see_nor_wake_each_other() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let a = server.queue(SystemClock)?;
    let b = server
        .options()
        .table_prefix("other_")
        .connect(&server.url_with(""))?;
    let mut listener = server.client()?;
    listener.batch_execute(&format!("LISTEN \"{}.backlog_jobs\"", server.schema))?;

    b.enqueue(NewJob::new("k", json!("b")))?;
    assert_eq!(notifications(&mut listener, Duration::from_millis(300))?, 0);
    assert!(a.lease(&LeaseRequest::new("w", 10))?.is_empty());
    let id = a.enqueue(NewJob::new("k", json!("a")))?.id;
    assert_eq!(b.lease(&LeaseRequest::new("w", 10))?.len(), 1);
    assert_eq!(a.lease(&LeaseRequest::new("w", 10))?[0].id, id);

    let tables: i64 = server
        .client()?
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
            &[&server.schema],
        )?
        .try_get(0)?;
    // jobs, history, queues, groups, group members, schedules, workers,
    // pending, dependencies, workflows, workflow steps, batches, batch
    // members, finished counts, sequences, sequence keys and refinery's
    // history: 17 per prefix.
    assert_eq!(tables, 34);
    Ok(())
}

// ---- dropped connections ----------------------------------------------------------

#[test]
fn connections_killed_by_the_server_are_replaced_without_losing_a_job() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    let first = queue.enqueue(NewJob::new("k", json!(1)))?.id;
    let job = queue.lease(&LeaseRequest::new("w", 1))?.remove(0);
    assert!(server.terminate_connections()? >= 1);

    // Every kind of call finds its pooled connection dead and retries.
    let second = queue.enqueue(NewJob::new("k", json!(2)))?.id;
    server.terminate_connections()?;
    queue.complete(&job, None)?;
    server.terminate_connections()?;
    let leased = queue.lease(&LeaseRequest::new("w", 5))?;
    assert_eq!(
        leased.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![second]
    );
    server.terminate_connections()?;
    assert_eq!(
        queue.get(first)?.state,
        JobState::Finished(backlog::FinalStatus::Completed)
    );
    queue.complete(&leased[0], None)?;
    Ok(())
}

/// A plain enqueue is one autocommit statement, sent once; a connection
/// idle in the pool for over a millisecond is checked first. One the
/// server terminated (`pg_terminate_backend`, as a restart does) is found
/// dead by that check and replaced: the job is there exactly once, with no
/// error. Only PostgreSQL: on MariaDB the driver sees the server's close on
/// the socket without a round trip (`tests/conformance/enqueue_cut.rs`).
#[test]
fn a_plain_enqueue_on_a_connection_the_server_just_terminated_is_there_once() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    for round in 0..5 {
        queue.enqueue(NewJob::new("warm", json!(round)))?;
        assert!(server.terminate_connections()? >= 1);
        let kind = format!("terminated_{round}");
        let id = queue.enqueue(NewJob::new(&kind, json!(round)))?.id;
        let rows = server.client()?.query_one(
            &format!(
                "SELECT count(*), min(id) FROM {}.backlog_jobs WHERE kind = $1",
                server.schema
            ),
            &[&kind],
        )?;
        assert_eq!(rows.try_get::<_, i64>(0)?, 1, "round {round}");
        assert_eq!(
            rows.try_get::<_, Option<i64>>(1)?,
            Some(id),
            "round {round}"
        );
    }
    Ok(())
}

/// A batch of plain jobs is one autocommit statement too, sent once, on a
/// connection checked as the single enqueue's: after the server terminated
/// the pooled connections, every job of the batch is there exactly once, in
/// input order.
#[test]
fn a_plain_batch_on_a_connection_the_server_just_terminated_is_there_once() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    for round in 0..3 {
        queue.enqueue_many((0..3).map(|i| NewJob::new("warm", json!(i))))?;
        assert!(server.terminate_connections()? >= 1);
        let kind = format!("terminated_{round}");
        let ids = queue.enqueue_many((0..3).map(|i| NewJob::new(&kind, json!(i))))?;
        let rows = server.client()?.query(
            &format!(
                "SELECT id, payload::text FROM {}.backlog_jobs WHERE kind = $1 ORDER BY id",
                server.schema
            ),
            &[&kind],
        )?;
        let found: Vec<(i64, String)> = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<TestResult<_>>()?;
        let expected: Vec<(i64, String)> = ids
            .iter()
            .zip(0..)
            .map(|(e, i)| (e.id, i.to_string()))
            .collect();
        assert_eq!(found, expected, "round {round}");
    }
    Ok(())
}

/// A batch of plain jobs commits by itself, so the check that every job
/// went in is its statement's own, made before the commit: when the table
/// takes fewer rows than the batch has jobs, without an error (here a
/// trigger that drops some), the whole batch fails and none of its jobs is
/// left. Both forms of the statement: jobs that differ only in their
/// payloads, and jobs that differ in more.
#[test]
fn a_plain_batch_the_table_takes_only_part_of_fails_whole() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    let s = &server.schema;
    server.client()?.batch_execute(&format!(
        "CREATE FUNCTION {s}.drop_skipped() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.payload ? 'skip' THEN RETURN NULL; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER drop_skipped BEFORE INSERT ON {s}.backlog_jobs
         FOR EACH ROW EXECUTE FUNCTION {s}.drop_skipped();"
    ))?;
    let payloads = [json!({"a": 1}), json!({"skip": 1}), json!({"a": 2})];
    let alike: Vec<NewJob> = payloads
        .iter()
        .map(|p| NewJob::new("k", p.clone()))
        .collect();
    let unlike: Vec<NewJob> = payloads
        .iter()
        .zip(0..)
        .map(|(p, i)| NewJob::new("k", p.clone()).priority(i))
        .collect();
    for jobs in [alike, unlike] {
        let e = queue
            .enqueue_many(jobs)
            .expect_err("one row of three dropped");
        assert!(e.to_string().contains("inserted 2 of 3 jobs"), "{e}");
    }
    let left = server
        .client()?
        .query_one(&format!("SELECT count(*) FROM {s}.backlog_jobs"), &[])?;
    assert_eq!(left.try_get::<_, i64>(0)?, 0);
    Ok(())
}

#[test]
fn a_worker_carries_on_after_its_connections_are_killed() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let ran = Arc::new(AtomicUsize::new(0));
    let queue = server.queue(SystemClock)?;
    let worker = sleepy_worker(server.queue(SystemClock)?, ran.clone())?;
    queue.enqueue(NewJob::new("k", json!(1)))?;
    assert!(wait_until(Duration::from_secs(5), || Ok(ran
        .load(Ordering::SeqCst)
        == 1))?);

    // The listener's connection too: it reconnects, and a later enqueue
    // still wakes the worker.
    server.terminate_connections()?;
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..20 {
        queue.enqueue(NewJob::new("k", json!(i)))?;
    }
    assert!(
        wait_until(Duration::from_secs(10), || Ok(
            ran.load(Ordering::SeqCst) == 21
        ))?,
        "ran {} of 21",
        ran.load(Ordering::SeqCst)
    );
    worker.shutdown(Duration::from_secs(5))?;
    let done = queue
        .counts()?
        .iter()
        .filter(|c| c.state == JobState::Finished(backlog::FinalStatus::Completed))
        .map(|c| c.count)
        .sum::<u64>();
    assert_eq!(done, 21);
    Ok(())
}

// ---- errors --------------------------------------------------------------------

#[test]
fn a_serialization_failure_is_busy_and_nul_in_json_is_an_invalid_payload() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    let mut a = server.client()?;
    let mut b = server.client()?;
    let table = format!("{}.t", server.schema);
    a.batch_execute(&format!(
        "CREATE TABLE {table} (x int); INSERT INTO {table} VALUES (1)"
    ))?;
    let mut tx = a
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()?;
    tx.query(&format!("SELECT x FROM {table}"), &[])?;
    b.execute(&format!("UPDATE {table} SET x = 2"), &[])?;
    let e = tx
        .execute(&format!("UPDATE {table} SET x = 3"), &[])
        .expect_err("a concurrent update under REPEATABLE READ");
    assert!(backlog::Error::from(e).is_busy());
    drop(tx);

    // JSON allows \u0000 in strings; JSONB does not. Nothing is written.
    let nul = queue.enqueue(NewJob::new("k", json!({"s": "a\u{0}b"})));
    assert!(
        matches!(nul, Err(backlog::Error::InvalidPayload(_))),
        "{nul:?}"
    );
    assert!(queue.lease(&LeaseRequest::new("w", 1))?.is_empty());
    Ok(())
}

/// A TCP proxy to the test server that can be taken down and brought back,
/// like a server restart, without disturbing anyone else's connections.
struct Proxy {
    port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    streams: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn start(upstream: String) -> TestResult<Proxy> {
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let streams = Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
        let (up2, streams2) = (up.clone(), streams.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let pipes = (client.try_clone(), server.try_clone());
                let (Ok(mut client_r), Ok(mut server_r)) = pipes else {
                    continue;
                };
                let (mut client_w, mut server_w) = (client, server);
                if let (Ok(a), Ok(b)) = (client_w.try_clone(), server_w.try_clone()) {
                    if let Ok(mut all) = streams2.lock() {
                        all.extend([a, b]);
                    }
                }
                std::thread::spawn(move || std::io::copy(&mut client_r, &mut server_w));
                std::thread::spawn(move || std::io::copy(&mut server_r, &mut client_w));
            }
        });
        Ok(Proxy { port, up, streams })
    }

    /// Cuts every connection and refuses new ones.
    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        if let Ok(mut all) = self.streams.lock() {
            for s in all.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_server_outage_is_waited_out_within_the_write_deadline() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let config: postgres::Config = server.url.parse()?;
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(format!("127.0.0.1:{port}"))?;
    let url = server.url_with("sslmode=disable").replacen(
        &format!(":{port}/"),
        &format!(":{}/", proxy.port),
        1,
    );
    assert!(url.contains(&proxy.port.to_string()), "{url}");
    let clock = ManualClock::at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let queue = server
        .options()
        .clock(clock)
        .connect_timeout(Duration::from_secs(2))
        .write_deadline(Duration::from_secs(5))
        .connect(&url)?;
    let id = queue.enqueue(NewJob::new("k", json!(1)))?.id;
    let job = queue.lease(&LeaseRequest::new("w", 1))?.remove(0);

    // The "server" goes away for a while; the completion waits it out.
    proxy.down();
    let back = std::thread::spawn({
        let up = proxy.up.clone();
        move || {
            std::thread::sleep(Duration::from_millis(1500));
            up.store(true, Ordering::SeqCst);
        }
    });
    let start = Instant::now();
    queue.complete(&job, None)?;
    assert!(
        start.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
    back.join().map_err(|_| "thread panicked")?;
    assert_eq!(
        queue.get(id)?.state,
        JobState::Finished(backlog::FinalStatus::Completed)
    );

    // Past the write deadline, the error says what happened.
    proxy.down();
    let down_for_good = QueueOptions::new()
        .schema(server.schema.clone())
        .migrate(false)
        .connect_timeout(Duration::from_millis(500))
        .write_deadline(Duration::from_secs(1));
    let failed = down_for_good.connect(&url);
    assert!(failed.is_err());
    let failed = queue.enqueue(NewJob::new("k", json!(2)));
    proxy.up();
    let failed = failed.expect_err("the server stayed away");
    assert!(!failed.is_invalid_input(), "{failed}");
    Ok(())
}

// ---- the lease plan -------------------------------------------------------------

#[test]
fn the_lease_walks_its_index_in_claim_order_without_sorting() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let (queue, _clock) = server.manual_queue()?;
    for queue_name in ["default", "other"] {
        let jobs =
            (0..20_000).map(|i| NewJob::new("k", json!(i)).queue(queue_name).priority(i % 3));
        queue.enqueue_many(jobs)?;
    }
    server
        .client()?
        .batch_execute(&format!("ANALYZE {}.backlog_jobs", server.schema))?;

    let one = queue.explain_lease(&LeaseRequest::new("w", 10))?.join("\n");
    assert!(one.contains("Index Scan using backlog_jobs_lease"), "{one}");
    assert!(
        one.contains("LockRows"),
        "claims lock with SKIP LOCKED:\n{one}"
    );
    assert!(!one.contains("Sort"), "no sort for one queue:\n{one}");
    // A batch the size of the default worker's look-ahead finds its rows by
    // id, not by hashing the whole table.
    let batch = queue
        .explain_lease(&LeaseRequest::new("w", 200))?
        .join("\n");
    assert!(!batch.contains("Seq Scan on backlog_jobs"), "{batch}");

    let two = queue
        .explain_lease(&LeaseRequest::new("w", 10).queues(["default", "other"]))?
        .join("\n");
    assert!(two.contains("Index Scan using backlog_jobs_lease"), "{two}");
    assert!(!two.contains("Seq Scan on backlog_jobs"), "{two}");
    let batch = queue
        .explain_lease(&LeaseRequest::new("w", 200).queues(["default", "other"]))?
        .join("\n");
    assert!(!batch.contains("Seq Scan on backlog_jobs"), "{batch}");

    let leased = queue.lease(&LeaseRequest::new("w", 10).queues(["default", "other"]))?;
    assert_eq!(leased.len(), 10);
    assert!(leased.iter().all(|j| j.priority == 2));
    Ok(())
}

// ---- migrations ---------------------------------------------------------------------

#[test]
fn nodes_migrating_a_new_schema_at_once_all_succeed() -> TestResult {
    let Some(server) = Server::new()? else {
        return Ok(());
    };
    let url = server.url_with("");
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (options, url) = (server.options(), url.clone());
            std::thread::spawn(move || options.connect(&url).map(|_| ()))
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "migrating thread panicked")??;
    }
    let applied: i64 = server
        .client()?
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.backlog_schema_history",
                server.schema
            ),
            &[],
        )?
        .try_get(0)?;
    // Each migration once: V1__initial, V2__due, V3__progress, V4__groups,
    // V5__limits, V6__schedules, V7__workers, V8__dependencies, V9__batches,
    // V10__finished_counts, V11__sequences, V12__open_batches_sequence_keys,
    // V13__finished_batches, V14__running_bound.
    assert_eq!(applied, 14);
    Ok(())
}

/// A point in time as unix µs, as the server stores it.
fn us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
