//! Prometheus metrics of a queue, in the text exposition format, through
//! [`prometheus-client`](prometheus_client) (the `metrics` feature, on by
//! default).
//!
//! Two kinds of numbers:
//!
//! - **Gauges read from the database at each scrape**, the same on every
//!   process: jobs per queue and live state, the dead-letter count, paused
//!   queues, queue limits, live workers (`backlog_workers`), due jobs no
//!   live worker handles (`backlog_unhandled_jobs{queue,kind}`), finished
//!   jobs per queue and status from the counts kept as jobs finish
//!   (`backlog_finished_jobs_total{queue,status}`, see [`crate::finished`]),
//!   open batches (`backlog_open_batches`) and workflows in progress
//!   (`backlog_live_workflows`), and on SQLite the size of the write-ahead
//!   log. [`Queue::metrics`]
//!   renders these alone (what `backlog metrics` prints).
//! - **What this process did**, counted from [`Queue::subscribe`] events by a
//!   [`Metrics`] recorder from its creation on: jobs enqueued (by queue and
//!   kind), leased, completed, retried, snoozed, released, dead, discarded,
//!   cancelled, rescued and lease-lost; jobs in flight; a histogram of
//!   handler run time; transactions retried after a transient failure
//!   (SQLite BUSY).
//!
//! ```
//! # fn main() -> backlog::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let queue = backlog::Queue::open(dir.path().join("app.db"))?;
//! let metrics = backlog::metrics::Metrics::new(&queue);
//! queue.enqueue(backlog::NewJob::new("email", serde_json::json!({})))?;
//! let text = metrics.render()?;
//! assert!(text.contains(r#"backlog_jobs{queue="default",state="available"} 1"#));
//! assert!(text.contains(r#"backlog_jobs_enqueued_total{queue="default",kind="email"} 1"#));
//! # Ok(())
//! # }
//! ```
//!
//! To serve backlog's metrics next to the application's own, register the
//! recorder in the application's registry with [`Metrics::register`].
//!
//! A scrape counts the live jobs (on SQLite from the lease and schedule
//! indexes, not the table; see `examples/metrics_scrape.rs` for its cost at
//! a million live jobs) and the `dead` range of history; it never reads the
//! rest of history. The open batches are counted in an index that holds
//! them alone (MySQL: their range of it), and the workflows in progress
//! with one seek of the step index per live job within the ids the steps
//! span (none on a queue without workflows).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{Receiver, TryRecvError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::clock::{self, ClockMicros};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::inspect::JobState;
use crate::queue::Queue;
use crate::sync;

type Labels = Vec<(&'static str, String)>;

fn labels(queue: &str, kind: &str) -> Labels {
    vec![("queue", queue.to_owned()), ("kind", kind.to_owned())]
}

/// Jobs whose start this process saw and whose end it has not: kept for the
/// run-time histogram, up to this many (a leak guard against lost events).
const MAX_TRACKED_RUNS: usize = 100_000;

impl Queue {
    /// The queue's gauges read from the database now, in Prometheus text
    /// format: jobs per queue and state, dead-letter count, paused queues,
    /// WAL size (SQLite). For counters of what this process did, keep a
    /// [`Metrics`] instead.
    pub fn metrics(&self) -> Result<String> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Gauges {
            queue: self.clone(),
        }));
        render(&registry)
    }
}

/// A queue's metrics recorder: the database gauges plus counters of the
/// events this process sends from its creation on. Counting runs on a
/// thread of its own (`backlog-metrics`) that ends once the recorder (every
/// clone) or the queue is dropped.
#[derive(Debug, Clone)]
pub struct Metrics {
    queue: Queue,
    counts: Arc<EventCounts>,
}

impl Metrics {
    /// Starts counting `queue`'s events.
    pub fn new(queue: &Queue) -> Metrics {
        let counts = Arc::new(EventCounts {
            events: queue.subscribe(),
            clock: Some(queue.options().clock.clone()),
            ..EventCounts::default()
        });
        // The thread holds the counters weakly: it ends at the first event
        // after the last `Metrics` handle is dropped, or when the queue is.
        let (recorder, events) = (Arc::downgrade(&counts), counts.events.clone());
        let spawned = std::thread::Builder::new()
            .name("backlog-metrics".into())
            .spawn(move || {
                // Waits for an event without taking it, so that events leave
                // the channel only under the gate (see `EventCounts::drain`).
                let mut ready = crossbeam_channel::Select::new();
                ready.recv(&events);
                loop {
                    ready.ready();
                    match recorder.upgrade() {
                        Some(counts) if counts.drain() => {}
                        _ => return,
                    }
                }
            });
        // Without the thread, scrapes still drain the events.
        drop(spawned);
        Metrics {
            queue: queue.clone(),
            counts,
        }
    }

    /// Adds backlog's metrics to an application's registry, so one endpoint
    /// serves both. The gauges are read from the database at each scrape.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(Gauges {
            queue: self.queue.clone(),
        }));
        registry.register_collector(Box::new(Counters {
            queue: self.queue.clone(),
            counts: self.counts.clone(),
        }));
    }

    /// Renders every metric in Prometheus text format. Every event sent
    /// before the call is counted.
    pub fn render(&self) -> Result<String> {
        let mut registry = Registry::default();
        self.register(&mut registry);
        render(&registry)
    }
}

fn render(registry: &Registry) -> Result<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .map_err(|_| Error::Database("could not encode the metrics".into()))?;
    Ok(text)
}

/// The gauges read from the database at each scrape.
#[derive(Debug)]
struct Gauges {
    queue: Queue,
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let started = Instant::now();
        let read = self
            .queue
            .depth()
            .and_then(|depth| Ok((depth, self.queue.paused_queues()?)))
            .and_then(|(depth, paused)| Ok((depth, paused, self.queue.all_limits()?)));
        let up = ConstGauge::new(i64::from(read.is_ok()));
        up.encode(encoder.encode_descriptor(
            "backlog_database_up",
            "Whether the last scrape could read the queue's database (1) or not (0)",
            None,
            up.metric_type(),
        )?)?;
        if let Ok((depth, paused, limits)) = read {
            let jobs = Family::<Labels, Gauge>::default();
            let dead = Family::<Labels, Gauge>::default();
            for c in &depth {
                let count = i64::try_from(c.count).unwrap_or(i64::MAX);
                match c.state {
                    JobState::Finished(_) => dead.get_or_create(&vec![("queue", c.queue.clone())]),
                    state => jobs.get_or_create(&vec![
                        ("queue", c.queue.clone()),
                        ("state", state.as_str().to_owned()),
                    ]),
                }
                .set(count);
            }
            jobs.encode(encoder.encode_descriptor(
                "backlog_jobs",
                "Live jobs per queue and state (available, scheduled, retrying, running, grouped, pending)",
                None,
                jobs.metric_type(),
            )?)?;
            dead.encode(encoder.encode_descriptor(
                "backlog_dead_letter_jobs",
                "Jobs in history as dead (their last attempt failed), per queue",
                None,
                dead.metric_type(),
            )?)?;
            let paused_family = Family::<Labels, Gauge>::default();
            for queue in paused {
                paused_family.get_or_create(&vec![("queue", queue)]).set(1);
            }
            paused_family.encode(encoder.encode_descriptor(
                "backlog_queue_paused",
                "1 for each paused queue",
                None,
                paused_family.metric_type(),
            )?)?;
            let concurrency = Family::<Labels, Gauge>::default();
            let rate = Family::<Labels, Gauge>::default();
            let period = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            for (queue, l) in limits {
                let label = vec![("queue", queue)];
                if let Some(n) = l.concurrency {
                    concurrency.get_or_create(&label).set(i64::from(n));
                }
                if let Some(r) = l.rate {
                    rate.get_or_create(&label).set(i64::from(r.limit));
                    period.get_or_create(&label).set(r.period.as_secs_f64());
                }
            }
            concurrency.encode(encoder.encode_descriptor(
                "backlog_queue_concurrency_limit",
                "Each limited queue's global concurrency limit: at most this many running",
                None,
                concurrency.metric_type(),
            )?)?;
            rate.encode(encoder.encode_descriptor(
                "backlog_queue_rate_limit",
                "Each rate-limited queue's limit: at most this many started per period",
                None,
                rate.metric_type(),
            )?)?;
            period.encode(encoder.encode_descriptor(
                "backlog_queue_rate_period",
                "Each rate-limited queue's period (a fixed window)",
                Some(&Unit::Seconds),
                period.metric_type(),
            )?)?;
        }
        // The worker registry: a failed read leaves these out (and the
        // next scrape tries again); `backlog_database_up` speaks for the
        // database.
        if let Ok(workers) = self.queue.workers() {
            let live = ConstGauge::new(i64::try_from(workers.len()).unwrap_or(i64::MAX));
            live.encode(encoder.encode_descriptor(
                "backlog_workers",
                "Live workers on this database: started, not shut down, heartbeat not expired",
                None,
                live.metric_type(),
            )?)?;
        }
        // Batches and workflows: each count seeks an index over what is not
        // finished (see `backend::gauges`); a failed read leaves them out.
        if let Ok(flows) = self.queue.store().flow_counts() {
            let open = ConstGauge::new(flows.open_batches);
            open.encode(encoder.encode_descriptor(
                "backlog_open_batches",
                "Batches created and not finished: open to new members, or sealed with \
                 members still to finish (their callbacks not enqueued yet)",
                None,
                open.metric_type(),
            )?)?;
            let live = ConstGauge::new(flows.live_workflows);
            live.encode(encoder.encode_descriptor(
                "backlog_live_workflows",
                "Workflows in progress: at least one step not finished (pending, available, \
                 scheduled, retrying or running)",
                None,
                live.metric_type(),
            )?)?;
        }
        if let Ok(unhandled) = self.queue.unhandled() {
            let family = Family::<Labels, Gauge>::default();
            for u in unhandled {
                family
                    .get_or_create(&labels(&u.queue, &u.kind))
                    .set(i64::try_from(u.due).unwrap_or(i64::MAX));
            }
            family.encode(encoder.encode_descriptor(
                "backlog_unhandled_jobs",
                "Due jobs per queue and kind that no live worker handles: they wait until a \
                 worker with a handler for the kind serves the queue",
                None,
                family.metric_type(),
            )?)?;
        }
        // Finished jobs since the counts began, from the counts kept as
        // jobs finish (never history): the same on every process, so a
        // rate over it is the whole database's throughput.
        if let Ok(totals) = self.queue.finished_totals() {
            let family = Family::<Labels, Counter>::default();
            for t in totals {
                for status in crate::outcome::FinalStatus::ALL {
                    let n = t.totals.get(status);
                    if n > 0 {
                        family
                            .get_or_create(&vec![
                                ("queue", t.queue.clone()),
                                ("status", status.as_str().to_owned()),
                            ])
                            .inc_by(n);
                    }
                }
            }
            family.encode(encoder.encode_descriptor(
                "backlog_finished_jobs",
                "Jobs finished per queue and status (completed, discarded, cancelled, dead, \
                 aggregated) on this database since its counts began, read from the counts \
                 kept as jobs finish",
                None,
                family.metric_type(),
            )?)?;
        }
        if let Ok(bytes) = crate::sqlite::QueueExt::wal_size(&self.queue) {
            let wal = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
            wal.encode(encoder.encode_descriptor(
                "backlog_sqlite_wal_size",
                "Size of the SQLite write-ahead log",
                Some(&Unit::Bytes),
                wal.metric_type(),
            )?)?;
        }
        if let Some((complete, partial, failed)) =
            crate::sqlite::diagnostics::checkpoint_counts(&self.queue)
        {
            let checkpoints = Family::<Labels, Counter>::default();
            for (result, n) in [
                ("complete", complete),
                ("partial", partial),
                ("failed", failed),
            ] {
                checkpoints
                    .get_or_create(&vec![("result", result.to_owned())])
                    .inc_by(n);
            }
            checkpoints.encode(encoder.encode_descriptor(
                "backlog_sqlite_checkpoints",
                "WAL checkpoints of this queue's connections by result: complete (the whole \
                 log copied back), partial (other connections kept part of it), failed",
                None,
                checkpoints.metric_type(),
            )?)?;
        }
        let took = ConstGauge::new(started.elapsed().as_secs_f64());
        took.encode(encoder.encode_descriptor(
            "backlog_scrape_duration",
            "How long reading the database gauges took",
            Some(&Unit::Seconds),
            took.metric_type(),
        )?)?;
        Ok(())
    }
}

/// What this process did, from its events.
#[derive(Debug)]
struct Counters {
    queue: Queue,
    counts: Arc<EventCounts>,
}

impl Collector for Counters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let c = &self.counts;
        c.drain();
        c.enqueued.encode(encoder.encode_descriptor(
            "backlog_jobs_enqueued",
            "Jobs this process enqueued, per queue and kind",
            None,
            c.enqueued.metric_type(),
        )?)?;
        c.counted.encode(encoder.encode_descriptor(
            "backlog_job_events",
            "What happened to jobs in this process, per event (leased, started, completed, \
             retried, snoozed, released, dead, discarded, cancelled, rescued, lease_lost; \
             missed: events this recorder fell behind on and did not see), queue and kind \
             (empty for a job this process did not lease)",
            None,
            c.counted.metric_type(),
        )?)?;
        c.latency.encode(encoder.encode_descriptor(
            "backlog_job_start_latency",
            "From when a job was due to when its handler started in this process, per queue \
             and kind",
            Some(&Unit::Seconds),
            c.latency.metric_type(),
        )?)?;
        let in_flight = ConstGauge::new(c.in_flight.load(Ordering::Relaxed));
        in_flight.encode(encoder.encode_descriptor(
            "backlog_jobs_in_flight",
            "Jobs this process leased and has not settled yet",
            None,
            in_flight.metric_type(),
        )?)?;
        c.run_time.encode(encoder.encode_descriptor(
            "backlog_job_run",
            "Handler run time, from start to settlement, of jobs run in this process, per \
             queue and kind",
            Some(&Unit::Seconds),
            c.run_time.metric_type(),
        )?)?;
        let busy = ConstCounter::new(self.queue.busy_retries());
        busy.encode(encoder.encode_descriptor(
            "backlog_busy_retries",
            "Transactions retried after a transient failure (SQLite BUSY/LOCKED, a \
             server's deadlock or serialization failure)",
            None,
            busy.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Counters fed from the queue's events.
#[derive(Debug)]
struct EventCounts {
    events: Receiver<Event>,
    /// Held while events are taken from the channel and counted: a scrape
    /// that drains under it has counted every event sent before it.
    gate: Mutex<()>,
    enqueued: Family<Labels, Counter>,
    counted: Family<Labels, Counter>,
    in_flight: AtomicI64,
    run_time: Family<Labels, Histogram, fn() -> Histogram>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// Leased jobs not settled yet: their labels, when they were due, and
    /// when their handler started.
    leased: Mutex<HashMap<i64, Tracked>>,
    /// The queue's clock, for the start latency (due times are on it).
    clock: Option<Arc<dyn crate::Clock>>,
}

/// A job this process leased and has not settled yet.
#[derive(Debug)]
struct Tracked {
    queue: String,
    kind: String,
    available_at: i64,
    started: Option<Instant>,
}

/// 1 ms to about 9 minutes.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

impl Default for EventCounts {
    fn default() -> Self {
        EventCounts {
            events: crossbeam_channel::never(),
            gate: Mutex::new(()),
            enqueued: Family::default(),
            counted: Family::default(),
            in_flight: AtomicI64::new(0),
            run_time: Family::new_with_constructor(seconds_histogram),
            latency: Family::new_with_constructor(seconds_histogram),
            leased: Mutex::new(HashMap::new()),
            clock: None,
        }
    }
}

impl EventCounts {
    /// Counts every event waiting in the channel; false once the queue is
    /// gone (its event bus dropped).
    fn drain(&self) -> bool {
        let _gate = sync::lock(&self.gate);
        loop {
            match self.events.try_recv() {
                Ok(event) => self.record(&event),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn record(&self, event: &Event) {
        let (name, job_id, settles) = match event {
            Event::Enqueued { queue, kind, .. } => {
                self.enqueued
                    .get_or_create(&vec![("queue", queue.clone()), ("kind", kind.clone())])
                    .inc();
                return;
            }
            Event::Leased {
                job_id,
                queue,
                kind,
                available_at,
                ..
            } => {
                let mut leased = sync::lock(&self.leased);
                let tracked = Tracked {
                    queue: queue.clone(),
                    kind: kind.clone(),
                    available_at: clock::micros(*available_at),
                    started: None,
                };
                if leased.len() < MAX_TRACKED_RUNS && leased.insert(*job_id, tracked).is_none() {
                    self.in_flight.fetch_add(1, Ordering::Relaxed);
                }
                ("leased", *job_id, false)
            }
            Event::Started { job_id, .. } => {
                let mut leased = sync::lock(&self.leased);
                if let Some(job) = leased.get_mut(job_id) {
                    job.started = Some(Instant::now());
                    if let Some(clock) = &self.clock {
                        let waited = clock.now_micros().saturating_sub(job.available_at).max(0);
                        self.latency
                            .get_or_create(&labels(&job.queue, &job.kind))
                            .observe(waited as f64 / 1e6);
                    }
                }
                ("started", *job_id, false)
            }
            Event::Completed { job_id } => ("completed", *job_id, true),
            Event::Retried { job_id, .. } => ("retried", *job_id, true),
            Event::Snoozed { job_id, .. } => ("snoozed", *job_id, true),
            Event::Released { job_id } => ("released", *job_id, true),
            Event::Dead { job_id } => ("dead", *job_id, true),
            Event::Discarded { job_id } => ("discarded", *job_id, true),
            Event::Cancelled { job_id } => ("cancelled", *job_id, true),
            Event::Rescued { job_id } => ("rescued", *job_id, true),
            Event::LeaseLost { job_id } => ("lease_lost", *job_id, true),
            Event::Lagged { missed } => {
                // The recorder fell behind: say so rather than undercount
                // silently.
                let mut missed_labels = labels("", "");
                missed_labels.insert(0, ("event", "missed".to_owned()));
                self.counted.get_or_create(&missed_labels).inc_by(*missed);
                return;
            }
            #[allow(unreachable_patterns)]
            _ => return,
        };
        let mut leased = sync::lock(&self.leased);
        let (queue, kind) = leased
            .get(&job_id)
            .map_or((String::new(), String::new()), |j| {
                (j.queue.clone(), j.kind.clone())
            });
        let mut event_labels = labels(&queue, &kind);
        event_labels.insert(0, ("event", name.to_owned()));
        self.counted.get_or_create(&event_labels).inc();
        if settles {
            if let Some(job) = leased.remove(&job_id) {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                if let (Some(started), false) = (job.started, name == "lease_lost") {
                    self.run_time
                        .get_or_create(&labels(&job.queue, &job.kind))
                        .observe(started.elapsed().as_secs_f64());
                }
            }
        }
    }
}
