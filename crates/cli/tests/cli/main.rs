//! The `flashsale` binary against real services: token, health, and the product commands
//! (with bad input refused with the server's reason).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use flashsale_test_support::{TestDatabase, amqp_url, redis_url, unique_name};

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn flashsale(args: &[&str], url: &str) -> Run {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("FLASHSALE_PRODUCT_STOCK_URL", url)
        .env_remove("FLASHSALE_TOKEN")
        .env_remove("FLASHSALE_JWT_SECRET")
        .output()
        .await
        .unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn product_stock() -> (String, flashsale_platform::shutdown::Shutdown, TestDatabase) {
    let db = TestDatabase::create().await.unwrap();
    let mut s = flashsale_product_stock::config::Settings::default();
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    s.redis.url = redis_url();
    s.redis.key_prefix = format!("{}:", unique_name("fs_cli"));
    s.amqp.url = amqp_url();
    s.amqp.exchange = unique_name("fs_cli_ex");
    s.amqp.queue_prefix = format!("{}.", unique_name("fs_cli_q"));
    s.amqp.queue_expires_ms = 60_000;
    s.amqp.queue_type = flashsale_messaging::QueueType::Classic;
    let app = flashsale_product_stock::startup::build(s).await.unwrap();
    let (port, stop) = (app.grpc_port(), app.shutdown());
    tokio::spawn(app.run_until_stopped());
    (format!("http://127.0.0.1:{port}"), stop, db)
}

#[tokio::test]
async fn token_prints_a_jwt_and_refuses_bad_roles() {
    let run = flashsale(
        &["token", "--sub", "alice", "--role", "admin"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        run.stdout.trim().split('.').count(),
        3,
        "not a JWT: {}",
        run.stdout
    );
    let bad = flashsale(
        &["token", "--sub", "alice", "--role", "root"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!bad.ok);
    assert!(bad.stderr.contains("root"), "{}", bad.stderr);
    let empty = flashsale(
        &["token", "--sub", "", "--role", "user"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!empty.ok);
}

#[tokio::test]
async fn health_fails_when_services_are_down() {
    let run = flashsale(
        &[
            "health",
            "--product-stock-url",
            "http://127.0.0.1:1",
            "--order-url",
            "http://127.0.0.1:1",
            "--outbound-url",
            "http://127.0.0.1:1",
            "--timeout-ms",
            "300",
        ],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!run.ok);
    assert_eq!(run.stdout.matches("DOWN").count(), 3, "{}", run.stdout);
}

#[tokio::test]
async fn product_commands_create_restock_list_and_reconcile() {
    let (url, stop, _db) = product_stock().await;
    let create = flashsale(
        &[
            "product",
            "create",
            "--sku",
            "CLI-1",
            "--name",
            "Cli wine",
            "--price-cents",
            "1200",
            "--stock",
            "5",
            "--per-user-limit",
            "1",
            "--policy",
            "commit-at-order",
        ],
        &url,
    )
    .await;
    assert!(create.ok, "{}", create.stderr);
    let json: serde_json::Value = serde_json::from_str(&create.stdout).unwrap();
    assert_eq!(json["product"]["onHand"], "5");
    assert_eq!(
        json["product"]["deductionPolicy"],
        "DEDUCTION_POLICY_COMMIT_AT_ORDER"
    );

    let restock = flashsale(
        &[
            "product",
            "restock",
            "--sku",
            "CLI-1",
            "--delta",
            "3",
            "--request-id",
            "r1",
        ],
        &url,
    )
    .await;
    assert!(restock.ok, "{}", restock.stderr);
    let get = flashsale(&["product", "get", "CLI-1"], &url).await;
    let json: serde_json::Value = serde_json::from_str(&get.stdout).unwrap();
    assert_eq!(
        (
            json["product"]["onHand"].as_str(),
            json["product"]["gateAvailable"].as_str()
        ),
        (Some("8"), Some("8"))
    );

    let list = flashsale(&["product", "list"], &url).await;
    assert!(list.ok && list.stdout.contains("CLI-1"), "{}", list.stderr);
    let rec = flashsale(&["product", "reconcile", "--sku", "CLI-1"], &url).await;
    assert!(rec.ok, "{}", rec.stderr);
    let json: serde_json::Value = serde_json::from_str(&rec.stdout).unwrap();
    assert_eq!(json["reports"][0]["sku"], "CLI-1");
    stop.trigger();
}

#[tokio::test]
async fn product_commands_report_the_servers_refusal() {
    let (url, stop, _db) = product_stock().await;
    let bad = flashsale(
        &[
            "product",
            "create",
            "--sku",
            "BAD",
            "--name",
            "x",
            "--price-cents",
            "-5",
            "--stock",
            "1",
        ],
        &url,
    )
    .await;
    assert!(!bad.ok);
    assert!(
        bad.stderr.contains("InvalidArgument") && bad.stderr.contains("price_cents"),
        "{}",
        bad.stderr
    );
    let missing = flashsale(&["product", "get", "NOPE"], &url).await;
    assert!(
        !missing.ok && missing.stderr.contains("NotFound"),
        "{}",
        missing.stderr
    );
    let wrong = flashsale(&["product", "list", "--token", "forged"], &url).await;
    assert!(
        !wrong.ok && wrong.stderr.contains("Unauthenticated"),
        "{}",
        wrong.stderr
    );
    stop.trigger();
}
