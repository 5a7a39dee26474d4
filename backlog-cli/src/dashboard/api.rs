//! The JSON API the pages call (documented in the README's dashboard
//! section): reads are GETs, actions POSTs with a JSON body. Each handler is
//! a thin layer over the library's public calls, as the CLI is.

use std::time::SystemTime;

use backlog::finished::Window;
use backlog::{BulkReport, FinalStatus, JobFilter, JobRecord, JobState, JobUpdate, Queue};
use hyper::Method;
use serde_json::{json, Map, Value};

use super::{error, failure, query_param, Config, Reply};
use crate::fail::{Code, Failure};
use crate::{flows, output, schedules};

/// Jobs per page unless `limit` says otherwise, and the most it may say.
const PAGE: usize = 50;
const MAX_PAGE: usize = 500;

pub fn healthz(queue: &Queue, method: &Method) -> Reply {
    if *method != Method::GET && *method != Method::HEAD {
        return error(405, format!("{method} is not allowed here; use GET"));
    }
    match queue.paused_queues() {
        Ok(_) => Reply::json(200, &json!({"ok": true})),
        Err(e) => error(503, format!("the database does not answer: {e}")),
    }
}

/// Every queue at a glance, the chart, and the flow-control section.
pub fn overview(queue: &Queue, config: &Config) -> Reply {
    let (stats, finished) = match queue
        .stats()
        .and_then(|s| Ok((s, queue.finished_per_minute(CHART_MINUTES)?)))
    {
        Ok(read) => read,
        Err(e) => return failure(e.into()),
    };
    let flow = match flow_control(queue) {
        Ok(flow) => flow,
        Err(f) => return failure(f),
    };
    let now = queue.now();
    let mut queues = Vec::with_capacity(stats.len());
    for s in &stats {
        let mut rows = output::stats_json(std::slice::from_ref(s));
        let mut row = rows[0].take();
        let oldest = if s.available > 0 {
            match oldest_available(queue, &s.queue) {
                Ok(at) => at.map(|at| age_secs(now, at)),
                Err(e) => return failure(e),
            }
        } else {
            None
        };
        row["oldest_available_secs"] = json!(oldest);
        let failed: u64 = finished
            .iter()
            .filter(|f| f.queue == s.queue && failed(f.status))
            .map(|f| f.count)
            .sum();
        row["failed_last_hour"] = json!(failed);
        queues.push(row);
    }
    Reply::json(
        200,
        &json!({
            "database": config.database,
            "read_only": config.read_only,
            "now": output::time_json(Some(now)),
            "queues": queues,
            "chart": chart(&finished),
            "flow_control": flow,
        }),
    )
}

/// The live workers, each with the jobs it holds, and the due jobs no live
/// worker handles, as the Workers page renders them (`workersPage` in
/// app.js): the JSON of `backlog --json workers`, with the server's now.
pub fn workers(queue: &Queue) -> Reply {
    let read = queue.workers().and_then(|w| Ok((w, queue.unhandled()?)));
    match read {
        Ok((workers, unhandled)) => Reply::json(
            200,
            &json!({
                "now": output::time_json(Some(queue.now())),
                "workers": workers.iter().map(crate::workers::to_json).collect::<Vec<_>>(),
                "unhandled": unhandled.iter().map(crate::workers::unhandled_json).collect::<Vec<_>>(),
            }),
        ),
        Err(e) => failure(e.into()),
    }
}

/// The throughput chart: one bar per minute.
const CHART_MINUTES: u32 = 60;

/// Finished the way an operator calls failed: out of attempts, or discarded.
fn failed(status: FinalStatus) -> bool {
    matches!(status, FinalStatus::Dead | FinalStatus::Discarded)
}

/// Completed and failed jobs per minute, every queue together, oldest
/// minute first (the last entry is the last 60 seconds).
fn chart(finished: &[backlog::FinishedCount]) -> Value {
    let minutes = CHART_MINUTES as usize;
    let (mut completed, mut failures) = (vec![0u64; minutes], vec![0u64; minutes]);
    for f in finished {
        let slot = minutes - 1 - (f.minutes_ago as usize).min(minutes - 1);
        if f.status == FinalStatus::Completed {
            completed[slot] += f.count;
        } else if failed(f.status) {
            failures[slot] += f.count;
        }
    }
    json!({"minutes": minutes, "completed": completed, "failed": failures})
}

/// `GET /api/chart?window=1h|24h|7d&queue=&kind=`: finished jobs per bucket
/// of the window (per minute for 1h, per hour for 24h and 7d), oldest
/// first, from the counts kept as jobs finish (`Queue::finished_buckets`),
/// every queue and kind together unless `queue` or `kind` narrows them;
/// and the queues and kinds that ever finished a job, for the page's
/// choosers.
pub fn chart_api(queue: &Queue, query: &str) -> Reply {
    match chart_window(queue, query) {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

fn chart_window(queue: &Queue, query: &str) -> Result<Value, Failure> {
    let param = |name| query_param(query, name).filter(|v| !v.is_empty());
    let name = param("window").unwrap_or_else(|| "1h".into());
    let window = Window::parse(&name)
        .ok_or_else(|| invalid(format!("window {name:?}: give 1h, 24h or 7d")))?;
    let (only_queue, only_kind) = (param("queue"), param("kind"));
    let n = window.buckets() as usize;
    let (mut completed, mut failures, mut cancelled) =
        (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    for b in queue.finished_buckets(window)? {
        if only_queue.as_ref().is_some_and(|q| *q != b.queue)
            || only_kind.as_ref().is_some_and(|k| *k != b.kind)
        {
            continue;
        }
        let slot = n - 1 - (b.buckets_ago as usize).min(n - 1);
        let column = match b.status {
            FinalStatus::Completed => &mut completed,
            FinalStatus::Cancelled => &mut cancelled,
            status if failed(status) => &mut failures,
            _ => continue,
        };
        column[slot] += b.count;
    }
    let totals = queue.finished_totals()?;
    let mut queues: Vec<&str> = totals.iter().map(|t| t.queue.as_str()).collect();
    queues.dedup();
    let mut kinds: Vec<&str> = totals.iter().map(|t| t.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    Ok(json!({
        "window": window.as_str(),
        "bucket_secs": window.bucket().as_secs(),
        "buckets": n,
        "queue": only_queue,
        "kind": only_kind,
        "completed": completed,
        "failed": failures,
        "cancelled": cancelled,
        "queues": queues,
        "kinds": kinds,
    }))
}

/// Periodic schedules (last and next tick) and the queues' limits, as the
/// overview's "Schedules and limits" section renders them
/// (`renderFlowControl` in app.js); `null`, hiding the section, when there
/// are neither.
fn flow_control(queue: &Queue) -> Result<Value, Failure> {
    let schedules = queue.schedules()?;
    let limits = queue.all_limits()?;
    if schedules.is_empty() && limits.is_empty() {
        return Ok(Value::Null);
    }
    Ok(json!({
        "schedules": schedules.iter().map(schedules::to_json).collect::<Vec<_>>(),
        "limits": limits
            .iter()
            .map(|(name, l)| output::limits_json(name, l))
            .collect::<Vec<_>>(),
    }))
}

/// The progress the job's handler last reported (kept in history when it
/// finished), as the job page's "Progress" section renders it
/// (`renderProgress` in app.js). `null` hides the section.
fn progress(record: &JobRecord) -> Value {
    match record.progress.as_deref() {
        Some(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into())),
        None => Value::Null,
    }
}

/// When the available job with the lowest id in `name` became due: the
/// "is it stuck?" number, one indexed read per queue.
fn oldest_available(queue: &Queue, name: &str) -> Result<Option<SystemTime>, Failure> {
    let page = queue.list(&JobFilter::new(JobState::Available).queue(name).limit(1))?;
    Ok(page.jobs.first().map(|j| j.available_at))
}

/// Whole seconds from `at` to `now`, 0 when `at` is later.
fn age_secs(now: SystemTime, at: SystemTime) -> u64 {
    now.duration_since(at).map_or(0, |d| d.as_secs())
}

/// `GET /api/jobs?state=&queue=&kind=&after=&limit=`: one page, oldest id
/// first, keyset-paged (`after` is the previous `next_after`); or
/// `?search=` an id or a unique key.
pub fn jobs(queue: &Queue, query: &str) -> Reply {
    match list(queue, query) {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

fn list(queue: &Queue, query: &str) -> Result<Value, Failure> {
    let param = |name| query_param(query, name).filter(|v| !v.is_empty());
    if let Some(search) = param("search") {
        return search_jobs(queue, search.trim(), param("queue"));
    }
    let state = param("state").unwrap_or_else(|| "all".into());
    let states: Vec<JobState> = if state == "all" {
        JobState::ALL.to_vec()
    } else {
        vec![JobState::parse(&state).ok_or_else(|| invalid(format!("unknown state {state:?}")))?]
    };
    let limit = match param("limit") {
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| invalid(format!("limit must be 1 to {MAX_PAGE}, not {n:?}")))?,
        None => PAGE,
    };
    let after = match param("after") {
        Some(a) => Some(
            a.parse::<i64>()
                .map_err(|_| invalid(format!("after must be a job id, not {a:?}")))?,
        ),
        None => None,
    };
    // Keyset paging over several states: the first `limit` ids of their
    // union are among the first `limit` of each.
    let mut jobs: Vec<JobRecord> = Vec::new();
    let mut more = false;
    for state in states {
        let mut f = JobFilter::new(state).limit(limit);
        if let Some(q) = param("queue") {
            f = f.queue(q);
        }
        if let Some(k) = param("kind") {
            f = f.kind(k);
        }
        if let Some(after) = after {
            f = f.after(after);
        }
        let page = queue.list(&f)?;
        more |= page.next_after.is_some();
        jobs.extend(page.jobs);
    }
    jobs.sort_by_key(|j| j.id);
    if jobs.len() > limit {
        jobs.truncate(limit);
        more = true;
    }
    let next_after = if more {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    Ok(json!({
        "jobs": jobs.iter().map(summary).collect::<Vec<_>>(),
        "next_after": next_after,
    }))
}

/// A search box's text: a job id (`123` or `#123`), else a unique key,
/// looked up in `queue` when given, else in every queue `stats` lists.
fn search_jobs(queue: &Queue, text: &str, only: Option<String>) -> Result<Value, Failure> {
    let mut jobs = Vec::new();
    if let Ok(id) = text.trim_start_matches('#').parse::<i64>() {
        match queue.get(id) {
            Ok(record) => jobs.push(summary(&record)),
            Err(backlog::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let queues = match only {
        Some(name) => vec![name],
        None => queue.stats()?.into_iter().map(|s| s.queue).collect(),
    };
    for name in queues {
        for record in queue.find_by_unique_key(&name, text)? {
            jobs.push(summary(&record));
        }
    }
    Ok(json!({ "jobs": jobs, "next_after": null }))
}

/// A job's row in a list: no payload, the last error cut short.
fn summary(r: &JobRecord) -> Value {
    let last_error = r.errors.last().map(|e| {
        let mut message: String = e.message.chars().take(300).collect();
        if message.len() < e.message.len() {
            message.push('…');
        }
        message
    });
    json!({
        "id": r.id,
        "state": r.state.as_str(),
        "queue": r.queue,
        "kind": r.kind,
        "priority": r.priority,
        "unique_key": r.unique_key,
        "attempts": r.attempts,
        "max_attempts": r.max_attempts,
        "available_at": output::time_json(Some(r.available_at)),
        "finished_at": output::time_json(r.finished_at),
        "created_at": output::time_json(Some(r.created_at)),
        "worker": r.worker,
        "last_error": last_error,
    })
}

/// `GET /api/jobs/ID`: everything about one job, and `links`: its
/// workflow and step, its batch, what it depends on and what depends on it
/// (as `backlog --json show` adds them).
pub fn job(queue: &Queue, id: &str) -> Reply {
    let result = parse_id(id).and_then(|id| {
        let record = queue.get(id)?;
        let mut links = json!({});
        flows::Links::read(queue, id)?.add_to(&mut links);
        Ok((record, links))
    });
    match result {
        Ok((record, links)) => Reply::json(
            200,
            &json!({
                "job": output::record_json(&record),
                "progress": progress(&record),
                "links": links,
                "now": output::time_json(Some(queue.now())),
            }),
        ),
        Err(f) => failure(f),
    }
}

/// `GET /api/workflows/ID|NAME`: the workflow and its steps, as `backlog
/// --json workflow` prints them (a name finds the newest of that name).
pub fn workflow(queue: &Queue, which: &str) -> Reply {
    let which = flows::which(&super::decode(which));
    let result = flows::find(queue, &which).and_then(|info| {
        Ok(json!({
            "workflow": flows::workflow_json(queue, &info)?,
            "now": output::time_json(Some(queue.now())),
        }))
    });
    match result {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

/// `POST /api/workflows/ID|NAME/cancel`: cancels every step not finished.
pub fn workflow_action(queue: &Queue, which: &str, action: &str) -> Reply {
    let which = flows::which(&super::decode(which));
    let result = (|| -> Result<Value, Failure> {
        if action != "cancel" {
            return Err(Failure::new(
                Code::NotFound,
                format!("no workflow action {action:?}: cancel"),
            ));
        }
        let info = flows::find(queue, &which)?;
        let cancelled = flows::cancel(queue, &info)?;
        let mut value = cancelled.json(&info);
        value["ok"] = json!(true);
        value["message"] = json!(cancelled.message(&info));
        Ok(value)
    })();
    match result {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

/// `GET /api/batches/ID`: counts per state, sealed or open, and its
/// callbacks, as `backlog --json batch` prints them.
pub fn batch(queue: &Queue, id: &str) -> Reply {
    let result = id
        .parse::<i64>()
        .map_err(|_| Failure::new(Code::NotFound, format!("{id:?} is not a batch id")))
        .and_then(|id| {
            let status = flows::batch(queue, id)?;
            Ok(json!({
                "batch": flows::batch_json(queue, &status)?,
                "now": output::time_json(Some(queue.now())),
            }))
        });
    match result {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

/// `POST /api/jobs/ID/ACTION`: retry, cancel, discard, delete, run-now,
/// update.
pub fn job_action(queue: &Queue, id: &str, action: &str, body: &[u8]) -> Reply {
    match act(queue, id, action, body) {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

fn act(queue: &Queue, id: &str, action: &str, body: &[u8]) -> Result<Value, Failure> {
    let id = parse_id(id)?;
    let body = json_body(body)?;
    let message = match action {
        "retry" => {
            queue.retry(id)?;
            format!("job {id} retried: available now")
        }
        "cancel" => match queue.cancel(id)? {
            backlog::CancelOutcome::Cancelled => format!("job {id} cancelled"),
            backlog::CancelOutcome::Requested => {
                format!("job {id} is running: its handler is asked to stop")
            }
        },
        "discard" => {
            let reason = text_field(&body, "reason")?.unwrap_or("discarded by an operator");
            queue.discard_job(id, reason)?;
            format!("job {id} discarded")
        }
        "delete" => {
            queue.delete(id)?;
            return Ok(json!({"ok": true, "message": format!("job {id} deleted"), "job": null}));
        }
        "run-now" => {
            queue.run_now(id)?;
            format!("job {id} is due now")
        }
        "update" => {
            let mut update = JobUpdate::new();
            if let Some(p) = body.get("priority").filter(|v| !v.is_null()) {
                let p = p
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| invalid(format!("priority must be an integer, not {p}")))?;
                update.priority = Some(p);
            }
            if let Some(at) = text_field(&body, "run_at")?.filter(|t| !t.is_empty()) {
                let at = output::parse_time(at, std::time::SystemTime::now()).map_err(invalid)?;
                update.run_at = Some(at);
            }
            if update.is_empty() {
                return Err(invalid("update needs priority or run_at"));
            }
            queue.update(id, &update)?;
            format!("job {id} updated")
        }
        other => {
            return Err(Failure::new(
                Code::NotFound,
                format!("no action {other:?}: retry, cancel, discard, delete, run-now or update"),
            ))
        }
    };
    let record = queue.get(id)?;
    Ok(json!({"ok": true, "message": message, "job": output::record_json(&record)}))
}

/// `POST /api/queues/NAME/pause` or `/resume`.
pub fn queue_action(queue: &Queue, name: &str, action: &str) -> Reply {
    let name = super::decode(name);
    let result = (|| -> Result<Value, Failure> {
        let known = queue.stats()?.iter().any(|s| s.queue == name);
        if !known {
            return Err(Failure::new(
                Code::UnknownQueue,
                format!("unknown queue {name:?}: it has no jobs, recent history or settings"),
            ));
        }
        let message = match action {
            "pause" => {
                queue.pause(&name)?;
                format!("queue {name} paused: workers lease nothing from it until resumed")
            }
            "resume" => {
                queue.resume(&name)?;
                format!("queue {name} resumed")
            }
            other => {
                return Err(Failure::new(
                    Code::NotFound,
                    format!("no queue action {other:?}: pause or resume"),
                ))
            }
        };
        Ok(json!({"ok": true, "message": message, "queue": name, "paused": action == "pause"}))
    })();
    match result {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

/// `POST /api/bulk` `{"action", "state", "queue"?, "kind"?, "reason"?}`:
/// retry, cancel, discard or delete every job the filter selects.
pub fn bulk(queue: &Queue, body: &[u8]) -> Reply {
    let result = (|| -> Result<Value, Failure> {
        let body = json_body(body)?;
        let action = text_field(&body, "action")?.ok_or_else(|| invalid("bulk needs an action"))?;
        let state = text_field(&body, "state")?
            .ok_or_else(|| invalid("bulk needs a state: it acts on the jobs of one state"))?;
        let state =
            JobState::parse(state).ok_or_else(|| invalid(format!("unknown state {state:?}")))?;
        let mut f = JobFilter::new(state).limit(500);
        if let Some(q) = text_field(&body, "queue")?.filter(|q| !q.is_empty()) {
            f = f.queue(q);
        }
        if let Some(k) = text_field(&body, "kind")?.filter(|k| !k.is_empty()) {
            f = f.kind(k);
        }
        let report: BulkReport = match action {
            "retry" => queue.retry_matching(&f)?,
            "cancel" => queue.cancel_matching(&f)?,
            "discard" => queue.discard_matching(
                &f,
                text_field(&body, "reason")?.unwrap_or("discarded by an operator"),
            )?,
            "delete" => queue.delete_matching(&f)?,
            other => {
                return Err(invalid(format!(
                    "no bulk action {other:?}: retry, cancel, discard or delete"
                )))
            }
        };
        let mut message = format!("{action}: {} job(s) done", report.done);
        if report.requested > 0 {
            message.push_str(&format!(", {} running asked to stop", report.requested));
        }
        if report.skipped > 0 {
            message.push_str(&format!(
                ", {} skipped (changed state meanwhile, or refused)",
                report.skipped
            ));
        }
        let mut value = json!({"ok": true, "message": message, "done": report.done,
                               "skipped": report.skipped});
        // Only a cancel can be a request: running jobs stop later.
        if action == "cancel" {
            value["asked_to_stop"] = json!(report.requested);
        }
        Ok(value)
    })();
    match result {
        Ok(value) => Reply::json(200, &value),
        Err(f) => failure(f),
    }
}

fn parse_id(id: &str) -> Result<i64, Failure> {
    id.parse::<i64>()
        .map_err(|_| Failure::new(Code::NotFound, format!("{id:?} is not a job id")))
}

/// The body as a JSON object; an empty body is `{}`.
fn json_body(body: &[u8]) -> Result<Map<String, Value>, Failure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid("the body must be a JSON object")),
        Err(e) => Err(invalid(format!("the body is not JSON: {e}"))),
    }
}

fn text_field<'a>(body: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, Failure> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(format!("{name} must be a string, not {other}"))),
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::new(Code::InvalidInput, message)
}
