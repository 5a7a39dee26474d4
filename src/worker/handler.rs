//! Handlers: the closures a worker runs, registered per job kind.
//!
//! A typed handler decodes the payload into its arguments first; a payload
//! that does not decode is a permanent failure (the job goes to `dead` at
//! once with the decode error) rather than a retry loop, since running the
//! same bytes again cannot help. A raw handler gets the JSON value.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::job::JobArgs;
use crate::worker::context::{to_result, JobContext};
use crate::worker::error::JobError;

/// What running a handler produced.
pub(crate) enum Handled {
    /// `Ok(output)`: the result to store (`None` for JSON `null`).
    Output(Option<Value>),
    /// `Err(JobError)`: what should happen instead.
    Failed(JobError),
    /// The payload does not decode into the handler's arguments.
    Undecodable(String),
}

/// A registered handler with its argument type erased.
pub(crate) type Handler = Arc<dyn Fn(&JobContext) -> Handled + Send + Sync>;

/// The handlers of one worker, by kind.
#[derive(Default, Clone)]
pub(crate) struct Handlers {
    by_kind: HashMap<String, Handler>,
    /// Kinds registered more than once: a configuration error at start.
    pub(crate) duplicates: Vec<String>,
    /// Kinds registered with a group handler: the worker then combines
    /// ready groups (see [`crate::group`]).
    pub(crate) grouped: Vec<String>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<&String> = self.by_kind.keys().collect();
        kinds.sort();
        f.debug_struct("Handlers").field("kinds", &kinds).finish()
    }
}

impl Handlers {
    pub(crate) fn insert(&mut self, kind: String, handler: Handler) {
        if self.by_kind.insert(kind.clone(), handler).is_some() {
            self.duplicates.push(kind);
        }
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&Handler> {
        self.by_kind.get(kind)
    }

    /// The registered kinds, sorted: what the worker leases.
    pub(crate) fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.by_kind.keys().cloned().collect();
        kinds.sort();
        kinds
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

/// Wraps a typed handler: decode, call, encode the output.
pub(crate) fn typed<T, O, F>(f: F) -> Handler
where
    T: JobArgs,
    O: Serialize,
    F: Fn(T, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &JobContext| match serde_json::from_str::<T>(ctx.payload()) {
            Ok(args) => handled(f(args, ctx)),
            Err(e) => Handled::Undecodable(format!(
                "payload does not decode into {}: {e}",
                std::any::type_name::<T>()
            )),
        },
    )
}

/// Wraps a group handler: the payload of a combined job is the array of its
/// members' payloads, decoded element by element.
pub(crate) fn grouped<T, O, F>(f: F) -> Handler
where
    T: JobArgs,
    O: Serialize,
    F: Fn(Vec<T>, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &JobContext| match serde_json::from_str::<Vec<T>>(ctx.payload()) {
            Ok(args) => handled(f(args, ctx)),
            Err(e) => Handled::Undecodable(format!(
                "payload does not decode into a group of {}: {e}",
                std::any::type_name::<T>()
            )),
        },
    )
}

/// Wraps a raw JSON handler.
pub(crate) fn raw<O, F>(f: F) -> Handler
where
    O: Serialize,
    F: Fn(Value, &JobContext) -> Result<O, JobError> + Send + Sync + 'static,
{
    Arc::new(
        move |ctx: &JobContext| match serde_json::from_str::<Value>(ctx.payload()) {
            Ok(payload) => handled(f(payload, ctx)),
            Err(e) => Handled::Undecodable(format!("payload is not JSON: {e}")),
        },
    )
}

fn handled<O: Serialize>(result: Result<O, JobError>) -> Handled {
    match result {
        Ok(output) => match to_result(&output) {
            Ok(value) => Handled::Output(value),
            Err(e) => Handled::Failed(JobError::retry(format!(
                "the handler's output could not be encoded as JSON: {e}"
            ))),
        },
        Err(e) => Handled::Failed(e),
    }
}
