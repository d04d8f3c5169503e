//! The dashboards and alert rules in `deploy/` ask only for what the services export, and every
//! alert has its entry in the runbook: a metric family renamed in the code, or an alert added
//! without a runbook entry, fails here rather than in an operator's hands. (`promtool check
//! rules` and `promtool check config` check the syntax: scripts/check-deploy.sh.)

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The workspace root: `crates/test-support` sits two levels below it.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// How the services' metric families begin: their own, and the process's CPU and memory under
/// Prometheus's usual names.
const PREFIXES: [&str; 2] = ["flashsale_", "process_"];

/// The metric names in `text`, by [`PREFIXES`] (a recording rule's `flashsale:…` is not one).
fn metric_names(text: &str) -> BTreeSet<String> {
    PREFIXES
        .iter()
        .flat_map(|prefix| names_from(text, prefix))
        .collect()
}

fn names_from(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// The metric families the services can export: every string in their sources that begins as
/// one of [`PREFIXES`].
fn exported() -> BTreeSet<String> {
    let mut sources = Vec::new();
    let crates = workspace().join("crates");
    let dirs = std::fs::read_dir(&crates).unwrap_or_else(|e| panic!("{}: {e}", crates.display()));
    for dir in dirs {
        let src = dir
            .unwrap_or_else(|e| panic!("{}: {e}", crates.display()))
            .path()
            .join("src");
        if src.is_dir() {
            files(&src, "rs", &mut sources);
        }
    }
    sources
        .iter()
        .flat_map(|p| {
            read(p)
                .split('"')
                .skip(1)
                .step_by(2)
                .filter(|s| PREFIXES.iter().any(|p| s.starts_with(p)))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The family a series name belongs to (`…_bucket`, `…_sum`, `…_count` of a histogram).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

fn deploy_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(
        &workspace().join("deploy/grafana/dashboards"),
        "json",
        &mut out,
    );
    files(&workspace().join("deploy/prometheus"), "yml", &mut out);
    out
}

#[test]
fn dashboards_and_rules_ask_only_for_metrics_the_services_export() {
    let exported = exported();
    assert!(
        exported.contains("flashsale_rpc_server_requests_total"),
        "the source scan found no metric families"
    );
    let mut unknown = Vec::new();
    let mut asked = 0;
    for path in deploy_files() {
        for name in metric_names(&read(&path)) {
            asked += 1;
            if !exported.contains(family(&name)) {
                unknown.push(format!("{}: {name}", path.display()));
            }
        }
    }
    assert!(asked > 10, "only {asked} metric names found in deploy/");
    assert!(
        unknown.is_empty(),
        "not exported by any service:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_dashboard_panel_has_a_query_and_fits_the_grid() {
    let mut dashboards = Vec::new();
    files(
        &workspace().join("deploy/grafana/dashboards"),
        "json",
        &mut dashboards,
    );
    assert!(!dashboards.is_empty());
    for path in dashboards {
        let d: serde_json::Value = serde_json::from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        assert!(
            d["uid"].is_string() && d["title"].is_string(),
            "{}",
            path.display()
        );
        let panels = d["panels"].as_array().expect("panels");
        let mut ids = BTreeSet::new();
        for p in panels {
            let title = p["title"].as_str().unwrap_or("?");
            assert!(ids.insert(p["id"].as_u64()), "{title}: id repeated");
            let (x, w) = (p["gridPos"]["x"].as_u64(), p["gridPos"]["w"].as_u64());
            assert!(
                x.zip(w).is_some_and(|(x, w)| w > 0 && x + w <= 24),
                "{title}: gridPos outside the 24 columns"
            );
            if p["type"] == "row" {
                continue;
            }
            let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            assert!(!targets.is_empty(), "{title}: no query");
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or("");
                assert!(
                    !metric_names(expr).is_empty()
                        && expr.matches('(').count() == expr.matches(')').count(),
                    "{title}: query {expr:?}"
                );
            }
        }
    }
}

#[test]
fn every_alert_has_its_runbook_entry() {
    let rules = read(&workspace().join("deploy/prometheus/alerts.yml"));
    let runbook = read(&workspace().join("docs/operations.md"));
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 5, "{alerts:?}");
    for alert in alerts {
        let anchor = alert.to_lowercase();
        assert!(
            anchors.contains(&anchor),
            "docs/operations.md has no `### {alert}` section"
        );
        assert!(
            rules.contains(&format!("runbook: docs/operations.md#{anchor}")),
            "{alert} does not link its runbook entry"
        );
    }
}

#[test]
fn names_are_read_whole_and_recording_rules_are_not_metrics() {
    let names = metric_names(
        "rate(flashsale_rpc_server_requests_total{x=\"y\"}[5m]) flashsale:ratio_rate5m x_flashsale_no",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["flashsale_rpc_server_requests_total"]
    );
    assert_eq!(
        family("flashsale_batch_size_bucket"),
        "flashsale_batch_size"
    );
}
