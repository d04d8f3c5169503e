//! The three service binaries behave like command-line tools: `--help` and `--version` answer
//! and exit 0, bad input exits non-zero with clap's message, and `migrate` applies the service's
//! migrations to its database and exits, as often as it is run. The order service refuses to
//! start without its payment secrets; the payment simulator refuses bad options.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, process::Output};

use flashsale_e2e::bin_dir;
use flashsale_test_support::{TestDatabase, foundation::check_tables};

/// Each binary, the prefix of its environment variables and tables its migrations create.
const SERVICES: [(&str, &str, &[&str]); 3] = [
    (
        "product-stock",
        "PRODUCT_STOCK",
        &[
            "outbox",
            "inbox",
            "products",
            "stock",
            "reservations",
            "stock_ledger",
            "stock_adjustments",
        ],
    ),
    (
        "order",
        "ORDER",
        &[
            "outbox",
            "inbox",
            "orders",
            "order_status_history",
            "payments",
            "refunds",
            "provider_payments",
        ],
    ),
    (
        "outbound",
        "OUTBOUND",
        &[
            "outbox",
            "inbox",
            "dead_letters",
            "shipments",
            "shipment_attempts",
        ],
    ),
];

fn exe(name: &str) -> PathBuf {
    let exe = bin_dir().unwrap().join(format!("flashsale-{name}"));
    assert!(
        exe.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        exe.display()
    );
    exe
}

async fn run(name: &str, args: &[&str], env: &[(String, String)]) -> Output {
    let config_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");
    tokio::process::Command::new(exe(name))
        .args(args)
        .env("FLASHSALE_CONFIG_DIR", config_dir)
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn help_lists_serve_and_migrate() {
    for (name, _, _) in SERVICES {
        let out = run(name, &["--help"], &[]).await;
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{name} --help: {out:?}");
        assert!(stdout.contains(&format!("flashsale-{name}")), "{stdout}");
        assert!(
            stdout.contains("serve") && stdout.contains("migrate"),
            "{name} --help: {stdout}"
        );
    }
}

#[tokio::test]
async fn version_prints_the_version() {
    for (name, _, _) in SERVICES {
        let out = run(name, &["--version"], &[]).await;
        assert!(out.status.success(), "{name} --version: {out:?}");
        assert_eq!(
            text(&out.stdout).trim(),
            format!("flashsale-{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[tokio::test]
async fn unknown_flags_and_subcommands_exit_non_zero_with_a_message() {
    for (name, _, _) in SERVICES {
        for args in [&["--no-such-flag"][..], &["launch"], &["migrate", "--now"]] {
            let out = run(name, args, &[]).await;
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {out:?}");
            assert!(
                stderr.contains("error:") && stderr.contains("Usage:"),
                "{name} {args:?}: {stderr}"
            );
        }
    }
}

#[tokio::test]
async fn migrate_creates_the_tables_and_can_run_again() {
    for (name, key, tables) in SERVICES {
        let db = TestDatabase::create().await.unwrap();
        let env = [(format!("FLASHSALE_{key}__DATABASE__URL"), db.url.clone())];
        let mut reports = Vec::new();
        for round in ["first", "second"] {
            let out = run(name, &["migrate"], &env).await;
            assert!(
                out.status.success(),
                "{name} migrate ({round} run): {}\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
            reports.push(text(&out.stdout));
        }
        assert!(
            !reports[0].contains("(0 migrations applied)"),
            "{name}: {}",
            reports[0]
        );
        assert!(
            reports[1].contains("(0 migrations applied)"),
            "{name}: {}",
            reports[1]
        );
        check_tables(&db.url, tables).await.unwrap();
    }
}

#[tokio::test]
async fn serve_without_migrating_refuses_a_database_with_pending_migrations() {
    let mut runs = tokio::task::JoinSet::new();
    for (name, key, _) in SERVICES {
        let db = TestDatabase::create().await.unwrap();
        let env = [
            (format!("FLASHSALE_{key}__DATABASE__URL"), db.url.clone()),
            (
                format!("FLASHSALE_{key}__DATABASE__MIGRATE_ON_START"),
                "false".to_owned(),
            ),
            (
                format!("FLASHSALE_{key}__AUTH__ALLOW_DEVELOPMENT_SECRET"),
                "true".to_owned(),
            ),
            (
                format!("FLASHSALE_{key}__GRPC__ADDR"),
                "127.0.0.1:0".to_owned(),
            ),
            (
                format!("FLASHSALE_{key}__METRICS__ADDR"),
                "127.0.0.1:0".to_owned(),
            ),
        ];
        runs.spawn(async move { (name, run(name, &["serve"], &env).await, db) });
    }
    while let Some(joined) = runs.join_next().await {
        let (name, out, db) = joined.unwrap();
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{name} serve started: {stderr}");
        assert!(
            stderr.contains("migrate_on_start")
                && stderr.contains(&format!("flashsale-{name} migrate")),
            "{name} serve: {stderr}"
        );
        // It applied nothing: the migrate step still has every migration to apply.
        check_tables(&db.url, &["outbox"]).await.unwrap_err();
    }
}

#[tokio::test]
async fn migrate_fails_when_the_database_is_unreachable() {
    // Concurrently: each binary waits out its connect timeout before it gives up.
    let mut runs = tokio::task::JoinSet::new();
    for (name, key, _) in SERVICES {
        let env = [(
            format!("FLASHSALE_{key}__DATABASE__URL"),
            "postgres://postgres@127.0.0.1:1/flashsale_nowhere".to_owned(),
        )];
        runs.spawn(async move { (name, run(name, &["migrate"], &env).await) });
    }
    while let Some(joined) = runs.join_next().await {
        let (name, out) = joined.unwrap();
        assert!(!out.status.success(), "{name} migrate: {out:?}");
        assert!(
            text(&out.stderr).contains("connect"),
            "{name} migrate: {}",
            text(&out.stderr)
        );
    }
}

#[tokio::test]
async fn the_order_service_refuses_to_start_without_its_payment_secrets() {
    for (key, value, says) in [
        ("WEBHOOK_SECRET", "", "not set"),
        ("API_KEY", "", "not set"),
        ("WEBHOOK_SECRET", "too short", "at least 32 bytes"),
        (
            "PROVIDER_URL",
            "pay.example:443",
            "order.payment.provider_url",
        ),
        ("CURRENCY", "euro", "ISO 4217"),
    ] {
        let env = [
            (format!("FLASHSALE_ORDER__PAYMENT__{key}"), value.to_owned()),
            (
                "FLASHSALE_ORDER__AUTH__ALLOW_DEVELOPMENT_SECRET".to_owned(),
                "true".to_owned(),
            ),
        ];
        let out = run("order", &["serve"], &env).await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{key}={value:?}: {out:?}");
        assert!(
            stderr.contains(&format!("order.payment.{}", key.to_lowercase()))
                && stderr.contains(says),
            "{key}={value:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn the_payment_simulator_answers_help_and_refuses_bad_options() {
    let sim = bin_dir().unwrap().join("flashsale-payment-sim");
    let run = |args: &'static [&'static str]| {
        let sim = sim.clone();
        async move {
            tokio::process::Command::new(sim)
                .args(args)
                .env("RUST_LOG", "warn")
                .kill_on_drop(true)
                .output()
                .await
                .unwrap()
        }
    };
    let help = run(&["--help"]).await;
    assert!(help.status.success(), "{help:?}");
    assert!(text(&help.stdout).contains("--duplicate-fraction"));
    for (args, says) in [
        (
            &["--duplicate-fraction", "2", "--addr", "127.0.0.1:0"][..],
            "--duplicate-fraction",
        ),
        (
            &["--webhook-secret", "short", "--addr", "127.0.0.1:0"],
            "--webhook-secret",
        ),
        (&["--refund-failures", "often"], "often"),
        (&["--addr", "nowhere"], "--addr"),
    ] {
        let out = run(args).await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn serve_refuses_the_development_secret_unless_allowed() {
    let mut runs = tokio::task::JoinSet::new();
    for (name, key, _) in SERVICES {
        // The database is unreachable: the key check comes first, so it is what stops `serve`.
        let env = [
            (
                format!("FLASHSALE_{key}__DATABASE__URL"),
                "postgres://postgres@127.0.0.1:1/flashsale_nowhere".to_owned(),
            ),
            (
                format!("FLASHSALE_{key}__AUTH__ALLOW_DEVELOPMENT_SECRET"),
                "false".to_owned(),
            ),
        ];
        runs.spawn(async move { (name, run(name, &["serve"], &env).await) });
    }
    while let Some(joined) = runs.join_next().await {
        let (name, out) = joined.unwrap();
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{name} serve started: {stderr}");
        assert!(
            stderr.contains("auth.allow_development_secret") && stderr.contains("no key"),
            "{name} serve: {stderr}"
        );
    }
}

#[tokio::test]
async fn serve_refuses_a_missing_jwks_file_and_the_old_shared_secret_naming_the_key() {
    let cases = [
        (
            "AUTH__USER_JWKS_FILE",
            "/nonexistent/jwks.json",
            "auth.user_jwks_file",
        ),
        (
            "AUTH__JWT_SECRET",
            "0123456789abcdef0123456789abcdef-old",
            "auth.jwt_secret",
        ),
    ];
    for (var, value, key) in cases {
        let env = [
            (format!("FLASHSALE_ORDER__{var}"), value.to_owned()),
            (
                "FLASHSALE_ORDER__AUTH__ALLOW_DEVELOPMENT_SECRET".to_owned(),
                "true".to_owned(),
            ),
        ];
        let out = run("order", &["serve"], &env).await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "order serve started with {var}");
        assert!(stderr.contains(&format!("order.{key}")), "{var}: {stderr}");
    }
}
