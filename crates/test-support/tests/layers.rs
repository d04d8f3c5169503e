//! The layers of each service crate and which may use which (docs/architecture.md#services):
//! `domain` uses only `domain`; `infra` uses `domain`, `config` and `migration`; `app` uses
//! `domain`, `infra` and `config`; `api` uses `app`, `domain` and `config`; `migration` only
//! `migration`; `config` uses `domain`; `startup.rs`, `main.rs`, `lib.rs` and `testing.rs` (the
//! feature-gated door for the benchmark, docs/architecture.md#services) use anything. A
//! layer always uses itself.
//!
//! Every `.rs` file under a service's `src/` is parsed with `syn`; its layer comes from its path,
//! and every `crate::`, `super::` and `self::` path it names — in `use` trees, grouped or not, in
//! expressions, types and patterns, and in macro arguments — is resolved to the module it lands
//! in. A file outside the known places (an `adapters/` directory, say) has no layer and fails.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer {
    Api,
    App,
    Domain,
    Infra,
    Migration,
    Config,
    Startup,
    Testing,
    Main,
    Lib,
}

impl Layer {
    /// The layer of the top-level module `name` (`crate::<name>`), if it is one.
    fn of_module(name: &str) -> Option<Self> {
        Some(match name {
            "api" => Self::Api,
            "app" => Self::App,
            "domain" => Self::Domain,
            "infra" => Self::Infra,
            "migration" => Self::Migration,
            "config" => Self::Config,
            "startup" => Self::Startup,
            "testing" => Self::Testing,
            _ => return None,
        })
    }

    /// The layer of a file from its path relative to `src/`, if it is in a known place.
    fn of_file(rel: &Path) -> Option<Self> {
        let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
        match parts.as_slice() {
            ["main.rs"] => Some(Self::Main),
            ["lib.rs"] => Some(Self::Lib),
            ["config.rs"] => Some(Self::Config),
            ["startup.rs"] => Some(Self::Startup),
            ["testing.rs"] => Some(Self::Testing),
            ["migration.rs"] => Some(Self::Migration),
            // `config.rs`'s own submodules (its tests in `config/tests.rs`).
            ["config", _] => Some(Self::Config),
            [dir, _, ..] => Self::of_module(dir).filter(|l| {
                matches!(
                    l,
                    Self::Api | Self::App | Self::Domain | Self::Infra | Self::Migration
                )
            }),
            [file] => file
                .strip_suffix(".rs")
                .and_then(Self::of_module)
                .filter(|l| {
                    matches!(
                        l,
                        Self::Api | Self::App | Self::Domain | Self::Infra | Self::Migration
                    )
                }),
            _ => None,
        }
    }

    fn may_use(self, target: Target) -> bool {
        use Layer::*;
        match self {
            Startup | Testing | Main | Lib => true,
            _ => {
                let Target::Layer(t) = target else {
                    return false;
                };
                t == self
                    || match self {
                        Domain | Migration => false,
                        Infra => matches!(t, Domain | Config | Migration),
                        App => matches!(t, Domain | Infra | Config),
                        Api => matches!(t, App | Domain | Config),
                        Config => t == Domain,
                        Startup | Testing | Main | Lib => true,
                    }
            }
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Api => "api",
            Self::App => "app",
            Self::Domain => "domain",
            Self::Infra => "infra",
            Self::Migration => "migration",
            Self::Config => "config",
            Self::Startup => "startup",
            Self::Testing => "testing",
            Self::Main => "main",
            Self::Lib => "lib",
        })
    }
}

/// Where a path lands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Layer(Layer),
    /// The crate root itself (`crate::*`, an item of `lib.rs`).
    Root(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Layer(l) => l.fmt(f),
            Self::Root(item) if item.is_empty() => f.write_str("the crate root"),
            Self::Root(item) => write!(f, "crate::{item} (no layer)"),
        }
    }
}

/// The module a file is, from its path relative to `src/` (`app/mod.rs` → `app`).
fn module_of_file(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .filter_map(|p| p.to_str())
        .map(|p| p.strip_suffix(".rs").unwrap_or(p).to_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Collects every crate-relative path a file names, resolved to an absolute module path.
struct Collector {
    module: Vec<String>,
    found: Vec<(usize, Vec<String>)>,
}

impl Collector {
    /// Records `segments` when it starts with `crate`, `super` or `self` and names something
    /// inside the crate.
    fn record(&mut self, line: usize, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let mut abs = match first.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => self.module.clone(),
            _ => return,
        };
        let mut rest = &segments[1..];
        if first == "super" {
            abs.pop();
        }
        while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
            abs.pop();
            rest = tail;
        }
        abs.extend(rest.iter().cloned());
        self.found.push((line, abs));
    }

    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, &n.ident.to_string(), n.ident.span()),
            syn::UseTree::Rename(r) => {
                self.use_leaf(prefix, &r.ident.to_string(), r.ident.span());
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.span.start().line;
                let path = prefix.clone();
                self.record(line, &path);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], ident: &str, span: Span) {
        let mut path = prefix.to_vec();
        // `use crate::infra::db::{self, X}`: `self` names the module of the prefix.
        if ident != "self" {
            path.push(ident.to_owned());
        }
        self.record(span.start().line, &path);
    }

    /// `crate::a::b` and `super::a` sequences inside a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if matches!(id.to_string().as_str(), "crate" | "super") => {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (trees.get(j), trees.get(j + 1))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        let Some(TokenTree::Ident(next)) = trees.get(j + 2) else {
                            break;
                        };
                        segments.push(next.to_string());
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.record(line, &segments);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            let line = p
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.record(line, &segments);
        }
        visit::visit_path(self, p);
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)`, `pub(in crate::x)`: who may see an item, not a use of another layer.
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        visit::visit_macro(self, m);
        self.tokens(m.tokens.clone());
    }
}

/// The violations in one file: `shown` is how the file is named in the report, `rel` its path
/// relative to the crate's `src/`.
fn check_source(shown: &str, rel: &Path, source: &str) -> Vec<String> {
    let Some(layer) = Layer::of_file(rel) else {
        return vec![format!(
            "{shown}: unknown layer (not in api/, app/, domain/, infra/, migration/, config.rs (or config/), \
             startup.rs, main.rs or lib.rs)"
        )];
    };
    let file = match syn::parse_file(source) {
        Ok(f) => f,
        Err(e) => return vec![format!("{shown}: does not parse: {e}")],
    };
    let mut collector = Collector {
        module: module_of_file(rel),
        found: Vec::new(),
    };
    collector.visit_file(&file);
    let mut violations = Vec::new();
    for (line, abs) in collector.found {
        let target = match abs.first() {
            Some(first) => {
                Layer::of_module(first).map_or_else(|| Target::Root(first.clone()), Target::Layer)
            }
            None => Target::Root(String::new()),
        };
        if !layer.may_use(target.clone()) {
            let v = format!("{shown}:{line}: {layer} imports {target}");
            if !violations.contains(&v) {
                violations.push(v);
            }
        }
    }
    violations
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
                .path()
        })
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Every violation in the service crate `crates/<name>`.
fn check_crate(name: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("crates").join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(!files.is_empty(), "no sources under {}", src.display());
    let mut violations = Vec::new();
    for path in files {
        let Ok(rel) = path.strip_prefix(&src) else {
            continue;
        };
        let shown = format!("crates/{name}/src/{}", rel.display());
        let source = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        violations.extend(check_source(&shown, rel, &source));
    }
    violations
}

fn assert_layered(name: &str) {
    let violations = check_crate(name);
    assert!(
        violations.is_empty(),
        "{name} breaks its layers:\n{}",
        violations.join("\n")
    );
}

#[test]
fn outbound_respects_its_layers() {
    assert_layered("outbound");
}

#[test]
fn order_respects_its_layers() {
    assert_layered("order");
}

#[test]
fn product_stock_respects_its_layers() {
    assert_layered("product-stock");
}

fn planted(rel: &str, source: &str) -> Vec<String> {
    check_source(rel, Path::new(rel), source)
}

#[test]
fn a_domain_file_naming_infra_in_an_expression_is_reported() {
    let source = "
pub fn rule() {
    crate::infra::db::insert(1);
}
";
    assert_eq!(
        planted("domain/order.rs", source),
        ["domain/order.rs:3: domain imports infra"]
    );
}

#[test]
fn grouped_and_nested_use_trees_are_resolved_item_by_item() {
    let source = "
use crate::{
    app::Shipping,
    infra::{db, stock::Committer},
    domain::Shipment,
};
use crate::migration::Migrator;
";
    assert_eq!(
        planted("api/grpc.rs", source),
        [
            "api/grpc.rs:4: api imports infra",
            "api/grpc.rs:7: api imports migration",
        ]
    );
}

#[test]
fn super_paths_types_and_macro_arguments_are_followed() {
    let source = "
use super::Shipping;
use super::super::infra::db;

fn f(x: crate::api::Reply) {
    tracing::info!(kind = ?crate::startup::Kind::A);
    mod inner {
        use super::super::super::config::Settings;
    }
}
";
    assert_eq!(
        planted("app/query.rs", source),
        [
            "app/query.rs:5: app imports api",
            "app/query.rs:6: app imports startup",
        ],
        "`super::super::infra` from app/query.rs is infra, which app may use"
    );
}

#[test]
fn allowed_uses_pass_and_startup_may_use_anything() {
    let app = "
use crate::{config::ShippingSettings, domain::Shipment, infra::db::{self, NewShipment}};
mod tests {
    use super::*;
}
";
    assert_eq!(planted("app/mod.rs", app), Vec::<String>::new());
    let startup = "use crate::{api::grpc, app::Shipping, infra::db, migration::Migrator};";
    assert_eq!(planted("startup.rs", startup), Vec::<String>::new());
    let config = "use crate::domain::Policy; mod tests { use super::*; }";
    assert_eq!(planted("config.rs", config), Vec::<String>::new());
}

#[test]
fn the_crate_root_and_unknown_modules_are_not_layers() {
    assert_eq!(
        planted("domain/mod.rs", "use crate::*;\nuse crate::adapters::db;"),
        [
            "domain/mod.rs:1: domain imports the crate root",
            "domain/mod.rs:2: domain imports crate::adapters (no layer)",
        ]
    );
}

#[test]
fn a_file_outside_the_known_places_is_reported() {
    for rel in ["adapters/grpc.rs", "adapters/mod.rs", "util.rs", "api.rs/x"] {
        let found = planted(rel, "");
        assert_eq!(found.len(), 1, "{rel}: {found:?}");
        assert!(found[0].contains("unknown layer"), "{rel}: {found:?}");
    }
    for rel in [
        "api/grpc.rs",
        "api/mod.rs",
        "app/mod.rs",
        "domain/order/rules.rs",
        "infra/db.rs",
        "migration/m0001.rs",
        "config.rs",
        "startup.rs",
        "main.rs",
        "lib.rs",
    ] {
        assert_eq!(planted(rel, ""), Vec::<String>::new(), "{rel}");
    }
}
