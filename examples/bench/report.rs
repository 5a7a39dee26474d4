//! What a run reports: every measured value as a JSON line as it comes, then
//! medians, ratios to the raw ceiling against their targets, the environment
//! (durability, pragmas read back, SQLite version) and the correctness gates,
//! as JSON lines, a human table, and optionally markdown and an SVG chart.

use std::fmt::Write as _;
use std::io::Write as _;

use serde_json::json;

use crate::db::{Gate, Pragmas};

/// A target a median must reach.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {}", fmt_value(t, unit)),
            Target::AtMost(t) => format!("<= {}", fmt_value(t, unit)),
        }
    }
}

/// One figure across runs.
#[derive(Debug, Clone)]
pub struct Series {
    pub mode: String,
    pub durability: String,
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
    pub target: Option<Target>,
}

impl Series {
    pub fn median(&self) -> f64 {
        median(&self.values)
    }

    /// Met or missed; nothing without a target, or in a smoke run.
    fn status(&self, verdicts: bool) -> &'static str {
        match self.target {
            _ if !verdicts => "",
            Some(t) if t.met(self.median()) => "met",
            Some(_) => "MISSED",
            None => "",
        }
    }

    /// The target as text; nothing in a smoke run.
    fn target_text(&self, verdicts: bool) -> String {
        match self.target {
            Some(t) if verdicts => t.describe(&self.unit),
            _ => String::new(),
        }
    }
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Percentile (0–100) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone)]
struct GateLine {
    mode: String,
    durability: String,
    what: String,
    gate: Gate,
}

/// Everything one invocation measured.
#[derive(Debug)]
pub struct Report {
    /// Whether figures are judged against their targets: not in a smoke
    /// run, whose sizes (and usually debug build) say nothing about them.
    verdicts: bool,
    series: Vec<Series>,
    gates: Vec<GateLine>,
    envs: Vec<(String, serde_json::Value)>,
    lines: Vec<String>,
}

/// What a smoke run says first, and again under its table.
pub const SMOKE_NOTE: &str = "smoke run: checks correctness only (jobs lost, duplicated or left \
behind; pragmas); its small sizes, usually in a debug build, are not judged against the targets. \
For figures: cargo run --release --example bench -- all";

impl Report {
    /// A report that judges figures against their targets.
    pub fn new() -> Report {
        Report {
            verdicts: true,
            series: Vec::new(),
            gates: Vec::new(),
            envs: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// A smoke run's report: correctness gates only, no verdict on figures.
    pub fn smoke() -> Report {
        let mut report = Report {
            verdicts: false,
            ..Report::new()
        };
        eprintln!("{SMOKE_NOTE}");
        report.emit(json!({"type": "smoke", "note": SMOKE_NOTE}));
        report
    }

    fn emit(&mut self, line: serde_json::Value) {
        let text = line.to_string();
        println!("{text}");
        let _ = std::io::stdout().flush();
        self.lines.push(text);
    }

    /// Records one run's value of a figure.
    pub fn value(&mut self, mode: &str, durability: &str, name: &str, unit: &str, value: f64) {
        self.push(mode, durability, name, unit, value, None);
    }

    /// Records one run's value of a figure that has a target.
    pub fn target(
        &mut self,
        mode: &str,
        durability: &str,
        name: &str,
        unit: &str,
        value: f64,
        target: Target,
    ) {
        self.push(mode, durability, name, unit, value, Some(target));
    }

    fn push(
        &mut self,
        mode: &str,
        durability: &str,
        name: &str,
        unit: &str,
        value: f64,
        target: Option<Target>,
    ) {
        let index = match self
            .series
            .iter()
            .position(|s| s.mode == mode && s.durability == durability && s.name == name)
        {
            Some(i) => i,
            None => {
                self.series.push(Series {
                    mode: mode.into(),
                    durability: durability.into(),
                    name: name.into(),
                    unit: unit.into(),
                    values: Vec::new(),
                    target,
                });
                self.series.len() - 1
            }
        };
        self.series[index].values.push(value);
        let run = self.series[index].values.len();
        self.emit(json!({
            "type": "value", "mode": mode, "durability": durability, "name": name,
            "unit": unit, "run": run, "value": value,
        }));
    }

    /// Records the outcome of a correctness gate.
    pub fn gate(&mut self, mode: &str, durability: &str, what: &str, gate: Gate) {
        self.emit(json!({
            "type": "gate", "mode": mode, "durability": durability, "what": what,
            "ok": gate.ok, "detail": gate.detail,
        }));
        self.gates.push(GateLine {
            mode: mode.into(),
            durability: durability.into(),
            what: what.into(),
            gate,
        });
    }

    /// Records the environment of a durability once: SQLite version and the
    /// pragmas read back from backlog's and the raw loop's connections. Pragmas
    /// that differ between the two fail the run: the comparison would be unfair.
    pub fn env(&mut self, durability: &str, backlog: &Pragmas, raw: &Pragmas) {
        if self.envs.iter().any(|(d, _)| d == durability) {
            return;
        }
        let line = json!({
            "type": "env", "durability": durability,
            "sqlite_version": rusqlite::version(),
            "backlog": {"journal_mode": backlog.journal_mode,
                        "synchronous": backlog.synchronous_name()},
            "raw": {"journal_mode": raw.journal_mode, "synchronous": raw.synchronous_name()},
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        });
        self.emit(line.clone());
        self.envs.push((durability.into(), line));
        self.gates.push(GateLine {
            mode: "env".into(),
            durability: durability.into(),
            what: "same pragmas as the raw loop".into(),
            gate: Gate {
                ok: backlog == raw && backlog.journal_mode == "wal",
                detail: format!(
                    "backlog journal_mode={} synchronous={}; raw journal_mode={} synchronous={}",
                    backlog.journal_mode,
                    backlog.synchronous_name(),
                    raw.journal_mode,
                    raw.synchronous_name()
                ),
            },
        });
    }

    pub fn passed(&self) -> bool {
        self.gates.iter().all(|g| g.gate.ok)
    }

    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// Prints the summary JSON lines and the human table.
    pub fn finish(&mut self) {
        let summaries: Vec<serde_json::Value> = self
            .series
            .iter()
            .map(|s| {
                json!({
                    "type": "summary", "mode": s.mode, "durability": s.durability,
                    "name": s.name, "unit": s.unit, "median": s.median(),
                    "runs": s.values,
                    "target": s.target.filter(|_| self.verdicts).map(|t| t.describe(&s.unit)),
                    "status": s.status(self.verdicts),
                })
            })
            .collect();
        for line in summaries {
            self.emit(line);
        }
        let failed: Vec<String> = self
            .gates
            .iter()
            .filter(|g| !g.gate.ok)
            .map(|g| format!("{} {} {}: {}", g.mode, g.durability, g.what, g.gate.detail))
            .collect();
        self.emit(json!({
            "type": "result", "passed": failed.is_empty(), "failed_gates": failed,
        }));
        eprintln!("{}", self.table());
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for (durability, env) in &self.envs {
            let _ = writeln!(
                out,
                "durability {durability}: SQLite {}, backlog {} / raw {}",
                env["sqlite_version"].as_str().unwrap_or("?"),
                pragma_text(&env["backlog"]),
                pragma_text(&env["raw"]),
            );
        }
        let _ = writeln!(
            out,
            "{:<12} {:<5} {:<46} {:>14} {:>8} {:>12} {:>7}",
            "mode", "dur", "figure", "median", "runs", "target", "status"
        );
        for s in &self.series {
            let _ = writeln!(
                out,
                "{:<12} {:<5} {:<46} {:>14} {:>8} {:>12} {:>7}",
                s.mode,
                s.durability,
                s.name,
                fmt_value(s.median(), &s.unit),
                s.values.len(),
                s.target_text(self.verdicts),
                s.status(self.verdicts)
            );
        }
        for line in self.gate_lines() {
            let _ = writeln!(out, "gate {line}");
        }
        if !self.verdicts {
            let _ = writeln!(out, "{SMOKE_NOTE}");
        }
        let _ = writeln!(
            out,
            "{}",
            if self.passed() {
                "correctness gate: PASSED"
            } else {
                "correctness gate: FAILED"
            }
        );
        out
    }

    /// The results as markdown tables, one per mode.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for (durability, env) in &self.envs {
            let _ = writeln!(
                out,
                "- {durability}: SQLite {}; backlog {}; raw {}",
                env["sqlite_version"].as_str().unwrap_or("?"),
                pragma_text(&env["backlog"]),
                pragma_text(&env["raw"]),
            );
        }
        let mut modes: Vec<&str> = Vec::new();
        for s in &self.series {
            if !modes.contains(&s.mode.as_str()) {
                modes.push(&s.mode);
            }
        }
        for mode in modes {
            let _ = writeln!(out, "\n#### {mode}\n");
            let _ = writeln!(
                out,
                "| figure | durability | median | runs | target | status |"
            );
            let _ = writeln!(out, "|---|---|---:|---|---|---|");
            for s in self.series.iter().filter(|s| s.mode == mode) {
                let runs: Vec<String> = s.values.iter().map(|v| fmt_value(*v, &s.unit)).collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    s.name,
                    s.durability,
                    fmt_value(s.median(), &s.unit),
                    runs.join(", "),
                    s.target_text(self.verdicts),
                    s.status(self.verdicts)
                );
            }
        }
        let _ = writeln!(out, "\nCorrectness gates (every run):\n");
        for line in self.gate_lines() {
            let _ = writeln!(out, "- {line}");
        }
        out
    }

    /// The gates grouped by mode, durability and check: how many runs passed,
    /// with the last run's detail, and every failure's own detail.
    fn gate_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut seen: Vec<(&str, &str, &str)> = Vec::new();
        for g in &self.gates {
            let key = (g.mode.as_str(), g.durability.as_str(), g.what.as_str());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let same: Vec<&GateLine> = self
                .gates
                .iter()
                .filter(|h| (h.mode.as_str(), h.durability.as_str(), h.what.as_str()) == key)
                .collect();
            let passed = same.iter().filter(|h| h.gate.ok).count();
            let last = same.last().map_or("", |h| h.gate.detail.as_str());
            lines.push(format!(
                "{} {} {}: {} {passed}/{} ({last})",
                g.mode,
                g.durability,
                g.what,
                if passed == same.len() { "ok" } else { "FAILED" },
                same.len()
            ));
            for h in same.iter().filter(|h| !h.gate.ok) {
                lines.push(format!("  FAILED run: {}", h.gate.detail));
            }
        }
        lines
    }

    /// Every JSON line printed so far.
    pub fn json_lines(&self) -> String {
        let mut out = self.lines.join("\n");
        out.push('\n');
        out
    }
}

fn pragma_text(v: &serde_json::Value) -> String {
    format!(
        "journal_mode={} synchronous={}",
        v["journal_mode"].as_str().unwrap_or("?"),
        v["synchronous"].as_str().unwrap_or("?")
    )
}

pub fn fmt_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return format!("{v} {unit}");
    }
    match unit {
        "ratio" => format!("{:.1} %", v * 100.0),
        "x" => format!("{v:.2}x"),
        "jobs/s" => format!("{v:.0} jobs/s"),
        "MB" => format!("{v:.1} MB"),
        _ if v >= 100.0 => format!("{v:.0} {unit}"),
        _ if v >= 1.0 => format!("{v:.2} {unit}"),
        _ => format!("{v:.3} {unit}"),
    }
}
