//! The SVG chart of BENCHMARKS.md, written by hand (no plotting dependency):
//! throughput of backlog next to the raw ceiling, and the latency
//! percentiles, both on log scales, from the medians of a run.

use std::fmt::Write as _;

use crate::report::{Report, Series};

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 340.0;
const RIGHT: f64 = 150.0;
const BAR: f64 = 11.0;
const GAP: f64 = 10.0;
const BACKLOG: &str = "#2f6fb0";
const RAW: &str = "#9a9a9a";
const PERCENTILES: [(&str, &str); 4] = [
    ("p50", "#9cc3e6"),
    ("p90", "#5b9bd5"),
    ("p99", "#2f6fb0"),
    ("max", "#1b3f66"),
];

/// One group of bars: a label and `(legend, value, colour)` bars.
struct Group {
    label: String,
    bars: Vec<(String, f64, &'static str)>,
}

fn find<'a>(report: &'a Report, mode: &str, durability: &str, name: &str) -> Option<&'a Series> {
    report
        .series()
        .iter()
        .find(|s| s.mode == mode && s.durability == durability && s.name == name)
}

fn throughput_groups(report: &Report) -> Vec<Group> {
    let mut groups = Vec::new();
    for durability in ["Full", "Fast"] {
        let pairs: Vec<(&str, String, String, String)> = {
            let mut v = vec![
                (
                    "enqueue",
                    "backlog one at a time",
                    "raw, batch 1",
                    "enqueue one per commit",
                ),
                (
                    "enqueue",
                    "backlog enqueue_many(100)",
                    "raw, batch 100",
                    "enqueue_many(100)",
                ),
                (
                    "enqueue",
                    "backlog enqueue_many(1000)",
                    "raw, batch 1000",
                    "enqueue_many(1000)",
                ),
            ]
            .into_iter()
            .map(|(m, b, r, l)| (m, b.to_owned(), r.to_owned(), l.to_owned()))
            .collect::<Vec<_>>();
            for s in report.series() {
                if s.mode == "burn-down" && s.durability == durability {
                    if let Some(threads) = s.name.strip_prefix("backlog worker, ") {
                        v.push((
                            "burn-down",
                            s.name.clone(),
                            "raw drain, batch 100".to_owned(),
                            format!("burn-down, worker {threads}"),
                        ));
                    }
                }
            }
            v
        };
        for (mode, backlog, raw, label) in pairs {
            let (Some(b), Some(r)) = (
                find(report, mode, durability, &backlog),
                find(report, mode, durability, &raw),
            ) else {
                continue;
            };
            groups.push(Group {
                label: format!("{label} [{durability}]"),
                bars: vec![
                    (
                        format!("backlog ({:.0} % of raw)", 100.0 * b.median() / r.median()),
                        b.median(),
                        BACKLOG,
                    ),
                    ("raw ceiling".to_owned(), r.median(), RAW),
                ],
            });
        }
    }
    groups
}

fn latency_groups(report: &Report) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for s in report.series() {
        if s.mode != "latency" || s.unit != "ms" {
            continue;
        }
        let Some((origin, percentile)) = s.name.rsplit_once(": ") else {
            continue;
        };
        let Some(&(_, colour)) = PERCENTILES.iter().find(|(p, _)| *p == percentile) else {
            continue;
        };
        let label = format!("{origin} [{}]", s.durability);
        let index = match groups.iter().position(|g| g.label == label) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    label,
                    bars: Vec::new(),
                });
                groups.len() - 1
            }
        };
        groups[index]
            .bars
            .push((percentile.to_owned(), s.median(), colour));
    }
    groups
}

/// Draws one panel at `top`; returns its height.
fn panel(svg: &mut String, top: f64, title: &str, unit: &str, groups: &[Group]) -> f64 {
    let values: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.1))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if values.is_empty() {
        return 0.0;
    }
    let lo = values
        .iter()
        .cloned()
        .fold(f64::MAX, f64::min)
        .log10()
        .floor();
    let hi = values
        .iter()
        .cloned()
        .fold(f64::MIN, f64::max)
        .log10()
        .ceil();
    let hi = if hi <= lo { lo + 1.0 } else { hi };
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |v: f64| LEFT + (v.max(10f64.powf(lo)).log10() - lo) / (hi - lo) * plot_w;
    let rows: f64 = groups.iter().map(|g| g.bars.len() as f64 * BAR + GAP).sum();
    let plot_top = top + 30.0;
    let height = 30.0 + rows + 30.0;
    let _ = writeln!(
        svg,
        r#"<text x="10" y="{}" font-size="15" font-weight="bold">{}</text>"#,
        top + 18.0,
        escape(title)
    );
    let mut decade = lo;
    while decade <= hi {
        let xv = x(10f64.powf(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{xv:.1}" y1="{plot_top}" x2="{xv:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xv:.1}" y="{:.1}" font-size="11" text-anchor="middle">{} {unit}</text>"##,
            plot_top + rows,
            plot_top + rows + 14.0,
            tick(10f64.powf(decade)),
        );
        decade += 1.0;
    }
    let mut y = plot_top;
    for g in groups {
        let mid = y + g.bars.len() as f64 * BAR / 2.0 + 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{mid:.1}" font-size="12" text-anchor="end">{}</text>"#,
            LEFT - 8.0,
            escape(&g.label)
        );
        for (legend, value, colour) in &g.bars {
            let w = (x(*value) - LEFT).max(1.0);
            let _ = writeln!(
                svg,
                r#"<rect x="{LEFT}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{colour}"/><text x="{:.1}" y="{:.1}" font-size="10">{} {}</text>"#,
                BAR - 1.0,
                LEFT + w + 4.0,
                y + BAR - 2.0,
                escape(legend),
                format_value(*value),
            );
            y += BAR;
        }
        y += GAP;
    }
    height
}

fn tick(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{}M", v / 1_000_000.0)
    } else if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The chart of `report`'s medians, or `None` when it measured nothing to draw.
pub fn svg(report: &Report, subtitle: &str) -> Option<String> {
    let throughput = throughput_groups(report);
    let latency = latency_groups(report);
    if throughput.is_empty() && latency.is_empty() {
        return None;
    }
    let mut body = String::new();
    let mut top = 40.0;
    top += panel(
        &mut body,
        top,
        "Throughput: backlog vs the raw-SQLite ceiling (median, log scale)",
        "jobs/s",
        &throughput,
    );
    top += panel(
        &mut body,
        top,
        "Latency: enqueue → handler start at a fixed rate (median of runs, log scale)",
        "ms",
        &latency,
    );
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{:.0}" font-family="sans-serif">"#,
        top + 10.0
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="13" fill="#444">{}</text>"##,
        escape(subtitle)
    );
    svg.push_str(&body);
    svg.push_str("</svg>\n");
    Some(svg)
}
