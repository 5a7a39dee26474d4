//! Which live state a job's row is in at a moment (available, scheduled,
//! retrying, running), told by its columns: decided once here for every
//! database. Each database's listing and counting run these conditions
//! with its own placeholder for now (`?1` on SQLite; `{now}` on the
//! servers, rendered at connect) and its own table name. A record's
//! `state` column ([`state_case!`]) is spelled here too, so that what the
//! states mean is written in this file alone.

/// A live job's state at `$now` (the database's placeholder for now, a
/// literal) as an SQL `CASE`, telling the states apart as [`condition`]
/// does: the `state` column of every database's live record
/// (`record::live_columns!`, PostgreSQL's `LIVE_COLUMNS`) and of
/// [`count`]. A macro, so that each database keeps its columns a constant.
macro_rules! state_case {
    ($now:literal) => {
        concat!(
            "CASE WHEN lease_token IS NOT NULL THEN 'running' ",
            "WHEN available_at <= ",
            $now,
            " THEN 'available' ",
            "WHEN attempts > 0 THEN 'retrying' ELSE 'scheduled' END"
        )
    };
}
pub(crate) use state_case;

/// The condition a live job's row meets in `state` (`available`,
/// `scheduled`, `retrying`; any other: `running`) at `now`.
pub(crate) fn condition(state: &str, now: &str) -> String {
    match state {
        "available" => format!("lease_token IS NULL AND available_at <= {now}"),
        "scheduled" => format!("lease_token IS NULL AND available_at > {now} AND attempts = 0"),
        "retrying" => format!("lease_token IS NULL AND available_at > {now} AND attempts > 0"),
        _ => "lease_token IS NOT NULL".into(),
    }
}

/// Live jobs of table `jobs` per queue and state at `now`, as
/// [`condition`] tells them apart.
pub(crate) fn count(jobs: &str, now: &str) -> String {
    format!(
        concat!(
            "\nSELECT queue, ",
            state_case!("{now}"),
            " AS state, count(*)\nFROM {jobs} GROUP BY 1, 2"
        ),
        jobs = jobs,
        now = now,
    )
}
