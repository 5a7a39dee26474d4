//! What only the MySQL/MariaDB backend has: the server's clock on nodes
//! whose clocks disagree, connections killed under a running worker, the
//! poller that notices other nodes' enqueues, the lease plan, byte-exact
//! names, deep payloads, table prefixes, concurrent migrations, and URLs
//! whose password never shows.
//!
//! Each test works in a database of its own (`bt_<random>`), dropped at the
//! end, on the server named by `BACKLOG_TEST_MYSQL_URL`; without it each
//! prints `SKIPPED: set BACKLOG_TEST_MYSQL_URL` and passes. The behaviour
//! every backend shares is in `tests/conformance/`.

#[cfg(not(feature = "mysql"))]
#[test]
fn mysql_tests_need_the_mysql_feature() {
    println!("SKIPPED: set BACKLOG_TEST_MYSQL_URL and build with --features mysql");
}

#[cfg(feature = "mysql")]
mod server {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant, SystemTime};

    use super::us;

    use backlog::mysql::mysql::prelude::Queryable;
    use backlog::mysql::mysql::{Conn, Opts};
    use backlog::mysql::{JobContextExt, QueueExt};
    use backlog::{
        Clock, Error, Event, JobState, LeaseRequest, NewJob, Outcome, Queue, QueueOptions,
        SystemClock, Worker,
    };
    use serde_json::{json, Value};

    type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

    /// A database of the test's own, dropped when it goes out of scope.
    struct TestDb {
        admin: Conn,
        name: String,
        url: String,
    }

    impl TestDb {
        /// `None` (after printing why) when no server is configured.
        fn create() -> TestResult<Option<TestDb>> {
            let Some(base) = std::env::var("BACKLOG_TEST_MYSQL_URL")
                .ok()
                .filter(|u| !u.is_empty())
            else {
                println!("SKIPPED: set BACKLOG_TEST_MYSQL_URL");
                return Ok(None);
            };
            let mut admin = Conn::new(Opts::from_url(&base)?)?;
            let name = format!("bt_{:016x}", rand::random::<u64>());
            admin.query_drop(format!("CREATE DATABASE {name}"))?;
            let url = with_database(&base, &name);
            Ok(Some(TestDb { admin, name, url }))
        }

        fn queue(&self, options: QueueOptions) -> backlog::Result<Queue> {
            options.connect(&self.url)
        }

        /// A connection of the test's own to its database.
        fn conn(&self) -> TestResult<Conn> {
            Ok(Conn::new(Opts::from_url(&self.url)?)?)
        }

        /// The server's clock, unix µs.
        fn server_now(&mut self) -> TestResult<i64> {
            let now: Option<i64> = self.admin.query_first(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
            )?;
            Ok(now.ok_or("no server time")?)
        }

        /// Kills every session on the test's database (the queue's pool and
        /// poller), as a server restart or a network cut would.
        fn kill_sessions(&mut self) -> TestResult<usize> {
            let ids: Vec<u64> = self.admin.exec(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
                (&self.name,),
            )?;
            for id in &ids {
                // A session may have ended meanwhile.
                let _ = self.admin.query_drop(format!("KILL CONNECTION {id}"));
            }
            Ok(ids.len())
        }
    }

    impl Drop for TestDb {
        fn drop(&mut self) {
            let _ = self
                .admin
                .query_drop(format!("DROP DATABASE IF EXISTS {}", self.name));
        }
    }

    /// `base` with its database replaced by `database`, query kept.
    fn with_database(base: &str, database: &str) -> String {
        let (head, query) = base
            .split_once('?')
            .map_or((base, None), |(h, q)| (h, Some(q)));
        let authority_end = head.find("://").map_or(0, |i| i + 3);
        let root = match head[authority_end..].find('/') {
            Some(slash) => &head[..authority_end + slash],
            None => head,
        };
        match query {
            Some(q) => format!("{root}/{database}?{q}"),
            None => format!("{root}/{database}"),
        }
    }

    /// `host:port/db?query` of a URL: what follows its scheme and user.
    fn without_user(url: &str) -> &str {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let authority = rest.find('/').map_or(rest, |i| &rest[..i]);
        match authority.rfind('@') {
            Some(at) => &rest[at + 1..],
            None => rest,
        }
    }

    /// The host's clock moved by a fixed offset: a node whose clock is wrong.
    #[derive(Debug)]
    struct Skewed(Duration, bool);

    impl Clock for Skewed {
        fn now(&self) -> SystemTime {
            let now = SystemClock.now();
            if self.1 {
                now + self.0
            } else {
                now - self.0
            }
        }
    }

    const FIVE_MINUTES: Duration = Duration::from_secs(300);

    fn ahead() -> Skewed {
        Skewed(FIVE_MINUTES, true)
    }

    fn behind() -> Skewed {
        Skewed(FIVE_MINUTES, false)
    }

    // ---- the server's clock --------------------------------------------------

    #[test]
    fn a_node_whose_clock_is_five_minutes_ahead_leases_heartbeats_and_is_rescued_on_time(
    ) -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        let fast = db.queue(QueueOptions::new().clock(ahead()))?;
        let normal = db.queue(QueueOptions::new())?;
        let slow = db.queue(QueueOptions::new().clock(behind()))?;

        // A job enqueued by a node behind is due at once for the others.
        let id = slow.enqueue(NewJob::new("k", json!(1)))?.id;
        let ttl = Duration::from_secs(2);
        let request = LeaseRequest::new("fast", 1).ttl(ttl);
        let leased = fast.lease(&request)?;
        assert_eq!(leased.len(), 1, "the job enqueued behind is due at once");
        let job = &leased[0];
        assert_eq!(job.id, id);
        // The lease runs from the server's now, not the node's.
        let until = us(job.lease_until) - db.server_now()?;
        assert!(until > 0 && until <= 2_100_000, "lease ends in {until} µs");

        // Heartbeats keep it past its TTL; the fast node's rescuer, whose
        // clock says the lease ran out minutes ago, rescues nothing.
        let start = Instant::now();
        while start.elapsed() < ttl * 2 {
            let report = fast.heartbeat(&[job.lease()], ttl)?;
            assert_eq!(report.extended, vec![job.lease()]);
            assert_eq!(
                fast.rescue(10)?.rescued,
                0,
                "rescued early by the fast node"
            );
            assert_eq!(normal.rescue(10)?.rescued, 0, "rescued early");
            thread::sleep(Duration::from_millis(400));
        }

        // Unattended, it is rescued once the TTL passes: not minutes later.
        let stopped = Instant::now();
        let mut rescued = 0;
        while rescued == 0 {
            assert!(
                stopped.elapsed() < ttl + Duration::from_secs(3),
                "not rescued within the TTL"
            );
            thread::sleep(Duration::from_millis(100));
            rescued = normal.rescue(10)?.rescued;
        }
        assert!(stopped.elapsed() >= ttl - Duration::from_millis(500));
        assert!(fast.complete(job, None).is_err_and(|e| e.is_lease_lost()));
        // It kept its place in line: due now by the server, not by a node.
        let record = normal.get(id)?;
        assert_eq!(record.state, JobState::Available);
        let again = normal.lease(&LeaseRequest::new("normal", 1))?;
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempt, 2);
        Ok(())
    }

    /// A multi-row insert reads the server's clock too, the rows that leave
    /// priority, max attempts and the delay to the schema (MariaDB's short
    /// text) and those that bind them.
    #[test]
    fn a_batch_is_stamped_by_the_servers_clock_whatever_its_rows_bind() -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        let fast = db.queue(QueueOptions::new().clock(ahead()))?;
        let before = db.server_now()?;
        let plain = fast.enqueue_many((0..5).map(|i| NewJob::new("k", json!(i))))?;
        let mixed = fast.enqueue_many((0..5).map(|i| {
            let job = NewJob::new("k", json!(i));
            if i == 2 {
                job.delay(Duration::from_secs(60)).priority(3)
            } else {
                job
            }
        }))?;
        let after = db.server_now()?;
        for (i, e) in plain.iter().chain(&mixed).enumerate() {
            let job = fast.get(e.id)?;
            assert!(
                (before..=after).contains(&us(job.created_at)),
                "{i}: {job:?}"
            );
            let delayed = i == 7;
            let delay = if delayed { 60_000_000 } else { 0 };
            assert_eq!(us(job.available_at) - us(job.created_at), delay, "{i}");
            assert_eq!(job.priority, if delayed { 3 } else { 0 }, "{i}");
            assert_eq!(job.max_attempts, backlog::DEFAULT_MAX_ATTEMPTS, "{i}");
        }
        Ok(())
    }

    #[test]
    fn schedules_and_stamps_come_from_the_servers_clock() -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        let fast = db.queue(QueueOptions::new().clock(ahead()))?;
        let slow = db.queue(QueueOptions::new().clock(behind()))?;
        let before = db.server_now()?;
        let now_id = fast.enqueue(NewJob::new("k", json!(1)))?.id;
        let later_id = slow
            .enqueue(NewJob::new("k", json!(2)).delay(Duration::from_secs(60)))?
            .id;
        let after = db.server_now()?;

        let now = fast.get(now_id)?;
        assert!((before..=after).contains(&us(now.created_at)), "{now:?}");
        assert!((before..=after).contains(&us(now.available_at)));
        let later = slow.get(later_id)?;
        let delay = us(later.available_at) - us(later.created_at);
        assert_eq!(delay, 60_000_000, "the delay is kept exactly");
        assert_eq!(later.state, JobState::Scheduled);
        // The fast node sees the same states: nothing is due early.
        assert_eq!(fast.get(later_id)?.state, JobState::Scheduled);

        // A failure's error is stamped by the server too.
        let job = fast.lease(&LeaseRequest::new("w", 10))?;
        let job = job.first().ok_or("the due job was not leased")?;
        fast.fail(job, "boom")?;
        let failed = fast.get(job.id)?;
        let stamped = failed.errors.first().ok_or("no error recorded")?.at;
        let stamped = us(stamped);
        let server = db.server_now()?;
        assert!(
            server - stamped < 10_000_000 && stamped <= server,
            "{failed:?}"
        );
        // The backoff counts from the server's now.
        assert!(us(failed.available_at) - stamped <= 2_000_000, "{failed:?}");
        Ok(())
    }

    // ---- batches ------------------------------------------------------------------

    #[test]
    fn a_large_batch_enqueue_returns_each_jobs_id_in_input_order() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        let before = queue.enqueue(NewJob::new("k", json!("old")).unique_key("key-3"))?;
        // 300 jobs span several multi-row inserts; every seventh has one of
        // five keys, one of which a live job holds already.
        let jobs: Vec<NewJob> = (0..300)
            .map(|i| {
                let job = NewJob::new("k", json!(i));
                if i % 7 == 0 {
                    job.unique_key(format!("key-{}", i % 5))
                } else {
                    job
                }
            })
            .collect();
        let ids = queue.enqueue_many(jobs)?;
        assert_eq!(ids.len(), 300);
        let mut first_of_key = std::collections::HashMap::new();
        first_of_key.insert("key-3".to_owned(), before.id);
        for (i, e) in ids.iter().enumerate() {
            let record = queue.get(e.id)?;
            if i % 7 == 0 {
                let key = format!("key-{}", i % 5);
                let seen = first_of_key.contains_key(&key);
                let first = *first_of_key.entry(key.clone()).or_insert(e.id);
                assert_eq!(e.id, first, "{i}: {key}");
                assert_eq!(e.existed, seen, "{i}");
                assert_eq!(record.unique_key.as_deref(), Some(key.as_str()));
            } else {
                assert!(!e.existed, "{i}");
                assert_eq!(record.payload, i.to_string(), "{i}");
            }
        }
        Ok(())
    }

    #[test]
    fn a_batch_of_completions_fences_each_lease_and_keeps_each_result() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        queue.enqueue_many((0..5).map(|i| NewJob::new("k", json!(i))))?;
        let jobs = queue.lease(&LeaseRequest::new("w", 5))?;
        queue.delete(jobs[2].id)?; // its lease is gone
        let results = queue.settle_many(jobs.iter().enumerate().map(|(i, job)| {
            let result = (i % 2 == 0).then(|| json!({"n": i, "text": "a \"quoted\" ✓"}));
            (job, Outcome::Complete(result))
        }))?;
        for (i, (job, result)) in jobs.iter().zip(&results).enumerate() {
            if i == 2 {
                assert!(matches!(result, Err(e) if e.is_lease_lost()), "{result:?}");
                continue;
            }
            assert!(result.is_ok(), "{i}: {result:?}");
            let record = queue.get(job.id)?;
            assert_eq!(record.state.as_str(), "completed");
            assert_eq!(record.worker.as_deref(), Some("w"));
            let stored: Option<Value> = record
                .result
                .map(|r| serde_json::from_str(&r))
                .transpose()?;
            let wanted = (i % 2 == 0).then(|| json!({"n": i, "text": "a \"quoted\" ✓"}));
            assert_eq!(stored, wanted, "{i}");
        }
        // A second completion of the same leases changes nothing.
        let again = queue.complete_many(&jobs)?;
        assert!(again
            .iter()
            .all(|r| matches!(r, Err(e) if e.is_lease_lost())));
        Ok(())
    }

    #[test]
    fn a_heartbeat_does_not_wait_for_a_transaction_completing_one_of_its_jobs() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new().write_deadline(Duration::from_secs(3)))?;
        queue.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i))))?;
        let jobs = queue.lease(&LeaseRequest::new("w", 2))?;
        let leases = [jobs[0].lease(), jobs[1].lease()];
        let report = queue.transaction(|tx| -> TestResult<_> {
            queue.complete_in(tx, &jobs[0], None)?; // locks its row until commit
            let other = queue.clone();
            let beat = thread::spawn(move || {
                let start = Instant::now();
                (
                    other.heartbeat(&leases, Duration::from_secs(30)),
                    start.elapsed(),
                )
            });
            let (report, took) = beat.join().map_err(|_| "heartbeat panicked")?;
            assert!(
                took < Duration::from_secs(1),
                "the heartbeat waited {took:?}"
            );
            Ok(report?)
        })?;
        assert_eq!(report.extended, vec![jobs[1].lease()]);
        assert!(report.lost.is_empty(), "{report:?}");
        assert_eq!(queue.get(jobs[0].id)?.state.as_str(), "completed");
        let after = queue.heartbeat(&leases, Duration::from_secs(30))?;
        assert_eq!(after.lost, vec![jobs[0].lease()]);
        Ok(())
    }

    // ---- connections -----------------------------------------------------------

    #[test]
    fn killed_connections_are_replaced_and_calls_carry_on() -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new().pool_size(2))?;
        let first = queue.enqueue(NewJob::new("k", json!(1)))?.id;
        assert!(db.kill_sessions()? > 0);
        // Each call finds its connection dead, and runs on a fresh one.
        let second = queue.enqueue(NewJob::new("k", json!(2)))?.id;
        assert_eq!(queue.get(first)?.state, JobState::Available);
        db.kill_sessions()?;
        let jobs = queue.lease(&LeaseRequest::new("w", 10))?;
        assert_eq!(jobs.len(), 2);
        db.kill_sessions()?;
        for result in queue.complete_many(&jobs)? {
            result?;
        }
        db.kill_sessions()?;
        assert_eq!(queue.get(second)?.state.as_str(), "completed");
        Ok(())
    }

    #[test]
    fn a_worker_whose_connections_are_killed_completes_every_job_exactly_once() -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        const JOBS: i64 = 200;
        db.conn()?
            .query_drop("CREATE TABLE effects (job_id BIGINT NOT NULL PRIMARY KEY)")?;
        let queue = db.queue(QueueOptions::new().pool_size(4))?;
        queue.enqueue_many((0..JOBS).map(|i| NewJob::new("work", json!(i))))?;

        let worker = Worker::builder(queue.clone())
            .concurrency(4)
            .lease_ttl(Duration::from_secs(5))
            .rescue_interval(Duration::from_millis(500))
            .handle_raw("work", |_: Value, ctx| {
                thread::sleep(Duration::from_millis(2));
                ctx.transaction(|tx| {
                    // A primary key: a second effect for a job would fail.
                    tx.exec_drop("INSERT INTO effects (job_id) VALUES (?)", (ctx.id(),))?;
                    Ok(())
                })
            })
            .start()?;
        let stop = Arc::new(AtomicBool::new(false));
        let killer = {
            let stop = stop.clone();
            let mut admin = Conn::new(Opts::from_url(&db.url)?)?;
            let name = db.name.clone();
            thread::spawn(move || -> Result<usize, String> {
                let mut kills = 0;
                while !stop.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(150));
                    let ids: Vec<u64> = admin
                        .exec(
                            "SELECT ID FROM information_schema.PROCESSLIST \
                             WHERE DB = ? AND ID <> CONNECTION_ID()",
                            (&name,),
                        )
                        .map_err(|e| e.to_string())?;
                    for id in ids {
                        if admin.query_drop(format!("KILL CONNECTION {id}")).is_ok() {
                            kills += 1;
                        }
                    }
                }
                Ok(kills)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut done = 0;
        while done < JOBS && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(200));
            // On the admin session, which is on another database: the killer
            // spares it.
            done = db
                .admin
                .query_first::<i64, _>(format!(
                    "SELECT count(*) FROM {}.backlog_history WHERE status = 'completed'",
                    db.name
                ))?
                .unwrap_or(0);
        }
        stop.store(true, Ordering::SeqCst);
        let kills = killer.join().map_err(|_| "killer panicked")??;
        worker.shutdown(Duration::from_secs(10))?;
        assert!(kills > 0, "no connection was killed");
        assert_eq!(done, JOBS, "completed jobs after {kills} killed sessions");
        let effects: Option<i64> = db
            .admin
            .query_first(format!("SELECT count(*) FROM {}.effects", db.name))?;
        assert_eq!(effects, Some(JOBS), "every effect exactly once");
        Ok(())
    }

    // ---- lock conflicts ------------------------------------------------------------

    #[test]
    fn a_deadlock_is_retried_inside_the_call_and_counted() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        queue.enqueue_many((0..2).map(|i| NewJob::new("k", json!(i))))?;
        queue.enqueue_many((0..50).map(|i| NewJob::new("k", json!(i)).queue("filler")))?;
        let jobs = queue.lease(&LeaseRequest::new("w", 2))?;
        let (a, b) = (jobs[0].id.min(jobs[1].id), jobs[0].id.max(jobs[1].id));

        // The application's transaction: heavy (50 rows changed, so InnoDB
        // picks the queue's as the deadlock victim), holding job b.
        let mut app = db.conn()?;
        let mut tx = app.start_transaction(backlog::mysql::mysql::TxOpts::default())?;
        // (By id range: a scan of the small table would lock a and b too.)
        tx.exec_drop(
            "UPDATE backlog_jobs SET updated_at = updated_at + 1 WHERE id > ?",
            (b,),
        )?;
        tx.exec_drop("SELECT id FROM backlog_jobs WHERE id = ? FOR UPDATE", (b,))?;

        // The queue fails both jobs in one transaction: a, then waits for b.
        let settling = {
            let queue = queue.clone();
            let jobs = jobs.clone();
            thread::spawn(move || {
                queue
                    .settle_many(jobs.iter().map(|j| (j, Outcome::fail("boom"))))
                    .map(|results| results.into_iter().collect::<backlog::Result<Vec<_>>>())
            })
        };
        thread::sleep(Duration::from_millis(500));
        // Now the application wants a: a deadlock, and the queue's
        // transaction is rolled back.
        tx.exec_drop("SELECT id FROM backlog_jobs WHERE id = ? FOR UPDATE", (a,))?;
        thread::sleep(Duration::from_millis(100));
        tx.commit()?;
        settling.join().map_err(|_| "settle panicked")???;
        assert!(queue.busy_retries() >= 1, "the deadlock was not retried");
        for id in [a, b] {
            assert_eq!(queue.get(id)?.state, JobState::Retrying, "{id}");
        }
        Ok(())
    }

    #[test]
    fn a_lock_held_past_the_write_deadline_is_busy() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new().write_deadline(Duration::from_secs(1)))?;
        let id = queue.enqueue(NewJob::new("k", json!(1)))?.id;
        let mut app = db.conn()?;
        let mut tx = app.start_transaction(backlog::mysql::mysql::TxOpts::default())?;
        tx.exec_drop("SELECT id FROM backlog_jobs WHERE id = ? FOR UPDATE", (id,))?;
        let start = Instant::now();
        let cancelled = queue.cancel(id);
        assert!(matches!(cancelled, Err(Error::Busy)), "{cancelled:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        tx.rollback()?;
        queue.cancel(id)?;
        Ok(())
    }

    // ---- wake-ups --------------------------------------------------------------

    #[test]
    fn a_worker_notices_another_nodes_enqueue_within_the_poll_interval() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let worker_node = db.queue(QueueOptions::new())?;
        let producer_node = db.queue(QueueOptions::new())?;
        let events = worker_node.subscribe();
        // An idle poll of a minute: only the poller can wake the fetcher.
        let worker = Worker::builder(worker_node.clone())
            .poll_interval(Duration::from_secs(60))
            .handle_raw("k", |_: Value, _| Ok(()))
            .start()?;
        thread::sleep(Duration::from_millis(300)); // past the first idle lease
        let mut pickups = Vec::new();
        for i in 0..5 {
            let enqueued_at = Instant::now();
            let id = producer_node.enqueue(NewJob::new("k", json!(i)))?.id;
            loop {
                match events.recv_timeout(Duration::from_secs(5))? {
                    Event::Completed { job_id } if job_id == id => break,
                    _ => {}
                }
            }
            pickups.push(enqueued_at.elapsed());
        }
        worker.shutdown(Duration::from_secs(5))?;
        let slowest = pickups.iter().max().copied().unwrap_or_default();
        assert!(
            slowest < Duration::from_millis(500),
            "pickups {pickups:?}: the poller should wake the worker within tens of ms"
        );
        Ok(())
    }

    // ---- plans and schema ------------------------------------------------------

    #[test]
    fn the_lease_walks_the_lease_index_without_sorting() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        queue.enqueue_many((0..200).map(|i| {
            NewJob::new("k", json!(i))
                .priority(i % 3)
                .queue(if i % 2 == 0 { "a" } else { "b" })
        }))?;
        let one = queue.explain_lease(&LeaseRequest::new("w", 10).queues(["a"]))?;
        let plan = one.join("\n");
        assert!(plan.contains("key=jobs_lease"), "{plan}");
        assert!(!plan.to_lowercase().contains("filesort"), "{plan}");

        let two = queue.explain_lease(
            &LeaseRequest::new("w", 10)
                .queues(["a", "b"])
                .kinds(["k", "other"]),
        )?;
        let walks: Vec<&String> = two.iter().filter(|l| l.contains("table=")).collect();
        let plan = two.join("\n");
        assert!(
            walks
                .iter()
                .filter(|l| l.contains("backlog_jobs"))
                .all(|l| l.contains("key=jobs_lease") && !l.to_lowercase().contains("filesort")),
            "each queue's walk reads the index in order:\n{plan}"
        );
        assert_eq!(
            walks
                .iter()
                .filter(|l| l.contains("key=jobs_lease"))
                .count(),
            2,
            "{plan}"
        );
        Ok(())
    }

    #[test]
    fn names_and_keys_compare_byte_for_byte() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        let names = ["mail", "Mail", "mail ", "mäil", "📨"];
        for name in names {
            let e = queue.enqueue(NewJob::new("k", json!(name)).queue(name).unique_key(name))?;
            assert!(!e.existed, "{name:?} collided with another name");
        }
        for name in names {
            let jobs = queue.lease(&LeaseRequest::new("w", 10).queues([name]))?;
            assert_eq!(jobs.len(), 1, "{name:?}");
            assert_eq!(jobs[0].queue, name);
            assert_eq!(jobs[0].unique_key.as_deref(), Some(name));
        }
        Ok(())
    }

    #[test]
    fn payloads_nest_as_deep_as_the_engine_accepts_and_read_back_unchanged() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let queue = db.queue(QueueOptions::new())?;
        let depth = backlog::MAX_JSON_DEPTH;
        let text = "[".repeat(depth) + &"]".repeat(depth);
        let deep: Value = serde_json::from_str(&text)?;
        let id = queue.enqueue(NewJob::new("k", deep.clone()))?.id;
        let job = queue.lease(&LeaseRequest::new("w", 1))?;
        assert_eq!(job[0].payload_value()?, deep);
        let spaced = r#"{"b": 1,  "a": [1, 2.50, "x"]}"#;
        queue.complete(&job[0], Some(serde_json::from_str(spaced)?))?;
        assert_eq!(queue.get(id)?.payload, text, "stored as given");
        Ok(())
    }

    #[test]
    fn two_table_prefixes_share_one_database_apart() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let one = db.queue(QueueOptions::new().table_prefix("app1_"))?;
        let two = db.queue(QueueOptions::new().table_prefix("app2_"))?;
        one.enqueue(NewJob::new("k", json!(1)))?;
        one.enqueue(NewJob::new("k", json!(2)))?;
        two.enqueue(NewJob::new("k", json!(3)))?;
        assert_eq!(one.lease(&LeaseRequest::new("w", 10))?.len(), 2);
        assert_eq!(two.lease(&LeaseRequest::new("w", 10))?.len(), 1);
        let mut conn = db.conn()?;
        let tables: Vec<String> = conn.query("SHOW TABLES")?;
        for table in [
            "app1_jobs",
            "app1_history",
            "app1_queues",
            "app1_schema_history",
            "app1_schedules",
            "app2_jobs",
        ] {
            assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
        }
        assert!(
            !tables.iter().any(|t| t.starts_with("backlog_")),
            "{tables:?}"
        );
        Ok(())
    }

    #[test]
    fn nodes_migrating_at_once_apply_the_schema_once() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let url = db.url.clone();
        let nodes: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                thread::spawn(move || Queue::connect(&url).map(|_| ()))
            })
            .collect();
        for node in nodes {
            node.join().map_err(|_| "node panicked")??;
        }
        let mut conn = db.conn()?;
        // Each migration in migrations/mysql recorded once.
        let versions = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/mysql"))?
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".sql"))
            })
            .count();
        assert!(versions >= 14, "{versions} migrations found");
        let applied: Vec<(i64, i64)> = conn.query(
            "SELECT version, count(*) FROM backlog_schema_history GROUP BY version ORDER BY version",
        )?;
        let once: Vec<(i64, i64)> = (1..=versions as i64).map(|v| (v, 1)).collect();
        assert_eq!(applied, once);
        Ok(())
    }

    // ---- URLs --------------------------------------------------------------------

    #[test]
    fn a_password_never_shows_in_errors_or_debug_output() -> TestResult {
        let Some(mut db) = TestDb::create()? else {
            return Ok(());
        };
        let user = db.name.clone();
        let password = "s3cret-Pa55";
        db.admin.query_drop(format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"
        ))?;
        db.admin
            .query_drop(format!("GRANT ALL ON {}.* TO '{user}'@'%'", db.name))?;
        let host_and_db = without_user(&db.url);
        let good = format!("mysql://{user}:{password}@{host_and_db}");
        let result = (|| -> TestResult {
            let queue = Queue::connect(&good)?;
            queue.enqueue(NewJob::new("k", json!(1)))?;
            let shown = format!("{queue:?}");
            assert!(!shown.contains(password), "{shown}");
            let bad = format!("mysql://{user}:wrong-{password}@{host_and_db}");
            let e = Queue::connect(&bad)
                .err()
                .ok_or("a wrong password connected")?;
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(password), "{shown}");
            Ok(())
        })();
        db.admin.query_drop(format!("DROP USER '{user}'@'%'"))?;
        result
    }

    #[test]
    fn a_url_without_a_database_is_refused_and_mariadb_urls_work() -> TestResult {
        let Some(db) = TestDb::create()? else {
            return Ok(());
        };
        let root = db.url.rsplit_once('/').map_or(db.url.as_str(), |(r, _)| r);
        match Queue::connect(&format!("{root}/")) {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("database"), "{why}"),
            other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
        }
        let mariadb = db.url.replacen("mysql://", "mariadb://", 1);
        Queue::connect(&mariadb)?.enqueue(NewJob::new("k", json!(1)))?;
        Ok(())
    }
}

/// A point in time as unix µs, as the server stores it.
#[cfg(feature = "mysql")]
fn us(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
