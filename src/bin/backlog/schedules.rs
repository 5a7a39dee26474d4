//! `backlog schedules`: the periodic schedules of a queue, with their last
//! and next tick (`Queue::schedules`), and `--remove NAME`
//! (`Queue::remove_schedule`).

use std::time::{SystemTime, UNIX_EPOCH};

use backlog::{Queue, ScheduleInfo};
use serde_json::{json, Value};

use crate::fail::{Code, Failure};
use crate::output::{self, Table};
use crate::Out;

pub fn run(out: &Out, queue: &Queue, remove: Option<&str>) -> Result<(), Failure> {
    if let Some(name) = remove {
        if !queue.remove_schedule(name)? {
            return Err(Failure::new(
                Code::NotFound,
                format!("no schedule named {name:?} (see `backlog schedules`)"),
            ));
        }
        return out.done(
            &format!("schedule {name} removed: no scheduler ticks it until it is registered again"),
            json!({"schedule": name, "removed": true}),
        );
    }
    let schedules = queue.schedules()?;
    if out.json {
        return out.value(&Value::Array(schedules.iter().map(to_json).collect()));
    }
    if schedules.is_empty() {
        return out.text("no schedules\n");
    }
    let now = queue.now_micros();
    let mut table = Table::new(&[
        ("NAME", false),
        ("EXPRESSION", false),
        ("LAST TICK", false),
        ("NEXT TICK", false),
    ]);
    for s in &schedules {
        let last = s.last_tick.map_or_else(
            || "-".to_owned(),
            |t| {
                format!(
                    "{} ({})",
                    output::time(micros(t)),
                    output::relative(micros(t), now)
                )
            },
        );
        let next = micros(s.next_tick);
        // A next tick in the past: no scheduler has run it since.
        let overdue = if next < now {
            ", no scheduler running?"
        } else {
            ""
        };
        table.row(vec![
            s.name.clone(),
            s.expression.clone(),
            last,
            format!(
                "{} ({}{overdue})",
                output::time(next),
                output::relative(next, now)
            ),
        ]);
    }
    out.text(&table.render())
}

fn to_json(s: &ScheduleInfo) -> Value {
    json!({
        "name": s.name,
        "expression": s.expression,
        "last_tick": output::time_json(s.last_tick.map(micros)),
        "next_tick": output::time_json(Some(micros(s.next_tick))),
        "updated_at": output::time_json(Some(micros(s.updated_at))),
    })
}

/// Unix µs of a time (0 before the epoch): what `output` formats.
fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
