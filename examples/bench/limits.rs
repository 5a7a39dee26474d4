//! The `limits` mode: the cost of a queue limit on burn-down. The same
//! prefilled queue is drained by the same worker three ways, in rotating
//! order within each run: no limit; a global concurrency limit equal to the
//! worker's handler threads (so it never binds: what is measured is the
//! limit's bookkeeping in every lease, not throttling); and that limit plus
//! a rate limit far above the drain's rate (its window is written by every
//! lease). River reports a global limit halving its throughput; the target
//! here is ≤ 10 % (limited / unlimited ≥ 0.9, medians).

use std::path::Path;
use std::time::Duration;

use backlog::{Durability, QueueLimits, Rate};

use crate::db::{durability_name, exactly_once, fresh_db, open_queue, BoxResult};
use crate::report::{Report, Target};
use crate::worker::{drain_with_worker, prefill_in_child};

pub struct Limits {
    pub jobs: usize,
    pub threads: usize,
}

/// One side of the comparison.
fn variants(threads: usize) -> [(&'static str, QueueLimits); 3] {
    let concurrency = Some(u32::try_from(threads).unwrap_or(u32::MAX));
    [
        ("no limit", QueueLimits::default()),
        (
            "concurrency limit = threads",
            QueueLimits {
                concurrency,
                rate: None,
            },
        ),
        (
            "concurrency + rate limit (not binding)",
            QueueLimits {
                concurrency,
                rate: Some(Rate::new(10_000_000, Duration::from_secs(1))),
            },
        ),
    ]
}

pub fn limits(
    report: &mut Report,
    dir: &Path,
    d: Durability,
    l: &Limits,
    run: usize,
) -> BoxResult<()> {
    crate::modes::record_env(report, dir, d)?;
    let dn = durability_name(d);
    let variants = variants(l.threads);
    let mut rates = [0.0f64; 3];
    for k in 0..variants.len() {
        let i = (k + run) % variants.len();
        let (name, limits) = variants[i];
        let path = fresh_db(dir, "limits")?;
        prefill_in_child(&path, l.jobs)?;
        let queue = open_queue(&path, d)?;
        queue.set_limits("default", limits)?;
        let drained = drain_with_worker(&queue, l.jobs, l.threads, 0)?;
        drop(queue);
        rates[i] = l.jobs as f64 / drained.took.as_secs_f64();
        let label = format!("{name}, {} threads", l.threads);
        report.value("limits", dn, &label, "jobs/s", rates[i]);
        report.gate(
            "limits",
            dn,
            &format!("{name}: handlers"),
            drained.handler_gate,
        );
        report.gate(
            "limits",
            dn,
            &format!("{name}: history"),
            exactly_once(&path, l.jobs)?,
        );
    }
    for i in 1..variants.len() {
        report.target(
            "limits",
            dn,
            &format!("{} / no limit", variants[i].0),
            "ratio",
            rates[i] / rates[0],
            Target::AtLeast(0.9),
        );
    }
    Ok(())
}
