//! The `dependencies` mode: what a dependency edge costs, against plain
//! jobs in the same run. Two figures per durability, each the median of its
//! runs:
//!
//! - enqueue: `enqueue_many` batches of jobs that each depend on one live
//!   job (an edge row, the look-up, the move to the pending table), per job,
//!   over the same batches without dependencies. Target ≤ 3 (a plain job is
//!   one row written; one with an edge is three writes and a seek).
//! - release: completing the one job they depend on, which releases them
//!   all in its transaction (a decrement and a move per edge), per released
//!   job, over the plain enqueue per job. Target ≤ 3.
//!
//! A gate checks that every job released is available, none left pending.

use std::path::Path;
use std::time::Instant;

use backlog::{Durability, JobState, LeaseRequest, NewJob};
use serde_json::json;

use crate::db::{durability_name, fresh_db, open_queue, BoxResult, Gate};
use crate::report::{Report, Target};

pub struct Flows {
    pub jobs: usize,
}

const BATCH: usize = 500;

pub fn dependencies(report: &mut Report, dir: &Path, d: Durability, f: &Flows) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    let batches = f.jobs.div_ceil(BATCH);
    let n = batches * BATCH;

    let queue = open_queue(&fresh_db(dir, "plain")?, d)?;
    let start = Instant::now();
    for _ in 0..batches {
        queue.enqueue_many((0..BATCH).map(|i| NewJob::new("k", json!(i))))?;
    }
    let plain = start.elapsed().as_secs_f64() / n as f64;
    drop(queue);

    let queue = open_queue(&fresh_db(dir, "edges")?, d)?;
    let root = queue.enqueue(NewJob::new("root", json!({})))?.id;
    let start = Instant::now();
    for _ in 0..batches {
        queue.enqueue_many((0..BATCH).map(|i| NewJob::new("k", json!(i)).depends_on([root])))?;
    }
    let with_edge = start.elapsed().as_secs_f64() / n as f64;
    let job = queue
        .lease(&LeaseRequest::new("bench", 1))?
        .pop()
        .ok_or("the root was not leased")?;
    let start = Instant::now();
    queue.complete(&job, None)?;
    let release = start.elapsed().as_secs_f64() / n as f64;
    let count = |state| -> BoxResult<u64> {
        Ok(queue
            .counts()?
            .iter()
            .filter(|c| c.state == state)
            .map(|c| c.count)
            .sum())
    };
    let (available, pending) = (count(JobState::Available)?, count(JobState::Pending)?);
    report.gate(
        "dependencies",
        dn,
        "every dependent released",
        Gate {
            ok: available == n as u64 && pending == 0,
            detail: format!("{available} of {n} available, {pending} pending"),
        },
    );

    report.value("dependencies", dn, "plain enqueue", "µs/job", plain * 1e6);
    report.value(
        "dependencies",
        dn,
        "enqueue with an edge",
        "µs/job",
        with_edge * 1e6,
    );
    report.value("dependencies", dn, "release", "µs/edge", release * 1e6);
    report.target(
        "dependencies",
        dn,
        "enqueue with an edge / plain enqueue",
        "ratio",
        with_edge / plain,
        Target::AtMost(3.0),
    );
    report.target(
        "dependencies",
        dn,
        "release per edge / plain enqueue per job",
        "ratio",
        release / plain,
        Target::AtMost(3.0),
    );
    Ok(())
}
