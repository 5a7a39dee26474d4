//! Finished-job counts (`backlog::finished`, V10): every way a job reaches
//! history is counted in the transaction that moves it, per queue, kind,
//! status and bucket of time; the counts outlive history's retention and
//! their own compaction.

use std::time::Duration;

use backlog::finished::{FinishedTotals, Window};
use backlog::{
    FinalStatus, Group, JobFilter, JobState, LeaseRequest, ManualClock, NewJob, QueueOptions,
    Retention,
};
use serde_json::json;

use crate::harness::{Backend, Harness, TestResult};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// `(queue, kind, [completed, discarded, cancelled, dead, aggregated])` of
/// every queue and kind, sorted.
fn totals(h: &Harness) -> TestResult<Vec<(String, String, [u64; 5])>> {
    Ok(h.queue
        .finished_totals()?
        .into_iter()
        .map(|t| (t.queue, t.kind, per_status(&t.totals)))
        .collect())
}

fn per_status(t: &FinishedTotals) -> [u64; 5] {
    FinalStatus::ALL.map(|s| t.get(s))
}

/// `(buckets_ago, queue, kind, status, count)`: one bucket as reported.
type Row = (u32, String, String, &'static str, u64);

/// The buckets of a window, as reported.
fn buckets(h: &Harness, window: Window) -> TestResult<Vec<Row>> {
    Ok(h.queue
        .finished_buckets(window)?
        .into_iter()
        .map(|b| (b.buckets_ago, b.queue, b.kind, b.status.as_str(), b.count))
        .collect())
}

fn row(ago: u32, queue: &str, kind: &str, status: &'static str, n: u64) -> Row {
    (ago, queue.into(), kind.into(), status, n)
}

fn finished_counts_count_every_way_a_job_finishes(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let lease = |queue: &str, n: usize| h.queue.lease(&LeaseRequest::new("w", n).queues([queue]));
    // Completed: one alone, then three in one batch (MySQL's batched path).
    for _ in 0..4 {
        h.queue.enqueue(NewJob::new("mail", json!({})).queue("a"))?;
    }
    let jobs = lease("a", 4)?;
    h.queue.complete(&jobs[0], None)?;
    let batch = h.queue.complete_many(&jobs[1..])?;
    assert!(batch.iter().all(Result::is_ok), "{batch:?}");
    // Dead: out of attempts.
    h.queue
        .enqueue(NewJob::new("mail", json!({})).queue("a").max_attempts(1))?;
    h.queue.fail(&lease("a", 1)?[0], "boom")?;
    // Discarded: by the handler, and by an operator while it waits.
    h.queue
        .enqueue(NewJob::new("resize", json!({})).queue("a"))?;
    h.queue.discard(&lease("a", 1)?[0], "bad input")?;
    let waiting = h
        .queue
        .enqueue(NewJob::new("resize", json!({})).queue("a"))?;
    h.queue.discard_job(waiting.id, "not needed")?;
    // Cancelled by an operator while it waits; a lost lease is not counted.
    let waiting = h
        .queue
        .enqueue(NewJob::new("resize", json!({})).queue("b"))?;
    h.queue.cancel(waiting.id)?;
    // Aggregated: three members combined into one job (itself live).
    for n in 0..3 {
        h.queue.enqueue(
            NewJob::new("digest", json!({"n": n}))
                .queue("b")
                .group(Group::new("g").max_size(3)),
        )?;
    }
    assert_eq!(h.queue.aggregate(10)?.jobs.len(), 1);

    let expected = vec![
        ("a".to_owned(), "mail".to_owned(), [4, 0, 0, 1, 0]),
        ("a".to_owned(), "resize".to_owned(), [0, 2, 0, 0, 0]),
        ("b".to_owned(), "digest".to_owned(), [0, 0, 0, 0, 3]),
        ("b".to_owned(), "resize".to_owned(), [0, 0, 1, 0, 0]),
    ];
    assert_eq!(totals(&h)?, expected);
    let stats = h.queue.stats()?;
    let a = stats.iter().find(|s| s.queue == "a").ok_or("no queue a")?;
    assert_eq!(per_status(&a.finished), [4, 2, 0, 1, 0]);
    let b_stats = stats.iter().find(|s| s.queue == "b").ok_or("no queue b")?;
    assert_eq!(per_status(&b_stats.finished), [0, 0, 1, 0, 3]);
    // The metrics export the totals per queue and status.
    let text = h.queue.metrics()?;
    for line in [
        r#"backlog_finished_jobs_total{queue="a",status="completed"} 4"#,
        r#"backlog_finished_jobs_total{queue="a",status="discarded"} 2"#,
        r#"backlog_finished_jobs_total{queue="b",status="aggregated"} 3"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    // Nothing moved the clock: all of it is in the current minute and hour.
    for window in Window::ALL {
        let rows = buckets(&h, window)?;
        assert!(rows.iter().all(|r| r.0 == 0), "{window:?}: {rows:?}");
        assert_eq!(rows.iter().map(|r| r.4).sum::<u64>(), 11, "{window:?}");
    }

    // Rescue: a lease that expired on a job with no attempt left goes dead.
    h.queue
        .enqueue(NewJob::new("mail", json!({})).queue("a").max_attempts(1))?;
    h.queue.lease(
        &LeaseRequest::new("gone", 1)
            .queues(["a"])
            .ttl(Duration::from_secs(5)),
    )?;
    h.advance(Duration::from_secs(10));
    assert_eq!(h.queue.rescue(10)?.dead, 1);
    // Counts are of finishes, not of rows: pruning history keeps them.
    h.advance(HOUR);
    let none = Some(Duration::ZERO);
    let retention = Retention {
        completed: none,
        discarded: none,
        cancelled: none,
        dead: none,
    };
    let pruned = h.queue.prune_history(&retention, 1000)?;
    assert_eq!(pruned, 12, "every finished job pruned");
    assert_eq!(h.history_rows()?, 0);
    let mut expected = expected;
    expected[0].2 = [4, 0, 0, 2, 0];
    assert_eq!(totals(&h)?, expected);
    let a = h.queue.stats()?.into_iter().find(|s| s.queue == "a");
    let a = a.ok_or("queue a is listed: it has finished jobs")?;
    assert_eq!((a.dead, per_status(&a.finished)), (0, [4, 2, 0, 2, 0]));
    // A job retried from history and finished again counts twice.
    let retried = h.queue.enqueue(NewJob::new("mail", json!({})).queue("c"))?;
    h.queue.discard(&lease("c", 1)?[0], "try later")?;
    h.queue.retry(retried.id)?;
    h.queue.complete(&lease("c", 1)?[0], None)?;
    let c = h
        .queue
        .finished_totals()?
        .into_iter()
        .find(|t| t.queue == "c");
    let c = c.ok_or("no queue c")?;
    assert_eq!((c.totals.discarded, c.totals.completed), (1, 1));
    assert_eq!(
        h.queue
            .list(&JobFilter::new(JobState::Finished(FinalStatus::Completed)).queue("c"))?
            .jobs
            .len(),
        1
    );
    Ok(())
}

fn finished_counts_bucket_by_minute_and_hour_on_the_clock(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let finish = |kind: &str, n: usize| -> TestResult {
        for _ in 0..n {
            h.queue.enqueue(NewJob::new(kind, json!({})))?;
        }
        for job in h.lease("w", n)? {
            h.queue.complete(&job, None)?;
        }
        Ok(())
    };
    // The harness starts 20 s into a minute and 13 min 20 s into an hour.
    finish("x", 1)?;
    h.advance(MINUTE);
    finish("x", 2)?;
    finish("y", 1)?;
    assert_eq!(
        buckets(&h, Window::Hour)?,
        [
            row(0, "default", "x", "completed", 2),
            row(0, "default", "y", "completed", 1),
            row(1, "default", "x", "completed", 1),
        ]
    );
    assert_eq!(
        buckets(&h, Window::Day)?,
        [
            row(0, "default", "x", "completed", 3),
            row(0, "default", "y", "completed", 1),
        ]
    );
    // Two hours on: out of the hour's window, two buckets back in the day's.
    h.advance(2 * HOUR);
    finish("y", 1)?;
    assert_eq!(
        buckets(&h, Window::Hour)?,
        [row(0, "default", "y", "completed", 1)]
    );
    let day = [
        row(0, "default", "y", "completed", 1),
        row(2, "default", "x", "completed", 3),
        row(2, "default", "y", "completed", 1),
    ];
    assert_eq!(buckets(&h, Window::Day)?, day);
    assert_eq!(buckets(&h, Window::Week)?, day);

    // Compaction: old minutes go (the hours hold them), totals stay.
    let before = totals(&h)?;
    assert_eq!(
        before,
        [
            ("default".to_owned(), "x".to_owned(), [3, 0, 0, 0, 0]),
            ("default".to_owned(), "y".to_owned(), [2, 0, 0, 0, 0]),
        ]
    );
    assert!(
        h.queue.compact_finished_counts()? > 0,
        "minutes 2 h old deleted"
    );
    assert_eq!(buckets(&h, Window::Day)?, day);
    assert_eq!(totals(&h)?, before);
    // A day on: the day's window is empty, the week's still has them.
    h.advance(24 * HOUR);
    assert!(buckets(&h, Window::Day)?.is_empty());
    assert_eq!(buckets(&h, Window::Week)?.len(), 3);
    // Nine days on: the hours are folded into the all-time totals.
    h.advance(8 * 24 * HOUR);
    assert!(h.queue.compact_finished_counts()? > 0, "hours folded");
    assert_eq!(h.queue.compact_finished_counts()?, 0, "nothing left to do");
    assert!(buckets(&h, Window::Week)?.is_empty());
    assert_eq!(totals(&h)?, before);
    finish("x", 1)?;
    assert_eq!(totals(&h)?[0].2, [4, 0, 0, 0, 0]);
    Ok(())
}

fn finished_counts_include_a_copied_history(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let dir = tempfile::tempdir()?;
    let from = QueueOptions::new()
        .clock(ManualClock::at(h.now()))
        .open(dir.path().join("old.db"))?;
    for max_attempts in [5, 1] {
        from.enqueue(NewJob::new("k", json!({})).max_attempts(max_attempts))?;
    }
    let jobs = from.lease(&LeaseRequest::new("w", 2))?;
    from.complete(&jobs[0], None)?;
    from.fail(&jobs[1], "boom")?;
    from.enqueue(NewJob::new("k", json!({})))?;
    let report = backlog::copy(&from, &h.queue)?;
    assert_eq!((report.live, report.history), (1, 2));
    assert_eq!(
        totals(&h)?,
        [("default".to_owned(), "k".to_owned(), [1, 0, 0, 1, 0])]
    );
    // Copied again: nothing is written, nothing counted twice.
    backlog::copy(&from, &h.queue)?;
    assert_eq!(totals(&h)?[0].2, [1, 0, 0, 1, 0]);
    Ok(())
}

/// Folds run from two handles at once, while jobs finish on both: every
/// finish is counted once, in the totals and in the buckets alike, however
/// the folds interleave with each other and with the finishes.
fn finished_counts_stay_exact_across_concurrent_folds(b: &Backend) -> TestResult {
    let h = b.harness()?;
    let other = h.second_handle()?;
    const JOBS: usize = 40;
    for _ in 0..2 * JOBS {
        h.queue.enqueue(NewJob::new("k", json!({})))?;
    }
    std::thread::scope(|s| -> TestResult {
        let sides = [&h.queue, &other].map(|queue| {
            s.spawn(move || -> backlog::Result<()> {
                for _ in 0..JOBS {
                    if let Some(job) = queue.lease(&LeaseRequest::new("w", 1))?.pop() {
                        queue.complete(&job, None)?;
                    }
                    queue.compact_finished_counts()?;
                }
                Ok(())
            })
        });
        for side in sides {
            side.join().expect("no panic")?;
        }
        Ok(())
    })?;
    let finished = u64::try_from(h.history_rows()?)?;
    assert_eq!(finished, 2 * JOBS as u64, "every job finished");
    for _ in 0..2 {
        assert_eq!(
            totals(&h)?,
            [("default".to_owned(), "k".to_owned(), [finished, 0, 0, 0, 0])]
        );
        for window in [Window::Hour, Window::Day] {
            let counted: u64 = buckets(&h, window)?.iter().map(|r| r.4).sum();
            assert_eq!(counted, finished, "{window:?}");
        }
        other.compact_finished_counts()?;
    }
    Ok(())
}

conformance!(
    finished_counts_count_every_way_a_job_finishes,
    finished_counts_bucket_by_minute_and_hour_on_the_clock,
    finished_counts_include_a_copied_history,
    finished_counts_stay_exact_across_concurrent_folds,
);
