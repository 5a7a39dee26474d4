//! `backlog`: look into a queue and act on it, from a shell.
//!
//! A thin layer over the library's public calls (`Queue::stats`,
//! `Queue::list`, `Queue::update`, ...): what this tool can do, a program
//! can do too. It never creates a database it was only asked to read, and
//! never migrates one unless told to (`backlog migrate`).

#[cfg(feature = "dashboard")]
mod dashboard;
mod fail;
mod flows;
mod output;
mod schedules;
mod target;
mod watch;
mod workers;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use backlog::{
    FinalStatus, JobFilter, JobRecord, JobState, JobUpdate, NewJob, Queue, QueueLimits, Rate,
    Retention,
};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use fail::{Code, Failure, EXIT_CODES};
use target::{Key, Target};

#[derive(Debug, Parser)]
#[command(
    name = "backlog",
    version,
    about = "Look into a backlog job queue and act on it",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The queue's database: a SQLite file, or a postgres:// or mysql:// URL.
    /// For `copy`, the source when only the destination is given.
    #[arg(long, env = "BACKLOG_DATABASE", global = true, value_name = "PATH|URL")]
    db: Option<String>,
    /// Print JSON for scripts instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// A file holding the key of an encrypted (SQLCipher) SQLite database,
    /// for a build with the `sqlcipher` feature; or set BACKLOG_SQLITE_KEY.
    /// Never the key itself on the command line, where `ps` shows it.
    #[arg(long, global = true, value_name = "PATH")]
    sqlite_key_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Each queue: jobs available, scheduled, retrying, running, grouped,
    /// pending (waiting for their dependencies), dead; completed in the last
    /// hour and minute; paused or not.
    Stats {
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// List jobs, oldest id first, a page at a time.
    Jobs(JobsArgs),
    /// Everything about one job: payload, attempts, every error, result,
    /// times; its workflow and step, its batch, what it depends on and what
    /// depends on it.
    Show {
        /// The job's id.
        id: i64,
    },
    /// Run a dead, discarded or cancelled job again (or every job --state selects).
    Retry(Select),
    /// Cancel a waiting job at once, or ask a running one to stop.
    Cancel(Select),
    /// Move a waiting job to history as discarded: it will not run.
    Discard {
        #[command(flatten)]
        select: Select,
        /// Recorded as the job's last error.
        #[arg(long, default_value = "discarded by an operator")]
        reason: String,
    },
    /// Delete a job, live or finished, for good.
    Delete(Select),
    /// Make a scheduled or retrying job due now (a manual trigger).
    RunNow {
        /// The job's id.
        id: i64,
    },
    /// Change a waiting job's priority, due time or queue.
    Update {
        /// The job's id.
        id: i64,
        /// The new priority (higher runs first).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// When it becomes due: RFC 3339 (2030-01-01T09:00:00Z), unix
        /// seconds, or a delay (+10m).
        #[arg(long)]
        run_at: Option<String>,
        /// Move it to this queue.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Stop leasing from a queue (running jobs finish). A queue with no
    /// jobs yet can be paused ahead of them.
    Pause {
        queue: String,
        /// Accepted for scripts written when pausing an empty queue needed it.
        #[arg(long, hide = true)]
        force: bool,
    },
    /// Lease from a paused queue again.
    Resume { queue: String },
    /// Show or set a queue's limits, honoured by every worker anywhere: at
    /// most N of its jobs running at once, at most N started per period.
    Limits {
        queue: String,
        /// At most N running at once (or `none`).
        #[arg(long, value_name = "N|none", allow_negative_numbers = true)]
        concurrency: Option<String>,
        /// At most N started per period, such as 100/s, 10/min, 5/2s (or
        /// `none`). Periods are fixed windows aligned to the clock.
        #[arg(long, value_name = "N/PERIOD|none")]
        rate: Option<String>,
        /// Remove both limits.
        #[arg(long, conflicts_with_all = ["concurrency", "rate"])]
        clear: bool,
    },
    /// Delete finished jobs older than an age.
    Purge {
        /// Only these statuses (repeatable). Defaults to all four.
        #[arg(long, value_parser = ["completed", "discarded", "cancelled", "dead"])]
        status: Vec<String>,
        /// Finished longer ago than this: 30s, 10m, 12h, 7d.
        #[arg(long, value_name = "AGE")]
        older_than: String,
    },
    /// Add a job.
    Enqueue {
        /// The job's kind (which handler runs it).
        kind: String,
        /// The payload, JSON; `-` reads it from stdin, `@FILE` from a file
        /// (for payloads over the command line's length limit).
        #[arg(value_name = "JSON|-|@FILE")]
        payload: String,
        /// The queue to add it to. Defaults to `default`.
        #[arg(long)]
        queue: Option<String>,
        /// Higher runs first. Defaults to 0.
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Due after this delay: 30s, 10m, 2h.
        #[arg(long, conflicts_with = "run_at")]
        delay: Option<String>,
        /// Due at this time: RFC 3339, unix seconds, or +10m.
        #[arg(long)]
        run_at: Option<String>,
        /// At most one live job of the queue holds this key: enqueueing it
        /// again returns the existing job.
        #[arg(long)]
        unique_key: Option<String>,
        /// Attempts before it is dead-lettered. Defaults to 25.
        #[arg(long)]
        max_attempts: Option<u32>,
    },
    /// A workflow's steps: name, job id, kind, state, the steps each comes
    /// after and those it still waits on. `workflow cancel ID|NAME` stops it.
    Workflow(WorkflowArgs),
    /// A batch's members counted per state, sealed or open, and its
    /// callbacks: each one's job once enqueued, or why not.
    Batch {
        /// The batch's id.
        id: i64,
    },
    /// Create the queue's tables, or bring them up to date.
    Migrate,
    /// The queue's metrics in Prometheus text format.
    Metrics,
    /// Live stats, refreshed like top; q or Ctrl-C quits.
    Watch {
        /// Time between refreshes: 500ms, 2s, 1m.
        #[arg(long, default_value = "2s")]
        interval: String,
        /// Stop after this many refreshes (for scripts).
        #[arg(long, hide = true)]
        count: Option<u64>,
    },
    /// Periodic schedules: expression, last and next tick.
    Schedules {
        /// Remove this schedule: every scheduler stops ticking it until it
        /// is registered again.
        #[arg(long, value_name = "NAME")]
        remove: Option<String>,
    },
    /// Live workers: host, pid, queues, kinds, threads, the jobs each runs,
    /// its last heartbeat; then the due jobs no live worker handles.
    Workers,
    /// Serve the web dashboard: queues, jobs, the dead letter, and actions on them.
    #[cfg(feature = "dashboard")]
    #[command(after_help = dashboard::LIMITS_HELP)]
    Dashboard {
        /// The address to listen on. Any other than loopback needs --token.
        #[arg(long, default_value = "127.0.0.1")]
        addr: std::net::IpAddr,
        /// The port (0: any free port, printed at start).
        #[arg(long, default_value_t = 7733)]
        port: u16,
        /// A secret every request must carry (open /?token=SECRET once in a
        /// browser, or send Authorization: Bearer SECRET).
        #[arg(long, env = "BACKLOG_DASHBOARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Show the queue without action buttons; actions are refused.
        #[arg(long)]
        read_only: bool,
    },
    /// Copy every live job and the history of one database into another
    /// (created and migrated if needed), keeping ids: `copy FROM TO`, or
    /// `--db FROM copy TO`.
    Copy {
        /// The source, then the destination: SQLite paths or database URLs.
        /// Given one, it is the destination and `--db` (or
        /// BACKLOG_DATABASE) is the source.
        #[arg(value_name = "[FROM] TO", num_args = 1..=2, required = true)]
        databases: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct JobsArgs {
    /// available, scheduled, retrying, running, grouped, pending (waiting
    /// for dependencies), completed, discarded, cancelled, dead, aggregated,
    /// or all.
    #[arg(long, default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(STATES.into_iter().chain(["all"])))]
    state: String,
    /// Only jobs of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only jobs of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only ids above this one: the next page (printed under each page).
    #[arg(long, value_name = "ID")]
    after: Option<i64>,
    /// Jobs per page.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

/// `backlog workflow ID|NAME`, or `backlog workflow cancel ID|NAME`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct WorkflowArgs {
    /// The workflow's id, or its name (the newest workflow of that name).
    #[arg(value_name = "ID|NAME", required = true)]
    which: Option<String>,
    #[command(subcommand)]
    action: Option<WorkflowAction>,
}

#[derive(Debug, Subcommand)]
enum WorkflowAction {
    /// Cancel every step not finished: a waiting or pending one at once
    /// (with what comes after it), a running one asked to stop.
    Cancel {
        /// The workflow's id, or its name (the newest of that name).
        #[arg(value_name = "ID|NAME")]
        which: String,
        /// Cancel without asking.
        #[arg(long)]
        yes: bool,
    },
}

/// One job by id, or every job a filter selects.
#[derive(Debug, Args)]
struct Select {
    /// The job's id. Without it, --state (and --queue, --kind) select jobs.
    #[arg(conflicts_with_all = ["state", "queue", "kind"], required_unless_present = "state")]
    id: Option<i64>,
    /// Select every job in this state.
    #[arg(long, value_parser = STATES)]
    state: Option<String>,
    /// With --state: only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// With --state: only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Act on the selected jobs without asking.
    #[arg(long)]
    yes: bool,
}

/// Every state `stats` counts (`JobState::ALL`).
const STATES: [&str; 11] = [
    "available",
    "scheduled",
    "retrying",
    "running",
    "grouped",
    "pending",
    "completed",
    "discarded",
    "cancelled",
    "dead",
    "aggregated",
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if cli.json {
                eprintln!(
                    "{}",
                    json!({"error": failure.message, "exit_code": failure.code as u8})
                );
            } else {
                eprintln!("backlog: {}", output::safe_lines(&failure.message));
            }
            ExitCode::from(failure.code as u8)
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let out = Out { json: cli.json };
    match &cli.command {
        Command::Copy { databases } => {
            return match (databases.as_slice(), &cli.db) {
                ([from, to], _) | ([to], Some(from)) => copy(&out, from, to, key(cli)?),
                _ => Err(Failure::new(
                    Code::Usage,
                    "copy: give FROM and TO, or TO with --db FROM (or BACKLOG_DATABASE)",
                )),
            };
        }
        Command::Migrate => {
            let target = target(cli)?;
            let (_, applied) = target.open_and_migrate()?;
            let text = if applied.is_empty() {
                format!("{}: schema up to date, nothing to apply", target.display())
            } else {
                format!(
                    "{}: applied {} migration(s): {}",
                    target.display(),
                    applied.len(),
                    applied.join(", ")
                )
            };
            return out.done(
                &text,
                json!({"database": target.display(), "migrated": true, "applied": applied}),
            );
        }
        _ => {}
    }
    let queue = target(cli)?.open_existing()?;
    match &cli.command {
        Command::Stats { queue: only } => stats(&out, &queue, only.as_deref()),
        Command::Jobs(args) => jobs(&out, &queue, args),
        Command::Show { id } => {
            let record = queue.get(*id)?;
            let links = flows::Links::read(&queue, *id)?;
            if out.json {
                let mut value = output::record_json(&record);
                links.add_to(&mut value);
                out.value(&value)
            } else {
                out.text(&output::record_text(&record, queue.now(), &links.text()))
            }
        }
        Command::Workflow(args) => workflow(&out, &queue, args),
        Command::Batch { id } => {
            let status = flows::batch(&queue, *id)?;
            if out.json {
                out.value(&flows::batch_json(&queue, &status)?)
            } else {
                out.text(&flows::batch_text(&queue, &status, queue.now())?)
            }
        }
        Command::Retry(select) => act(&out, &queue, select, Action::Retry),
        Command::Cancel(select) => act(&out, &queue, select, Action::Cancel),
        Command::Discard { select, reason } => act(&out, &queue, select, Action::Discard(reason)),
        Command::Delete(select) => act(&out, &queue, select, Action::Delete),
        Command::RunNow { id } => {
            queue.run_now(*id)?;
            report_job(&out, &queue, *id, "due now")
        }
        Command::Update {
            id,
            priority,
            run_at,
            queue: to,
        } => {
            let mut update = JobUpdate::new();
            update.priority = *priority;
            update.queue = to.clone();
            if let Some(at) = run_at {
                update.run_at = Some(time_arg(at)?);
            }
            if update.is_empty() {
                return Err(Failure::new(
                    Code::Usage,
                    "update needs --priority, --run-at or --queue",
                ));
            }
            queue.update(*id, &update)?;
            report_job(&out, &queue, *id, "updated")
        }
        Command::Pause { queue: name, .. } => {
            let known = queue.stats()?.iter().any(|s| s.queue == *name);
            queue.pause(name)?;
            let text = if known {
                format!("queue {name} paused: workers lease nothing from it until resumed")
            } else {
                format!(
                    "queue {name} paused: it has no jobs yet; workers will lease none \
                     from it until resumed"
                )
            };
            out.done(&text, json!({"queue": name, "paused": true}))
        }
        Command::Limits {
            queue: name,
            concurrency,
            rate,
            clear,
        } => limits(
            &out,
            &queue,
            name,
            concurrency.as_deref(),
            rate.as_deref(),
            *clear,
        ),
        Command::Resume { queue: name } => {
            let was_paused = queue.paused_queues()?.contains(name);
            if !was_paused {
                known_queue(&queue, name)?;
            }
            queue.resume(name)?;
            let text = if was_paused {
                format!("queue {name} resumed")
            } else {
                format!("queue {name} was not paused")
            };
            out.done(&text, json!({"queue": name, "paused": false}))
        }
        Command::Purge { status, older_than } => purge(&out, &queue, status, older_than),
        Command::Enqueue {
            kind,
            payload,
            queue: q,
            priority,
            delay,
            run_at,
            unique_key,
            max_attempts,
        } => {
            let value: Value = serde_json::from_str(&payload_arg(payload)?).map_err(|e| {
                Failure::new(Code::InvalidInput, format!("the payload is not JSON: {e}"))
            })?;
            let mut job = NewJob::new(kind.clone(), value);
            if let Some(q) = q {
                job = job.queue(q.clone());
            }
            if let Some(p) = priority {
                job = job.priority(*p);
            }
            if let Some(d) = delay {
                job = job.delay(duration_arg(d)?);
            }
            if let Some(at) = run_at {
                job = job.run_at(time_arg(at)?);
            }
            if let Some(key) = unique_key {
                job = job.unique_key(key.clone());
            }
            if let Some(n) = max_attempts {
                job = job.max_attempts(*n);
            }
            let enqueued = queue.enqueue(job)?;
            let record = queue.get(enqueued.id)?;
            let text = if enqueued.existed {
                format!(
                    "job {} already holds unique key {:?}: nothing added",
                    enqueued.id,
                    unique_key.as_deref().unwrap_or_default()
                )
            } else {
                format!(
                    "enqueued job {} ({} in queue {}, {})",
                    enqueued.id,
                    record.kind,
                    record.queue,
                    record.state.as_str()
                )
            };
            out.done(
                &text,
                json!({"id": enqueued.id, "existed": enqueued.existed, "job": output::record_json(&record)}),
            )
        }
        Command::Metrics => out.raw(&queue.metrics()?),
        Command::Schedules { remove } => schedules::run(&out, &queue, remove.as_deref()),
        Command::Workers => workers::run(&out, &queue),
        Command::Watch { interval, count } => {
            watch::run(&queue, duration_arg(interval)?, *count, out.json)
        }
        #[cfg(feature = "dashboard")]
        Command::Dashboard {
            addr,
            port,
            token,
            read_only,
        } => dashboard::run(
            queue,
            dashboard::Config {
                addr: *addr,
                port: *port,
                token: token.clone().filter(|t| !t.is_empty()),
                read_only: *read_only,
                database: target(cli)?.display(),
            },
        ),
        Command::Copy { .. } | Command::Migrate => Ok(()),
    }
}

fn target(cli: &Cli) -> Result<Target, Failure> {
    match cli.db.as_deref() {
        Some(db) if !db.is_empty() => Ok(Target::parse(db)?.with_key(key(cli)?)),
        _ => Err(Failure::new(
            Code::Usage,
            "which database? pass --db PATH|URL or set BACKLOG_DATABASE",
        )),
    }
}

/// The SQLite key the command line points to, if any: it opens every
/// SQLite file the command opens (a server URL ignores it).
fn key(cli: &Cli) -> Result<Option<Key>, Failure> {
    Key::from_cli(cli.sqlite_key_file.as_deref())
}

/// How results are printed.
struct Out {
    json: bool,
}

impl Out {
    /// Prints text for people: whatever it quotes from the database (a
    /// kind, an error message) cannot reach the terminal as a control
    /// sequence.
    fn text(&self, text: &str) -> Result<(), Failure> {
        self.raw(&output::safe_lines(text))
    }

    /// Prints text as it is: JSON and the metrics' text format, for
    /// programs (their encoders escape what they need to).
    fn raw(&self, text: &str) -> Result<(), Failure> {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(())
    }

    fn value(&self, value: &Value) -> Result<(), Failure> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| Failure::new(Code::Other, e.to_string()))?;
        self.raw(&format!("{text}\n"))
    }

    /// A one-line result for people, or its JSON.
    fn done(&self, text: &str, value: Value) -> Result<(), Failure> {
        if self.json {
            self.value(&value)
        } else {
            self.text(&format!("{text}\n"))
        }
    }
}

/// `backlog workflow ID|NAME` shows it; `backlog workflow cancel ID|NAME`
/// cancels its steps not finished, once confirmed.
fn workflow(out: &Out, queue: &Queue, args: &WorkflowArgs) -> Result<(), Failure> {
    match (&args.action, &args.which) {
        (Some(WorkflowAction::Cancel { which, yes }), _) => {
            let info = flows::find(queue, &flows::which(which))?;
            let open = info.steps.iter().filter(|s| !s.state.is_finished()).count();
            if open > 0 && !yes {
                confirm(&format!(
                    "Cancel workflow {} {} ({open} step(s) not finished)?",
                    info.id, info.name
                ))?;
            }
            let cancelled = flows::cancel(queue, &info)?;
            out.done(&cancelled.message(&info), cancelled.json(&info))
        }
        (None, Some(which)) => {
            let info = flows::find(queue, &flows::which(which))?;
            if out.json {
                out.value(&flows::workflow_json(queue, &info)?)
            } else {
                out.text(&flows::workflow_text(queue, &info)?)
            }
        }
        (None, None) => Err(Failure::new(Code::Usage, "workflow: give its id or name")),
    }
}

fn stats(out: &Out, queue: &Queue, only: Option<&str>) -> Result<(), Failure> {
    let mut stats = queue.stats()?;
    if let Some(name) = only {
        stats.retain(|s| s.queue == name);
        if stats.is_empty() {
            return Err(unknown_queue(name));
        }
    }
    if out.json {
        out.value(&output::stats_json(&stats))
    } else {
        out.text(&output::stats_table(&stats))
    }
}

/// `backlog limits`: shows a queue's limits, or changes the ones given
/// (keeping the other) and shows the result.
fn limits(
    out: &Out,
    queue: &Queue,
    name: &str,
    concurrency: Option<&str>,
    rate: Option<&str>,
    clear: bool,
) -> Result<(), Failure> {
    let mut limits = queue.limits(name)?;
    let changing = clear || concurrency.is_some() || rate.is_some();
    if clear {
        limits = QueueLimits::default();
    }
    if let Some(text) = concurrency {
        limits.concurrency = match text {
            "none" => None,
            n => Some(n.parse().map_err(|_| {
                Failure::new(
                    Code::InvalidInput,
                    format!("--concurrency {n:?}: give a whole number from 1, or none"),
                )
            })?),
        };
    }
    if let Some(text) = rate {
        limits.rate = match text {
            "none" => None,
            r => Some(r.parse::<Rate>()?),
        };
    }
    if changing {
        queue.set_limits(name, limits)?;
    }
    let shown = output::limits_text(&limits);
    let text = if changing && limits.is_unlimited() {
        format!("queue {name}: limits cleared")
    } else if changing {
        format!("queue {name}: limits set: {shown}")
    } else {
        format!("queue {name}: {shown}")
    };
    out.done(&text, output::limits_json(name, &limits))
}

fn unknown_queue(name: &str) -> Failure {
    Failure::new(
        Code::UnknownQueue,
        format!("unknown queue {name:?}: it has no live jobs, dead jobs, recent completions or settings (see `backlog stats`)"),
    )
}

/// Fails with `UnknownQueue` unless `name` is a queue `stats` lists.
fn known_queue(queue: &Queue, name: &str) -> Result<(), Failure> {
    if queue.stats()?.iter().any(|s| s.queue == name) {
        Ok(())
    } else {
        Err(unknown_queue(name))
    }
}

fn filter(state: JobState, queue: Option<&str>, kind: Option<&str>) -> JobFilter {
    let mut filter = JobFilter::new(state);
    if let Some(q) = queue {
        filter = filter.queue(q);
    }
    if let Some(k) = kind {
        filter = filter.kind(k);
    }
    filter
}

fn parse_state(name: &str) -> Result<JobState, Failure> {
    JobState::parse(name)
        .ok_or_else(|| Failure::new(Code::Usage, format!("unknown state {name:?}")))
}

fn jobs(out: &Out, queue: &Queue, args: &JobsArgs) -> Result<(), Failure> {
    if args.limit == 0 {
        return Err(Failure::new(
            Code::InvalidInput,
            "--limit must be at least 1",
        ));
    }
    let states: Vec<JobState> = if args.state == "all" {
        JobState::ALL.to_vec()
    } else {
        vec![parse_state(&args.state)?]
    };
    // Keyset paging over several states: the first `limit` ids of their
    // union are among the first `limit` of each.
    let mut jobs: Vec<JobRecord> = Vec::new();
    let mut more = false;
    for state in states {
        let mut f = filter(state, args.queue.as_deref(), args.kind.as_deref()).limit(args.limit);
        if let Some(after) = args.after {
            f = f.after(after);
        }
        let page = queue.list(&f)?;
        more |= page.next_after.is_some();
        jobs.extend(page.jobs);
    }
    jobs.sort_by_key(|j| j.id);
    if jobs.len() > args.limit {
        jobs.truncate(args.limit);
        more = true;
    }
    let next_after = if more {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    if jobs.is_empty() {
        if let Some(name) = &args.queue {
            known_queue(queue, name)?;
        }
    }
    if out.json {
        return out.value(&json!({
            "jobs": jobs.iter().map(output::record_json).collect::<Vec<_>>(),
            "next_after": next_after,
        }));
    }
    if jobs.is_empty() {
        return out.text("no jobs match\n");
    }
    let mut text = output::jobs_table(&jobs, queue.now());
    if let Some(after) = next_after {
        text.push_str(&format!("more: --after {after}\n"));
    }
    out.text(&text)
}

enum Action<'a> {
    Retry,
    Cancel,
    Discard(&'a str),
    Delete,
}

impl Action<'_> {
    fn verb(&self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
            Action::Discard(_) => "discard",
            Action::Delete => "delete",
        }
    }
}

/// Retry, cancel, discard or delete: one job by id, or the jobs a filter
/// selects once confirmed.
fn act(out: &Out, queue: &Queue, select: &Select, action: Action<'_>) -> Result<(), Failure> {
    if let Some(id) = select.id {
        let what = match action {
            Action::Retry => {
                queue.retry(id)?;
                "retried: available now".to_owned()
            }
            Action::Cancel => match queue.cancel(id)? {
                backlog::CancelOutcome::Cancelled => "cancelled".to_owned(),
                backlog::CancelOutcome::Requested => {
                    "running: its handler is asked to stop at the next heartbeat".to_owned()
                }
            },
            Action::Discard(reason) => {
                queue.discard_job(id, reason)?;
                "discarded".to_owned()
            }
            Action::Delete => {
                queue.delete(id)?;
                return out.done(
                    &format!("job {id} deleted"),
                    json!({"id": id, "deleted": true}),
                );
            }
        };
        return report_job(out, queue, id, &what);
    }
    let state = parse_state(select.state.as_deref().unwrap_or_default())?;
    let f = filter(state, select.queue.as_deref(), select.kind.as_deref()).limit(500);
    let matching = count(queue, &f)?;
    if matching == 0 {
        if let Some(name) = &select.queue {
            known_queue(queue, name)?;
        }
    }
    let description = format!(
        "{matching} {} job(s){}{}",
        state.as_str(),
        select
            .queue
            .as_deref()
            .map(|q| format!(" in queue {q}"))
            .unwrap_or_default(),
        select
            .kind
            .as_deref()
            .map(|k| format!(" of kind {k}"))
            .unwrap_or_default()
    );
    if matching > 0 && !select.yes {
        confirm(&format!("{} {description}?", capitalize(action.verb())))?;
    }
    let report = match action {
        Action::Retry => queue.retry_matching(&f)?,
        Action::Cancel => queue.cancel_matching(&f)?,
        Action::Discard(reason) => queue.discard_matching(&f, reason)?,
        Action::Delete => queue.delete_matching(&f)?,
    };
    let mut text = format!("{}: {} done", action.verb(), report.done);
    if report.requested > 0 {
        text.push_str(&format!(" ({} running, asked to stop)", report.requested));
    }
    if report.skipped > 0 {
        text.push_str(&format!(
            ", {} skipped (changed state meanwhile, or refused)",
            report.skipped
        ));
    }
    let mut value = json!({"action": action.verb(), "matched": matching, "done": report.done,
                           "skipped": report.skipped});
    // Only a cancel can be a request (running jobs finish later); a
    // "requested": 0 beside the other actions read as "nothing asked".
    if matches!(action, Action::Cancel) {
        value["asked_to_stop"] = json!(report.requested);
    }
    out.done(&text, value)
}

/// How many jobs `filter` lists (walking its pages).
fn count(queue: &Queue, filter: &JobFilter) -> Result<u64, Failure> {
    let mut n = 0;
    let mut f = filter.clone();
    loop {
        let page = queue.list(&f)?;
        n += page.jobs.len() as u64;
        match page.next_after {
            Some(after) => f = f.after(after),
            None => return Ok(n),
        }
    }
}

/// Asks on the terminal; refuses when there is no terminal to ask on.
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::new(
            Code::Aborted,
            format!("{question} Not confirmed: pass --yes to run without a terminal"),
        ));
    }
    eprint!("{} [y/N] ", output::safe(question));
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure::new(Code::Aborted, "aborted: nothing changed"))
    }
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Prints a job after an action on it.
fn report_job(out: &Out, queue: &Queue, id: i64, what: &str) -> Result<(), Failure> {
    let record = queue.get(id)?;
    out.done(
        &format!(
            "job {id} {what} ({} in queue {}, {})",
            record.kind,
            record.queue,
            record.state.as_str()
        ),
        output::record_json(&record),
    )
}

fn purge(out: &Out, queue: &Queue, statuses: &[String], older_than: &str) -> Result<(), Failure> {
    let age = duration_arg(older_than)?;
    let wanted: Vec<FinalStatus> = if statuses.is_empty() {
        FinalStatus::ALL.to_vec()
    } else {
        statuses
            .iter()
            .filter_map(|s| FinalStatus::parse(s))
            .collect()
    };
    let keep = |status| wanted.contains(&status).then_some(age);
    let retention = Retention {
        completed: keep(FinalStatus::Completed),
        discarded: keep(FinalStatus::Discarded),
        cancelled: keep(FinalStatus::Cancelled),
        dead: keep(FinalStatus::Dead),
    };
    const BATCH: usize = 1000;
    let mut deleted = 0;
    loop {
        let n = queue.prune_history(&retention, BATCH)?;
        deleted += n;
        if n < BATCH {
            break;
        }
    }
    let names: Vec<&str> = wanted.iter().map(|s| s.as_str()).collect();
    out.done(
        &format!(
            "purged {deleted} finished job(s) ({}) older than {older_than}",
            names.join(", ")
        ),
        json!({"deleted": deleted, "statuses": names, "older_than_secs": age.as_secs()}),
    )
}

fn copy(out: &Out, from: &str, to: &str, key: Option<Key>) -> Result<(), Failure> {
    let (from, to) = (Target::parse(from)?, Target::parse(to)?);
    let (from, to) = (from.with_key(key.clone()), to.with_key(key));
    let source = from.open_existing()?;
    let (destination, _) = to.open_and_migrate()?;
    let report = backlog::copy(&source, &destination)?;
    out.done(
        &format!(
            "copied {} live, {} waiting and {} finished job(s) from {} to {}; {} already there; \
             {} dependency edge(s), {} workflow(s), {} batch(es), {} sequence(s), \
             {} paused queue(s)",
            report.live,
            report.pending,
            report.history,
            from.display(),
            to.display(),
            report.skipped,
            report.dependencies,
            report.workflows,
            report.batches,
            report.sequences,
            report.paused_queues
        ),
        json!({"live": report.live, "pending": report.pending, "history": report.history,
               "skipped": report.skipped, "dependencies": report.dependencies,
               "workflows": report.workflows, "batches": report.batches,
               "sequences": report.sequences, "paused_queues": report.paused_queues}),
    )
}

/// The largest payload `-` or `@FILE` reads: over the library's default
/// cap (1 MiB), so its error names the size, under anything that would
/// strain memory.
const MAX_PAYLOAD_READ: u64 = 64 * 1024 * 1024;

/// The payload argument: JSON text, `-` for stdin, `@FILE` for a file.
fn payload_arg(arg: &str) -> Result<String, Failure> {
    use std::io::Read;
    let (source, reader): (String, Box<dyn Read>) = if arg == "-" {
        ("stdin".into(), Box::new(std::io::stdin()))
    } else if let Some(path) = arg.strip_prefix('@') {
        let file = std::fs::File::open(path).map_err(|e| {
            Failure::new(
                Code::InvalidInput,
                format!("cannot read the payload from {path}: {e}"),
            )
        })?;
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            return Err(Failure::new(
                Code::InvalidInput,
                format!("the payload file {path} is not a regular file"),
            ));
        }
        (path.to_owned(), Box::new(file))
    } else {
        return Ok(arg.to_owned());
    };
    let mut text = String::new();
    reader
        .take(MAX_PAYLOAD_READ + 1)
        .read_to_string(&mut text)
        .map_err(|e| {
            Failure::new(
                Code::InvalidInput,
                format!("cannot read the payload from {source}: {e}"),
            )
        })?;
    if text.len() as u64 > MAX_PAYLOAD_READ {
        return Err(Failure::new(
            Code::InvalidInput,
            format!("the payload from {source} is over {MAX_PAYLOAD_READ} bytes"),
        ));
    }
    Ok(text)
}

fn duration_arg(text: &str) -> Result<Duration, Failure> {
    output::parse_duration(text).map_err(|e| Failure::new(Code::InvalidInput, e))
}

fn time_arg(text: &str) -> Result<SystemTime, Failure> {
    output::parse_time(text, SystemTime::now()).map_err(|e| Failure::new(Code::InvalidInput, e))
}
