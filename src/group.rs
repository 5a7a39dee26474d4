//! Grouped jobs, asynq's aggregation: jobs enqueued with the same [`Group`]
//! key (in one queue, of one kind) wait, then run together as one job whose
//! handler receives all of their payloads.
//!
//! A group is ready when it holds [`Group::max_size`] members, when
//! [`Group::grace`] passed since its last member was added, or when
//! [`Group::max_delay`] passed since its first: whichever comes first. A
//! worker with a group handler ([`WorkerBuilder::handle_group`]) then
//! combines it, on any process, in one transaction: one job of the same kind
//! is inserted whose payload is the JSON array of the members' payloads
//! (oldest first, at most `max_size` of them), and each member moves to
//! history as [`FinalStatus::Aggregated`] with the id of that job
//! ([`JobRecord::aggregated_into`]). The combined job then runs like any
//! other: retries, timeouts, transactional completion.
//!
//! While they wait, members are [`JobState::Grouped`]: [`Queue::get`],
//! [`Queue::list`] and [`Queue::counts`] show them; they are kept outside
//! the live jobs table, so no lease ever walks them, and operator actions
//! on one member (`cancel`, `delete`, `update`, `run_now`) answer
//! [`Error::InvalidState`]: a member belongs to its group.
//!
//! [`WorkerBuilder::handle_group`]: crate::WorkerBuilder::handle_group
//! [`FinalStatus::Aggregated`]: crate::FinalStatus::Aggregated
//! [`JobRecord::aggregated_into`]: crate::JobRecord::aggregated_into
//! [`JobState::Grouped`]: crate::JobState::Grouped
//! [`Queue::get`]: crate::Queue::get
//! [`Queue::list`]: crate::Queue::list
//! [`Queue::counts`]: crate::Queue::counts
//! [`Error::InvalidState`]: crate::Error::InvalidState

use std::time::Duration;

use crate::clock::duration_micros;
use crate::error::{Error, Result};
use crate::validate;

/// The largest [`Group::max_size`]: the combined job's payload holds every
/// member's, so a group is capped.
pub const MAX_GROUP_SIZE: u32 = 10_000;

/// A group to enqueue a job into, with the policy that says when the group
/// is combined. See [the module](crate::group).
///
/// The policy is stored with the group, so whichever process combines it
/// applies it; the last enqueue into a group sets the policy for the whole
/// group.
///
/// ```
/// use std::time::Duration;
/// use backlog::{Group, NewJob};
/// use serde_json::json;
///
/// let job = NewJob::new("notify", json!({"user": 42, "event": "like"}))
///     .group(Group::new("user-42")
///         .max_size(50)
///         .grace(Duration::from_secs(10))
///         .max_delay(Duration::from_secs(300)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub(crate) key: String,
    pub(crate) max_size: u32,
    pub(crate) grace: Duration,
    pub(crate) max_delay: Duration,
}

impl Group {
    /// The group named `key` (a name: 1 to 128 bytes, no control
    /// characters), with the default policy.
    pub fn new(key: impl Into<String>) -> Self {
        Group {
            key: key.into(),
            max_size: 100,
            grace: Duration::from_secs(5),
            max_delay: Duration::from_secs(60),
        }
    }

    /// Combined as soon as it holds this many members; 1 to
    /// [`MAX_GROUP_SIZE`]. Defaults to 100.
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.max_size = max_size;
        self
    }

    /// Combined once this long passed without a new member. Defaults to 5 s.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Combined at the latest this long after its first member was added,
    /// however often members keep coming. At least the grace period.
    /// Defaults to 60 s.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The group's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Checks the policy and returns it in µs: (max size, grace, max delay).
    pub(crate) fn check(&self) -> Result<(u32, i64, i64)> {
        validate::name("group key", &self.key)?;
        if self.max_size == 0 || self.max_size > MAX_GROUP_SIZE {
            return Err(Error::InvalidArgument(format!(
                "a group's max_size must be 1 to {MAX_GROUP_SIZE}, got {}",
                self.max_size
            )));
        }
        if self.max_delay < self.grace {
            return Err(Error::InvalidArgument(format!(
                "a group's max_delay ({:?}) must be at least its grace ({:?})",
                self.max_delay, self.grace
            )));
        }
        Ok((
            self.max_size,
            duration_micros(self.grace)?,
            duration_micros(self.max_delay)?,
        ))
    }
}

/// What one [`Queue::aggregate`](crate::Queue::aggregate) call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AggregateReport {
    /// The jobs inserted, one per group combined, with how many members each
    /// holds.
    pub jobs: Vec<(i64, usize)>,
}

/// The payload of a combined job: the JSON array of its members' payloads,
/// each already valid JSON text, in the order given.
pub(crate) fn combined_payload<'a>(payloads: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (i, payload) in payloads.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(payload);
    }
    out.push(']');
    out
}
