//! The lists of statements both servers run, named once. PostgreSQL and
//! MySQL apply dependencies, workflows and sequences, and an operator's
//! calls, with the same statements, each written in its own dialect: a list
//! here is a trait of the texts ([`FlowTexts`], [`SequenceTexts`],
//! [`InspectTexts`]) that each server's `queries/` implements beside the
//! SQL of the other (same names, same order), and a struct of them rendered
//! for one queue's tables ([`FlowStatements`], [`SequenceStatements`],
//! [`InspectStatements`]), filled here from any dialect's texts. So the compiler checks that each server has every
//! statement, and a statement added to the list is added to both.
//!
//! A statement only one server runs (MySQL's read back of what an `UPDATE
//! .. RETURNING` returns on PostgreSQL) is in that server's struct of its
//! own statements, the `own` of these (`sql.flows.own.remaining`), so that
//! a reader sees which statements one server alone needs.

use crate::backend::live_state;

/// The texts of [`FlowStatements`], one dialect's (the statements of
/// `flows.rs`, `workflows.rs` and `flows/cascade.rs`), before rendering:
/// `{jobs}`, `{now}` and the other placeholders are filled at connect.
pub(crate) trait FlowTexts {
    // ---- enqueue ---------------------------------------------------------
    /// Whether a dependency is pending, its row share-locked.
    const PENDING_FOR_SHARE: &'static str;
    /// Whether a dependency is live, its row share-locked.
    const LIVE_FOR_SHARE: &'static str;
    /// A finished dependency's status.
    const HISTORY_STATUS: &'static str;
    /// [`FlowTexts::PENDING_FOR_SHARE`] for a batch's dependencies.
    const PENDING_MANY_FOR_SHARE: &'static str;
    /// [`FlowTexts::LIVE_FOR_SHARE`] for a batch's dependencies.
    const LIVE_MANY_FOR_SHARE: &'static str;
    /// [`FlowTexts::HISTORY_STATUS`] for a batch's dependencies.
    const HISTORY_MANY_STATUS: &'static str;
    /// Records an edge.
    const INSERT_EDGE: &'static str;
    /// Records a batch's edges.
    const INSERT_EDGES: &'static str;
    /// Copies a live job to pending, with its count of dependencies.
    const LIVE_TO_PENDING: &'static str;
    /// [`FlowTexts::LIVE_TO_PENDING`] for a batch.
    const LIVE_TO_PENDING_MANY: &'static str;
    // ---- release ---------------------------------------------------------
    /// The edges out of a job.
    const DEPENDENTS: &'static str;
    /// Counts one dependency of a pending job as done.
    const COUNT_DOWN: &'static str;
    /// [`FlowTexts::COUNT_DOWN`] for every dependent of many jobs.
    const COUNT_DOWN_MANY: &'static str;
    /// Makes a pending job whose dependencies are all done live.
    fn release() -> String;
    /// [`FlowTexts::release`] for a batch.
    const RELEASE_MANY: &'static str;
    /// Finishes a pending job (an operator's cancel or discard).
    const PENDING_TO_HISTORY: &'static str;
    /// Deletes a pending job (after its row was moved or copied elsewhere).
    const DELETE_PENDING: &'static str;
    /// The edges out of many jobs that ended without completing: one level
    /// of a cancel cascade.
    const DEPENDENTS_MANY: &'static str;
    // ---- retry -----------------------------------------------------------
    /// The jobs a job's end cancelled.
    const CANCELLED_DEPENDENTS: &'static str;
    /// Unmarks an edge as the one that cancelled its dependent.
    const UNMARK_CANCELLED: &'static str;
    /// Moves a cancelled job back to pending.
    const HISTORY_TO_PENDING: &'static str;
    // ---- workflows and inspection ----------------------------------------
    /// Inserts a workflow's row.
    const INSERT_WORKFLOW: &'static str;
    /// Records a job as a workflow's step.
    const INSERT_STEP: &'static str;
    /// A workflow by id, or the newest of a name.
    const WORKFLOW: &'static str;
    /// A workflow's steps.
    const STEPS: &'static str;
    /// The jobs a job depends on, their ends and results.
    const DEPENDENCIES: &'static str;
    /// A job's workflow and step.
    const JOB_WORKFLOW: &'static str;
    /// A job's batch.
    const JOB_BATCH: &'static str;
    /// Whether a job is pending.
    const IS_PENDING: &'static str;
    /// Pending jobs per queue.
    const COUNT_PENDING: &'static str;
}

/// [`FlowTexts`] rendered for one queue's tables, once at connect, and
/// the statements only one server runs (`Own`).
#[derive(Debug)]
pub(crate) struct FlowStatements<Own> {
    pub pending_for_share: String,
    pub live_for_share: String,
    pub history_status: String,
    pub pending_many_for_share: String,
    pub live_many_for_share: String,
    pub history_many_status: String,
    pub insert_edge: String,
    pub insert_edges: String,
    pub live_to_pending: String,
    pub live_to_pending_many: String,
    pub dependents: String,
    pub count_down: String,
    pub count_down_many: String,
    pub release: String,
    pub release_many: String,
    pub pending_to_history: String,
    pub delete_pending: String,
    pub dependents_many: String,
    pub cancelled_dependents: String,
    pub unmark_cancelled: String,
    pub history_to_pending: String,
    pub insert_workflow: String,
    pub insert_step: String,
    pub workflow: String,
    pub steps: String,
    pub dependencies: String,
    pub job_workflow: String,
    pub job_batch: String,
    pub is_pending: String,
    pub count_pending: String,
    /// The server's own statements.
    pub own: Own,
}

impl<Own> FlowStatements<Own> {
    /// Dialect `D`'s texts, each rendered with `r`, beside `own`.
    pub(crate) fn render<D: FlowTexts>(r: impl Fn(&str) -> String, own: Own) -> Self {
        FlowStatements {
            pending_for_share: r(D::PENDING_FOR_SHARE),
            live_for_share: r(D::LIVE_FOR_SHARE),
            history_status: r(D::HISTORY_STATUS),
            pending_many_for_share: r(D::PENDING_MANY_FOR_SHARE),
            live_many_for_share: r(D::LIVE_MANY_FOR_SHARE),
            history_many_status: r(D::HISTORY_MANY_STATUS),
            insert_edge: r(D::INSERT_EDGE),
            insert_edges: r(D::INSERT_EDGES),
            live_to_pending: r(D::LIVE_TO_PENDING),
            live_to_pending_many: r(D::LIVE_TO_PENDING_MANY),
            dependents: r(D::DEPENDENTS),
            count_down: r(D::COUNT_DOWN),
            count_down_many: r(D::COUNT_DOWN_MANY),
            release: r(&D::release()),
            release_many: r(D::RELEASE_MANY),
            pending_to_history: r(D::PENDING_TO_HISTORY),
            delete_pending: r(D::DELETE_PENDING),
            dependents_many: r(D::DEPENDENTS_MANY),
            cancelled_dependents: r(D::CANCELLED_DEPENDENTS),
            unmark_cancelled: r(D::UNMARK_CANCELLED),
            history_to_pending: r(D::HISTORY_TO_PENDING),
            insert_workflow: r(D::INSERT_WORKFLOW),
            insert_step: r(D::INSERT_STEP),
            workflow: r(D::WORKFLOW),
            steps: r(D::STEPS),
            dependencies: r(D::DEPENDENCIES),
            job_workflow: r(D::JOB_WORKFLOW),
            job_batch: r(D::JOB_BATCH),
            is_pending: r(D::IS_PENDING),
            count_pending: r(D::COUNT_PENDING),
            own,
        }
    }
}

/// The texts of [`SequenceStatements`], one dialect's (the statements of
/// `sequences.rs`), before rendering.
pub(crate) trait SequenceTexts {
    /// Makes a job its sequence's tail, keeping the tail it replaced.
    const SWAP_TAIL: &'static str;
    /// Records a sequenced job's key.
    const RECORD_KEY: &'static str;
    /// The keys of many sequenced jobs.
    const KEYS_OF: &'static str;
    /// Forgets many jobs' keys.
    const FORGET_KEYS: &'static str;
    /// Puts a sequence's tail back when the job that replaced it is still
    /// the tail.
    const RESTORE_TAIL: &'static str;
    /// Makes a job wait on the one before it in its sequence.
    const LINK: &'static str;
    /// The jobs before a job in its sequence.
    const PREDECESSORS: &'static str;
    /// Whether one job is the next of another in their sequence.
    const IS_NEXT: &'static str;
    /// Hands a sequence's wait on to the job after an ended one.
    const HAND_OVER: &'static str;
}

/// [`SequenceTexts`] rendered for one queue's tables, once at connect.
/// (MySQL's one statement of its own is beside it, `own_sequences`: a field
/// here that only one server reads would be dead code in a build with the
/// other server alone.)
#[derive(Debug)]
pub(crate) struct SequenceStatements {
    pub swap_tail: String,
    pub record_key: String,
    pub keys_of: String,
    pub forget_keys: String,
    pub restore_tail: String,
    pub link: String,
    pub predecessors: String,
    pub is_next: String,
    pub hand_over: String,
}

impl SequenceStatements {
    /// Dialect `D`'s texts, each rendered with `r`.
    pub(crate) fn render<D: SequenceTexts>(r: impl Fn(&str) -> String) -> Self {
        SequenceStatements {
            swap_tail: r(D::SWAP_TAIL),
            record_key: r(D::RECORD_KEY),
            keys_of: r(D::KEYS_OF),
            forget_keys: r(D::FORGET_KEYS),
            restore_tail: r(D::RESTORE_TAIL),
            link: r(D::LINK),
            predecessors: r(D::PREDECESSORS),
            is_next: r(D::IS_NEXT),
            hand_over: r(D::HAND_OVER),
        }
    }
}

/// The texts of [`InspectStatements`], one dialect's (the statements of
/// each server's `inspect.rs`: what an operator reads and does), before
/// rendering.
pub(crate) trait InspectTexts {
    /// Live jobs per queue and state at now: the same on both servers, as
    /// `live_state` spells it with each one's `{jobs}` and `{now}`.
    fn count_live() -> String {
        live_state::count("{jobs}", "{now}")
    }
    /// Finished jobs per queue and status.
    const COUNT_HISTORY: &'static str;
    /// Moves a finished job back to live, attempts reset, due now.
    const RETRY_FROM_HISTORY: &'static str;
    /// Removes a finished job.
    const DELETE_HISTORY: &'static str;
    /// Makes an unleased live job due now, unless it is due already.
    const RUN_NOW: &'static str;
    /// Flags a running job for cancellation.
    const REQUEST_CANCEL: &'static str;
    /// The lease token of a live job (NULL when not leased).
    const LIVE_LEASE: &'static str;
    /// A finished job's status.
    const HISTORY_STATUS: &'static str;
    /// Pauses or resumes a queue.
    const SET_PAUSED: &'static str;
    /// Queues that are paused.
    const PAUSED_QUEUES: &'static str;
    /// Changes an unleased live job's priority, time or queue.
    const UPDATE_WAITING: &'static str;
    /// Completed jobs per queue in the last hour and the last minute.
    const COUNT_RECENT_COMPLETIONS: &'static str;
    /// Finished jobs per queue, status and minute ago.
    const COUNT_FINISHED_PER_MINUTE: &'static str;
    /// The jobs holding a unique key: the live one, then finished ones.
    const FIND_UNIQUE: &'static str;
}

/// [`InspectTexts`] rendered for one queue's tables, once at connect.
#[derive(Debug)]
pub(crate) struct InspectStatements {
    pub count_live: String,
    pub count_history: String,
    pub retry_from_history: String,
    pub delete_history: String,
    pub run_now: String,
    pub request_cancel: String,
    pub live_lease: String,
    pub history_status: String,
    pub set_paused: String,
    pub paused_queues: String,
    pub update_waiting: String,
    pub count_recent_completions: String,
    pub count_finished_per_minute: String,
    pub find_unique: String,
}

impl InspectStatements {
    /// Dialect `D`'s texts, each rendered with `r`.
    pub(crate) fn render<D: InspectTexts>(r: impl Fn(&str) -> String) -> Self {
        InspectStatements {
            count_live: r(&D::count_live()),
            count_history: r(D::COUNT_HISTORY),
            retry_from_history: r(D::RETRY_FROM_HISTORY),
            delete_history: r(D::DELETE_HISTORY),
            run_now: r(D::RUN_NOW),
            request_cancel: r(D::REQUEST_CANCEL),
            live_lease: r(D::LIVE_LEASE),
            history_status: r(D::HISTORY_STATUS),
            set_paused: r(D::SET_PAUSED),
            paused_queues: r(D::PAUSED_QUEUES),
            update_waiting: r(D::UPDATE_WAITING),
            count_recent_completions: r(D::COUNT_RECENT_COMPLETIONS),
            count_finished_per_minute: r(D::COUNT_FINISHED_PER_MINUTE),
            find_unique: r(D::FIND_UNIQUE),
        }
    }
}
