//! The seal on the extension traits (`sqlite::QueueExt`, `postgres::QueueExt`,
//! `diesel::QueueExt`, `sqlx::QueueExt`, the `JobContextExt`s): each has
//! [`Sealed`] as a supertrait, which no crate but this one can name, so only
//! `Queue` and `JobContext` implement them, and a method added to one later
//! breaks no application.

/// Implemented by the types the extension traits extend, beside each
/// (`queue/mod.rs`, `worker/context.rs`), and nothing else.
pub trait Sealed {}
