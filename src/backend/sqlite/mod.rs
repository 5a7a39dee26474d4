//! The SQLite backend: one file, WAL, a write gate per process, a read pool.
//!
//! Everything SQLite-specific lives in this folder: the schema
//! (`migrations/sqlite/`), every statement ([`queries`]), and the operations
//! that run them ([`jobs`], [`inspect`]), each operation of the engine's
//! `Store` wrapped in its transaction in `store.rs`. Operations take a plain
//! `&Connection` so the same code runs inside the queue's own write
//! transaction or inside an application's transaction (`enqueue_in`,
//! `complete_in`).

pub(crate) mod batches;
pub(crate) mod connection;
pub(crate) mod counts;
pub(crate) mod data_version;
pub(crate) mod flows;
pub(crate) mod gauges;
pub(crate) mod groups;
pub(crate) mod inspect;
pub(crate) mod jobs;
pub(crate) mod limits;
pub(crate) mod migrate;
pub(crate) mod queries;
mod rows;
pub(crate) mod schedules;
pub(crate) mod sequences;
mod store;
pub(crate) mod wal;
pub(crate) mod workers;
pub(crate) mod workflows;
pub(crate) mod write_path;

pub(crate) use connection::Connections;
