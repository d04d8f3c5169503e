//! The services are closed to every other crate (docs/architecture.md#services): outside a
//! service's own crate, only its `config` and `startup` modules, and the feature-gated `testing`
//! door, may be named (the other services' tests included). The benchmark, the fault suite, the command line and the end-to-end tests
//! reach a service through its gRPC contract and its events, like a gateway.
//!
//! Every `.rs` file of every other crate (sources, tests, benches) is read as tokens, so `use`
//! trees, grouped or not, paths in expressions and types, and macro arguments are all seen;
//! comments and strings are not code and are skipped. A service crate renamed on import
//! (`use flashsale_order as o`) is reported too, since its paths could no longer be followed.
//! Beside it, no other crate's manifest may turn on a service's `internals` feature, which
//! makes its layers public for the service's own tests.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// The service crates, as they are named in code and in manifests.
const SERVICES: [(&str, &str); 3] = [
    ("flashsale_order", "flashsale-order"),
    ("flashsale_product_stock", "flashsale-product-stock"),
    ("flashsale_outbound", "flashsale-outbound"),
];

/// What another crate may name of a service.
const OPEN: [&str; 3] = ["config", "startup", "testing"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every use of another service's internals in `source`, as `line: path`; `own` is the crate
/// the file belongs to (a service's own files name its internals freely).
fn closed_uses(source: &str, own: &str) -> Vec<String> {
    let tokens = TokenStream::from_str(source).unwrap_or_else(|e| panic!("tokenize: {e}"));
    let mut found = Vec::new();
    scan(tokens, own, &mut found);
    found
}

fn scan(tokens: TokenStream, own: &str, found: &mut Vec<String>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Group(g) => scan(g.stream(), own, found),
            TokenTree::Ident(id) if id != own && SERVICES.iter().any(|(s, _)| id == s) => {
                let line = id.span().start().line;
                match (trees.get(i + 1), trees.get(i + 2), trees.get(i + 3)) {
                    (Some(TokenTree::Ident(r#as)), ..) if r#as == "as" => {
                        found.push(format!("{line}: {id} renamed with `as`"));
                    }
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(next))
                        if a.as_char() == ':' && b.as_char() == ':' =>
                    {
                        for first in first_segments(next) {
                            if !OPEN.contains(&first.as_str()) {
                                found.push(format!("{line}: {id}::{first}"));
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

/// The first segment of each path after `service::`: one ident, or in a `{...}` group the first
/// ident of each comma-separated tree (`self` and `*` name the whole crate).
fn first_segments(next: &TokenTree) -> Vec<String> {
    match next {
        TokenTree::Ident(id) => vec![id.to_string()],
        TokenTree::Punct(p) if p.as_char() == '*' => vec!["*".into()],
        TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => {
            let mut firsts = Vec::new();
            let mut at_start = true;
            for t in g.stream() {
                match &t {
                    TokenTree::Punct(p) if p.as_char() == ',' => at_start = true,
                    _ if at_start => {
                        at_start = false;
                        firsts.extend(first_segments(&t));
                    }
                    _ => {}
                }
            }
            firsts
        }
        other => vec![other.to_string()],
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every crate of the workspace: its directory, and its name in code (`flashsale_order`).
fn crates() -> Vec<(PathBuf, String)> {
    let mut crates: Vec<(PathBuf, String)> = std::fs::read_dir(workspace().join("crates"))
        .unwrap_or_else(|e| panic!("list crates/: {e}"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| {
            let manifest = read(&p.join("Cargo.toml"));
            let name = manifest
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{}: no package name", p.display()))
                .replace('-', "_");
            (p, name)
        })
        .collect();
    crates.sort();
    crates
}

#[test]
fn no_other_crate_names_a_services_internals() {
    let crates = crates();
    assert!(
        crates.iter().any(|(_, name)| name == "flashsale_bench"),
        "the bench crate is among those checked: {crates:?}"
    );
    let mut problems = Vec::new();
    let mut files = 0;
    for (dir, name) in &crates {
        let mut paths = Vec::new();
        rust_files(dir, &mut paths);
        for path in paths {
            files += 1;
            let source = read(&path);
            for p in closed_uses(&source, name) {
                problems.push(format!("{}:{p}", path.display()));
            }
        }
    }
    assert!(files > 100, "only {files} files read");
    assert!(
        problems.is_empty(),
        "a service's internals named outside it (only {OPEN:?} are open):\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_other_crate_turns_on_a_services_internals() {
    let mut problems = Vec::new();
    for (dir, name) in crates() {
        let manifest = read(&dir.join("Cargo.toml"));
        for line in manifest.lines() {
            // A service's dev-dependency on itself turns it on for its own tests.
            let other_service = SERVICES
                .iter()
                .any(|(code, pkg)| *code != name && line.starts_with(pkg));
            if other_service && line.contains("\"internals\"") {
                problems.push(format!("{}: {line}", dir.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_planted_import_of_internals_is_reported_wherever_it_hides() {
    let planted = r#"
        use flashsale_order::app::Intake;
        use flashsale_product_stock::{config::Settings, infra::gate::RedisGate};
        use flashsale_outbound as out;
        fn f() {
            let _ = flashsale_order::domain::Policy::ReserveThenCommit;
            let _ = format!("{:?}", flashsale_product_stock::app::HOLD_SWEEP);
        }
    "#;
    assert_eq!(
        closed_uses(planted, "flashsale_bench"),
        [
            "2: flashsale_order::app",
            "3: flashsale_product_stock::infra",
            "4: flashsale_outbound renamed with `as`",
            "6: flashsale_order::domain",
            "7: flashsale_product_stock::app",
        ]
    );
}

#[test]
fn the_open_modules_comments_and_strings_are_not_reported() {
    let fine = r#"
        //! See `flashsale_order::app::Intake` for the write.
        use flashsale_order::{config, startup::build};
        use flashsale_product_stock::testing::Gate;
        fn f() -> &'static str {
            let _ = flashsale_outbound::config::Settings::default();
            "flashsale_order::infra::db"
        }
    "#;
    assert_eq!(closed_uses(fine, "flashsale_bench"), Vec::<String>::new());
    let own = "use flashsale_order::app::Intake; use flashsale_outbound::domain::Shipment;";
    assert_eq!(
        closed_uses(own, "flashsale_order"),
        ["1: flashsale_outbound::domain"],
        "a service names its own internals, not another's"
    );
}
