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
        "refusals-before-opening",
        "open-loop",
        "sustained",
    ];
    (
        known.iter().position(|k| *k == name).unwrap_or(known.len()),
        name.to_owned(),
    )
}

const DASH: &str = "–";

pub(super) fn num(v: &Value, places: usize) -> String {
    v.as_f64()
        .map_or_else(|| DASH.to_owned(), |x| group(x, places))
}

/// `12345.6` → `12,346` (places 0) or `12,345.60` (places 2).
pub(super) fn group(x: f64, places: usize) -> String {
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
    let rounds: Vec<&Kept> = kept
        .iter()
        .filter(|k| k.report["mode"] == "sustained")
        .collect();
    for k in kept {
        if k.report["modes"].is_array() {
            bench(&mut md, &mut charts, k, chart_dir);
        } else if k.report["mode"] == "sustained" {
            // Several rounds: one table of them all, then the first in full.
            if rounds.first().is_some_and(|f| f.name == k.name) {
                if rounds.len() > 1 {
                    sustained_rounds(&mut md, &rounds);
                }
                sustained(&mut md, &mut charts, k, chart_dir);
            }
        } else if k.report["invariants"].is_array() {
            sale(&mut md, k);
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
        let _ = writeln!(
            md,
            "| ratio (platform ÷ mode) | median | lowest | highest | rounds |\n|---|--:|--:|--:|--:|"
        );
        for (name, v) in ratios {
            let spread = &r["ratios_spread"][name.as_str()];
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} |",
                num(v, 2),
                num(&spread["min"], 2),
                num(&spread["max"], 2),
                num(&spread["rounds"], 0)
            );
        }
        md.push('\n');
    }
    cost(md, &modes);
    refusals(md, &modes);
    sweeps(md, &r["naive_sweep"]);
    platform_sweeps(md, &r["platform_sweep"]);
    open_loop(md, charts, k, chart_dir);
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

/// Every point of each naive sweep, the best marked.
fn sweeps(md: &mut String, sweeps: &Value) {
    for sw in sweeps.as_array().into_iter().flatten() {
        let best = &sw["best"];
        let _ = writeln!(
            md,
            "Naive design swept (round {}): {} requests from {} buyers for {} units per point; \
             the best point is re-run at full size and is the naive baseline of the ratios.\n",
            num(&sw["round"], 0),
            num(&sw["requests_per_point"], 0),
            num(&sw["buyers_per_point"], 0),
            num(&sw["stock_per_point"], 0)
        );
        let _ = writeln!(
            md,
            "| variant | pool | in flight | accepted/s | p50 ms | p99 ms | errors |\n|---|--:|--:|--:|--:|--:|--:|"
        );
        for p in sw["points"].as_array().into_iter().flatten() {
            let mark = if p == best { " **best**" } else { "" };
            let _ = writeln!(
                md,
                "| {}{mark} | {} | {} | {} | {} | {} | {} |",
                text(&p["variant"]),
                num(&p["pool"], 0),
                num(&p["concurrency"], 0),
                num(&p["accepted_per_s"], 0),
                num(&p["p50_ms"], 1),
                num(&p["p99_ms"], 1),
                num(&p["errors"], 0)
            );
        }
        md.push('\n');
    }
}

/// Every point of each platform sweep (the platform across concurrencies).
fn platform_sweeps(md: &mut String, sweeps: &Value) {
    for sw in sweeps.as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "Platform across concurrencies (round {}): {} requests from {} buyers for {} units \
             per point, each saga followed to the end and each product read back. {}\n",
            num(&sw["round"], 0),
            num(&sw["requests_per_point"], 0),
            num(&sw["buyers_per_point"], 0),
            num(&sw["stock_per_point"], 0),
            verdict(sw["passed"].as_bool())
        );
        let _ = writeln!(
            md,
            "| in flight | accepted/s | p50 ms | p99 ms | confirmed/s | errors |\n|--:|--:|--:|--:|--:|--:|"
        );
        for p in sw["points"].as_array().into_iter().flatten() {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                num(&p["concurrency"], 0),
                num(&p["accepted_per_s"], 0),
                num(&p["p50_ms"], 1),
                num(&p["p99_ms"], 1),
                num(&p["confirmed_per_s"], 0),
                num(&p["errors"], 0)
            );
        }
        md.push('\n');
    }
}

/// The open-loop curves: a table per target and one chart of p99 against the offered rate.
fn open_loop(md: &mut String, charts: &mut Vec<(String, String)>, k: &Kept, chart_dir: &str) {
    let Some(curves) = k.report["open_loop"].as_array().filter(|c| !c.is_empty()) else {
        return;
    };
    let slo = curves
        .iter()
        .find_map(|c| c["slo_ms"].as_f64())
        .unwrap_or(50.0);
    let mut series = Vec::new();
    for c in curves {
        let target = text(&c["target"]);
        let _ = writeln!(
            md,
            "Open loop, {target} (round {}, {} s per rate, latency from the scheduled start): \
             **highest rate within p99 ≤ {} ms: {}** calls/s.\n",
            num(&c["round"], 0),
            num(&c["secs_per_rate"], 0),
            num(&c["slo_ms"], 0),
            num(&c["max_rate_within_slo"], 0)
        );
        let _ = writeln!(
            md,
            "| offered/s | achieved/s | p50 ms | p99 ms | p99.9 ms | max ms | errors | not started | within SLO |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|---|"
        );
        let mut points = Vec::new();
        for p in c["points"].as_array().into_iter().flatten() {
            let l = &p["latency_ms"];
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(&p["offered_rps"], 0),
                num(&p["achieved_rps"], 0),
                num(&l["p50"], 1),
                num(&l["p99"], 1),
                num(&l["p999"], 1),
                num(&l["max"], 1),
                num(&p["errored"], 0),
                num(&p["not_started"], 0),
                if p["meets_slo"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
            );
            if let (Some(x), Some(y)) = (p["offered_rps"].as_f64(), l["p99"].as_f64()) {
                points.push((x, y));
            }
        }
        md.push('\n');
        series.push(Series {
            dashed: !target.starts_with("platform"),
            name: format!("{target} p99"),
            points,
        });
    }
    let file = format!("open-loop-{}.svg", k.name);
    let svg = Chart {
        title: format!(
            "{}: p99 latency against the offered rate (open loop)",
            text(&k.report["scenario"])
        ),
        x_label: "offered calls per second".into(),
        y_label: "p99 ms from the scheduled start (log)".into(),
        series,
        marks: vec![(slo, format!("SLO {slo} ms"))],
        log_y: true,
    }
    .render();
    let _ = writeln!(
        md,
        "![p99 latency against the offered rate]({chart_dir}/{file})\n"
    );
    charts.push((file, svg));
}

/// `flashsale sale`: the sale's figures, its payments and its checks.
fn sale(md: &mut String, k: &Kept) {
    let r = &k.report;
    let _ = writeln!(
        md,
        "### Sale end to end: `{}`\n\n{} buyers for {} product(s) of {} units, {} accepted; the \
         flood took {} s ({} calls/s); the whole sale {} s. {}\n",
        k.name,
        num(&r["buyers"], 0),
        r["skus"].as_array().map_or(0, Vec::len),
        num(&r["stock"], 0),
        num(&r["accepted"], 0),
        num(&r["floodSecs"], 1),
        num(&r["throughputRps"], 0),
        num(&r["elapsedSecs"], 1),
        verdict(r["pass"].as_bool())
    );
    if let Some(p) = r["payments"].as_object() {
        let _ = writeln!(md, "| payments | |\n|---|--:|");
        for (name, v) in p {
            if v.is_number() {
                let _ = writeln!(md, "| {name} | {} |", num(v, 1));
            } else if let Some(o) = v.as_object() {
                for (sub, v) in o.iter().filter(|(_, v)| v.is_number()) {
                    let _ = writeln!(md, "| {name}.{sub} | {} |", num(v, 1));
                }
            }
        }
        md.push('\n');
    }
    memory(md, &r["memory"]);
    checks(md, &r["invariants"]);
}

/// A sustained sale: its summary, its checks and two charts (rates, backlog).
fn sustained(md: &mut String, charts: &mut Vec<(String, String)>, k: &Kept, chart_dir: &str) {
    let r = &k.report;
    let _ = writeln!(
        md,
        "### Sustained sale: `{}`\n\n{} new buyers a second for {} s, each paying as soon as its \
         order is confirmed. {}\n",
        k.name,
        num(&r["arrivalRate"], 0),
        num(&r["sustainSecs"], 0),
        verdict(r["pass"].as_bool())
    );
    let _ = writeln!(md, "| | |\n|---|--:|");
    for (label, key, places) in [
        ("arrivals", "arrivals", 0),
        ("accepted", "accepted", 0),
        (
            "accepted/s (second half of the arrivals)",
            "acceptedPerSec",
            1,
        ),
        (
            "shipped/s (second half of the arrivals)",
            "shippedPerSec",
            1,
        ),
        ("shipped ÷ accepted per second", "shippedToAcceptedRatio", 2),
        (
            "backlog, middle fifth of the arrivals (mean)",
            "backlogMiddle",
            0,
        ),
        (
            "backlog, last fifth of the arrivals (mean)",
            "backlogEnd",
            0,
        ),
        ("drain after the arrivals stopped, s", "drainSecs", 1),
        ("paid at the provider", "paidAtProvider", 0),
        ("paid but left unshipped", "paidLeftUnshipped", 0),
        ("payments that could not be made", "paymentsFailed", 0),
        ("errors", "errors", 0),
    ] {
        let _ = writeln!(md, "| {label} | {} |", num(&r[key], places));
    }
    let _ = writeln!(
        md,
        "| backlog bounded | {} |\n",
        match r["backlogBounded"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => DASH,
        }
    );
    memory(md, &r["memory"]);
    let timeline = r["timeline"].as_array().cloned().unwrap_or_default();
    let rate = |key: &str| -> Vec<(f64, f64)> {
        timeline
            .windows(2)
            .filter_map(|w| {
                let (a, b) = (&w[0], &w[1]);
                let dt = b["t"].as_f64()? - a["t"].as_f64()?;
                (dt > 0.0).then_some((b["t"].as_f64()?, (b[key].as_f64()? - a[key].as_f64()?) / dt))
            })
            .collect()
    };
    if timeline.len() > 2 {
        let series = ["accepted", "confirmed", "paid", "shipped"]
            .iter()
            .map(|k| Series {
                name: format!("{k}/s"),
                points: rate(k),
                dashed: false,
            })
            .collect();
        let file = format!("{}-rates.svg", k.name);
        let svg = Chart {
            title: "Sustained sale: orders per second".into(),
            x_label: "seconds since the first arrival".into(),
            y_label: "orders per second".into(),
            series,
            marks: Vec::new(),
            log_y: false,
        }
        .render();
        let _ = writeln!(
            md,
            "![Orders accepted, confirmed, paid and shipped per second]({chart_dir}/{file})\n"
        );
        charts.push((file, svg));
        let backlog = |f: &dyn Fn(&Value) -> Option<f64>| -> Vec<(f64, f64)> {
            timeline
                .iter()
                .filter_map(|s| Some((s["t"].as_f64()?, f(s)?)))
                .collect()
        };
        let series = vec![
            Series {
                name: "orders PENDING".into(),
                points: backlog(&|s| s["pending"].as_f64()),
                dashed: false,
            },
            Series {
                name: "orders PAID, not shipped".into(),
                points: backlog(&|s| s["paidUnshipped"].as_f64()),
                dashed: false,
            },
            Series {
                name: "unsent outbox rows".into(),
                points: backlog(&|s| {
                    let o = s["outboxUnsent"].as_object()?;
                    Some(o.values().filter_map(Value::as_f64).sum())
                }),
                dashed: true,
            },
        ];
        let file = format!("{}-backlog.svg", k.name);
        let svg = Chart {
            title: "Sustained sale: backlog".into(),
            x_label: "seconds since the first arrival".into(),
            y_label: "orders or rows waiting".into(),
            series,
            marks: Vec::new(),
            log_y: false,
        }
        .render();
        let _ = writeln!(md, "![The backlog over time]({chart_dir}/{file})\n");
        charts.push((file, svg));
    }
}

/// A column of a table of reports: its heading, its value in a report, its decimals.
type Column<'a> = (&'a str, &'a dyn Fn(&Value) -> Value, usize);

/// The sustained sales of one kept run side by side, with the median of each column.
fn sustained_rounds(md: &mut String, rounds: &[&Kept]) {
    let columns: [Column<'_>; 8] = [
        ("new buyers/s", &|r| r["arrivalRate"].clone(), 0),
        ("accepted/s", &|r| r["acceptedPerSec"].clone(), 0),
        ("shipped/s", &|r| r["shippedPerSec"].clone(), 0),
        ("refused OVERLOADED", &|r| r["overloaded"].clone(), 0),
        (
            "refusal p99 ms",
            &|r| r["latency"]["createOrderOverloaded"]["p99Ms"].clone(),
            1,
        ),
        (
            "accepted p99 ms",
            &|r| r["latency"]["createOrderAccepted"]["p99Ms"].clone(),
            1,
        ),
        ("backlog at the end", &|r| r["backlogEnd"].clone(), 0),
        ("order RSS MiB", &order_peak_mib, 1),
    ];
    let _ = writeln!(
        md,
        "### Sustained sale, {} rounds\n\nEach round a sale of its own on the same services; the \
         first round is shown in full below.\n",
        rounds.len()
    );
    let head: Vec<&str> = columns.iter().map(|(h, _, _)| *h).collect();
    let _ = writeln!(
        md,
        "| report | {} | checks |\n|---|{}---|",
        head.join(" | "),
        "--:|".repeat(columns.len())
    );
    for k in rounds {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, f, places)| num(&f(&k.report), *places))
            .collect();
        let verdict = match k.report["pass"].as_bool() {
            Some(true) => "pass",
            Some(false) => "**FAIL**",
            None => DASH,
        };
        let _ = writeln!(md, "| `{}` | {} | {verdict} |", k.name, cells.join(" | "));
    }
    let medians: Vec<String> = columns
        .iter()
        .map(|(_, f, places)| {
            let mut v: Vec<f64> = rounds
                .iter()
                .filter_map(|k| f(&k.report).as_f64())
                .collect();
            median(&mut v).map_or_else(|| DASH.to_owned(), |m| group(m, *places))
        })
        .collect();
    let _ = writeln!(md, "| median | {} | |\n", medians.join(" | "));
}

/// The median of `v` (the mean of the middle two for an even count), sorting it; `None` when
/// it is empty.
pub(super) fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The order service's peak resident memory in a sale report, MiB.
pub(super) fn order_peak_mib(r: &Value) -> Value {
    r["memory"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["service"] == "order")
        .map_or(Value::Null, |m| m["peak_rss_mib"].clone())
}

fn verdict(pass: Option<bool>) -> &'static str {
    match pass {
        Some(true) => "Every check passed.",
        Some(false) => "**The run failed a check** (below).",
        None => "",
    }
}

/// Each service's peak memory during a sale.
fn memory(md: &mut String, memory: &Value) {
    let peaks: Vec<String> = memory
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| format!("{} {} MiB", text(&m["service"]), num(&m["peak_rss_mib"], 1)))
        .collect();
    if !peaks.is_empty() {
        let _ = writeln!(md, "Peak resident memory: {}.\n", peaks.join(", "));
    }
}

/// A sale's invariant checks, the failed ones spelled out.
fn checks(md: &mut String, checks: &Value) {
    let all = checks.as_array().cloned().unwrap_or_default();
    let failed: Vec<String> = all
        .iter()
        .filter(|c| c["pass"].as_bool() != Some(true))
        .map(|c| format!("{} ({})", text(&c["name"]), text(&c["detail"])))
        .collect();
    if failed.is_empty() {
        let names: Vec<String> = all.iter().map(|c| text(&c["name"])).collect();
        let _ = writeln!(md, "Checks passed: {}.\n", names.join("; "));
    } else {
        let _ = writeln!(md, "Checks that **failed**:\n");
        for f in failed {
            let _ = writeln!(md, "- {f}");
        }
        md.push('\n');
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
        let on = if r["stretch"] == "before the opening" {
            "`SALE_NOT_STARTED` in the 5 s before a product's sale opened"
        } else {
            "on a sold-out product"
        };
        let _ = writeln!(
            md,
            "Refusal-only stretch: {} requests refused {on}, the servers' \
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
            md.contains("| platform/naive accepted per second | 7.50 | – | – | – |"),
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
    fn open_loop_curves_sustained_sales_and_sales_are_rendered_with_their_charts() {
        let mut bench = report();
        bench["open_loop"] = json!([
            {"target": "platform", "round": 1, "secs_per_rate": 10, "slo_ms": 50, "max_rate_within_slo": 2000,
             "points": [{"offered_rps": 1000, "achieved_rps": 998, "latency_ms": {"p50": 2.0, "p99": 9.5, "p999": 20.0, "max": 30.0}, "errored": 0, "not_started": 0, "meets_slo": true},
                        {"offered_rps": 4000, "achieved_rps": 3900, "latency_ms": {"p50": 20.0, "p99": 149.0, "p999": 300.0, "max": 400.0}, "errored": 0, "not_started": 0, "meets_slo": false}]},
            {"target": "naive-fn pool 16", "round": 1, "secs_per_rate": 10, "slo_ms": 50, "max_rate_within_slo": 500,
             "points": [{"offered_rps": 1000, "achieved_rps": 700, "latency_ms": {"p50": 500.0, "p99": 1274.0, "p999": 1300.0, "max": 1400.0}, "errored": 3, "not_started": 10, "meets_slo": false}]}
        ]);
        bench["naive_sweep"] = json!([{"round": 1, "requests_per_point": 4000, "buyers_per_point": 4000, "stock_per_point": 2000,
            "points": [{"variant": "naive-fn", "pool": 16, "concurrency": 64, "accepted_per_s": 548.0, "p50_ms": 90.0, "p99_ms": 199.0, "errors": 0},
                       {"variant": "naive", "pool": 8, "concurrency": 64, "accepted_per_s": 457.0, "p50_ms": 95.0, "p99_ms": 204.0, "errors": 0}],
            "best": {"variant": "naive-fn", "pool": 16, "concurrency": 64, "accepted_per_s": 548.0, "p50_ms": 90.0, "p99_ms": 199.0, "errors": 0}}]);
        let sustained = json!({"mode": "sustained", "arrivalRate": 500, "sustainSecs": 60, "arrivals": 30000, "accepted": 30000,
            "acceptedPerSec": 500.0, "shippedPerSec": 480.0, "shippedToAcceptedRatio": 0.96, "backlogBounded": false,
            "drainSecs": 12.0, "pass": true, "memory": [{"service": "order", "peak_rss_mib": 80.5}],
            "timeline": [{"t": 0.0, "accepted": 0, "confirmed": 0, "paid": 0, "shipped": 0, "pending": 0, "paidUnshipped": 0, "outboxUnsent": {"order": 0}},
                         {"t": 1.0, "accepted": 500, "confirmed": 400, "paid": 300, "shipped": 200, "pending": 100, "paidUnshipped": 100, "outboxUnsent": {"order": 5, "outbound": null}},
                         {"t": 2.0, "accepted": 1000, "confirmed": 900, "paid": 800, "shipped": 700, "pending": 100, "paidUnshipped": 100, "outboxUnsent": {"order": 3}}]});
        let sale = json!({"buyers": 40000, "skus": ["A", "B"], "stock": 8000, "accepted": 16000, "floodSecs": 9.0,
            "throughputRps": 4400.0, "elapsedSecs": 120.0, "pass": false,
            "payments": {"paidPerSec": 900.5, "lateBySale": {"startedLate": 0, "paidLate": 2}},
            "memory": [], "invariants": [{"name": "paid orders shipped", "pass": false, "detail": "2 left"}, {"name": "units sold <= stock", "pass": true, "detail": "ok"}]});
        let kept = vec![
            Kept {
                name: "big-sale".into(),
                report: bench,
            },
            Kept {
                name: "sale".into(),
                report: sale,
            },
            Kept {
                name: "sustained".into(),
                report: sustained,
            },
        ];
        let out = render(&kept, "bench");
        let md = &out.markdown;
        assert!(
            md.contains("highest rate within p99 ≤ 50 ms: 2,000** calls/s"),
            "{md}"
        );
        assert!(
            md.contains("| 1,000 | 700 | 500.0 | 1,274.0 | 1,300.0 | 1,400.0 | 3 | 10 | no |"),
            "{md}"
        );
        assert!(md.contains("| naive-fn **best** | 16 | 64 | 548 |"), "{md}");
        assert!(
            md.contains("| paidPerSec | 900.5 |") && md.contains("| lateBySale.paidLate | 2.0 |"),
            "{md}"
        );
        assert!(md.contains("paid orders shipped (2 left)"), "{md}");
        assert!(
            md.contains("| shipped ÷ accepted per second | 0.96 |"),
            "{md}"
        );
        assert!(md.contains("| backlog bounded | **no** |"), "{md}");
        assert!(md.contains("Peak resident memory: order 80.5 MiB."), "{md}");
        let files: Vec<&str> = out.charts.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            files,
            vec![
                "open-loop-big-sale.svg",
                "intake-big-sale.svg",
                "sustained-rates.svg",
                "sustained-backlog.svg"
            ]
        );
        // Rates are the differences of the cumulative counts: 500 accepted in the second second.
        let rates = &out.charts[2].1;
        assert_eq!(rates.matches("<polyline").count(), 4);
        assert!(out.charts[0].1.contains("SLO 50 ms"));
    }

    #[test]
    fn rounds_show_their_spread_and_the_platform_sweep_and_sustained_rounds_their_tables() {
        let mut bench = report();
        bench["rounds"] = json!(3);
        bench["ratios"] = json!({"platform confirmed/naive accepted per second": 0.8});
        bench["ratios_spread"] = json!({"platform confirmed/naive accepted per second": {"min": 0.7, "max": 0.95, "rounds": 3}});
        bench["platform_sweep"] = json!([{"round": 2, "requests_per_point": 4000, "buyers_per_point": 4000,
            "stock_per_point": 2000, "passed": false,
            "points": [{"concurrency": 16, "accepted_per_s": 3000.4, "p50_ms": 2.0, "p99_ms": 9.26,
                        "confirmed_per_s": 1500.0, "errors": 0}]}]);
        let round = |rate: u64, shipped: f64, p99: f64, pass: bool| {
            json!({"mode": "sustained", "arrivalRate": rate, "acceptedPerSec": 800.0, "shippedPerSec": shipped,
                "overloaded": 100, "latency": {"createOrderOverloaded": {"p99Ms": p99}, "createOrderAccepted": {"p99Ms": 40.0}},
                "backlogEnd": 900.0, "pass": pass, "memory": [{"service": "order", "peak_rss_mib": 50.0}], "timeline": []})
        };
        let kept = vec![
            Kept {
                name: "big-sale".into(),
                report: bench,
            },
            Kept {
                name: "sustained".into(),
                report: round(1600, 700.0, 30.0, true),
            },
            Kept {
                name: "sustained-2".into(),
                report: round(1600, 760.0, 20.0, true),
            },
            Kept {
                name: "sustained-3".into(),
                report: round(1600, 720.0, 140.0, false),
            },
        ];
        let md = render(&kept, "bench").markdown;
        assert!(
            md.contains(
                "| platform confirmed/naive accepted per second | 0.80 | 0.70 | 0.95 | 3 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("Platform across concurrencies (round 2)"),
            "{md}"
        );
        assert!(md.contains("**The run failed a check**"), "{md}");
        assert!(
            md.contains("| 16 | 3,000 | 2.0 | 9.3 | 1,500 | 0 |"),
            "{md}"
        );
        assert!(md.contains("### Sustained sale, 3 rounds"), "{md}");
        assert!(
            md.contains(
                "| `sustained-3` | 1,600 | 800 | 720 | 100 | 140.0 | 40.0 | 900 | 50.0 | **FAIL** |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| median | 1,600 | 800 | 720 | 100 | 30.0 | 40.0 | 900 | 50.0 | |"),
            "{md}"
        );
        // The first round in full, the others only in the table.
        assert_eq!(md.matches("### Sustained sale: `").count(), 1, "{md}");
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
