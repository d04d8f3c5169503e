//! Every run ever kept: `scripts/bench-report.sh RUN_DIR` copies the run into
//! `docs/bench/runs/<UTC time>-<commit>/` beside replacing the latest results, and never removes
//! one. The generated page lists each kept run with its reports' verdicts, so a run that failed
//! stays on the record when a later one replaces it as the latest.

use std::{fmt::Write as _, path::Path};

use super::{Kept, read_results};

/// One kept run: its directory's name and its reports.
pub struct KeptRun {
    pub name: String,
    pub reports: Vec<Kept>,
}

/// Every run below `dir`, oldest first (the names start with the UTC time); none when `dir`
/// does not exist. A run whose reports cannot be read is an error naming it.
pub fn read_runs(dir: &Path) -> anyhow::Result<Vec<KeptRun>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut runs = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        runs.push(KeptRun {
            reports: read_results(&path)?,
            name,
        });
    }
    runs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(runs)
}

/// A report's verdict: `passed` (flashsale bench) or `pass` (flashsale sale); `None` when it
/// has neither.
fn verdict(report: &serde_json::Value) -> Option<bool> {
    report["passed"]
        .as_bool()
        .or_else(|| report["pass"].as_bool())
}

/// What a report ran: a sustained sale's rate and length, a bench scenario's modes.
fn setting(report: &serde_json::Value) -> String {
    if report["mode"] == "sustained" {
        return format!(
            "{} buyers/s for {} s",
            report["arrivalRate"], report["sustainSecs"]
        );
    }
    match report["modes"].as_array() {
        Some(modes) => {
            let mut names: Vec<&str> = modes.iter().filter_map(|m| m["mode"].as_str()).collect();
            names.dedup();
            names.join(", ")
        }
        None => "—".into(),
    }
}

/// The markdown table of every kept run, one row per report.
pub fn table(runs: &[KeptRun]) -> String {
    let mut md = String::from("### Every kept run\n\n");
    if runs.is_empty() {
        md.push_str("No run kept yet.\n");
        return md;
    }
    let failed = runs
        .iter()
        .filter(|r| r.reports.iter().any(|k| verdict(&k.report) == Some(false)))
        .count();
    let _ = writeln!(
        md,
        "{} run(s) kept in `docs/bench/runs`, {failed} with a failed report; the tables above are \
         the latest.\n",
        runs.len()
    );
    md.push_str(
        "| run | report | what ran | commit | measured | result |\n|---|---|---|---|---|---|\n",
    );
    for run in runs {
        for k in &run.reports {
            let meta = &k.report["meta"];
            let commit = meta["commit"]
                .as_str()
                .map_or("—", |c| &c[..c.len().min(12)]);
            let dirty = if meta["commit_dirty"] == true {
                " (dirty)"
            } else {
                ""
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | `{commit}`{dirty} | {} | {} |",
                run.name,
                k.name,
                setting(&k.report),
                meta["generated_at"].as_str().unwrap_or("—"),
                match verdict(&k.report) {
                    Some(true) => "PASS",
                    Some(false) => "**FAIL**",
                    None => "—",
                }
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kept(name: &str, report: serde_json::Value) -> Kept {
        Kept {
            name: name.into(),
            report,
        }
    }

    #[test]
    fn a_failed_run_stays_listed_beside_the_ones_that_passed() {
        let meta = |c: &str| json!({ "commit": c, "generated_at": "2026-12-03T11:21:19Z" });
        let runs = [
            KeptRun {
                name: "20261203T112119Z-c20d9358aaaa".into(),
                reports: vec![
                    kept(
                        "big-sale",
                        json!({ "passed": true, "meta": meta("c20d9358aaaabbbb") }),
                    ),
                    kept(
                        "sustained",
                        json!({
                            "pass": false, "mode": "sustained", "arrivalRate": 500,
                            "sustainSecs": 60, "meta": meta("c20d9358aaaabbbb"),
                        }),
                    ),
                ],
            },
            KeptRun {
                name: "20261204T000000Z-0123456789ab".into(),
                reports: vec![kept("flood", json!({ "scenario": "Flood" }))],
            },
        ];
        let md = table(&runs);
        assert!(md.contains("2 run(s) kept"), "{md}");
        assert!(md.contains("1 with a failed report"), "{md}");
        assert!(
            md.contains("| big-sale | — | `c20d9358aaaa` | 2026-12-03T11:21:19Z | PASS |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| sustained | 500 buyers/s for 60 s | `c20d9358aaaa` | 2026-12-03T11:21:19Z | **FAIL** |"
            ),
            "{md}"
        );
        assert!(md.contains("| flood | — | `—` | — | — |"), "{md}");
        assert!(table(&[]).contains("No run kept yet."));
    }

    #[test]
    fn runs_are_read_oldest_first_and_a_missing_directory_holds_none() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("fs-runs-{}", uuid::Uuid::new_v4()));
        assert!(read_runs(&dir)?.is_empty());
        for name in ["20261204T000000Z-b", "20261203T000000Z-a"] {
            std::fs::create_dir_all(dir.join(name))?;
            std::fs::write(dir.join(name).join("flood.json"), "{\"passed\": true}")?;
        }
        std::fs::write(dir.join("README"), "not a run")?;
        let runs = read_runs(&dir)?;
        let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["20261203T000000Z-a", "20261204T000000Z-b"]);
        std::fs::write(dir.join("20261203T000000Z-a").join("flood.json"), "[]")?;
        let e = read_runs(&dir).err().map(|e| format!("{e:#}"));
        assert!(
            e.is_some_and(|e| e.contains("20261203T000000Z-a")),
            "names the run"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
