//! What the release build of the services contains: the build command of the container image
//! (deploy/Dockerfile) and of `FLASHSALE_PROFILE=release scripts/up.sh` resolve
//! `flashsale-platform` without its `failpoints` feature, so failpoints that can panic or end
//! the process are not compiled into them (and such a binary refuses FLASHSALE_FAILPOINTS; see
//! `platform::failpoint`). The test and fault builds do get the feature — the same check sees it
//! there, so it can tell the two apart.
//!
//! Feature resolution is read from `cargo tree` with the build's own package selection and flags;
//! nothing is compiled.

#![allow(clippy::expect_used)]

use std::{path::PathBuf, process::Command};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The features `flashsale-platform` is built with by `cargo build <args>` (dev-dependencies
/// only count for builds of tests, as in `cargo build`).
fn platform_features(args: &[String], with_tests: bool) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let edges = if with_tests {
        "normal,build,dev"
    } else {
        "normal,build"
    };
    let out = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["tree", "--locked", "--prefix", "none", "-e", edges])
        .args(["-f", "{p}|{f}"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("flashsale-platform "))
        .unwrap_or_else(|| panic!("flashsale-platform is not in the build of {args:?}"));
    let features = line.split('|').nth(1).unwrap_or_default();
    features
        .trim_end_matches("(*)")
        .split(',')
        .map(|f| f.trim().to_owned())
        .filter(|f| !f.is_empty())
        .collect()
}

/// The package selection and feature flags of the first `cargo build --release` in `text`
/// (lines joined at a trailing `\`), without the flags that do not change features.
fn release_build_args(text: &str, origin: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.contains("cargo build") && l.contains("--release"))
        .unwrap_or_else(|| panic!("{origin} has no `cargo build --release`"));
    let after = line
        .split("cargo build")
        .nth(1)
        .unwrap_or_default()
        .split("&&")
        .next()
        .unwrap_or_default();
    let mut args = Vec::new();
    let mut words = after.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "--workspace" | "--all-features" | "--no-default-features" => args.push(w.to_owned()),
            "-p" | "--package" | "--features" | "-F" | "--exclude" => {
                args.push(w.to_owned());
                args.push(words.next().unwrap_or_default().to_owned());
            }
            w if w.starts_with("--features=") || w.starts_with("--package=") => {
                args.push(w.to_owned());
            }
            _ => {}
        }
    }
    assert!(
        !args.is_empty(),
        "{origin}: no package selection in `{line}`"
    );
    args
}

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

#[test]
fn the_release_builds_of_the_services_have_no_failpoints() {
    for (origin, text) in [
        ("deploy/Dockerfile", read("deploy/Dockerfile")),
        ("scripts/up.sh", read("scripts/up.sh")),
    ] {
        let args = release_build_args(&text, origin);
        let features = platform_features(&args, false);
        assert!(
            !features.iter().any(|f| f == "failpoints"),
            "{origin} builds flashsale-platform with {features:?}"
        );
    }
    // A release build of one service alone is the same.
    for service in [
        "flashsale-order",
        "flashsale-product-stock",
        "flashsale-outbound",
    ] {
        let args = vec!["-p".to_owned(), service.to_owned()];
        assert!(!platform_features(&args, false).contains(&"failpoints".to_owned()));
    }
}

#[test]
fn the_test_and_fault_builds_have_failpoints() {
    // scripts/test.sh, faults.sh and soak.sh build the workspace with this flag.
    let args: Vec<String> = ["--workspace", "--features", "flashsale-platform/failpoints"]
        .map(str::to_owned)
        .to_vec();
    assert!(platform_features(&args, false).contains(&"failpoints".to_owned()));
    // Every build of the tests has them (the services' tests arm failpoints in-process).
    let args = vec!["--workspace".to_owned()];
    assert!(platform_features(&args, true).contains(&"failpoints".to_owned()));
    // Each service's own feature turns them on for that service.
    for service in [
        "flashsale-order",
        "flashsale-product-stock",
        "flashsale-outbound",
    ] {
        let args = ["-p", service, "--features", "failpoints"].map(str::to_owned);
        assert!(
            platform_features(&args, false).contains(&"failpoints".to_owned()),
            "{service}/failpoints does not reach flashsale-platform"
        );
    }
    for script in ["scripts/test.sh", "scripts/faults.sh", "scripts/soak.sh"] {
        assert!(
            read(script).contains("--features flashsale-platform/failpoints"),
            "{script} does not build with failpoints"
        );
    }
}
