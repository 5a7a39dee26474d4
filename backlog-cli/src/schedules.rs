//! `backlog schedules`: the periodic schedules of a queue, with their last
//! and next tick (`Queue::schedules`), and `--remove NAME`
//! (`Queue::remove_schedule`).

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
    let now = queue.now();
    let mut table = Table::new(&[
        ("NAME", false),
        ("EXPRESSION", false),
        ("LAST TICK", false),
        ("NEXT TICK", false),
    ]);
    for s in &schedules {
        let last = s.last_tick.map_or_else(
            || "-".to_owned(),
            |t| format!("{} ({})", output::time(t), output::relative(t, now)),
        );
        // A next tick in the past: no scheduler has run it since.
        let overdue = if s.next_tick < now {
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
                output::time(s.next_tick),
                output::relative(s.next_tick, now)
            ),
        ]);
    }
    out.text(&table.render())
}

pub fn to_json(s: &ScheduleInfo) -> Value {
    json!({
        "name": s.name,
        "expression": s.expression,
        "last_tick": output::time_json(s.last_tick),
        "next_tick": output::time_json(Some(s.next_tick)),
        "updated_at": output::time_json(Some(s.updated_at)),
    })
}
