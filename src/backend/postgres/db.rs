//! The queue's handle on one PostgreSQL database ([`Db`]): its pool, its
//! rendered statements, its clock, and connecting to it. The concerns
//! beside it name it; `mod.rs` implements the seam on it by dispatching to
//! them.

use std::fmt;
use std::sync::Arc;

use super::connection::{self, Pool};
use super::queries::{Queries, Tables};
use super::target::Target;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::limits::LimitedQueues;
use crate::options::QueueOptions;

/// The oldest server backlog runs on: `MATERIALIZED` CTEs came in 12.
const MIN_SERVER_VERSION: i32 = 120_000;

/// A queue's connections to one PostgreSQL database, and its SQL. Boxed:
/// the rendered statements are large, and `Backend` holds one of these.
pub(crate) struct Db(Box<Inner>);

pub(crate) struct Inner {
    pub(super) pool: Pool,
    pub(super) q: Queries,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) limited: LimitedQueues,
}

impl std::ops::Deref for Db {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("postgres::Db")
            .field("url", &self.pool.target.redacted)
            .field("tables", &self.q.tables)
            .finish_non_exhaustive()
    }
}

impl Db {
    /// Connects to `url` (one connection, to fail now on a wrong address,
    /// password or server, waiting for room on a full server up to the
    /// connect deadline) and sets up the pool, that connection its first.
    /// Migrations are the caller's next step.
    pub(crate) fn connect(url: &str, options: &QueueOptions) -> Result<Db> {
        options.check_common()?;
        let target = Target::parse(url, options)?;
        let mut client = connection::connect_waiting(&target, options.connect_deadline)?;
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])?
            .try_get(0)?;
        if version < MIN_SERVER_VERSION {
            return Err(Error::UnsupportedServer(format!(
                "PostgreSQL {}.{} is older than 12",
                version / 10_000,
                version % 10_000 / 100
            )));
        }
        let q = Queries::render(Tables::new(options), options.clock.is_manual());
        let pool = Pool::new(target, options)?;
        pool.adopt(client)?;
        Ok(Db(Box::new(Inner {
            pool,
            q,
            clock: options.clock.clone(),
            limited: LimitedQueues::default(),
        })))
    }

    /// The queue's SQL, for `backlog::postgres`.
    pub(crate) fn queries(&self) -> &Queries {
        &self.q
    }

    /// The pool, for `backlog::postgres`'s transactions.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }
}
