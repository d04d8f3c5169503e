//! Every `FLASHSALE_<SERVICE>__…` variable the deployment files, the scripts and the docs set
//! names a setting of that service: a service refuses to start on a key nothing reads, so a
//! misspelt variable in a manifest would stop its pods.

use std::{collections::HashMap, path::Path};

use flashsale_platform::config::{ConfigError, environment, load_from};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The files under `dir` (recursively) whose name ends with one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, exts, out);
        } else if exts.iter().any(|e| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(e))
        }) {
            out.push(path);
        }
    }
}

/// The `FLASHSALE_…` words of `text`.
fn variables(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("FLASHSALE_") {
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + word.len()..];
        found.push(word);
    }
    found
}

/// Whether `var` (one service's variable) names a setting of that service.
fn unknown(service: &str, var: &str) -> Option<String> {
    let dir = Path::new(ROOT).join("config");
    let env = environment(Some(HashMap::from([(var.to_owned(), "1".to_owned())])));
    let err = match service {
        "product_stock" => load_from(
            service,
            &flashsale_product_stock::config::Settings::default(),
            &dir,
            None,
            env,
        )
        .err(),
        "order" => load_from(
            service,
            &flashsale_order::config::Settings::default(),
            &dir,
            None,
            env,
        )
        .err(),
        _ => load_from(
            service,
            &flashsale_outbound::config::Settings::default(),
            &dir,
            None,
            env,
        )
        .err(),
    };
    // Other errors are the value "1" refused: the key exists.
    err.map(|e: ConfigError| e.to_string())
        .filter(|e| e.contains("no setting has this name"))
}

#[test]
fn every_service_variable_the_deployment_files_scripts_and_docs_set_names_a_setting() {
    let root = Path::new(ROOT);
    let mut paths = Vec::new();
    files(&root.join("k8s"), &[".yaml", ".env"], &mut paths);
    files(
        &root.join("deploy"),
        &[".yml", ".yaml", "Dockerfile", ".local"],
        &mut paths,
    );
    files(&root.join("scripts"), &[".sh"], &mut paths);
    files(&root.join("docs"), &[".md"], &mut paths);
    paths.push(root.join("README.md"));
    let mut checked = 0;
    let mut bad = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        for var in variables(&text) {
            let Some((service, _)) = [
                ("FLASHSALE_PRODUCT_STOCK__", "product_stock"),
                ("FLASHSALE_ORDER__", "order"),
                ("FLASHSALE_OUTBOUND__", "outbound"),
            ]
            .iter()
            .find(|(prefix, _)| var.starts_with(prefix) && var.len() > prefix.len())
            .map(|(_, s)| (*s, ())) else {
                continue;
            };
            checked += 1;
            if let Some(e) = unknown(service, &var) {
                bad.push(format!("{}: {var}: {e}", path.display()));
            }
        }
    }
    assert!(checked >= 20, "only {checked} variables found");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_misspelt_variable_is_found() {
    assert!(unknown("order", "FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT").is_some());
    assert!(unknown("order", "FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS").is_none());
    assert_eq!(
        variables("x FLASHSALE_ORDER__GRPC__ADDR=1 `FLASHSALE_OUTBOUND__A__B`"),
        ["FLASHSALE_ORDER__GRPC__ADDR", "FLASHSALE_OUTBOUND__A__B"]
    );
}
