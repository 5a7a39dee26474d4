//! The PostgreSQL backend's SQL: the statement templates, one per
//! operation, in `enqueue.rs` and `templates.rs` (in the order of a job's
//! life, beside `sqlite/queries.rs` and `mysql/queries/`), those of
//! dependencies and workflows, sequences and limits in `flows.rs`,
//! `sequences.rs` and `limits.rs` here (each with its struct of rendered
//! statements), and here [`Tables`] and [`Queries`], which render them all
//! for one queue's tables once at connect. Every file that runs them is
//! above this folder, and none is named here.

mod enqueue;
mod flows;
mod inspect;
mod limits;
mod sequences;
mod templates;

pub use enqueue::*;
pub(crate) use flows::OwnFlows;
pub(crate) use limits::LimitQueries;
pub use templates::*;

use crate::backend::statements::{
    FlowStatements, FlowTexts, InspectStatements, SequenceStatements,
};
use crate::options::QueueOptions;

/// The names a queue's SQL is rendered with.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    /// `schema.` or empty.
    pub schema: String,
    pub prefix: String,
}

impl Tables {
    pub(crate) fn new(options: &QueueOptions) -> Tables {
        Tables {
            schema: options
                .schema
                .as_ref()
                .map_or_else(String::new, |s| format!("{s}.")),
            prefix: options.table_prefix.clone(),
        }
    }

    /// A template with the table names, the clock and the token filled in.
    pub(crate) fn render(&self, template: &str) -> String {
        let (schema, prefix) = (&self.schema, &self.prefix);
        template
            .replace("{leased_columns}", LEASED_COLUMNS)
            .replace("{jobs}", &format!("{schema}{prefix}jobs"))
            .replace("{history}", &format!("{schema}{prefix}history"))
            .replace("{queues}", &format!("{schema}{prefix}queues"))
            .replace("{groups}", &format!("{schema}{prefix}groups"))
            .replace("{group_members}", &format!("{schema}{prefix}group_members"))
            .replace("{schedules}", &format!("{schema}{prefix}schedules"))
            .replace("{workers}", &format!("{schema}{prefix}workers"))
            .replace("{pending}", &format!("{schema}{prefix}pending"))
            .replace("{dependencies}", &format!("{schema}{prefix}dependencies"))
            .replace("{workflows}", &format!("{schema}{prefix}workflows"))
            .replace(
                "{workflow_steps}",
                &format!("{schema}{prefix}workflow_steps"),
            )
            .replace("{batches}", &format!("{schema}{prefix}batches"))
            .replace("{batch_jobs}", &format!("{schema}{prefix}batch_jobs"))
            .replace(
                "{finished_counts}",
                &format!("{schema}{prefix}finished_counts"),
            )
            .replace("{sequences}", &format!("{schema}{prefix}sequences"))
            .replace("{sequence_jobs}", &format!("{schema}{prefix}sequence_jobs"))
            .replace("{channel}", &self.channel())
            .replace("{now}", NOW)
            .replace("{token}", TOKEN)
    }

    /// The notification channel of this queue's tables: one per schema and
    /// prefix, so queues sharing a server do not wake each other. A name
    /// longer than PostgreSQL's 63-byte identifiers is replaced by a hash of
    /// it (a schema and a prefix may be 32 bytes each).
    pub(crate) fn channel(&self) -> String {
        let name = format!("{}{}jobs", self.schema, self.prefix);
        if name.len() <= 63 {
            return name;
        }
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("backlog_{hash:016x}")
    }

    /// The migration history table refinery keeps.
    pub(crate) fn schema_history(&self) -> String {
        format!("{}{}schema_history", self.schema, self.prefix)
    }
}

/// Every statement, rendered once at connect.
#[derive(Debug)]
pub(crate) struct Queries {
    pub tables: Tables,
    /// The queue's clock is a manual one (tests): its time overrides the
    /// server's.
    pub manual_clock: bool,
    pub channel: String,
    pub enqueue: String,
    pub enqueue_batch: String,
    pub enqueue_batch_uniform: String,
    pub enqueue_notify: String,
    pub enqueue_plain: String,
    pub find_live_unique: String,
    pub find_history_unique: String,
    pub lease: String,
    pub next_due: String,
    pub lease_queues: String,
    pub finish_to_history: String,
    pub delete_live: String,
    pub reschedule: String,
    pub lease_held: String,
    pub write_progress: String,
    pub write_progress_wait: String,
    pub join_group_member: String,
    pub join_group: String,
    pub ready_groups: String,
    pub group_members: String,
    pub aggregate_to_history: String,
    pub group_left: String,
    pub delete_group: String,
    pub rearm_group: String,
    pub next_group_ready: String,
    pub count_grouped: String,
    pub import_grouped: String,
    pub heartbeat: String,
    pub expired_leases: String,
    pub unheld_leases: String,
    pub inspect: InspectStatements,
    pub limits: LimitQueries,
    pub flows: FlowStatements<OwnFlows>,
    pub sequences: SequenceStatements,
    /// [`COUNT_WAITING_DUE`], [`COUNT_WAITING_LATER`], [`COUNT_RUNNING`] and
    /// [`COUNT_DEAD`] as one statement.
    pub depth: String,
    pub import_live: String,
    pub import_history: String,
    pub raise_next_id: String,
    pub prune_history: String,
    pub notify: String,
    pub listen: String,
}

impl Queries {
    pub(crate) fn render(tables: Tables, manual_clock: bool) -> Queries {
        let r = |t: &str| tables.render(t);
        Queries {
            manual_clock,
            channel: tables.channel(),
            enqueue: r(ENQUEUE),
            enqueue_batch: r(ENQUEUE_BATCH),
            enqueue_batch_uniform: r(ENQUEUE_BATCH_UNIFORM),
            enqueue_notify: r(ENQUEUE_NOTIFY),
            enqueue_plain: r(&enqueue_plain()),
            find_live_unique: r(FIND_LIVE_UNIQUE),
            find_history_unique: r(FIND_HISTORY_UNIQUE),
            lease: r(LEASE),
            next_due: r(NEXT_DUE),
            lease_queues: r(LEASE_QUEUES),
            finish_to_history: r(FINISH_TO_HISTORY),
            delete_live: r(DELETE_LIVE),
            reschedule: r(RESCHEDULE),
            lease_held: r(LEASE_HELD),
            write_progress: r(WRITE_PROGRESS),
            write_progress_wait: r(WRITE_PROGRESS_WAIT),
            join_group_member: r(JOIN_GROUP_MEMBER),
            join_group: r(JOIN_GROUP),
            ready_groups: r(READY_GROUPS),
            group_members: r(GROUP_MEMBERS),
            aggregate_to_history: r(AGGREGATE_TO_HISTORY),
            group_left: r(GROUP_LEFT),
            delete_group: r(DELETE_GROUP),
            rearm_group: r(REARM_GROUP),
            next_group_ready: r(NEXT_GROUP_READY),
            count_grouped: r(COUNT_GROUPED),
            import_grouped: r(IMPORT_GROUPED),
            heartbeat: r(HEARTBEAT),
            expired_leases: r(EXPIRED_LEASES),
            unheld_leases: r(UNHELD_LEASES),
            inspect: InspectStatements::render::<Queries>(r),
            limits: LimitQueries::render(r),
            flows: FlowStatements::render::<Queries>(r, OwnFlows::render(r)),
            sequences: SequenceStatements::render::<Queries>(r),
            depth: r(&[
                COUNT_WAITING_DUE,
                COUNT_WAITING_LATER,
                COUNT_RUNNING,
                COUNT_GROUPED,
                &tables.render(<Queries as FlowTexts>::COUNT_PENDING),
                COUNT_DEAD,
            ]
            .map(|part| format!("({part})"))
            .join("\nUNION ALL\n")),
            import_live: r(IMPORT_LIVE),
            import_history: r(IMPORT_HISTORY),
            raise_next_id: r(RAISE_NEXT_ID),
            prune_history: r(PRUNE_HISTORY),
            notify: r(NOTIFY),
            listen: r(LISTEN),
            tables,
        }
    }
}

impl Queries {
    /// The `$1` of a statement: the engine's `now` for a manual clock, else
    /// NULL, so the server's clock is used.
    pub(crate) fn now_override(&self, now: i64) -> Option<i64> {
        self.manual_clock.then_some(now)
    }
}
