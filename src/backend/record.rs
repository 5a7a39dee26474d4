//! A job as the operator sees it ([`JobRecord`]): the columns every
//! database selects for one, in one order, and the one reader of them.
//!
//! Each database hands its driver's row over as [`Columns`] (its
//! `inspect.rs` implements it), so which column holds what, how a stored
//! time becomes a [`SystemTime`](std::time::SystemTime) and what an unknown
//! state means are decided here once, for live, finished, grouped and
//! pending jobs alike. SQLite and MySQL select the columns below as they
//! are; PostgreSQL keeps its own copy in `postgres/queries/templates.rs`,
//! which differs only in casts (JSONB read back as text, typed NULLs).

use crate::clock;
use crate::error::{Error, Result};
use crate::inspect::{JobRecord, JobState};
use crate::outcome::AttemptError;

/// A row as a driver returned it, read one column at a time into the
/// engine's types. `None` is SQL NULL.
pub(crate) trait Columns {
    /// An integer column, whatever width the schema stores it in.
    fn int(&mut self, i: usize) -> Result<Option<i64>>;
    /// A text column.
    fn text(&mut self, i: usize) -> Result<Option<String>>;
    /// A flag: a `BOOLEAN` on PostgreSQL, 0/1 elsewhere.
    fn flag(&mut self, i: usize) -> Result<bool>;
    /// A JSON column as text. Defaults to [`Columns::text`]; PostgreSQL's
    /// JSONB comes back reformatted and is put back in the engine's form.
    fn json(&mut self, i: usize) -> Result<Option<String>> {
        self.text(i)
    }
}

/// Reads a column no row leaves NULL.
fn given<T>(value: Option<T>, i: usize) -> Result<T> {
    value.ok_or_else(|| Error::Database(format!("column {i} is NULL").into()))
}

/// An `INTEGER` column the engine holds as an `i32`.
fn narrow(value: i64, i: usize) -> Result<i32> {
    i32::try_from(value)
        .map_err(|_| Error::Database(format!("column {i}: {value} is out of range").into()))
}

/// A count the schema stores as an integer and never as a negative one.
fn count(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

/// A live job as a record, with `state` derived at `$now` (each database's
/// placeholder for now): a literal, so that each database's `queries`
/// keeps it as a constant.
macro_rules! live_columns {
    ($now:literal) => {
        concat!(
            "id, queue, kind, priority, unique_key, payload, attempts, ",
            "max_attempts, available_at, errors, locked_by, lease_until, first_leased_at, ",
            "cancel_requested, NULL AS result, NULL AS finished_at, created_at, updated_at, ",
            $crate::backend::live_state::state_case!($now),
            " AS state, progress, ",
            "NULL AS group_key, NULL AS aggregated_into"
        )
    };
}
pub(crate) use live_columns;

/// A finished job as a record, in the column order of [`live_columns!`].
pub(crate) const HISTORY_COLUMNS: &str = "id, queue, kind, priority, unique_key, payload, \
     attempts, max_attempts, available_at, errors, processed_by, NULL AS lease_until, \
     started_at, cancel_requested, result, finished_at, created_at, updated_at, \
     status AS state, progress, group_key, aggregated_into";

/// A job waiting in its group as a record, in the column order of
/// [`live_columns!`]: never attempted, due when its group is combined.
pub(crate) const GROUPED_COLUMNS: &str = "id, queue, kind, priority, NULL AS unique_key, \
     payload, 0 AS attempts, max_attempts, created_at AS available_at, '[]' AS errors, \
     NULL AS locked_by, NULL AS lease_until, NULL AS first_leased_at, \
     FALSE AS cancel_requested, NULL AS result, NULL AS finished_at, created_at, \
     created_at AS updated_at, 'grouped' AS state, NULL AS progress, group_key, \
     NULL AS aggregated_into";

/// Reads a row in the column order of [`live_columns!`] (every database's
/// live, finished, grouped and pending records). The sequence key is not a
/// column: the caller adds it.
pub(crate) fn read(r: &mut impl Columns) -> Result<JobRecord> {
    let errors = given(r.text(9)?, 9)?;
    let state = given(r.text(18)?, 18)?;
    Ok(JobRecord {
        id: given(r.int(0)?, 0)?,
        queue: given(r.text(1)?, 1)?,
        kind: given(r.text(2)?, 2)?,
        priority: narrow(given(r.int(3)?, 3)?, 3)?,
        unique_key: r.text(4)?,
        payload: given(r.json(5)?, 5)?,
        attempts: count(given(r.int(6)?, 6)?),
        max_attempts: count(given(r.int(7)?, 7)?),
        available_at: clock::at(given(r.int(8)?, 8)?),
        errors: serde_json::from_str::<Vec<AttemptError>>(&errors).unwrap_or_default(),
        worker: r.text(10)?,
        lease_until: clock::at_opt(r.int(11)?),
        started_at: clock::at_opt(r.int(12)?),
        cancel_requested: r.flag(13)?,
        result: r.json(14)?,
        finished_at: clock::at_opt(r.int(15)?),
        created_at: clock::at(given(r.int(16)?, 16)?),
        updated_at: clock::at(given(r.int(17)?, 17)?),
        progress: r.text(19)?,
        group_key: r.text(20)?,
        aggregated_into: r.int(21)?,
        sequence_key: None,
        state: JobState::parse(&state)
            .ok_or_else(|| Error::Database(format!("unknown job state {state:?}").into()))?,
    })
}
