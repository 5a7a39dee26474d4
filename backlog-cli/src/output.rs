//! What the commands print: aligned tables for people, JSON for scripts.

use std::time::{Duration, SystemTime};

use backlog::{JobRecord, QueueLimits, QueueStats};
use serde_json::{json, Value};

/// A table with a header row, columns padded to their widest cell; columns
/// named in `right` are right-aligned (numbers).
pub struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; its cells are made safe for a terminal here, so the
    /// widths are those of what is printed.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| safe(c)).collect());
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if self.right[i] {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    if i + 1 < cells.len() {
                        out.push_str(&" ".repeat(pad));
                    }
                }
            }
            let mut out = out.trim_end().to_owned();
            out.push('\n');
            out
        };
        let mut out = line(self.header.clone());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// A point in time as RFC 3339 in UTC, to the second (people).
pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A point in time as RFC 3339 in UTC, to the microsecond (scripts).
pub fn time_json(at: Option<SystemTime>) -> Value {
    match at {
        Some(at) => json!(humantime::format_rfc3339_micros(at).to_string()),
        None => Value::Null,
    }
}

/// How far `at` is from `now`, as "in 5m" or "3h ago".
pub fn relative(at: SystemTime, now: SystemTime) -> String {
    let (delta, future) = match at.duration_since(now) {
        Ok(ahead) => (ahead, true),
        Err(behind) => (behind.duration(), false),
    };
    let secs = delta.as_secs();
    let text = if secs < 1 {
        return "now".into();
    } else if secs < 120 {
        format!("{secs}s")
    } else if secs < 7200 {
        format!("{}m", (secs + 30) / 60)
    } else if secs < 2 * 86400 {
        format!("{}h", (secs + 1800) / 3600)
    } else {
        format!("{}d", (secs + 43200) / 86400)
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A queue's limits in words: `concurrency 3, rate 100/s`, or `no limits`.
pub fn limits_text(limits: &QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(rate) = limits.rate {
        parts.push(format!("rate {rate}"));
    }
    if parts.is_empty() {
        "no limits".into()
    } else {
        parts.join(", ")
    }
}

/// A queue's limits as JSON: `null` for a limit not set.
pub fn limits_json(queue: &str, limits: &QueueLimits) -> Value {
    json!({
        "queue": queue,
        "concurrency": limits.concurrency,
        "rate": limits.rate.map(|r| json!({
            "limit": r.limit,
            "period_ms": r.period.as_millis() as u64,
            "text": r.to_string(),
        })),
    })
}

/// The stats table of `backlog stats` and `backlog watch`: live jobs by
/// state (PENDING: waiting for their dependencies), dead jobs, recent completions, then the finished totals since the
/// counts began (COMPLETED, DISCARDED, CANCELLED, and DIED: every job that
/// went dead, pruned ones included); a LIMITS column when a queue has
/// limits, a NO WORKER column (due jobs per kind that no live worker
/// handles) when a queue has such jobs.
pub fn stats_table(stats: &[QueueStats]) -> String {
    let limited = stats.iter().any(|s| !s.limits.is_unlimited());
    let unhandled = stats.iter().any(|s| !s.unhandled.is_empty());
    let mut columns = vec![
        ("QUEUE", false),
        ("AVAILABLE", true),
        ("SCHEDULED", true),
        ("RETRYING", true),
        ("RUNNING", true),
        ("GROUPED", true),
        ("PENDING", true),
        ("DEAD", true),
        ("DONE 1H", true),
        ("PER MIN", true),
        ("COMPLETED", true),
        ("DISCARDED", true),
        ("CANCELLED", true),
        ("DIED", true),
        ("PAUSED", false),
    ];
    if limited {
        columns.push(("LIMITS", false));
    }
    if unhandled {
        columns.push(("NO WORKER", false));
    }
    let mut table = Table::new(&columns);
    for s in stats {
        let mut row = vec![
            s.queue.clone(),
            s.available.to_string(),
            s.scheduled.to_string(),
            s.retrying.to_string(),
            s.running.to_string(),
            s.grouped.to_string(),
            s.pending.to_string(),
            s.dead.to_string(),
            s.completed_last_hour.to_string(),
            s.completed_last_minute.to_string(),
            s.finished.completed.to_string(),
            s.finished.discarded.to_string(),
            s.finished.cancelled.to_string(),
            s.finished.dead.to_string(),
            if s.paused { "paused" } else { "-" }.to_owned(),
        ];
        if limited {
            row.push(if s.limits.is_unlimited() {
                "-".to_owned()
            } else {
                limits_text(&s.limits)
            });
        }
        if unhandled {
            row.push(unhandled_text(&s.unhandled));
        }
        table.row(row);
    }
    if stats.is_empty() {
        return "no queues yet: nothing enqueued, nothing in history\n".into();
    }
    table.render()
}

/// Finished totals per status, every status named.
pub fn finished_json(t: &backlog::finished::FinishedTotals) -> Value {
    json!({
        "completed": t.completed,
        "discarded": t.discarded,
        "cancelled": t.cancelled,
        "dead": t.dead,
        "aggregated": t.aggregated,
    })
}

/// A queue's due jobs no live worker handles: `email 2, resize 1`, or `-`.
fn unhandled_text(unhandled: &[backlog::UnhandledJobs]) -> String {
    if unhandled.is_empty() {
        return "-".into();
    }
    unhandled
        .iter()
        .map(|u| format!("{} {}", u.kind, u.due))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn stats_json(stats: &[QueueStats]) -> Value {
    Value::Array(
        stats
            .iter()
            .map(|s| {
                let mut value = json!({
                    "queue": s.queue,
                    "available": s.available,
                    "scheduled": s.scheduled,
                    "retrying": s.retrying,
                    "running": s.running,
                    "grouped": s.grouped,
                    "pending": s.pending,
                    "dead": s.dead,
                    "completed_last_hour": s.completed_last_hour,
                    "completed_last_minute": s.completed_last_minute,
                    "finished": finished_json(&s.finished),
                    "paused": s.paused,
                });
                if !s.limits.is_unlimited() {
                    value["limits"] = limits_json(&s.queue, &s.limits);
                }
                if !s.unhandled.is_empty() {
                    value["unhandled"] = s
                        .unhandled
                        .iter()
                        .map(|u| json!({"kind": u.kind, "due": u.due}))
                        .collect();
                }
                value
            })
            .collect(),
    )
}

/// A stored JSON text as a value (or as a string, should it not parse).
fn json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

pub fn record_json(r: &JobRecord) -> Value {
    json!({
        "id": r.id,
        "state": r.state.as_str(),
        "queue": r.queue,
        "kind": r.kind,
        "priority": r.priority,
        "unique_key": r.unique_key,
        "payload": json_text(&r.payload),
        "attempts": r.attempts,
        "max_attempts": r.max_attempts,
        "available_at": time_json(Some(r.available_at)),
        "errors": r.errors.iter().map(|e| json!({
            "attempt": e.attempt,
            "at": time_json(Some(e.at)),
            "message": e.message,
        })).collect::<Vec<_>>(),
        "worker": r.worker,
        "lease_until": time_json(r.lease_until),
        "started_at": time_json(r.started_at),
        "cancel_requested": r.cancel_requested,
        "result": r.result.as_deref().map(json_text),
        "progress": r.progress.as_deref().map(json_text),
        "group": r.group_key,
        "sequence": r.sequence_key,
        "aggregated_into": r.aggregated_into,
        "finished_at": time_json(r.finished_at),
        "created_at": time_json(Some(r.created_at)),
        "updated_at": time_json(Some(r.updated_at)),
    })
}

/// One line of `backlog jobs`.
pub fn jobs_table(jobs: &[JobRecord], now: SystemTime) -> String {
    let mut table = Table::new(&[
        ("ID", true),
        ("STATE", false),
        ("QUEUE", false),
        ("KIND", false),
        ("PRI", true),
        ("TRIES", true),
        ("WHEN", false),
        ("LAST ERROR", false),
    ]);
    for j in jobs {
        let when = match j.finished_at {
            Some(at) => format!("finished {}", relative(at, now)),
            None if j.lease_until.is_some() => {
                format!("started {}", relative(j.updated_at, now))
            }
            None => format!("due {}", relative(j.available_at, now)),
        };
        table.row(vec![
            j.id.to_string(),
            j.state.as_str().to_owned(),
            j.queue.clone(),
            j.kind.clone(),
            j.priority.to_string(),
            format!("{}/{}", j.attempts, j.max_attempts),
            when,
            j.errors
                .last()
                .map(|e| truncate(&safe(&e.message), 60))
                .unwrap_or_default(),
        ]);
    }
    table.render()
}

/// `backlog show`: every field, then `links` (lines already made safe: its
/// workflow, batch and dependencies), payload pretty-printed, every error.
pub fn record_text(r: &JobRecord, now: SystemTime, links: &str) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: String| {
        out.push_str(&format!("{name:<14}{}\n", safe(&value)));
    };
    field("id", r.id.to_string());
    field("state", r.state.as_str().to_owned());
    field("queue", r.queue.clone());
    field("kind", r.kind.clone());
    field("priority", r.priority.to_string());
    if let Some(key) = &r.unique_key {
        field("unique key", key.clone());
    }
    field("attempts", format!("{} of {}", r.attempts, r.max_attempts));
    field("created", stamp(r.created_at, now));
    field(
        if r.finished_at.is_some() {
            "was due"
        } else {
            "due"
        },
        stamp(r.available_at, now),
    );
    if let Some(at) = r.started_at {
        field("first started", stamp(at, now));
    }
    if let Some(at) = r.lease_until {
        field("lease until", stamp(at, now));
    }
    if let Some(worker) = &r.worker {
        field("worker", worker.clone());
    }
    if r.cancel_requested {
        field("cancel", "requested".into());
    }
    if let Some(group) = &r.group_key {
        field("group", group.clone());
    }
    if let Some(key) = &r.sequence_key {
        field("sequence", key.clone());
    }
    if let Some(into) = r.aggregated_into {
        field("combined into", format!("job {into}"));
    }
    if let Some(at) = r.finished_at {
        field("finished", stamp(at, now));
    }
    field("updated", stamp(r.updated_at, now));
    out.push_str(links);
    out.push_str("payload\n");
    out.push_str(&indent(&pretty(&r.payload)));
    if let Some(result) = &r.result {
        out.push_str("result\n");
        out.push_str(&indent(&pretty(result)));
    }
    if let Some(progress) = &r.progress {
        out.push_str("progress\n");
        out.push_str(&indent(&pretty(progress)));
    }
    if r.errors.is_empty() {
        out.push_str("errors        none\n");
    } else {
        out.push_str(&format!("errors        {}\n", r.errors.len()));
        for e in &r.errors {
            out.push_str(&format!(
                "  attempt {} at {}: {}\n",
                e.attempt,
                time(e.at),
                safe(&e.message)
            ));
        }
    }
    out
}

fn stamp(at: SystemTime, now: SystemTime) -> String {
    format!("{} ({})", time(at), relative(at, now))
}

fn pretty(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| text.to_owned())
}

/// Indents each line, made safe for a terminal (a payload that is not
/// JSON is shown as stored).
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {}\n", safe(l))).collect()
}

fn truncate(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max - 1).collect();
        format!("{cut}…")
    }
}

/// `text` made safe to print on a terminal, every character escaped that
/// could change the terminal's state or hide what the text says: C0 and C1
/// control characters (ESC, BEL, CSI, a carriage return or newline), DEL,
/// bidi overrides and isolates, zero-width and other invisible format
/// characters. Each is shown as `\u{..}`. For one-line fields; JSON output
/// is never passed through this.
pub fn safe(text: &str) -> String {
    escape(text, false)
}

/// [`safe`] for text of several lines: newlines are kept, everything else
/// escaped.
pub fn safe_lines(text: &str) -> String {
    escape(text, true)
}

fn escape(text: &str, keep_newlines: bool) -> String {
    if !text
        .chars()
        .any(|c| unsafe_char(c) && !(keep_newlines && c == '\n'))
    {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) && !(keep_newlines && c == '\n') {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Control characters, and the invisible ones that reorder or hide text
/// (Unicode's bidi controls, zero-width and other format characters, line
/// and paragraph separators).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// Parses `--run-at`: RFC 3339 (`2030-01-01T00:00:00Z`), a unix time in
/// seconds, or a delay from now (`+10m`).
pub fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    let out_of_range = || format!("{text:?} is too far in the future");
    if let Some(delay) = text.strip_prefix('+') {
        let delay = parse_duration(delay)?;
        return now.checked_add(delay).ok_or_else(out_of_range);
    }
    if let Ok(secs) = text.parse::<u64>() {
        return SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_secs(secs))
            .ok_or_else(out_of_range);
    }
    humantime::parse_rfc3339_weak(text).map_err(|e| {
        format!("{text:?} is not a time (RFC 3339 like 2030-01-01T09:00:00Z, unix seconds, or +10m): {e}")
    })
}

/// Parses a duration such as `90s`, `10m`, `1h 30m`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration (like 30s, 10m, 2h, 7d): {e}"))
}
