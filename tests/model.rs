//! Model-based property test: random sequences of queue operations, each
//! checked against a simple in-memory model of where every job is.
//!
//! After every step the database must agree with the model exactly (which jobs
//! are live, leased with which token, attempts, due times, which are in
//! history with which status), and these invariants must hold: at most one
//! valid lease per job, each job in exactly one place, attempts never above
//! max_attempts, and a write with a stale token changes nothing.
//!
//! `PROPTEST_CASES` sets the number of cases (256 by default).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use backlog::{
    Durability, Error, FinalStatus, Job, LeaseRequest, ManualClock, NewJob, Queue, QueueOptions,
    Retention, RetryPolicy,
};
use proptest::prelude::*;
use rusqlite::Connection;
use serde_json::json;

const TTL: Duration = Duration::from_secs(30);
const QUEUES: [&str; 2] = ["alpha", "beta"];
const SEC: i64 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        queue: usize,
        priority: i32,
        delay_secs: u64,
        max_attempts: u32,
        unique: Option<u8>,
    },
    EnqueueInvalid(u8),
    Lease(usize),
    Complete(usize),
    Fail(usize),
    Snooze(usize, u64),
    Release(usize),
    Heartbeat,
    Rescue,
    Advance(u64),
    Pause(usize),
    Resume(usize),
    Prune,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, -1..=1i32, prop_oneof![Just(0u64), 1..20u64], 1..=3u32, proptest::option::of(0..3u8))
            .prop_map(|(queue, priority, delay_secs, max_attempts, unique)| Op::Enqueue {
                queue, priority, delay_secs, max_attempts, unique
            }),
        1 => (0..4u8).prop_map(Op::EnqueueInvalid),
        3 => (1..=3usize).prop_map(Op::Lease),
        2 => any::<usize>().prop_map(Op::Complete),
        2 => any::<usize>().prop_map(Op::Fail),
        1 => (any::<usize>(), 0..10u64).prop_map(|(p, s)| Op::Snooze(p, s)),
        1 => any::<usize>().prop_map(Op::Release),
        1 => Just(Op::Heartbeat),
        1 => Just(Op::Rescue),
        2 => prop_oneof![0..5u64, 25..40u64].prop_map(Op::Advance),
        1 => (0..2usize).prop_map(Op::Pause),
        1 => (0..2usize).prop_map(Op::Resume),
        1 => Just(Op::Prune),
        1 => Just(Op::Reopen),
    ]
}

/// A live row as read back: attempts, max_attempts, lease_token, lease_until, available_at.
type LiveRow = (u32, u32, Option<i64>, Option<i64>, i64);

#[derive(Debug, Clone, PartialEq)]
enum Place {
    Live {
        lease: Option<(i64, i64)>, // (token, lease_until)
    },
    Finished(FinalStatus, i64), // status, finished_at
    Pruned,
}

#[derive(Debug, Clone)]
struct ModelJob {
    queue: usize,
    priority: i32,
    unique: Option<String>,
    attempts: u32,
    max_attempts: u32,
    available_at: i64,
    place: Place,
}

struct World {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    clock: ManualClock,
    queue: Queue,
    raw: Connection,
    jobs: BTreeMap<i64, ModelJob>,
    leases: Vec<Job>,
    paused: BTreeSet<usize>,
}

fn open(path: &Path, clock: &ManualClock) -> Queue {
    QueueOptions::new()
        .durability(Durability::Fast)
        .clock(clock.clone())
        .open(path)
        .expect("open queue")
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.db");
        let clock = ManualClock::at(
            std::time::UNIX_EPOCH + std::time::Duration::from_micros((1_700_000_000 * SEC) as u64),
        );
        let queue = open(&path, &clock);
        let raw = Connection::open(&path).expect("raw connection");
        World {
            _dir: dir,
            path,
            clock,
            queue,
            raw,
            jobs: BTreeMap::new(),
            leases: Vec::new(),
            paused: BTreeSet::new(),
        }
    }

    fn now(&self) -> i64 {
        let since = self.queue.now().duration_since(std::time::UNIX_EPOCH);
        since.map_or(0, |d| d.as_micros() as i64)
    }

    fn is_current(&self, job: &Job) -> bool {
        matches!(
            self.jobs.get(&job.id).map(|j| &j.place),
            Some(Place::Live { lease: Some((token, _)) }) if *token == job.lease_token
        )
    }

    fn pick(&self, n: usize) -> Option<Job> {
        if self.leases.is_empty() {
            None
        } else {
            Some(self.leases[n % self.leases.len()].clone())
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now();
        match op.clone() {
            Op::Enqueue {
                queue,
                priority,
                delay_secs,
                max_attempts,
                unique,
            } => {
                let unique = unique.map(|u| format!("key-{u}"));
                let mut job = NewJob::new("model", json!({"n": self.jobs.len()}))
                    .queue(QUEUES[queue])
                    .priority(priority)
                    .delay(Duration::from_secs(delay_secs))
                    .max_attempts(max_attempts);
                if let Some(key) = &unique {
                    job = job.unique_key(key.clone());
                }
                let enqueued = self.queue.enqueue(job).map_err(fail)?;
                let holder = unique.as_ref().and_then(|key| {
                    self.jobs.iter().find_map(|(id, j)| {
                        (j.queue == queue
                            && j.unique.as_ref() == Some(key)
                            && matches!(j.place, Place::Live { .. }))
                        .then_some(*id)
                    })
                });
                match holder {
                    Some(id) => {
                        prop_assert!(enqueued.existed, "duplicate key inserted a job");
                        prop_assert_eq!(enqueued.id, id);
                    }
                    None => {
                        prop_assert!(!enqueued.existed);
                        prop_assert!(!self.jobs.contains_key(&enqueued.id), "id reused");
                        self.jobs.insert(
                            enqueued.id,
                            ModelJob {
                                queue,
                                priority,
                                unique,
                                attempts: 0,
                                max_attempts,
                                available_at: now + delay_secs as i64 * SEC,
                                place: Place::Live { lease: None },
                            },
                        );
                    }
                }
            }
            Op::EnqueueInvalid(which) => {
                let job = match which {
                    0 => NewJob::new("", json!(1)),
                    1 => NewJob::from_json_str("model", "{not json"),
                    2 => NewJob::new("model", json!(1)).max_attempts(0),
                    _ => NewJob::new("model", json!(1)).delay_secs(-1.0),
                };
                let err = self.queue.enqueue(job).err();
                prop_assert!(
                    err.as_ref().is_some_and(Error::is_invalid_input),
                    "invalid enqueue gave {:?}",
                    err
                );
            }
            Op::Lease(n) => {
                let mut expected: Vec<(i64, &ModelJob)> = self
                    .jobs
                    .iter()
                    .filter(|(_, j)| {
                        j.place == Place::Live { lease: None }
                            && j.available_at <= now
                            && !self.paused.contains(&j.queue)
                    })
                    .map(|(id, j)| (*id, j))
                    .collect();
                expected.sort_by(|(a_id, a), (b_id, b)| {
                    b.priority
                        .cmp(&a.priority)
                        .then(a.available_at.cmp(&b.available_at))
                        .then(a_id.cmp(b_id))
                });
                let expected: Vec<i64> = expected.iter().take(n).map(|(id, _)| *id).collect();
                let leased = self
                    .queue
                    .lease(&LeaseRequest::new("model-worker", n).queues(QUEUES).ttl(TTL))
                    .map_err(fail)?;
                let got: Vec<i64> = leased.iter().map(|j| j.id).collect();
                prop_assert_eq!(got, expected, "lease picked the wrong jobs");
                for job in leased {
                    let m = self.jobs.get_mut(&job.id).expect("modelled");
                    m.attempts += 1;
                    prop_assert_eq!(job.attempt, m.attempts);
                    m.place = Place::Live {
                        lease: Some((job.lease_token, now + TTL.as_micros() as i64)),
                    };
                    self.leases.push(job);
                }
            }
            Op::Complete(n) => {
                let Some(job) = self.pick(n) else {
                    return Ok(());
                };
                let current = self.is_current(&job);
                let result = self.queue.complete(&job, Some(json!("done")));
                self.expect_fenced(&job, current, result)?;
                if current {
                    self.jobs.get_mut(&job.id).expect("modelled").place =
                        Place::Finished(FinalStatus::Completed, now);
                }
            }
            Op::Fail(n) => {
                let Some(job) = self.pick(n) else {
                    return Ok(());
                };
                let current = self.is_current(&job);
                let result = self.queue.fail(&job, "boom");
                self.expect_fenced(&job, current, result)?;
                if current {
                    let m = self.jobs.get_mut(&job.id).expect("modelled");
                    if m.attempts >= m.max_attempts {
                        m.place = Place::Finished(FinalStatus::Dead, now);
                    } else {
                        let available_at: i64 = self
                            .raw
                            .query_row(
                                "SELECT available_at FROM backlog_jobs WHERE id = ?1",
                                [job.id],
                                |r| r.get(0),
                            )
                            .map_err(fail)?;
                        let policy = RetryPolicy::default();
                        let low = policy.backoff_with(m.attempts, -1.0).as_micros() as i64;
                        let high = policy.backoff_with(m.attempts, 1.0).as_micros() as i64;
                        let wait = available_at - now;
                        prop_assert!(
                            (low - 1..=high + 1).contains(&wait),
                            "backoff {} outside [{}, {}]",
                            wait,
                            low,
                            high
                        );
                        m.available_at = available_at;
                        m.place = Place::Live { lease: None };
                    }
                }
            }
            Op::Snooze(n, secs) => {
                let Some(job) = self.pick(n) else {
                    return Ok(());
                };
                let current = self.is_current(&job);
                let result = self.queue.snooze(&job, Duration::from_secs(secs));
                self.expect_fenced(&job, current, result)?;
                if current {
                    let m = self.jobs.get_mut(&job.id).expect("modelled");
                    m.attempts -= 1;
                    m.available_at = now + secs as i64 * SEC;
                    m.place = Place::Live { lease: None };
                }
            }
            Op::Release(n) => {
                let Some(job) = self.pick(n) else {
                    return Ok(());
                };
                let current = self.is_current(&job);
                let result = self.queue.release(&job);
                self.expect_fenced(&job, current, result)?;
                if current {
                    let m = self.jobs.get_mut(&job.id).expect("modelled");
                    m.attempts -= 1;
                    m.available_at = now;
                    m.place = Place::Live { lease: None };
                }
            }
            Op::Heartbeat => {
                let mut leases: Vec<_> = self.leases.iter().map(Job::lease).collect();
                leases.sort_by_key(|l| (l.job_id, l.token));
                leases.dedup();
                let report = self.queue.heartbeat(&leases, TTL).map_err(fail)?;
                let expected: HashSet<_> = self
                    .leases
                    .iter()
                    .filter(|j| self.is_current(j))
                    .map(Job::lease)
                    .collect();
                let extended: HashSet<_> = report.extended.iter().copied().collect();
                prop_assert_eq!(&extended, &expected);
                prop_assert_eq!(report.extended.len() + report.lost.len(), leases.len());
                for lease in &report.extended {
                    let m = self.jobs.get_mut(&lease.job_id).expect("modelled");
                    m.place = Place::Live {
                        lease: Some((lease.token, now + TTL.as_micros() as i64)),
                    };
                }
            }
            Op::Rescue => {
                let report = self.queue.rescue(1000).map_err(fail)?;
                let (mut rescued, mut dead) = (0, 0);
                for m in self.jobs.values_mut() {
                    if let Place::Live {
                        lease: Some((_, until)),
                    } = m.place
                    {
                        if until < now {
                            if m.attempts >= m.max_attempts {
                                m.place = Place::Finished(FinalStatus::Dead, now);
                                dead += 1;
                            } else {
                                // Rescue keeps the job's place in line.
                                m.place = Place::Live { lease: None };
                                m.available_at = m.available_at.min(now);
                                rescued += 1;
                            }
                        }
                    }
                }
                prop_assert_eq!((report.rescued, report.dead), (rescued, dead));
            }
            Op::Advance(secs) => self.clock.advance(Duration::from_secs(secs)),
            Op::Pause(q) => {
                self.queue.pause(QUEUES[q]).map_err(fail)?;
                self.paused.insert(q);
            }
            Op::Resume(q) => {
                self.queue.resume(QUEUES[q]).map_err(fail)?;
                self.paused.remove(&q);
            }
            Op::Prune => {
                let retention = Retention {
                    completed: Some(Duration::ZERO),
                    discarded: None,
                    cancelled: None,
                    dead: None,
                };
                let deleted = self.queue.prune_history(&retention, 1000).map_err(fail)?;
                let mut expected = 0;
                for m in self.jobs.values_mut() {
                    if let Place::Finished(FinalStatus::Completed, at) = m.place {
                        if at < now {
                            m.place = Place::Pruned;
                            expected += 1;
                        }
                    }
                }
                prop_assert_eq!(deleted, expected);
            }
            Op::Reopen => {
                self.queue = open(&self.path, &self.clock);
            }
        }
        Ok(())
    }

    /// A settle with the current token succeeds; with a stale one it is
    /// `LeaseLost` and the row is untouched (checked by `check` afterwards).
    fn expect_fenced(
        &self,
        job: &Job,
        current: bool,
        result: backlog::Result<()>,
    ) -> Result<(), TestCaseError> {
        match (current, result) {
            (true, Ok(())) => Ok(()),
            (false, Err(Error::LeaseLost { job_id })) if job_id == job.id => Ok(()),
            (current, result) => Err(TestCaseError::fail(format!(
                "settle of job {} (current lease: {current}) gave {result:?}",
                job.id
            ))),
        }
    }

    /// The database agrees with the model, and the invariants hold.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut stmt = self
            .raw
            .prepare("SELECT id, attempts, max_attempts, lease_token, lease_until, available_at FROM backlog_jobs")
            .map_err(fail)?;
        let live: BTreeMap<i64, LiveRow> = stmt
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
                ))
            })
            .map_err(fail)?
            .collect::<Result<_, _>>()
            .map_err(fail)?;
        let mut stmt = self
            .raw
            .prepare("SELECT id, status, attempts, max_attempts FROM backlog_history")
            .map_err(fail)?;
        let history: BTreeMap<i64, (String, u32, u32)> = stmt
            .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))
            .map_err(fail)?
            .collect::<Result<_, _>>()
            .map_err(fail)?;

        for (id, (attempts, max, ..)) in &live {
            prop_assert!(
                attempts <= max,
                "live job {} has {} > {} attempts",
                id,
                attempts,
                max
            );
            prop_assert!(
                !history.contains_key(id),
                "job {} is both live and finished",
                id
            );
        }
        for (id, (_, attempts, max)) in &history {
            prop_assert!(
                attempts <= max,
                "finished job {} has {} > {} attempts",
                id,
                attempts,
                max
            );
        }
        for (id, m) in &self.jobs {
            match &m.place {
                Place::Live { lease } => {
                    let row = live.get(id);
                    prop_assert!(row.is_some(), "job {} lost: not live", id);
                    let (attempts, _, token, until, available_at) =
                        row.cloned().unwrap_or_default();
                    prop_assert_eq!(attempts, m.attempts, "attempts of job {}", id);
                    prop_assert_eq!(token.zip(until), *lease, "lease of job {}", id);
                    if lease.is_none() {
                        prop_assert_eq!(available_at, m.available_at, "due time of job {}", id);
                    }
                }
                Place::Finished(status, _) => {
                    let row = history.get(id);
                    prop_assert!(row.is_some(), "job {} lost: not in history", id);
                    prop_assert_eq!(row.map(|r| r.0.as_str()), Some(status.as_str()));
                    prop_assert_eq!(row.map(|r| r.1), Some(m.attempts));
                }
                Place::Pruned => {
                    prop_assert!(!live.contains_key(id) && !history.contains_key(id));
                }
            }
        }
        let modelled = self
            .jobs
            .values()
            .filter(|m| m.place != Place::Pruned)
            .count();
        prop_assert_eq!(
            live.len() + history.len(),
            modelled,
            "unmodelled rows exist"
        );
        Ok(())
    }
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_agree_with_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut world = World::new();
        for op in &ops {
            world.apply(op)?;
            world.check()?;
        }
        let integrity: String = world
            .raw
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(fail)?;
        prop_assert_eq!(integrity, "ok");
    }
}
