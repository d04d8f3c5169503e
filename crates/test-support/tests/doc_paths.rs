//! Every repository path the product docs cite exists: a backticked `crates/…`, `scripts/…`,
//! `docs/…`, `config/…`, `deploy/…`, `k8s/…` or `proto/…` in `README.md` or `docs/**/*.md`
//! names a file or directory of this checkout (an `#anchor` or `:line` after it ignored).
//! A doc that cites a renamed or deleted file fails here, not in a reader's hands.

use std::path::{Path, PathBuf};

const ROOTS: [&str; 7] = [
    "crates/", "scripts/", "docs/", "config/", "deploy/", "k8s/", "proto/",
];

/// The workspace root: `crates/test-support` sits two levels below it.
fn workspace() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            markdown_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

/// The backticked spans of `text` that start with one of [`ROOTS`], cut at the first
/// character that cannot be part of a path, with an `#anchor` or `:line` dropped.
fn cited_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || !ROOTS.iter().any(|r| span.starts_with(r)) {
            continue;
        }
        let path: String = span
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
            .collect();
        // A glob or a placeholder (`crates/*/src`, `docs/adr/NNNN-…`) names no one file.
        if span[path.len()..].starts_with(['*', '<', '{']) {
            continue;
        }
        out.push(path.trim_end_matches(['.', '/']).to_owned());
    }
    out
}

#[test]
fn every_path_the_docs_cite_exists() {
    let root = workspace().unwrap();
    let mut docs = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut docs).unwrap();
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for path in cited_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!(
                    "{}: `{path}`",
                    doc.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "paths the docs cite that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_cited_path_is_read_without_its_anchor_line_or_glob() {
    let text = "see `crates/order/src/app/intake.rs:120`, `docs/architecture.md#operations`, \
                `crates/*/src`, `scripts/test.sh --no-fail-fast`, `cargo test` and `k8s/`";
    assert_eq!(
        cited_paths(text),
        [
            "crates/order/src/app/intake.rs",
            "docs/architecture.md",
            "scripts/test.sh",
            "k8s",
        ]
    );
}
