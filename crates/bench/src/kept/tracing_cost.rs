//! What tracing costs, from a run of `scripts/bench.sh tracing`: the big sale's platform mode
//! run with tracing off (`tracing-off.json`, `tracing-off-2.json`, …) and with spans sampled and
//! exported (`tracing-sampled.json`, …), on the same machine, the two in turn. The figure is the
//! CPU the three services spend per accepted order, over the intake and the saga until the last
//! confirmation, median over the rounds; the machine's whole CPU per accepted order beside it.

use std::path::Path;

use anyhow::Context as _;
use serde_json::{Value, json};

const SERVICES: [&str; 3] = ["order", "product-stock", "outbound"];
const WINDOWS: [&str; 2] = ["intake", "after_intake_to_last_confirmation"];

/// CPU milliseconds per accepted order of one platform round: (the three services, the
/// machine).
fn per_accepted(mode: &Value) -> Option<(f64, f64)> {
    let mut services = 0.0;
    let mut machine = 0.0;
    for w in WINDOWS {
        let per = mode.get("cpu")?.get(w)?.get("ms_per_accepted")?;
        for s in SERVICES {
            services += per.get(s)?.as_f64()?;
        }
        machine += per.get("machine")?.as_f64()?;
    }
    Some((services, machine))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Each platform round of one report, as [`per_accepted`].
fn rounds(report: &Value) -> Vec<(f64, f64)> {
    report
        .get("modes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| {
            m.get("mode")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with("platform"))
        })
        .filter_map(per_accepted)
        .collect()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The comparison of one run's reports, as JSON.
pub fn compare(off: &[Value], sampled: &[Value]) -> anyhow::Result<Value> {
    let (off, sampled): (Vec<_>, Vec<_>) = (
        off.iter().flat_map(rounds).collect(),
        sampled.iter().flat_map(rounds).collect(),
    );
    anyhow::ensure!(
        !off.is_empty() && !sampled.is_empty(),
        "no platform round with CPU figures in one of the reports"
    );
    let med = |r: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        median(r.iter().map(pick).collect()).unwrap_or(f64::NAN)
    };
    let (off_svc, on_svc) = (med(&off, |r| r.0), med(&sampled, |r| r.0));
    let (off_all, on_all) = (med(&off, |r| r.1), med(&sampled, |r| r.1));
    Ok(json!({
        "services_cpu_ms_per_accepted": {
            "off": round3(off_svc),
            "sampled": round3(on_svc),
            "rounds_off": off.iter().map(|r| round3(r.0)).collect::<Vec<_>>(),
            "rounds_sampled": sampled.iter().map(|r| round3(r.0)).collect::<Vec<_>>(),
        },
        "machine_cpu_ms_per_accepted": {
            "off": round3(off_all),
            "sampled": round3(on_all),
        },
        "services_cost_percent": round3((on_svc / off_svc - 1.0) * 100.0 * 1000.0) / 1000.0,
        "machine_cost_percent": round3((on_all / off_all - 1.0) * 100.0 * 1000.0) / 1000.0,
    }))
}

/// The reports of `run` named `tracing-<variant>.json` or `tracing-<variant>-<n>.json`.
fn reports(run: &Path, variant: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(run).with_context(|| format!("read {}", run.display()))?;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(rest) = name.strip_prefix(&format!("tracing-{variant}")) else {
            continue;
        };
        let round = rest.strip_suffix(".json");
        if !round.is_some_and(|r| {
            r.is_empty()
                || r.strip_prefix('-')
                    .is_some_and(|n| n.parse::<u32>().is_ok())
        }) {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        out.push(serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?);
    }
    Ok(out)
}

/// Reads the tracing reports of `run` and prints the comparison.
pub fn print(run: &Path) -> anyhow::Result<()> {
    let cmp = compare(&reports(run, "off")?, &reports(run, "sampled")?)?;
    println!("{}", serde_json::to_string_pretty(&cmp)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(services: &[f64]) -> Value {
        let modes: Vec<Value> = services
            .iter()
            .map(|ms| {
                let per = json!({"order": ms / 2.0, "product-stock": ms / 4.0, "outbound": ms / 4.0, "machine": ms * 2.0});
                json!({"mode": "platform (CreateOrder)", "cpu": {
                    "intake": {"ms_per_accepted": per},
                    "after_intake_to_last_confirmation": {"ms_per_accepted": per},
                }})
            })
            .chain([json!({"mode": "naive best of sweep", "cpu": {}})])
            .collect();
        json!({ "modes": modes })
    }

    #[test]
    fn the_cost_is_the_median_services_cpu_per_accepted_order_sampled_against_off() {
        let off = [report(&[0.1, 0.3]), report(&[0.2])];
        let cmp = compare(&off, &[report(&[0.22, 0.21, 0.5])]).unwrap();
        // Medians: 0.2 → 0.4 off, 0.22 → 0.44 sampled (both windows): 10% more.
        assert_eq!(cmp["services_cpu_ms_per_accepted"]["off"], json!(0.4));
        assert_eq!(cmp["services_cpu_ms_per_accepted"]["sampled"], json!(0.44));
        assert_eq!(cmp["services_cost_percent"], json!(10.0));
        assert_eq!(cmp["machine_cost_percent"], json!(10.0));
    }

    #[test]
    fn a_report_without_platform_rounds_is_an_error() {
        let empty = json!({"modes": []});
        assert!(compare(&[empty], &[report(&[0.1])]).is_err());
        assert!(compare(&[report(&[0.1])], &[]).is_err());
    }
}
