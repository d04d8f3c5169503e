//! The kept results as Markdown tables and SVG charts. A figure a report does not carry is
//! shown as `–`, never made up.

use std::fmt::Write as _;

use serde_json::Value;

use super::{
    Kept,
    svg::{Chart, Series},
};

pub struct Rendered {
    pub markdown: String,
    /// (file name, SVG)
    pub charts: Vec<(String, String)>,
}

/// The order reports appear in: the scenarios as `scripts/bench.sh` runs them, then the rest by
/// name.
pub fn order_key(name: &str) -> (usize, String) {
    let known = [
        "flood",
        "big-sale",
        "ticketing",
        "refusals",
        "open-loop",
        "sustained",
    ];
    (
        known.iter().position(|k| *k == name).unwrap_or(known.len()),
        name.to_owned(),
    )
}

const DASH: &str = "–";

fn num(v: &Value, places: usize) -> String {
    v.as_f64()
        .map_or_else(|| DASH.to_owned(), |x| group(x, places))
}

/// `12345.6` → `12,346` (places 0) or `12,345.60` (places 2).
fn group(x: f64, places: usize) -> String {
    let s = format!("{:.*}", places, x.abs());
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    if x < 0.0 && out.chars().any(|c| c.is_ascii_digit() && c != '0') {
        out.insert(0, '-');
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => DASH.to_owned(),
        other => other.to_string(),
    }
}

pub fn render(kept: &[Kept], chart_dir: &str) -> Rendered {
    let mut md = String::new();
    let mut charts = Vec::new();
    if let Some(first) = kept.first() {
        where_it_ran(&mut md, &first.report["meta"]);
    }
    for k in kept {
        if k.report["modes"].is_array() {
            bench(&mut md, &mut charts, k, chart_dir);
        } else {
            let _ = writeln!(
                md,
                "### {}\n\nThe kept report `{}.json` is not a report this generator knows.\n",
                k.name, k.name
            );
        }
    }
    Rendered {
        markdown: md,
        charts,
    }
}

fn where_it_ran(md: &mut String, meta: &Value) {
    let m = &meta["machine"];
    let commit = meta["commit"]
        .as_str()
        .map_or_else(|| DASH.to_owned(), |c| c.chars().take(12).collect());
    let dirty = if meta["commit_dirty"].as_bool() == Some(true) {
        " (with changes not committed)"
    } else {
        ""
    };
    let _ = writeln!(md, "### Where these figures were measured\n");
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(md, "| run | {} |", text(&meta["generated_at"]));
    let _ = writeln!(md, "| commit | `{commit}`{dirty} |");
    let _ = writeln!(
        md,
        "| machine | {}, {} CPUs online ({} available to the bench), {} MiB, Linux {} |",
        text(&m["cpu_model"]),
        text(&m["cpus_online"]),
        text(&m["cores_available"]),
        num(&m["memory_mib"], 0),
        text(&m["kernel"])
    );
    for (name, key) in [("PostgreSQL", "postgres"), ("Redis", "redis")] {
        let s = &meta[key];
        let settings: Vec<String> = s["settings"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {name} | {} ({}) |",
            text(&s["version"]),
            if settings.is_empty() {
                DASH.to_owned()
            } else {
                settings.join(", ")
            }
        );
    }
    let _ = writeln!(md, "| RabbitMQ | {} |\n", text(&meta["rabbitmq"]));
}

fn bench(md: &mut String, charts: &mut Vec<(String, String)>, k: &Kept, chart_dir: &str) {
    let r = &k.report;
    let _ = writeln!(
        md,
        "### {}\n\n{} requests from {} buyers for {} units, {} in flight, {} round(s). Command \
         line: `flashsale {}`.\n",
        text(&r["scenario"]),
        num(&r["requests"], 0),
        num(&r["buyers"], 0),
        num(&r["stock"], 0),
        num(&r["concurrency"], 0),
        num(&r["rounds"], 0),
        r["options"]
            .as_array()
            .map(|o| o.iter().map(text).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    );
    let modes = r["modes"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        md,
        "| mode | round | requests | accepted | refused | errors | req/s | accepted/s | p50 ms | p99 ms | p99.9 ms | checks |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
    );
    for m in &modes {
        let refused: f64 = m["refused"]
            .as_object()
            .map(|o| o.values().filter_map(Value::as_f64).sum())
            .unwrap_or(0.0);
        let checks = m["checks"].as_array().cloned().unwrap_or_default();
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| c["pass"].as_bool() != Some(true))
            .map(|c| text(&c["name"]))
            .collect();
        let verdict = if checks.is_empty() {
            DASH.to_owned()
        } else if failed.is_empty() {
            format!("{} pass", checks.len())
        } else {
            format!("**FAIL**: {}", failed.join(", "))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {verdict} |",
            text(&m["mode"]),
            num(&m["round"], 0),
            num(&m["requests"], 0),
            num(&m["accepted"], 0),
            group(refused, 0),
            num(&m["errored"], 0),
            num(&m["throughput_rps"], 0),
            num(&m["accepted_per_s"], 0),
            num(&m["latency_ms"]["p50"], 2),
            num(&m["latency_ms"]["p99"], 2),
            num(&m["latency_ms"]["p999"], 2),
        );
    }
    md.push('\n');
    if let Some(ratios) = r["ratios"].as_object().filter(|o| !o.is_empty()) {
        let _ = writeln!(md, "| ratio (platform ÷ mode) | value |\n|---|--:|");
        for (name, v) in ratios {
            let _ = writeln!(md, "| {name} | {} |", num(v, 2));
        }
        md.push('\n');
    }
    cost(md, &modes);
    refusals(md, &modes);
    let failed: Vec<String> = modes
        .iter()
        .flat_map(|m| {
            let mode = text(&m["mode"]);
            m["checks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c["pass"].as_bool() != Some(true))
                .map(move |c| format!("{mode}: {} ({})", text(&c["name"]), text(&c["detail"])))
        })
        .collect();
    if failed.is_empty() {
        let _ = writeln!(
            md,
            "Invariants after every mode: all checks passed (`\"passed\": {}` in the report).\n",
            r["passed"]
        );
    } else {
        let _ = writeln!(md, "Invariants that **failed**:\n");
        for f in failed {
            let _ = writeln!(md, "- {f}");
        }
        md.push('\n');
    }
    if let Some(svg) = intake_chart(&text(&r["scenario"]), &modes) {
        let file = format!("intake-{}.svg", k.name);
        let _ = writeln!(
            md,
            "![Accepted orders per second over each mode's run, {}]({chart_dir}/{file})\n",
            text(&r["scenario"])
        );
        charts.push((file, svg));
    }
}

/// CPU milliseconds per accepted order over each mode's intake, by process group.
fn cost(md: &mut String, modes: &[Value]) {
    let rows: Vec<(String, &serde_json::Map<String, Value>)> = modes
        .iter()
        .filter_map(|m| {
            Some((
                text(&m["mode"]),
                m["cpu"]["intake"]["ms_per_accepted"].as_object()?,
            ))
        })
        .collect();
    let Some((_, first)) = rows.first() else {
        return;
    };
    let mut groups: Vec<&String> = first.keys().filter(|g| *g != "machine").collect();
    groups.sort();
    let _ = writeln!(
        md,
        "CPU milliseconds per accepted order (per call for the no-op and the raw insert), over \
         each mode's intake:\n"
    );
    let _ = writeln!(
        md,
        "| mode | machine | {} |\n|---|--:|{}",
        groups
            .iter()
            .map(|g| g.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "--:|".repeat(groups.len())
    );
    for (mode, per) in &rows {
        let cells: Vec<String> = groups
            .iter()
            .map(|g| num(per.get(*g).unwrap_or(&Value::Null), 3))
            .collect();
        let _ = writeln!(
            md,
            "| {mode} | {} | {} |",
            num(per.get("machine").unwrap_or(&Value::Null), 3),
            cells.join(" | ")
        );
    }
    md.push('\n');
}

/// The refusals mode: the servers' counters per refused request.
fn refusals(md: &mut String, modes: &[Value]) {
    for m in modes {
        let r = &m["refusals"];
        if !r.is_object() {
            continue;
        }
        let _ = writeln!(
            md,
            "Refusal-only stretch: {} requests refused on a sold-out product, the servers' \
             counters read around it and around an equally long quiet stretch ({} s each):\n",
            num(&r["refused"], 0),
            num(&r["window_s"], 1)
        );
        let _ = writeln!(
            md,
            "| counter | during | quiet | beyond quiet | per refused request |\n|---|--:|--:|--:|--:|"
        );
        let mut names: Vec<&String> = r["net"]
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        names.sort_by_key(|n| (n.starts_with("redis.cmd."), n.to_owned()));
        for n in names {
            let _ = writeln!(
                md,
                "| `{n}` | {} | {} | {} | {} |",
                num(&r["during"][n.as_str()], 0),
                num(&r["background"][n.as_str()], 0),
                num(&r["net"][n.as_str()], 0),
                num(&r["net_per_refused"][n.as_str()], 4)
            );
        }
        if let Some(per) = m["cpu"]["ms_per_refused"].as_object() {
            let cells: Vec<String> = per
                .iter()
                .map(|(g, v)| format!("{g} {}", num(v, 4)))
                .collect();
            let _ = writeln!(
                md,
                "\nCPU milliseconds per refused request: {}.",
                cells.join(", ")
            );
        }
        md.push('\n');
    }
}

/// Accepted orders per second over each mode's run (its 250 ms slots), one line per mode that
/// accepted anything in the first round.
fn intake_chart(scenario: &str, modes: &[Value]) -> Option<String> {
    let series: Vec<Series> = modes
        .iter()
        .filter(|m| m["round"].as_u64().unwrap_or(1) == 1)
        .filter(|m| m["accepted"].as_u64().unwrap_or(0) > 0)
        .filter_map(|m| {
            let slots = m["timeline"].as_array()?;
            let points: Vec<(f64, f64)> = slots
                .iter()
                .filter_map(|s| Some((s["from_s"].as_f64()?, s["accepted"].as_f64()? * 4.0)))
                .collect();
            (points.len() > 1).then(|| Series {
                name: text(&m["mode"]),
                dashed: !text(&m["mode"]).starts_with("platform"),
                points,
            })
        })
        .collect();
    if series.is_empty() {
        return None;
    }
    Some(
        Chart {
            title: format!("{scenario}: accepted orders per second"),
            x_label: "seconds since the mode started".into(),
            y_label: "accepted / s (250 ms slots)".into(),
            series,
            marks: Vec::new(),
            log_y: false,
        }
        .render(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report() -> Value {
        json!({
            "scenario": "BigSale", "requests": 40000, "buyers": 40000, "stock": 20000,
            "concurrency": 64, "rounds": 1, "passed": false,
            "options": ["bench", "--scenario", "big-sale"],
            "meta": {"commit": "0123456789abcdef", "commit_dirty": false, "generated_at": "2026-12-03T07:00:00Z",
                     "machine": {"cpu_model": "Test CPU", "cpus_online": 2, "cores_available": 2, "memory_mib": 24000, "kernel": "6.1"},
                     "postgres": {"version": "15.2", "settings": {"fsync": "on"}}, "redis": null, "rabbitmq": "RabbitMQ 3.10"},
            "ratios": {"platform/naive accepted per second": 7.5},
            "modes": [
                {"mode": "naive (PostgreSQL row + order)", "round": 1, "requests": 40000, "accepted": 20000,
                 "refused": {"SOLD_OUT": 20000}, "errored": 0, "throughput_rps": 1200.0, "accepted_per_s": 1100.6,
                 "latency_ms": {"p50": 40.0, "p99": 90.0, "p999": 120.0},
                 "timeline": [{"from_s": 0.0, "accepted": 300}, {"from_s": 0.25, "accepted": 280}],
                 "cpu": {"intake": {"ms_per_accepted": {"machine": 1.5, "order": null, "postgresql": 1.2}}},
                 "checks": [{"name": "stock conserved", "pass": true, "detail": "ok"}]},
                {"mode": "platform (CreateOrder)", "round": 1, "requests": 40000, "accepted": 20000,
                 "refused": {"SOLD_OUT": 20000}, "errored": 0, "throughput_rps": 9000.0, "accepted_per_s": 8300.0,
                 "latency_ms": {"p50": 4.0, "p99": 12.0, "p999": 20.0},
                 "timeline": [{"from_s": 0.0, "accepted": 2000}, {"from_s": 0.25, "accepted": 2100}],
                 "cpu": {"intake": {"ms_per_accepted": {"machine": 0.2, "order": 0.08, "postgresql": 0.05}}},
                 "checks": [{"name": "gate equals database", "pass": false, "detail": "gate 1 vs available 0"}]}
            ]
        })
    }

    #[test]
    fn a_bench_report_becomes_tables_a_chart_and_its_failed_checks() {
        let kept = vec![Kept {
            name: "big-sale".into(),
            report: report(),
        }];
        let out = render(&kept, "bench");
        let md = &out.markdown;
        assert!(md.contains("`0123456789ab`"), "{md}");
        assert!(md.contains("Test CPU, 2 CPUs online"), "{md}");
        assert!(md.contains("15.2 (fsync=on)"), "{md}");
        assert!(md.contains("| naive (PostgreSQL row + order) | 1 | 40,000 | 20,000 | 20,000 | 0 | 1,200 | 1,101 | 40.00 | 90.00 | 120.00 | 1 pass |"), "{md}");
        assert!(md.contains("**FAIL**: gate equals database"), "{md}");
        assert!(
            md.contains("platform (CreateOrder): gate equals database (gate 1 vs available 0)"),
            "{md}"
        );
        assert!(
            md.contains("| platform/naive accepted per second | 7.50 |"),
            "{md}"
        );
        assert!(
            md.contains("| platform (CreateOrder) | 0.200 | 0.080 | 0.050 |"),
            "{md}"
        );
        assert!(
            md.contains("| naive (PostgreSQL row + order) | 1.500 | – | 1.200 |"),
            "{md}"
        );
        assert!(md.contains("](bench/intake-big-sale.svg)"), "{md}");
        assert_eq!(out.charts.len(), 1);
        assert_eq!(out.charts[0].1.matches("<polyline").count(), 2);
    }

    #[test]
    fn numbers_are_grouped_and_missing_ones_are_a_dash() {
        assert_eq!(group(1234567.891, 0), "1,234,568");
        assert_eq!(group(-1234.5, 2), "-1,234.50");
        assert_eq!(group(0.0, 3), "0.000");
        assert_eq!(num(&Value::Null, 2), DASH);
        assert_eq!(num(&json!("x"), 2), DASH);
    }
}
