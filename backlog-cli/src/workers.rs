//! `backlog workers`: the live workers of a queue's database
//! (`Queue::workers`): where each runs, what it serves, the jobs it holds,
//! its heartbeat; then the due jobs no live worker handles
//! (`Queue::unhandled`).

use backlog::{Queue, UnhandledJobs, WorkerInfo};
use serde_json::{json, Value};

use crate::fail::Failure;
use crate::output::{self, Table};
use crate::Out;

/// Job ids shown per worker in the table; `--json` has them all.
const IDS_SHOWN: usize = 5;

pub fn run(out: &Out, queue: &Queue) -> Result<(), Failure> {
    let workers = queue.workers()?;
    let unhandled = queue.unhandled()?;
    if out.json {
        return out.value(&json!({
            "workers": workers.iter().map(to_json).collect::<Vec<_>>(),
            "unhandled": unhandled.iter().map(unhandled_json).collect::<Vec<_>>(),
        }));
    }
    let now = queue.now();
    let mut text = if workers.is_empty() {
        "no live workers\n".to_owned()
    } else {
        let mut table = Table::new(&[
            ("ID", false),
            ("HOST", false),
            ("PID", true),
            ("QUEUES", false),
            ("KINDS", false),
            ("THREADS", true),
            ("RUNNING", false),
            ("STARTED", false),
            ("HEARTBEAT", false),
        ]);
        for w in &workers {
            table.row(vec![
                w.id.clone(),
                w.host.clone(),
                w.pid.to_string(),
                w.queues.join(","),
                w.kinds.join(","),
                w.concurrency.to_string(),
                running_text(w),
                output::relative(w.started_at, now),
                output::relative(w.heartbeat_at, now),
            ]);
        }
        table.render()
    };
    if !unhandled.is_empty() {
        text.push_str(
            "\ndue jobs no live worker handles (they wait for a worker with a handler):\n",
        );
        let mut table = Table::new(&[("QUEUE", false), ("KIND", false), ("DUE", true)]);
        for u in &unhandled {
            table.row(vec![u.queue.clone(), u.kind.clone(), u.due.to_string()]);
        }
        text.push_str(&table.render());
    }
    // Cells went through the table's escaping; the rest is ours.
    out.text(&text)
}

/// `2: #12, #13`, the first few ids of the jobs a worker holds.
fn running_text(w: &WorkerInfo) -> String {
    if w.running.is_empty() {
        return "0".to_owned();
    }
    let mut ids: Vec<String> = w
        .running
        .iter()
        .take(IDS_SHOWN)
        .map(|j| format!("#{}", j.id))
        .collect();
    if w.running.len() > IDS_SHOWN {
        ids.push("…".to_owned());
    }
    format!("{}: {}", w.running.len(), ids.join(", "))
}

pub fn to_json(w: &WorkerInfo) -> Value {
    json!({
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "queues": w.queues,
        "kinds": w.kinds,
        "concurrency": w.concurrency,
        "started_at": output::time_json(Some(w.started_at)),
        "heartbeat_at": output::time_json(Some(w.heartbeat_at)),
        "expires_at": output::time_json(Some(w.expires_at)),
        "running": w.running.iter().map(|j| json!({
            "id": j.id,
            "queue": j.queue,
            "kind": j.kind,
        })).collect::<Vec<_>>(),
    })
}

pub fn unhandled_json(u: &UnhandledJobs) -> Value {
    json!({"queue": u.queue, "kind": u.kind, "due": u.due})
}
