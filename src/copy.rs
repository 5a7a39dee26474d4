//! Moving a queue to another database: [`copy`], what a user who outgrows
//! one SQLite file runs on the day they switch to a server.

use crate::error::{Error, Result};
use crate::inspect::{JobFilter, JobState};
use crate::queue::Queue;

/// Jobs read and written per batch.
const BATCH: usize = 500;

/// What [`copy`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Live jobs written to the target (leased ones as available).
    pub live: u64,
    /// Finished jobs written to the target's history.
    pub history: u64,
    /// Jobs the target already had (the same id, or a live job holding the
    /// same unique key): left as they were.
    pub skipped: u64,
    /// Paused queues paused on the target too.
    pub paused_queues: u64,
}

/// Copies every live job and the history of `from` into `to`, keeping ids,
/// attempts, errors, schedules (`available_at`), priorities and unique keys.
/// A job leased at copy time is copied as available, in its place in line:
/// stop the workers on `from` first, or they may finish a job that then also
/// runs on `to`. Paused queues stay paused.
///
/// The worker registry is not copied: it is live state, and the workers
/// started on `to` register there themselves. Neither are dependencies and
/// workflows (see [`crate::flow`]): a source with jobs still waiting for
/// their dependencies is refused with [`Error::InvalidState`] before
/// anything is written (let them run, or cancel them, first), and a copied
/// job no longer reads what its dependencies returned.
///
/// Copying again is safe: a job the target already has (same id) is skipped
/// and counted in [`CopyReport::skipped`]. After the copy the target hands
/// out ids above every copied one.
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
    let waiting = from.list(&JobFilter::new(JobState::Pending).limit(1))?;
    if let Some(job) = waiting.jobs.first() {
        return Err(Error::InvalidState {
            job_id: job.id,
            reason: "it waits for its dependencies, which copy cannot carry: let them finish, \
                     or cancel it, before copying"
                .into(),
        });
    }
    let mut report = CopyReport::default();
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
