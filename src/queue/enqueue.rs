//! Enqueueing: validating and encoding jobs ([`Prepared`]), inserting them,
//! the periodic scheduler's tick claims, which enqueue the same way, and
//! batches (created, sealed, read back: what a batch is, [`crate::batch`]).

use std::time::{Duration, UNIX_EPOCH};

use crate::backend::params::{ClaimTickParams, Claimed, EnqueueParams, GroupParams};
use crate::batch::{join_verdict, BatchBuilder, BatchQueue, BatchStatus, CreateBatchParams};
use crate::clock::{add_micros, duration_micros, system_time_to_micros};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::job::{Enqueued, IntoNewJob, NewJob, Payload, Schedule, UniqueScope};
use crate::validate;

use super::Queue;

/// An encoded, validated job, ready for the backend.
pub(crate) struct Prepared {
    job: NewJob,
    payload: String,
    available_at: i64,
    unique_history_since: Option<i64>,
    /// `unique_history_since`'s statuses, as JSON (`None`: any).
    unique_statuses: Option<String>,
    /// The group's policy: max size, grace and max delay in µs.
    group: Option<(u32, i64, i64)>,
    /// Its dependencies, deduplicated, each with the job's policy.
    depends_on: Vec<crate::backend::params::Edge>,
}

impl Queue {
    /// Enqueues one job and commits.
    ///
    /// A job whose unique key is already taken is not inserted: the existing
    /// job's id comes back with `existed: true`.
    pub fn enqueue(&self, job: impl IntoNewJob) -> Result<Enqueued> {
        let mut ids = self.enqueue_many([job])?;
        ids.pop()
            .ok_or_else(|| Error::Database("enqueue returned no id".into()))
    }

    /// Enqueues many jobs in one transaction: all or none. Every job is
    /// validated before anything is written. Ids come back in input order.
    pub fn enqueue_many<J: IntoNewJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
    ) -> Result<Vec<Enqueued>> {
        let now = self.now_micros();
        let prepared = self.prepare_all(jobs, now)?;
        let params: Vec<EnqueueParams<'_>> = params(&prepared, now);
        let ids = self.store().enqueue_many(&params)?;
        failpoint!("enqueue-after-commit");
        self.enqueued(&prepared, &ids);
        Ok(ids)
    }

    /// Tells this process's workers and subscribers of jobs just enqueued.
    pub(crate) fn enqueued(&self, prepared: &[Prepared], ids: &[Enqueued]) {
        if self.inner.bus.has_listeners() {
            self.inner.bus.ring();
            self.inner
                .bus
                .emit(
                    ids.iter()
                        .zip(prepared)
                        .filter(|(e, _)| !e.existed)
                        .map(|(e, p)| Event::Enqueued {
                            job_id: e.id,
                            queue: p.job.queue.clone(),
                            kind: p.job.kind.clone(),
                        }),
                );
        }
    }

    pub(crate) fn prepare_all<J: IntoNewJob>(
        &self,
        jobs: impl IntoIterator<Item = J>,
        now: i64,
    ) -> Result<Vec<Prepared>> {
        jobs.into_iter()
            .map(|j| self.prepare(j.into_new_job()?, now))
            .collect()
    }

    /// Validates and encodes one job. Nothing here touches the database.
    fn prepare(&self, job: NewJob, now: i64) -> Result<Prepared> {
        validate::name("queue", &job.queue)?;
        validate::name("kind", &job.kind)?;
        if let Some(key) = &job.unique_key {
            validate::unique_key(key)?;
        }
        if job.max_attempts == 0 {
            return Err(Error::InvalidArgument(
                "max_attempts must be at least 1".into(),
            ));
        }
        let limit = self.inner.options.max_payload_bytes;
        let payload = match &job.payload {
            Payload::Value(value) => validate::payload(value, limit)?,
            Payload::Text(text) => {
                // The cap is checked before parsing, so oversize text costs nothing.
                validate::payload_size(text.len(), limit)?;
                let value = validate::parse_json(text)?;
                validate::payload(&value, limit)?
            }
        };
        let available_at = match job.schedule {
            Schedule::Now => now,
            Schedule::Delay(delay) => add_micros(now, delay)?,
            Schedule::DelaySecs(secs) => {
                if !secs.is_finite() || secs < 0.0 {
                    return Err(Error::InvalidSchedule(format!(
                        "delay must be a finite, non-negative number of seconds, got {secs}"
                    )));
                }
                let delay = Duration::try_from_secs_f64(secs)
                    .map_err(|e| Error::InvalidSchedule(e.to_string()))?;
                add_micros(now, delay)?
            }
            // A time before the unix epoch is in the past too: it means now.
            Schedule::At(at) if at < UNIX_EPOCH => now,
            Schedule::At(at) => system_time_to_micros(at)?.max(now),
        };
        let unique_history_since = match (job.unique_scope, &job.unique_key) {
            (UniqueScope::LiveAndHistory(period), Some(_)) => {
                Some(now.saturating_sub(duration_micros(period)?))
            }
            _ => None,
        };
        let group = match &job.group {
            None => None,
            Some(group) => {
                if !matches!(job.schedule, Schedule::Now) || job.unique_key.is_some() {
                    return Err(Error::InvalidArgument(
                        "a grouped job can have neither a delay nor a unique key: its group \
                         decides when it runs"
                            .into(),
                    ));
                }
                Some(group.check()?)
            }
        };
        let depends_on = crate::flow::check_edges(&job)?;
        crate::sequence::check(&job)?;
        if job.batch.is_some() && job.group.is_some() {
            return Err(Error::InvalidArgument(
                "a grouped job cannot join a batch: its group combines it into another job".into(),
            ));
        }
        let unique_statuses = match (&job.unique_states, unique_history_since) {
            (Some(states), Some(_)) => Some(serde_json::to_string(
                &states.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            )?),
            _ => None,
        };
        if !depends_on.is_empty() && job.batch.is_some() {
            return Err(Error::InvalidArgument(
                "a job with dependencies cannot join a batch (not supported yet)".into(),
            ));
        }
        Ok(Prepared {
            job,
            payload,
            available_at,
            unique_history_since,
            unique_statuses,
            group,
            depends_on,
        })
    }

    /// Validates and encodes `job` as an enqueue at `now` would, writing
    /// nothing: a periodic schedule's job is checked when it is registered.
    pub(crate) fn check_job(&self, job: &NewJob, now: i64) -> Result<()> {
        if job.batch.is_some() {
            // A batch is sealed once; a schedule would enqueue into it forever.
            return Err(Error::InvalidArgument(
                "a periodic job cannot join a batch".into(),
            ));
        }
        self.prepare(job.clone(), now).map(|_| ())
    }

    /// Claims a periodic tick (`claim.job` is filled from `job`), and tells
    /// this process's workers and subscribers of an enqueued job as
    /// [`Queue::enqueue`] does.
    pub(crate) fn claim_tick(
        &self,
        claim: ClaimTickParams<'_>,
        job: Option<NewJob>,
    ) -> Result<Claimed> {
        let prepared = job.map(|j| self.prepare(j, claim.now)).transpose()?;
        let claim = ClaimTickParams {
            job: prepared
                .as_ref()
                .and_then(|p| params(std::slice::from_ref(p), claim.now).pop()),
            ..claim
        };
        let claimed = self.store().claim_tick(&claim)?;
        if matches!(claimed, Claimed::Enqueued(_)) {
            failpoint!("claim-tick-after-commit");
        }
        if let (Claimed::Enqueued(e), Some(p)) = (claimed, &prepared) {
            if !e.existed && self.inner.bus.has_listeners() {
                self.inner.bus.ring();
                self.inner.bus.emit([Event::Enqueued {
                    job_id: e.id,
                    queue: p.job.queue.clone(),
                    kind: p.job.kind.clone(),
                }]);
            }
        }
        Ok(claimed)
    }
}

/// The backend's view of prepared jobs, all stamped with the same `now`.
pub(crate) fn params(prepared: &[Prepared], now: i64) -> Vec<EnqueueParams<'_>> {
    prepared
        .iter()
        .map(|p| EnqueueParams {
            queue: &p.job.queue,
            kind: &p.job.kind,
            priority: p.job.priority,
            unique_key: p.job.unique_key.as_deref(),
            unique_history_since: p.unique_history_since,
            payload: &p.payload,
            max_attempts: p.job.max_attempts,
            available_at: p.available_at,
            now,
            group: match (&p.job.group, p.group) {
                (Some(g), Some((max_size, grace_us, max_delay_us))) => Some(GroupParams {
                    key: &g.key,
                    max_size,
                    grace_us,
                    max_delay_us,
                }),
                _ => None,
            },
            depends_on: &p.depends_on,
            batch: p.job.batch,
            sequence: p.job.sequence.as_deref(),
            unique_statuses: p.unique_statuses.as_deref(),
        })
        .collect()
}

// A batch's calls: its builder reaches the queue through `BatchQueue`.
impl Queue {
    /// Starts building a batch (see [`crate::batch`]).
    pub fn batch(&self) -> BatchBuilder<'_> {
        BatchBuilder::new(self)
    }

    /// Seals batch `id` and commits: no job may join it any more, and when
    /// every member has finished, its callbacks are enqueued now. Sealing a
    /// sealed batch changes nothing. [`Error::InvalidArgument`] when there is
    /// no such batch.
    pub fn seal_batch(&self, id: i64) -> Result<()> {
        let found = self.store().seal_batch(id, self.now_micros())?;
        join_verdict(id, found.map(|_| false))
    }

    /// Batch `id`'s progress, counted per state. [`Error::InvalidArgument`]
    /// when there is no such batch.
    pub fn batch_status(&self, id: i64) -> Result<BatchStatus> {
        self.store()
            .batch(id)?
            .map(|row| row.status())
            .ok_or_else(|| Error::InvalidArgument(format!("no batch has id {id}")))
    }
}

impl BatchQueue for Queue {
    fn now_micros(&self) -> i64 {
        Queue::now_micros(self)
    }

    fn check_job(&self, job: &NewJob, now: i64) -> Result<()> {
        Queue::check_job(self, job, now)
    }

    fn create_batch(&self, p: &CreateBatchParams<'_>) -> Result<i64> {
        self.store().create_batch(p)
    }
}
