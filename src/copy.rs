//! Moving a queue to another database: [`copy`], what a user who outgrows
//! one SQLite file runs on the day they switch to a server.

use std::collections::HashMap;

use crate::backend::rows::{self, Table};
use crate::error::{Error, Result};
use crate::inspect::{JobFilter, JobState};
use crate::queue::Queue;

/// Jobs and rows read and written per batch.
const BATCH: usize = 500;

/// What [`copy`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Live jobs written to the target (leased ones as available).
    pub live: u64,
    /// Jobs waiting for their dependencies written to the target, still
    /// waiting for the same ones.
    pub pending: u64,
    /// Finished jobs written to the target's history.
    pub history: u64,
    /// Jobs the target already had (the same id, or a live job holding the
    /// same unique key): left as they were.
    pub skipped: u64,
    /// Dependency edges written (every job's, finished ones' included: a
    /// handler reads its dependencies' results through them).
    pub dependencies: u64,
    /// Workflows written, with their steps.
    pub workflows: u64,
    /// Batches written, with their counters, callbacks and live members.
    pub batches: u64,
    /// Sequences written, with their tails (one per queue and key ever
    /// used).
    pub sequences: u64,
    /// Paused queues paused on the target too.
    pub paused_queues: u64,
}

/// The tables copied as they are, before the jobs: a job that finishes on
/// the target as soon as it arrives there finds what waits for it and the
/// batch it counts in. The order among them does not matter (nothing on
/// the target reads them before their jobs arrive).
const FLOW_TABLES: [&Table; 8] = [
    &rows::WORKFLOWS,
    &rows::WORKFLOW_STEPS,
    &rows::BATCHES,
    &rows::BATCH_JOBS,
    &rows::DEPENDENCIES,
    &rows::PENDING,
    &rows::SEQUENCES,
    &rows::SEQUENCE_JOBS,
];

/// Copies every live job and the history of `from` into `to`, keeping ids,
/// attempts, errors, schedules (`available_at`), priorities and unique keys.
/// A job leased at copy time is copied as available, in its place in line:
/// stop the workers on `from` first, or they may finish a job that then also
/// runs on `to`. Paused queues stay paused.
///
/// Dependencies, workflows, batches and sequences come along, with their ids: a job
/// waiting for its dependencies waits on `to` for the same ones (and is
/// cancelled, or released, as it would have been on `from`), a handler
/// reads what its dependencies returned, [`Queue::workflow`] shows the same
/// steps, and a batch keeps its counters, its callbacks and its open or
/// sealed state, so its callbacks are enqueued once, when its last member
/// finishes on `to` (never again for a batch that finished on `from`).
/// Sequences keep their tails: a job enqueued on `to` with a sequence key
/// waits for the copied jobs of its sequence; each job keeps its key.
/// Start the workers on `to` after the copy returns.
///
/// Before anything is written, a workflow or a batch that `to` holds under
/// the same id but that is not the same one (created at another time) is
/// refused with [`Error::InvalidArgument`] naming it: its members would
/// join another batch. Copy into a fresh database, or one that only holds
/// an earlier copy of `from`.
///
/// The worker registry is not copied: it is live state, and the workers
/// started on `to` register there themselves.
///
/// Copying again is safe: a job, edge, workflow or batch the target already
/// has (same id) is skipped; skipped jobs are counted in
/// [`CopyReport::skipped`]. After the copy the target hands out job,
/// workflow and batch ids above every copied one.
///
/// ```no_run
/// # fn main() -> backlog::Result<()> {
/// let old = backlog::Queue::open("app.db")?;
/// # #[cfg(feature = "postgres")]
/// let new = backlog::Queue::connect("postgres://app@db.internal/app")?;
/// # #[cfg(not(feature = "postgres"))]
/// # let new = backlog::Queue::open("copy.db")?;
/// let report = backlog::copy(&old, &new)?;
/// println!("{} live jobs, {} finished", report.live, report.history);
/// # Ok(())
/// # }
/// ```
pub fn copy(from: &Queue, to: &Queue) -> Result<CopyReport> {
    if from.same_database(to) {
        return Err(Error::InvalidArgument(
            "copy needs two different databases".into(),
        ));
    }
    refuse_other_with_same_id(from, to, &rows::WORKFLOWS)?;
    refuse_other_with_same_id(from, to, &rows::BATCHES)?;
    let mut report = CopyReport::default();
    for table in FLOW_TABLES {
        let mut read = 0;
        let written = copy_rows(from, to, table, &mut read)?;
        if table.name == rows::PENDING.name {
            report.pending += written;
            report.skipped += read - written;
        } else if table.name == rows::DEPENDENCIES.name {
            report.dependencies += written;
        } else if table.name == rows::WORKFLOWS.name {
            report.workflows += written;
        } else if table.name == rows::BATCHES.name {
            report.batches += written;
        } else if table.name == rows::SEQUENCES.name {
            report.sequences += written;
        }
    }
    // Waiting jobs came with their table, counter included.
    for state in JobState::ALL
        .into_iter()
        .filter(|s| *s != JobState::Pending)
    {
        let mut filter = JobFilter::new(state).limit(BATCH);
        loop {
            let page = from.list(&filter)?;
            if page.jobs.is_empty() {
                break;
            }
            let written = to.store().import(&page.jobs)?;
            let written = written as u64;
            let read = page.jobs.len() as u64;
            if matches!(state, JobState::Finished(_)) {
                report.history += written;
            } else {
                report.live += written;
            }
            report.skipped += read - written;
            match page.next_after {
                Some(after) => filter = filter.after(after),
                None => break,
            }
        }
    }
    for queue in from.paused_queues()? {
        to.pause(&queue)?;
        report.paused_queues += 1;
    }
    Ok(report)
}

/// Copies every row of `table` from `from` to `to`, a page at a time;
/// how many were written (`read` counts those read).
fn copy_rows(from: &Queue, to: &Queue, table: &Table, read: &mut u64) -> Result<u64> {
    let mut written = 0;
    let mut after = Vec::new();
    loop {
        let page = from.store().read_rows(table, &after, BATCH)?;
        let Some(last) = page.last() else {
            break;
        };
        after = key(table, last)?;
        *read += page.len() as u64;
        written += to.store().write_rows(table, &page)? as u64;
        if page.len() < BATCH {
            break;
        }
    }
    Ok(written)
}

/// The key of `row`, to read the page after it.
fn key(table: &Table, row: &rows::Row) -> Result<Vec<i64>> {
    row[..table.key]
        .iter()
        .map(|c| {
            c.int()
                .ok_or_else(|| Error::Database(format!("{} without a key", table.what).into()))
        })
        .collect()
}

/// Refuses, before anything is written, a row of `table` (workflows,
/// batches: id, then `created_at`) that `to` has under an id of `from`'s
/// but created at another time: another workflow or batch, which `from`'s
/// steps or members would join.
fn refuse_other_with_same_id(from: &Queue, to: &Queue, table: &Table) -> Result<()> {
    let mut created = HashMap::new();
    each_row(from, table, |row| {
        created.insert(row[0].int(), row[1].int());
        Ok(())
    })?;
    if created.is_empty() {
        return Ok(());
    }
    each_row(to, table, |row| match created.get(&row[0].int()) {
        Some(at) if *at != row[1].int() => Err(Error::InvalidArgument(format!(
            "the target holds another {} with id {}: copy would merge them (copy into a \
             fresh database, or one holding only an earlier copy of the source)",
            table.what,
            row[0].int().unwrap_or_default()
        ))),
        _ => Ok(()),
    })
}

/// Calls `f` with every row of `table` on `queue`, a page at a time.
fn each_row(
    queue: &Queue,
    table: &Table,
    mut f: impl FnMut(&rows::Row) -> Result<()>,
) -> Result<()> {
    let mut after = Vec::new();
    loop {
        let page = queue.store().read_rows(table, &after, BATCH)?;
        page.iter().try_for_each(&mut f)?;
        match page.last() {
            Some(last) if page.len() == BATCH => after = key(table, last)?,
            _ => return Ok(()),
        }
    }
}
