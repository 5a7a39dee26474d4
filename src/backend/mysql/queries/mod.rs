//! The MySQL/MariaDB backend's SQL: the statement templates, one per
//! operation, in `templates.rs` (in the order of a job's life, beside
//! `sqlite/queries.rs` and `postgres/queries/`), and here [`Tables`] and
//! [`Sql`], which render them for one queue's tables once at connect.

mod counts;
mod flows;
mod inspect;
mod multi_row;
mod sequences;
mod templates;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::live_state;
use crate::backend::statements::{
    FlowStatements, FlowTexts, InspectStatements, SequenceStatements,
};
use crate::sync;

pub use counts::COUNT_MOVED;
pub use flows::OwnFlows;
pub use multi_row::{enqueue_row, enqueue_rows, RowShape, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY};
pub use sequences::OwnSequences;
pub use templates::*;

/// The queue's three tables, qualified and quoted.
#[derive(Debug, Clone)]
pub struct Tables {
    pub jobs: String,
    pub history: String,
    pub queues: String,
    pub groups: String,
    pub group_members: String,
    /// Periodic schedules (`schedules.rs`).
    pub schedules: String,
    /// Refinery's record of the applied migrations (`migrate.rs`).
    pub schema_history: String,
    /// Dependencies and workflows (`flows.rs`).
    pub pending: String,
    pub dependencies: String,
    pub workflows: String,
    pub workflow_steps: String,
    pub releases: String,
    /// Batches and their unfinished members (`batches.rs`).
    pub batches: String,
    pub batch_jobs: String,
    /// The live-worker registry (`workers.rs`).
    pub workers: String,
    /// The finished-job counts (`counts.rs`).
    pub finished_counts: String,
    /// Each sequence's tail, and each sequenced job's key (`sequences.rs`).
    pub sequences: String,
    pub sequence_jobs: String,
}

impl Tables {
    /// `database`.`prefix…`: the database quoted (backticks doubled), the
    /// prefix a checked identifier.
    pub fn new(database: &str, prefix: &str) -> Tables {
        let db = format!("`{}`", database.replace('`', "``"));
        Tables {
            jobs: format!("{db}.`{prefix}jobs`"),
            history: format!("{db}.`{prefix}history`"),
            queues: format!("{db}.`{prefix}queues`"),
            groups: format!("{db}.`{prefix}groups`"),
            group_members: format!("{db}.`{prefix}group_members`"),
            schedules: format!("{db}.`{prefix}schedules`"),
            schema_history: format!("{db}.`{prefix}schema_history`"),
            pending: format!("{db}.`{prefix}pending`"),
            dependencies: format!("{db}.`{prefix}dependencies`"),
            workflows: format!("{db}.`{prefix}workflows`"),
            workflow_steps: format!("{db}.`{prefix}workflow_steps`"),
            releases: format!("{db}.`{prefix}releases`"),
            batches: format!("{db}.`{prefix}batches`"),
            batch_jobs: format!("{db}.`{prefix}batch_jobs`"),
            workers: format!("{db}.`{prefix}workers`"),
            finished_counts: format!("{db}.`{prefix}finished_counts`"),
            sequences: format!("{db}.`{prefix}sequences`"),
            sequence_jobs: format!("{db}.`{prefix}sequence_jobs`"),
        }
    }

    /// Fills a template's placeholders.
    pub fn render(&self, template: &str) -> String {
        template
            .replace("{now}", NOW)
            .replace("{jobs}", &self.jobs)
            .replace("{history}", &self.history)
            .replace("{queues}", &self.queues)
            .replace("{groups}", &self.groups)
            .replace("{group_members}", &self.group_members)
            .replace("{schedules}", &self.schedules)
            .replace("{pending}", &self.pending)
            .replace("{dependencies}", &self.dependencies)
            .replace("{workflows}", &self.workflows)
            .replace("{workflow_steps}", &self.workflow_steps)
            .replace("{releases}", &self.releases)
            .replace("{batch_jobs}", &self.batch_jobs)
            .replace("{batches}", &self.batches)
            .replace("{workers}", &self.workers)
            .replace("{finished_counts}", &self.finished_counts)
            .replace("{sequences}", &self.sequences)
            .replace("{sequence_jobs}", &self.sequence_jobs)
    }
}

/// Every fixed statement, rendered for one queue's tables. The lease, whose
/// text depends on the number of queues and kinds, is rendered per call.
#[derive(Debug)]
pub struct Sql {
    pub tables: Tables,
    /// Whether the server has `INSERT .. RETURNING` (MariaDB).
    pub returning: bool,
    pub enqueue: String,
    pub find_live_unique: String,
    pub find_history_unique: String,
    pub claim: String,
    pub claim_bounding: String,
    pub finish_to_history: String,
    /// The finished counts of the jobs a finish moved (`counts.rs`), on
    /// every finishing transaction.
    pub count_moved: String,
    pub lock_held: String,
    pub complete_many_to_history: String,
    pub delete_many_live: String,
    pub delete_live: String,
    pub reschedule: String,
    pub cancel_requested: String,
    pub lease_held: String,
    pub progress_lock: String,
    pub progress_lock_wait: String,
    pub join_group_member: String,
    pub join_group: String,
    pub ready_groups: String,
    pub group_members: String,
    pub aggregate_to_history: String,
    pub delete_aggregated: String,
    pub group_left: String,
    pub delete_group: String,
    pub rearm_group: String,
    pub next_group_ready: String,
    pub import_grouped: String,
    pub get_grouped: String,
    pub count_grouped: String,
    pub write_progress: String,
    pub heartbeat_lock: String,
    pub heartbeat: String,
    pub heartbeat_held: String,
    pub expired_leases: String,
    pub unheld_leases: String,
    pub get_live: String,
    pub get_history: String,
    pub inspect: InspectStatements,
    pub depth: String,
    pub import_live: String,
    pub import_history: String,
    pub raise_next_id: String,
    pub drop_id_placeholder: String,
    pub prune_history: String,
    /// The rest of a prune, in order: jobs, edges out and in, the steps'
    /// workflows, steps, workflows.
    pub prune: [String; 6],
    pub latest_job: String,
    pub flows: FlowStatements<OwnFlows>,
    pub sequences: SequenceStatements,
    pub own_sequences: OwnSequences,
    /// The multi-row inserts rendered so far, by rows, shape and whether
    /// they return ids ([`Sql::enqueue_rows`], [`Sql::enqueue_row`]).
    enqueue_rows: Mutex<HashMap<(usize, RowShape, bool), Arc<str>>>,
}

impl Sql {
    pub fn new(tables: Tables, returning: bool) -> Sql {
        let r = |t: &str| tables.render(t);
        Sql {
            enqueue: r(ENQUEUE),
            find_live_unique: r(FIND_LIVE_UNIQUE),
            find_history_unique: r(FIND_HISTORY_UNIQUE),
            claim: r(CLAIM),
            claim_bounding: r(CLAIM_BOUNDING),
            finish_to_history: r(FINISH_TO_HISTORY),
            count_moved: r(COUNT_MOVED),
            lock_held: r(LOCK_HELD),
            complete_many_to_history: r(COMPLETE_MANY_TO_HISTORY),
            delete_many_live: r(DELETE_MANY_LIVE),
            delete_live: r(DELETE_LIVE),
            reschedule: r(RESCHEDULE),
            cancel_requested: r(CANCEL_REQUESTED),
            lease_held: r(LEASE_HELD),
            progress_lock: r(PROGRESS_LOCK),
            progress_lock_wait: r(PROGRESS_LOCK_WAIT),
            join_group_member: r(JOIN_GROUP_MEMBER),
            join_group: r(JOIN_GROUP),
            ready_groups: r(READY_GROUPS),
            group_members: r(GROUP_MEMBERS),
            aggregate_to_history: r(AGGREGATE_TO_HISTORY),
            delete_aggregated: r(DELETE_AGGREGATED),
            group_left: r(GROUP_LEFT),
            delete_group: r(DELETE_GROUP),
            rearm_group: r(REARM_GROUP),
            next_group_ready: r(NEXT_GROUP_READY),
            import_grouped: r(IMPORT_GROUPED),
            get_grouped: r(&format!(
                "SELECT {GROUPED_COLUMNS} FROM {{group_members}} WHERE id = :id"
            )),
            count_grouped: r(COUNT_GROUPED),
            write_progress: r(WRITE_PROGRESS),
            heartbeat_lock: r(HEARTBEAT_LOCK),
            heartbeat: r(HEARTBEAT),
            heartbeat_held: r(HEARTBEAT_HELD),
            expired_leases: r(EXPIRED_LEASES),
            unheld_leases: r(UNHELD_LEASES),
            get_live: r(&format!(
                "SELECT {LIVE_COLUMNS} FROM {{jobs}} WHERE id = :id"
            )),
            get_history: r(&format!(
                "SELECT {HISTORY_COLUMNS} FROM {{history}} WHERE id = :id"
            )),
            inspect: InspectStatements::render::<Sql>(r),
            depth: r(&format!(
                "{}\nUNION ALL{}",
                depth(),
                <Sql as FlowTexts>::COUNT_PENDING
            )),
            import_live: r(IMPORT_LIVE),
            import_history: r(IMPORT_HISTORY),
            raise_next_id: r(RAISE_NEXT_ID),
            drop_id_placeholder: r(DROP_ID_PLACEHOLDER),
            prune_history: r(PRUNE_HISTORY),
            prune: [
                r(PRUNE_JOBS),
                r(PRUNE_EDGES_OUT),
                r(PRUNE_EDGES_IN),
                r(PRUNE_STEPS_OF),
                r(PRUNE_STEPS),
                r(PRUNE_WORKFLOWS),
            ],
            latest_job: r(LATEST_JOB),
            flows: FlowStatements::render::<Sql>(r, OwnFlows::new(r)),
            sequences: SequenceStatements::render::<Sql>(r),
            own_sequences: OwnSequences::new(r),
            tables,
            returning,
            enqueue_rows: Mutex::default(),
        }
    }

    /// When the next job of this many queues comes due.
    pub fn next_due(&self, queue_count: usize) -> String {
        self.tables.render(&next_due(queue_count))
    }

    /// The multi-row insert of `rows` jobs of one [`RowShape`] (MariaDB),
    /// returning their queues and unique keys too when keyed.
    /// Rendered once per queue and kept: rendering the text of 1,000 rows
    /// for every call was the largest cost on the client (BENCHMARKS.md,
    /// issue 20's MariaDB enqueue). The sizes are `enqueue.rs`'s few chunk
    /// sizes, so the cache holds at most forty texts (a queue's clock is
    /// manual or not, so twenty are ever used).
    pub fn enqueue_rows(&self, rows: usize, shape: RowShape) -> Arc<str> {
        self.kept((rows, shape, true), || enqueue_rows(rows, shape))
    }

    /// One job's insert of one [`RowShape`], without `RETURNING` (MySQL
    /// too), kept as [`Sql::enqueue_rows`] is.
    pub fn enqueue_row(&self, shape: RowShape) -> Arc<str> {
        self.kept((1, shape, false), || enqueue_row(shape))
    }

    fn kept(&self, key: (usize, RowShape, bool), text: impl FnOnce() -> String) -> Arc<str> {
        let mut cache = sync::lock(&self.enqueue_rows);
        cache
            .entry(key)
            .or_insert_with(|| self.tables.render(&text()).into())
            .clone()
    }

    /// The lease walk for this many queues and kinds (0: any kind).
    pub fn lease(&self, queue_count: usize, kinds: usize) -> String {
        self.tables.render(&lease(queue_count, kinds))
    }

    /// The lease walk of one limited queue, counting its running jobs.
    pub fn lease_counting(&self, kinds: usize) -> String {
        self.tables.render(&lease_candidates_counting(kinds))
    }

    /// The lease walk of one limited queue whose places this transaction's
    /// settles freed: its running jobs and its concurrency limit read too.
    pub fn lease_handed(&self, kinds: usize) -> String {
        self.tables.render(&lease_candidates_handed(kinds))
    }

    /// One page of jobs in a state: history by status, or live by derived
    /// state.
    pub fn list(&self, state: Option<&str>) -> String {
        let sql = match state {
            Some("pending") => return self.flows.own.list_pending.clone(),
            Some("grouped") => format!(
                "SELECT {GROUPED_COLUMNS} FROM {{group_members}}
                 WHERE (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 AND id > :after ORDER BY id LIMIT :limit"
            ),
            None => format!(
                "SELECT {HISTORY_COLUMNS} FROM {{history}} WHERE status = :status
                 AND (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 AND id > :after ORDER BY id LIMIT :limit"
            ),
            Some(live) => format!(
                "SELECT {LIVE_COLUMNS} FROM {{jobs}} WHERE {}
                 AND (:queue IS NULL OR queue = :queue) AND (:kind IS NULL OR kind = :kind)
                 AND id > :after ORDER BY id LIMIT :limit",
                live_state::condition(live, "{now}")
            ),
        };
        self.tables.render(&sql)
    }
}
