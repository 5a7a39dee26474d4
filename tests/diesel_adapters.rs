//! `backlog::diesel::{postgres, mysql}`: enqueue and complete inside the
//! application's diesel transaction.
//!
//! Each scenario is written once, generic over the application's diesel
//! connection ([`App`]), and run per database the adapters serve:
//! PostgreSQL (`PgConnection`) and MySQL/MariaDB (`MysqlConnection`; tested
//! on MariaDB 10.11, there is no MySQL 8 server here). Not on SQLite: no
//! diesel adapter exists for it (diesel's SQLite backend cannot share
//! backlog's SQLite build; see the README's "diesel" section). The
//! conformance harness (`conformance/harness.rs`: a fresh schema or
//! database per scenario, dropped at the end) needs
//! `BACKLOG_TEST_POSTGRES_URL` / `BACKLOG_TEST_MYSQL_URL`; without one,
//! each of its scenarios prints `SKIPPED`.
//!
//! The commit and rollback scenarios run their worker in another process
//! ([`diesel_worker_child`]: this binary re-run), as the issue asks: what
//! wakes it is the server's, not a handle's in this process.
//!
//! `cargo test --features diesel-postgres,diesel-mysql --test diesel_adapters`

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use backlog::diesel::QueueExt;
use backlog::postgres::postgres::fallible_iterator::FallibleIterator;
use backlog::{Error, FinalStatus, JobState, LeaseRequest, NewJob, Queue, QueueOptions, Worker};
use diesel::{Connection, MysqlConnection, PgConnection, RunQueryDsl};
use serde_json::json;

use harness::{Backend, Children, Harness, TestResult};

/// Each scenario on each database, with that database's diesel connection.
macro_rules! on_each_database {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[test]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Postgres.run(super::$name::<diesel::PgConnection>)
            })*
        }
        mod mysql {
            $(#[test]
            fn $name() -> crate::harness::TestResult {
                crate::harness::Backend::Mysql.run(super::$name::<diesel::MysqlConnection>)
            })*
        }
    };
}

on_each_database!(
    a_rolled_back_enqueue_leaves_no_job_and_a_worker_process_runs_nothing,
    a_committed_enqueue_is_one_job_a_worker_process_starts_within_a_second,
    one_unique_key_under_concurrent_transactions_is_one_job,
    a_unique_key_freed_by_a_rollback_goes_to_the_waiting_transaction,
    complete_in_a_handler_commits_its_effects_and_the_completion_together,
    complete_in_on_a_stale_lease_is_lease_lost_and_commits_nothing,
    bad_calls_are_typed_errors_and_write_nothing,
    what_only_backlogs_driver_follows_is_refused_and_writes_nothing,
    a_key_unique_for_a_period_holds_through_diesel,
);

/// The application's diesel connection to a scenario's database, and the
/// one thing that differs per dialect in these scenarios: its own insert.
trait App: Connection + Send + 'static {
    /// A connection on the database's defaults (PostgreSQL: the default
    /// `search_path`, so the queue's statements must name their schema
    /// themselves).
    fn open(h: &Harness) -> TestResult<Self>;
    /// The application's own write: an effect row for `job_id`.
    /// (`schema`: the scenario's PostgreSQL schema, empty on MySQL.)
    fn insert_effect(&mut self, schema: &str, job_id: i64) -> diesel::QueryResult<usize>;
}

impl App for PgConnection {
    fn open(h: &Harness) -> TestResult<Self> {
        let (_, url) = schema_and_url(h)?;
        Ok(PgConnection::establish(&url)?)
    }

    fn insert_effect(&mut self, schema: &str, job_id: i64) -> diesel::QueryResult<usize> {
        diesel::sql_query(format!(
            "INSERT INTO {schema}.effects (job_id, note) VALUES ($1, 'ran')"
        ))
        .bind::<diesel::sql_types::BigInt, _>(job_id)
        .execute(self)
    }
}

impl App for MysqlConnection {
    fn open(h: &Harness) -> TestResult<Self> {
        let (_, url) = schema_and_url(h)?;
        let mut conn = MysqlConnection::establish(&url)?;
        // As the adapter's documentation asks (the queue's own sessions too).
        diesel::sql_query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut conn)?;
        Ok(conn)
    }

    fn insert_effect(&mut self, _: &str, job_id: i64) -> diesel::QueryResult<usize> {
        // The scenario's own database is the connection's default.
        diesel::sql_query("INSERT INTO effects (job_id, note) VALUES (?, 'ran')")
            .bind::<diesel::sql_types::BigInt, _>(job_id)
            .execute(self)
    }
}

/// The scenario's schema (the harness's `CHILD_SCHEMA`; empty on MySQL,
/// whose scenario has a database of its own) and server URL.
fn schema_and_url(h: &Harness) -> TestResult<(String, String)> {
    let env = h.child_env();
    let get = |key: &str| {
        env.iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("no {key} in the harness's environment"))
    };
    Ok((
        get("BACKLOG_TEST_CHILD_SCHEMA")?,
        get("BACKLOG_TEST_CHILD_TARGET")?,
    ))
}

/// A listener on the scenario's channel (`<schema>.backlog_jobs`) on
/// PostgreSQL; `None` on MySQL, which has no notifications (its workers
/// probe for new jobs).
fn listener(h: &Harness) -> TestResult<Option<backlog::postgres::postgres::Client>> {
    if h.backend() != Backend::Postgres {
        return Ok(None);
    }
    let (schema, url) = schema_and_url(h)?;
    let mut client =
        backlog::postgres::postgres::Client::connect(&url, backlog::postgres::postgres::NoTls)?;
    client.batch_execute(&format!("LISTEN \"{schema}.backlog_jobs\""))?;
    Ok(Some(client))
}

/// Notifications received within `wait` (0 without a listener).
fn notifications(
    client: &mut Option<backlog::postgres::postgres::Client>,
    wait: Duration,
) -> TestResult<usize> {
    let Some(client) = client else {
        return Ok(0);
    };
    let mut n = 0;
    let mut all = client.notifications();
    let mut iter = all.timeout_iter(wait);
    while iter.next()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// The role of this test binary re-run as [`diesel_worker_child`].
const ROLE: &str = "BACKLOG_DIESEL_CHILD_ROLE";

/// The idle poll of the worker process: far past any scenario, so only a
/// wake-up (PostgreSQL's NOTIFY at the commit, MySQL's new-job probe)
/// explains a job that starts on time.
const IDLE_POLL: Duration = Duration::from_secs(3600);

/// How soon after the commit the worker process must start the job.
const STARTS_WITHIN: Duration = Duration::from_secs(1);

/// A worker in a process of its own: this test binary re-run with [`ROLE`]
/// set and the scenario's database in the environment
/// ([`Harness::child_env`]). It prints `ready` once its worker started,
/// `job-started <id>` as each `charge` begins and `warmed-up <id>` for each
/// `warm_up`; it ends when its standard
/// input closes (the parent gone) or when the parent kills it. Without a
/// role (a plain `--ignored` run) it returns at once.
#[test]
#[ignore = "a child process of the diesel adapter scenarios"]
fn diesel_worker_child() -> TestResult {
    let Ok(role) = std::env::var(ROLE) else {
        return Ok(());
    };
    if role != "worker" {
        return Err(format!("unknown role {role}").into());
    }
    let (queue, _) =
        harness::child_queue(QueueOptions::new())?.ok_or("no database in the environment")?;
    let worker = Worker::builder(queue)
        .poll_interval(IDLE_POLL)
        .handle_raw("charge", |_, ctx| {
            println!("job-started {}", ctx.id());
            Ok(())
        })
        .handle_raw("warm_up", |_, ctx| {
            println!("warmed-up {}", ctx.id());
            Ok(())
        })
        .start()?;
    println!("ready");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    worker.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// A running [`diesel_worker_child`], killed and reaped when dropped (a
/// failed assertion included).
struct WorkerProcess {
    _process: Children,
    /// Each `charge` job the process started, and when the parent read its
    /// line.
    started: mpsc::Receiver<(i64, Instant)>,
    /// The `warm_up` jobs [`WorkerProcess::spawn`] committed (all finished).
    warm_ups: i64,
}

impl WorkerProcess {
    /// Starts the process and returns once its worker is idle and waiting
    /// and has been woken by a commit: a `warm_up` job committed after it
    /// reported ready has run there (its LISTEN on PostgreSQL, its probe's
    /// first reading on MySQL, are in place). A warm-up committed before
    /// the probe's first reading would wait for the idle poll, so another
    /// is committed each second until one runs; all have finished on return.
    fn spawn(h: &Harness) -> TestResult<WorkerProcess> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "diesel_worker_child", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, "worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in h.child_env() {
            command.env(k, v);
        }
        let mut child = command.spawn()?;
        let out = child.stdout.take();
        let process = Children(vec![child]);
        let out = out.ok_or("the worker process has no stdout")?;
        let (signal_tx, signals) = mpsc::channel();
        let (started_tx, started) = mpsc::channel();
        std::thread::spawn(move || {
            // libtest may print its "test ... " prefix on the same line.
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let at = Instant::now();
                if let Some((_, id)) = line.split_once("job-started ") {
                    if let Ok(id) = id.trim().parse::<i64>() {
                        let _ = started_tx.send((id, at));
                    }
                } else if line.contains("warmed-up ") {
                    let _ = signal_tx.send("warmed-up");
                } else if line.contains("ready") {
                    let _ = signal_tx.send("ready");
                }
            }
        });
        if signals.recv_timeout(Duration::from_secs(30)) != Ok("ready") {
            return Err("the worker process did not become ready".into());
        }
        let mut warm_ups = Vec::new();
        loop {
            if warm_ups.len() == 10 {
                return Err("the worker process ran none of 10 committed warm-up jobs".into());
            }
            warm_ups.push(h.queue.enqueue(NewJob::new("warm_up", json!({})))?.id);
            if signals.recv_timeout(Duration::from_secs(1)) == Ok("warmed-up") {
                break;
            }
        }
        for id in &warm_ups {
            h.queue.wait(*id, Duration::from_secs(10))?;
        }
        Ok(WorkerProcess {
            _process: process,
            started,
            warm_ups: warm_ups.len() as i64,
        })
    }

    /// The next job started within `wait`, if any.
    fn next_start(&self, wait: Duration) -> Option<(i64, Instant)> {
        self.started.recv_timeout(wait).ok()
    }
}

/// Rolled back: no job, no effect, no notification (PostgreSQL), and a
/// worker in another process, whose idle poll is an hour, runs nothing.
/// It was awake: a job committed next starts there within a second.
fn a_rolled_back_enqueue_leaves_no_job_and_a_worker_process_runs_nothing<C: App>(
    b: &Backend,
) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (schema, _) = schema_and_url(&h)?;
    let worker = WorkerProcess::spawn(&h)?;
    let mut listen = listener(&h)?;
    let mut conn = C::open(&h)?;

    let mut handed_out = None;
    let outcome = conn.transaction::<(), Box<dyn std::error::Error>, _>(|conn| {
        conn.insert_effect(&schema, 7)?;
        handed_out = Some(
            h.queue
                .enqueue_in(conn, NewJob::new("charge", json!({"order": 7})))?,
        );
        Err("the application changed its mind".into())
    });
    assert!(outcome.is_err());
    let id = handed_out.ok_or("enqueue_in returned no id")?.id;

    assert_eq!(notifications(&mut listen, Duration::from_millis(500))?, 0);
    // Time for MySQL's probe to look (every 25 ms when idle), had the job shown.
    let ran = worker.next_start(Duration::from_millis(500));
    assert_eq!(ran, None, "the worker process ran a rolled-back job");
    assert_eq!(h.live_rows()?, 0);
    assert_eq!(h.effects_of(7)?, 0);
    assert!(matches!(h.queue.get(id), Err(Error::NotFound { .. })));

    let next = conn.transaction::<_, backlog::Error, _>(|c| {
        h.queue
            .enqueue_in(c, NewJob::new("charge", json!({"order": 8})))
    })?;
    let committed = Instant::now();
    let (ran, at) = worker
        .next_start(Duration::from_secs(5))
        .ok_or("the worker process never ran the committed job")?;
    assert_eq!(ran, next.id);
    let latency = at.saturating_duration_since(committed);
    assert!(
        latency < STARTS_WITHIN,
        "started {latency:?} after the commit"
    );
    Ok(())
}

/// Committed: exactly one job with the caller's row, nothing notified and
/// nothing started before the commit, and a worker in another process,
/// whose idle poll is an hour, starts it within a second of the commit
/// (woken by the commit's NOTIFY on PostgreSQL, by its new-job probe on
/// MySQL), once.
fn a_committed_enqueue_is_one_job_a_worker_process_starts_within_a_second<C: App>(
    b: &Backend,
) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (schema, _) = schema_and_url(&h)?;
    let worker = WorkerProcess::spawn(&h)?;
    let mut listen = listener(&h)?;
    let mut conn = C::open(&h)?;

    let mut notified_before_commit = None;
    let mut ran_before_commit = None;
    let mut committing = None;
    let enqueued = conn.transaction::<_, Box<dyn std::error::Error>, _>(|conn| {
        conn.insert_effect(&schema, 7)?;
        let job = h
            .queue
            .enqueue_in(conn, NewJob::new("charge", json!({"order": 7})))?;
        notified_before_commit = Some(notifications(&mut listen, Duration::from_millis(200))?);
        // Time for MySQL's probe to look, had the job shown.
        ran_before_commit = Some(worker.next_start(Duration::from_millis(300)));
        committing = Some(Instant::now());
        Ok(job)
    })?;
    let committing = committing.ok_or("the transaction body did not run")?;
    assert_eq!(notified_before_commit, Some(0), "nothing before the commit");
    assert_eq!(
        ran_before_commit,
        Some(None),
        "nothing ran before the commit"
    );
    assert!(!enqueued.existed);
    assert_eq!(h.effects_of(7)?, 1);

    let (ran, at) = worker
        .next_start(Duration::from_secs(5))
        .ok_or("the worker process never ran the job")?;
    let latency = at.saturating_duration_since(committing);
    println!(
        "diesel {:?}: committed job started in another process after {latency:?} ({} warm-up)",
        h.backend(),
        worker.warm_ups
    );
    assert_eq!(ran, enqueued.id);
    assert!(
        latency < STARTS_WITHIN,
        "started {latency:?} after the commit"
    );
    let record = h.queue.wait(enqueued.id, Duration::from_secs(5))?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    assert_eq!(record.attempts, 1, "started once");
    let again = worker.next_start(Duration::from_millis(300));
    assert_eq!(again, None, "the job started twice");
    assert_eq!(
        h.live_rows()? + h.history_rows()?,
        1 + worker.warm_ups,
        "exactly one job besides the warm-ups"
    );
    if listen.is_some() {
        assert!(
            notifications(&mut listen, Duration::from_millis(500))? >= 1,
            "the commit notified"
        );
    }
    Ok(())
}

/// Two application transactions enqueue the same unique key at once: the
/// second waits on the unique index for the first's commit, then gets the
/// first's job (`existed`). One job in all.
fn one_unique_key_under_concurrent_transactions_is_one_job<C: App>(b: &Backend) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let results = race_for_key::<C>(&h, [true, true])?;
    let (a, b) = (&results[0], &results[1]);
    assert_eq!(a.id, b.id, "both name one job");
    assert_eq!(
        [a.existed, b.existed].iter().filter(|e| !**e).count(),
        1,
        "exactly one inserted: {results:?}"
    );
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}

/// The first holder of the key rolls back: the waiting transaction inserts
/// its own job, and that is the only one.
fn a_unique_key_freed_by_a_rollback_goes_to_the_waiting_transaction<C: App>(
    b: &Backend,
) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let results = race_for_key::<C>(&h, [false, true])?;
    assert!(!results[1].existed, "the second inserted its own");
    assert_eq!(h.live_rows()?, 1);
    assert_eq!(h.queue.get(results[1].id)?.id, results[1].id);
    assert!(matches!(
        h.queue.get(results[0].id),
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

/// Transaction 0 enqueues key "order-7" and holds; transaction 1 enqueues
/// the same key (blocking on the index); then transaction 0 commits or rolls
/// back as `commit[0]` says, and transaction 1 as `commit[1]`.
fn race_for_key<C: App>(h: &Harness, commit: [bool; 2]) -> TestResult<Vec<backlog::Enqueued>>
where
    Queue: QueueExt<C>,
{
    let job = || NewJob::new("charge", json!({"order": 7})).unique_key("order-7");
    let first_in = Arc::new(Barrier::new(2));
    let mut conns = [C::open(h)?, C::open(h)?];
    let [c0, c1] = &mut conns;
    let queue = &h.queue;
    std::thread::scope(|s| -> TestResult<Vec<backlog::Enqueued>> {
        let gate = first_in.clone();
        let first = s.spawn(move || {
            let mut got = None;
            let r = c0.transaction::<(), Box<dyn std::error::Error + Send + Sync>, _>(|c| {
                got = Some(queue.enqueue_in(c, job())?);
                gate.wait();
                // Let the second transaction reach the index and block on it.
                std::thread::sleep(Duration::from_millis(300));
                if commit[0] {
                    Ok(())
                } else {
                    Err("roll back".into())
                }
            });
            (got, r.is_ok())
        });
        first_in.wait();
        let second = c1.transaction::<_, Box<dyn std::error::Error + Send + Sync>, _>(|c| {
            let got = queue.enqueue_in(c, job())?;
            if commit[1] {
                Ok(got)
            } else {
                Err("roll back".into())
            }
        });
        let (got0, committed0) = first.join().map_err(|_| "first transaction panicked")?;
        assert_eq!(committed0, commit[0]);
        let got0 = got0.ok_or("first enqueue_in returned nothing")?;
        let got1 = second.map_err(|e| e.to_string())?;
        Ok(vec![got0, got1])
    })
}

/// A handler does its work through diesel: the completion (fence first) and
/// its effect commit together, the result is stored, and the worker does not
/// complete the job a second time.
fn complete_in_a_handler_commits_its_effects_and_the_completion_together<C: App>(
    b: &Backend,
) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let (schema, _) = schema_and_url(&h)?;
    let conn = Arc::new(Mutex::new(C::open(&h)?));
    let node = h.handle_with(QueueOptions::new())?;
    let handler_queue = node.clone();
    let worker = Worker::builder(node)
        .poll_interval(Duration::from_millis(20))
        .handle_raw("charge", move |payload, ctx| {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            conn.transaction::<_, backlog::Error, _>(|c| {
                handler_queue.complete_in(c, ctx.job(), Some(json!({"charged": payload})))?;
                c.insert_effect(&schema, ctx.id())?;
                Ok(())
            })?;
            Ok(())
        })
        .start()?;
    let id = h.queue.enqueue(NewJob::new("charge", json!(7)))?.id;
    let record = h.queue.wait(id, Duration::from_secs(10))?;
    worker.shutdown(Duration::from_secs(5))?;
    assert_eq!(record.state, JobState::Finished(FinalStatus::Completed));
    let result: serde_json::Value =
        serde_json::from_str(record.result.as_deref().ok_or("no result stored")?)?;
    assert_eq!(result, json!({"charged": 7}));
    assert_eq!(h.effects_of(id)?, 1);
    assert_eq!(record.attempts, 1, "ran once");
    assert_eq!(h.history_rows()?, 1, "completed once");
    assert_eq!(h.live_rows()?, 0);
    Ok(())
}

/// A lease that went stale (expired, rescued, leased by another worker):
/// `complete_in` says `LeaseLost`, and the transaction that propagates it
/// commits neither the effect nor a completion.
fn complete_in_on_a_stale_lease_is_lease_lost_and_commits_nothing<C: App>(b: &Backend) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let (schema, _) = schema_and_url(&h)?;
    let ttl = Duration::from_secs(10);
    let id = h.queue.enqueue(NewJob::new("charge", json!(1)))?.id;
    let stale = h
        .queue
        .lease(&LeaseRequest::new("slow", 1).ttl(ttl))?
        .pop()
        .ok_or("nothing to lease")?;
    h.advance(ttl + Duration::from_secs(1));
    assert_eq!(h.queue.rescue(10)?.rescued, 1);
    let fresh = h.lease_one("fresh")?;
    assert_eq!(fresh.id, id);

    let mut conn = C::open(&h)?;
    let outcome = conn.transaction::<(), backlog::Error, _>(|c| {
        h.queue.complete_in(c, &stale, None)?;
        c.insert_effect(&schema, id)?;
        Ok(())
    });
    assert!(
        matches!(outcome, Err(Error::LeaseLost { job_id }) if job_id == id),
        "{outcome:?}"
    );
    assert_eq!(h.effects_of(id)?, 0);
    assert_eq!(h.state(id)?, JobState::Running);

    // The fresh lease completes through diesel.
    conn.transaction::<(), backlog::Error, _>(|c| h.queue.complete_in(c, &fresh, None))?;
    assert_eq!(h.state(id)?, JobState::Finished(FinalStatus::Completed));
    Ok(())
}

/// Outside a transaction, an invalid job, a grouped job, a retry, a queue on
/// SQLite: each a typed error, nothing written.
fn bad_calls_are_typed_errors_and_write_nothing<C: App>(b: &Backend) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let mut conn = C::open(&h)?;
    let job = || NewJob::new("charge", json!(1));

    assert!(matches!(
        h.queue.enqueue_in(&mut conn, job()),
        Err(Error::NotInTransaction)
    ));
    conn.transaction::<(), Box<dyn std::error::Error>, _>(|c| {
        assert!(matches!(
            h.queue.enqueue_in(c, NewJob::new("", json!(1))),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            h.queue
                .enqueue_many_in(c, [job(), job().group(backlog::Group::new("g"))]),
            Err(Error::InvalidArgument(_))
        ));
        let dir = tempfile::tempdir()?;
        let on_sqlite = Queue::open(dir.path().join("q.db"))?;
        assert!(matches!(
            on_sqlite.enqueue_in(c, job()),
            Err(Error::InvalidArgument(_))
        ));
        Ok(())
    })?;
    assert_eq!(h.live_rows()?, 0);

    h.queue.enqueue(job())?;
    let leased = h.lease_one("w")?;
    assert!(matches!(
        h.queue.complete_in(&mut conn, &leased, None),
        Err(Error::NotInTransaction)
    ));
    let retry = conn.transaction::<(), backlog::Error, _>(|c| {
        h.queue
            .settle_in(c, &leased, backlog::Outcome::fail("try again"))
    });
    assert!(matches!(retry, Err(Error::InvalidArgument(_))), "{retry:?}");
    assert_eq!(h.state(leased.id)?, JobState::Running);
    assert_eq!(h.history_rows()?, 0);
    Ok(())
}

/// Dependencies, batch membership and the jobs they follow are kept by
/// backlog's own driver: through diesel, enqueueing a dependent or a batch
/// member, or finishing a job that a batch or a dependent follows, is a
/// typed error and writes nothing (not a job that would run at once, nor a
/// batch that never fires its callbacks).
fn what_only_backlogs_driver_follows_is_refused_and_writes_nothing<C: App>(
    b: &Backend,
) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let mut conn = C::open(&h)?;
    let first = h.queue.enqueue(NewJob::new("charge", json!(1)))?.id;
    let batch = h.queue.batch().create()?;
    conn.transaction::<(), Box<dyn std::error::Error>, _>(|c| {
        let dependent = h
            .queue
            .enqueue_in(c, NewJob::new("charge", json!(2)).depends_on([first]));
        assert!(
            matches!(&dependent, Err(Error::InvalidArgument(why)) if why.contains("dependencies")),
            "{dependent:?}"
        );
        let member = h
            .queue
            .enqueue_in(c, NewJob::new("charge", json!(3)).batch(batch.id));
        assert!(
            matches!(&member, Err(Error::InvalidArgument(why)) if why.contains("batch")),
            "{member:?}"
        );
        Ok(())
    })?;
    assert_eq!(h.live_rows()?, 1);

    // A job another job waits on, and a batch member, finish only through
    // backlog's own driver.
    h.queue
        .enqueue(NewJob::new("report", json!(4)).depends_on([first]))?;
    h.queue
        .enqueue(NewJob::new("charge", json!(5)).batch(batch.id))?;
    h.queue.seal_batch(batch.id)?;
    for _ in 0..2 {
        let leased = h
            .queue
            .lease(&LeaseRequest::new("w", 1).kinds(["charge"]))?
            .pop()
            .ok_or("nothing to lease")?;
        let refused =
            conn.transaction::<(), backlog::Error, _>(|c| h.queue.complete_in(c, &leased, None));
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(why)) if why.contains("depend")),
            "{refused:?}"
        );
        assert_eq!(h.state(leased.id)?, JobState::Running);
        h.queue.complete(&leased, None)?;
    }
    assert_eq!(h.history_rows()?, 2);
    Ok(())
}

/// A key unique for a period is held by a finished job of the statuses
/// asked for, through diesel as through backlog's own driver.
fn a_key_unique_for_a_period_holds_through_diesel<C: App>(b: &Backend) -> TestResult
where
    Queue: QueueExt<C>,
{
    let h = b.harness()?;
    let mut conn = C::open(&h)?;
    let first = h
        .queue
        .enqueue(NewJob::new("digest", json!({})).unique_key("d-7"))?
        .id;
    let leased = h.lease_one("w")?;
    h.queue.complete(&leased, None)?;
    let hour = Duration::from_secs(3600);
    let keyed = || {
        NewJob::new("digest", json!({}))
            .unique_key("d-7")
            .unique_for(hour)
    };
    let (held, again) = conn.transaction::<_, backlog::Error, _>(|c| {
        let held = h.queue.enqueue_in(c, keyed())?;
        // Only a dead job would hold it: the completed one does not.
        let again = h
            .queue
            .enqueue_in(c, keyed().unique_states([FinalStatus::Dead]))?;
        Ok((held, again))
    })?;
    assert!(held.existed && held.id == first, "{held:?}");
    assert!(!again.existed && again.id != first, "{again:?}");
    assert_eq!(h.live_rows()?, 1);
    Ok(())
}
