//! The transactional calls of the server databases, made once: what
//! `enqueue_in`, `enqueue_workflow_in`, `create_batch_in`, `seal_batch_in`
//! and `settle_in` decide (validate and encode first, refuse a queue on
//! another database, the batch's verdict, the settle parameters, the note
//! that the worker must not settle the job again) is here. [`AppTx`], the
//! application's transaction on one database's driver, only runs that
//! database's statements, the two dialects side by side in each match.
//!
//! `backlog::postgres` and `backlog::mysql` each declare their public
//! `QueueExt` and `JobContextExt` with [`transactional_calls!`]: the traits
//! stay one per database (`queue.transaction(|tx| ..)` must infer its
//! transaction type with both features on, which one generic trait cannot),
//! but their declarations, documentation and forwarding are written once.

#[cfg(feature = "mysql")]
use crate::backend::mysql;
use crate::backend::params::{EnqueueParams, SettleParams, WorkflowParams};
#[cfg(feature = "postgres")]
use crate::backend::postgres;
use crate::backend::Backend;
use crate::batch::{self, Batch, BatchBuilder, CreateBatchParams};
use crate::error::{Error, Result};
use crate::job::{Enqueued, IntoNewJob};
use crate::lease::Job;
use crate::outcome::Outcome;
use crate::queue::{params, Queue};
use crate::{EnqueuedWorkflow, Workflow};

/// The application's transaction, on the driver of one server database
/// (the private enum of implementations: the public traits stay per
/// database and non-generic).
pub(crate) enum AppTx<'a, 't> {
    #[cfg(feature = "postgres")]
    Postgres(&'a mut ::postgres::Transaction<'t>),
    #[cfg(feature = "mysql")]
    Mysql(&'a mut ::mysql::Transaction<'t>),
}

#[cfg(feature = "postgres")]
impl<'a, 't> From<&'a mut ::postgres::Transaction<'t>> for AppTx<'a, 't> {
    fn from(tx: &'a mut ::postgres::Transaction<'t>) -> Self {
        AppTx::Postgres(tx)
    }
}

#[cfg(feature = "mysql")]
impl<'a, 't> From<&'a mut ::mysql::Transaction<'t>> for AppTx<'a, 't> {
    fn from(tx: &'a mut ::mysql::Transaction<'t>) -> Self {
        AppTx::Mysql(tx)
    }
}

// `now` is MySQL's only: unused in a build without it.
#[cfg_attr(not(feature = "mysql"), allow(unused_variables))]
impl AppTx<'_, '_> {
    /// Refuses a queue on another database than this transaction's, before
    /// anything is sent.
    fn check_queue(&self, queue: &Queue) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(_) => postgres_db(queue).map(|_| ()),
            #[cfg(feature = "mysql")]
            AppTx::Mysql(_) => mysql_db(queue).map(|_| ()),
        }
    }

    fn enqueue_all(
        &mut self,
        q: &Queue,
        jobs: &[EnqueueParams<'_>],
        now: i64,
    ) -> Result<Vec<Enqueued>> {
        match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(tx) => {
                let db = postgres_db(q)?;
                postgres::jobs::enqueue_all(&mut postgres::on_transaction(tx), db.queries(), jobs)
            }
            #[cfg(feature = "mysql")]
            AppTx::Mysql(tx) => {
                mysql::jobs::enqueue_all(&mysql_db(q)?.sql, *tx, jobs, clocked(q, now))
            }
        }
    }

    fn enqueue_workflow(
        &mut self,
        q: &Queue,
        w: &WorkflowParams<'_>,
        jobs: &[EnqueueParams<'_>],
        now: i64,
    ) -> Result<(i64, Vec<Enqueued>)> {
        match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(tx) => {
                let db = postgres_db(q)?;
                let mut tx = postgres::on_transaction(tx);
                postgres::workflows::enqueue_workflow(&mut tx, db.queries(), w, jobs)
            }
            #[cfg(feature = "mysql")]
            AppTx::Mysql(tx) => {
                let sql = &mysql_db(q)?.sql;
                mysql::workflows::enqueue_workflow(sql, *tx, w, jobs, clocked(q, now))
            }
        }
    }

    fn create_batch(&mut self, q: &Queue, p: &CreateBatchParams<'_>) -> Result<i64> {
        match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(tx) => {
                let db = postgres_db(q)?;
                postgres::batches::create(&mut postgres::on_transaction(tx), db.queries(), p)
            }
            #[cfg(feature = "mysql")]
            AppTx::Mysql(tx) => {
                mysql::batches::create(&mysql_db(q)?.sql, *tx, p, clocked(q, p.now))
            }
        }
    }

    /// Whether the batch exists.
    fn seal_batch(&mut self, q: &Queue, id: i64, now: i64) -> Result<bool> {
        let found = match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(tx) => {
                let db = postgres_db(q)?;
                let tx = &mut postgres::on_transaction(tx);
                postgres::batches::seal(tx, db.queries(), id, now, postgres::jobs::enqueue_all)?
                    .is_some()
            }
            #[cfg(feature = "mysql")]
            AppTx::Mysql(tx) => {
                let sql = &mysql_db(q)?.sql;
                mysql::batches::seal(sql, *tx, id, clocked(q, now), mysql::jobs::enqueue_all)?
                    .is_some()
            }
        };
        Ok(found)
    }

    fn settle(&mut self, q: &Queue, p: &SettleParams, now: i64) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            AppTx::Postgres(tx) => {
                let db = postgres_db(q)?;
                let mut tx = postgres::on_transaction(tx);
                let mut results = postgres::jobs::settle_all(&mut tx, db.queries(), &[p], false)?;
                results
                    .pop()
                    .unwrap_or_else(|| Err(Error::Database("settle returned no result".into())))
                    .map(|_| ())
            }
            #[cfg(feature = "mysql")]
            AppTx::Mysql(tx) => mysql::jobs::settle(&mysql_db(q)?.sql, *tx, p, clocked(q, now)),
        }
    }
}

pub(crate) fn enqueue_in(
    queue: &Queue,
    tx: AppTx<'_, '_>,
    job: impl IntoNewJob,
) -> Result<Enqueued> {
    single(enqueue_many_in(queue, tx, [job])?)
}

pub(crate) fn enqueue_many_in<J: IntoNewJob>(
    queue: &Queue,
    mut tx: AppTx<'_, '_>,
    jobs: impl IntoIterator<Item = J>,
) -> Result<Vec<Enqueued>> {
    let now = queue.now_micros();
    let prepared = queue.prepare_all(jobs, now)?;
    tx.check_queue(queue)?;
    tx.enqueue_all(queue, &params(&prepared, now), now)
}

pub(crate) fn enqueue_workflow_in(
    queue: &Queue,
    mut tx: AppTx<'_, '_>,
    workflow: Workflow,
) -> Result<EnqueuedWorkflow> {
    let now = queue.now_micros();
    let planned = queue.plan_workflow(workflow, now)?;
    tx.check_queue(queue)?;
    let (id, ids) = tx.enqueue_workflow(queue, &planned.params(now), &planned.jobs(now), now)?;
    Ok(planned.enqueued(id, &ids))
}

pub(crate) fn create_batch_in(
    queue: &Queue,
    mut tx: AppTx<'_, '_>,
    batch: BatchBuilder<'_>,
) -> Result<Batch> {
    let p = batch.params()?;
    tx.check_queue(queue)?;
    let id = tx.create_batch(queue, &p.borrowed())?;
    Ok(Batch { id })
}

pub(crate) fn seal_batch_in(queue: &Queue, mut tx: AppTx<'_, '_>, id: i64) -> Result<()> {
    tx.check_queue(queue)?;
    let found = tx.seal_batch(queue, id, queue.now_micros())?;
    batch::join_verdict(id, found.then_some(false))
}

pub(crate) fn settle_in(
    queue: &Queue,
    mut tx: AppTx<'_, '_>,
    job: &Job,
    outcome: Outcome,
) -> Result<()> {
    tx.check_queue(queue)?;
    let now = queue.now_micros();
    let params = queue.settle_params(job, outcome, now)?;
    tx.settle(queue, &params, now)?;
    queue.note_settled_in(job.lease());
    Ok(())
}

/// The one id `enqueue_in` asked for.
pub(crate) fn single(mut ids: Vec<Enqueued>) -> Result<Enqueued> {
    ids.pop()
        .ok_or_else(|| Error::Database("enqueue returned no id".into()))
}

/// The PostgreSQL database of `queue`, or a typed error for a queue on
/// another backend.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_db(queue: &Queue) -> Result<&postgres::Db> {
    postgres_db_or(
        queue,
        "this queue is not on PostgreSQL: use the transaction calls of its database's module",
    )
}

/// [`postgres_db`], refused with `refusal` (what the caller needs).
#[cfg(feature = "postgres")]
pub(crate) fn postgres_db_or<'q>(queue: &'q Queue, refusal: &str) -> Result<&'q postgres::Db> {
    match queue.backend() {
        Backend::Postgres(db) => Ok(db),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidArgument(refusal.into())),
    }
}

/// The MySQL connections of `queue`, or a typed error for a queue on another
/// database.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_db(queue: &Queue) -> Result<&mysql::Db> {
    mysql_db_or(
        queue,
        "this queue is not on MySQL: use the transaction calls of its database's module",
    )
}

/// [`mysql_db`], refused with `refusal` (what the caller needs).
#[cfg(feature = "mysql")]
pub(crate) fn mysql_db_or<'q>(queue: &'q Queue, refusal: &str) -> Result<&'q mysql::Db> {
    match queue.backend() {
        Backend::Mysql(db) => Ok(db),
        #[allow(unreachable_patterns)]
        _ => Err(Error::InvalidArgument(refusal.into())),
    }
}

/// `now` of `queue`'s clock, overriding MySQL's only for a manual clock.
#[cfg(feature = "mysql")]
pub(crate) fn clocked(queue: &Queue, now: i64) -> mysql::Now {
    mysql::Now::new(now, queue.options().clock.is_manual())
}

/// Declares a server database's public `QueueExt` and `JobContextExt` on
/// the `Transaction<'_>` type in scope where it is invoked, forwarding to
/// the functions above; only the documentation that differs by database,
/// and the bodies of the two `transaction` calls (written as closures of
/// the queue or job context and `f`: `QueueExt::transaction` runs `f` in a
/// transaction on the queue's pool; `JobContextExt::transaction` the same,
/// fenced on the job's lease and completing it), are given per database.
macro_rules! transactional_calls {
    (
        $(#[$queue_doc:meta])*
        trait QueueExt;
        $(#[$complete_doc:meta])*
        fn complete_in;
        $(#[$transaction_doc:meta])*
        fn transaction = |$queue:ident, $f:ident| $transaction:expr;
        $(#[$context_doc:meta])*
        trait JobContextExt;
        $(#[$context_transaction_doc:meta])*
        fn transaction = |$ctx:ident, $job_f:ident| $job_transaction:expr;
    ) => {
        $(#[$queue_doc])*
        pub trait QueueExt: $crate::sealed::Sealed {
            /// Enqueues a job inside the caller's transaction: the job exists
            /// if and only if that transaction commits.
            fn enqueue_in(
                &self,
                tx: &mut Transaction<'_>,
                job: impl $crate::IntoNewJob,
            ) -> $crate::Result<$crate::Enqueued>;

            /// Enqueues many jobs inside the caller's transaction.
            fn enqueue_many_in<J: $crate::IntoNewJob>(
                &self,
                tx: &mut Transaction<'_>,
                jobs: impl IntoIterator<Item = J>,
            ) -> $crate::Result<Vec<$crate::Enqueued>>;

            /// Enqueues a workflow inside the caller's transaction (see
            /// [`Queue::enqueue_workflow`](crate::Queue::enqueue_workflow)):
            /// its steps exist if and only if that transaction commits.
            fn enqueue_workflow_in(
                &self,
                tx: &mut Transaction<'_>,
                workflow: $crate::Workflow,
            ) -> $crate::Result<$crate::EnqueuedWorkflow>;

            /// Creates an open batch inside the caller's transaction (see
            /// [`crate::batch`]): it exists if and only if that transaction
            /// commits.
            fn create_batch_in(
                &self,
                tx: &mut Transaction<'_>,
                batch: $crate::batch::BatchBuilder<'_>,
            ) -> $crate::Result<$crate::batch::Batch>;

            /// Seals a batch inside the caller's transaction, enqueueing its
            /// callbacks there when every member has finished (see
            /// [`Queue::seal_batch`](crate::Queue::seal_batch)).
            fn seal_batch_in(&self, tx: &mut Transaction<'_>, id: i64) -> $crate::Result<()>;

            $(#[$complete_doc])*
            fn complete_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                result: Option<serde_json::Value>,
            ) -> $crate::Result<()>;

            /// Records a failed attempt inside the caller's transaction. Same
            /// rules as [`QueueExt::complete_in`].
            fn fail_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                error: impl Into<String>,
            ) -> $crate::Result<()>;

            /// Applies any outcome inside the caller's transaction.
            fn settle_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                outcome: $crate::Outcome,
            ) -> $crate::Result<()>;

            $(#[$transaction_doc])*
            fn transaction<T, E>(
                &self,
                f: impl FnOnce(&mut Transaction<'_>) -> std::result::Result<T, E>,
            ) -> std::result::Result<T, E>
            where
                E: From<$crate::Error>;
        }

        impl QueueExt for $crate::Queue {
            fn enqueue_in(
                &self,
                tx: &mut Transaction<'_>,
                job: impl $crate::IntoNewJob,
            ) -> $crate::Result<$crate::Enqueued> {
                $crate::app_transaction::enqueue_in(self, tx.into(), job)
            }

            fn enqueue_many_in<J: $crate::IntoNewJob>(
                &self,
                tx: &mut Transaction<'_>,
                jobs: impl IntoIterator<Item = J>,
            ) -> $crate::Result<Vec<$crate::Enqueued>> {
                $crate::app_transaction::enqueue_many_in(self, tx.into(), jobs)
            }

            fn enqueue_workflow_in(
                &self,
                tx: &mut Transaction<'_>,
                workflow: $crate::Workflow,
            ) -> $crate::Result<$crate::EnqueuedWorkflow> {
                $crate::app_transaction::enqueue_workflow_in(self, tx.into(), workflow)
            }

            fn create_batch_in(
                &self,
                tx: &mut Transaction<'_>,
                batch: $crate::batch::BatchBuilder<'_>,
            ) -> $crate::Result<$crate::batch::Batch> {
                $crate::app_transaction::create_batch_in(self, tx.into(), batch)
            }

            fn seal_batch_in(&self, tx: &mut Transaction<'_>, id: i64) -> $crate::Result<()> {
                $crate::app_transaction::seal_batch_in(self, tx.into(), id)
            }

            fn complete_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                result: Option<serde_json::Value>,
            ) -> $crate::Result<()> {
                self.settle_in(tx, job, $crate::Outcome::Complete(result))
            }

            fn fail_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                error: impl Into<String>,
            ) -> $crate::Result<()> {
                self.settle_in(tx, job, $crate::Outcome::fail(error))
            }

            fn settle_in(
                &self,
                tx: &mut Transaction<'_>,
                job: &$crate::Job,
                outcome: $crate::Outcome,
            ) -> $crate::Result<()> {
                $crate::app_transaction::settle_in(self, tx.into(), job, outcome)
            }

            fn transaction<T, E>(
                &self,
                f: impl FnOnce(&mut Transaction<'_>) -> std::result::Result<T, E>,
            ) -> std::result::Result<T, E>
            where
                E: From<$crate::Error>,
            {
                let ($queue, $f) = (self, f);
                $transaction
            }
        }

        $(#[$context_doc])*
        pub trait JobContextExt: $crate::sealed::Sealed {
            $(#[$context_transaction_doc])*
            fn transaction<T, F>(&self, f: F) -> std::result::Result<T, $crate::JobError>
            where
                T: serde::Serialize,
                F: FnOnce(&mut Transaction<'_>) -> std::result::Result<T, $crate::JobError>;
        }

        impl JobContextExt for $crate::JobContext {
            fn transaction<T, F>(&self, f: F) -> std::result::Result<T, $crate::JobError>
            where
                T: serde::Serialize,
                F: FnOnce(&mut Transaction<'_>) -> std::result::Result<T, $crate::JobError>,
            {
                let ($ctx, $job_f) = (self, f);
                $job_transaction
            }
        }
    };
}
pub(crate) use transactional_calls;
