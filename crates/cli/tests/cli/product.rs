//! `flashsale product …` against product-stock, including the server's refusals.

use crate::helpers::{flashsale, product_stock};

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

#[tokio::test]
async fn product_create_splits_a_hot_product_into_stock_buckets_and_refuses_too_many() {
    let (url, stop, _db) = product_stock().await;
    let create = |sku: &'static str, buckets: &'static str| {
        let url = url.clone();
        async move {
            flashsale(
                &[
                    "product",
                    "create",
                    "--sku",
                    sku,
                    "--name",
                    "Hot drop",
                    "--price-cents",
                    "900",
                    "--stock",
                    "10",
                    "--stock-buckets",
                    buckets,
                ],
                &url,
            )
            .await
        }
    };
    let hot = create("CLI-HOT", "4").await;
    assert!(hot.ok, "{}", hot.stderr);
    let json: serde_json::Value = serde_json::from_str(&hot.stdout).unwrap();
    assert_eq!(json["product"]["stockBuckets"], 4);
    assert_eq!(json["product"]["gateAvailable"], "10");
    let bad = create("CLI-TOO-HOT", "65").await;
    assert!(
        !bad.ok && bad.stderr.contains("InvalidArgument") && bad.stderr.contains("stock_buckets"),
        "{}",
        bad.stderr
    );
    stop.trigger();
}

#[tokio::test]
async fn product_create_sets_a_sale_window_and_refuses_a_bad_one() {
    let (url, stop, _db) = product_stock().await;
    let create = |sku: &'static str, extra: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut args = vec![
                "product",
                "create",
                "--sku",
                sku,
                "--name",
                "Midnight gin",
                "--price-cents",
                "2500",
                "--stock",
                "10",
            ];
            args.extend_from_slice(extra);
            flashsale(&args, &url).await
        }
    };
    let sale = create(
        "CLI-SALE",
        &[
            "--sale-start",
            "2999-12-24T20:00:00Z",
            "--sale-end",
            "2999-12-24T20:10:00Z",
            "--sale-price-cents",
            "1999",
        ],
    )
    .await;
    assert!(sale.ok, "{}", sale.stderr);
    let json: serde_json::Value = serde_json::from_str(&sale.stdout).unwrap();
    assert_eq!(json["product"]["saleStart"], "2999-12-24T20:00:00Z");
    assert_eq!(json["product"]["saleEnd"], "2999-12-24T20:10:00Z");
    assert_eq!(json["product"]["salePriceCents"], "1999");
    let soon = create("CLI-SOON", &["--sale-start", "+90s", "--sale-end", "+2h"]).await;
    assert!(soon.ok, "{}", soon.stderr);

    // Refused by the command line, naming the flag, before anything is sent.
    for (flag, value) in [
        ("--sale-start", "tomorrow"),
        ("--sale-end", "+5d"),
        ("--sale-start", "+-5s"),
    ] {
        let bad = flashsale(
            &[
                "product",
                "create",
                "--sku",
                "CLI-BAD",
                "--name",
                "x",
                "--price-cents",
                "1",
                "--stock",
                "1",
                flag,
                value,
            ],
            &url,
        )
        .await;
        assert!(!bad.ok, "{flag} {value} accepted");
        assert!(
            bad.stderr.contains(flag) && bad.stderr.contains(value),
            "{flag} {value}: {}",
            bad.stderr
        );
    }
    // Refused by the server, naming the field.
    let late = create(
        "CLI-LATE",
        &[
            "--sale-start",
            "2999-12-24T20:10:00Z",
            "--sale-end",
            "2999-12-24T20:00:00Z",
            "--sale-price-cents",
            "2600",
        ],
    )
    .await;
    assert!(!late.ok);
    assert!(
        late.stderr.contains("InvalidArgument")
            && late.stderr.contains("sale_end")
            && late.stderr.contains("sale_price_cents"),
        "{}",
        late.stderr
    );
    let missing = flashsale(&["product", "get", "CLI-LATE"], &url).await;
    assert!(!missing.ok && missing.stderr.contains("NotFound"));
    stop.trigger();
}

#[tokio::test]
async fn product_update_changes_the_named_terms_and_reports_a_stale_etag() {
    let (url, stop, _db) = product_stock().await;
    let create = flashsale(
        &[
            "product",
            "create",
            "--sku",
            "CLI-UPD",
            "--name",
            "Gin",
            "--price-cents",
            "2500",
            "--stock",
            "10",
        ],
        &url,
    )
    .await;
    assert!(create.ok, "{}", create.stderr);
    let update = flashsale(
        &[
            "product",
            "update",
            "--sku",
            "CLI-UPD",
            "--price-cents",
            "2000",
            "--sale-start",
            "+1h",
            "--sale-price-cents",
            "1500",
            "--etag",
            "1",
        ],
        &url,
    )
    .await;
    assert!(update.ok, "{}", update.stderr);
    let json: serde_json::Value = serde_json::from_str(&update.stdout).unwrap();
    assert_eq!(json["product"]["priceCents"], "2000");
    assert_eq!(json["product"]["salePriceCents"], "1500");
    assert!(json["product"]["saleStart"].is_string(), "{json}");
    assert_eq!(json["product"]["etag"], "2");
    assert_eq!(json["product"]["name"], "Gin", "not given: unchanged");

    let stale = flashsale(
        &[
            "product", "update", "--sku", "CLI-UPD", "--name", "Rum", "--etag", "1",
        ],
        &url,
    )
    .await;
    assert!(
        !stale.ok && stale.stderr.contains("Aborted"),
        "{}",
        stale.stderr
    );
    let cleared = flashsale(
        &[
            "product",
            "update",
            "--sku",
            "CLI-UPD",
            "--no-sale-start",
            "--no-sale-price",
        ],
        &url,
    )
    .await;
    assert!(cleared.ok, "{}", cleared.stderr);
    let json: serde_json::Value = serde_json::from_str(&cleared.stdout).unwrap();
    assert!(json["product"]["saleStart"].is_null(), "{json}");
    assert!(json["product"]["salePriceCents"].is_null(), "{json}");

    // Nothing to change, or a flag and its removal together: refused before anything is sent.
    let nothing = flashsale(&["product", "update", "--sku", "CLI-UPD"], &url).await;
    assert!(
        !nothing.ok && nothing.stderr.contains("nothing to change"),
        "{}",
        nothing.stderr
    );
    let both = flashsale(
        &[
            "product",
            "update",
            "--sku",
            "CLI-UPD",
            "--sale-end",
            "+1h",
            "--no-sale-end",
        ],
        &url,
    )
    .await;
    assert!(
        !both.ok && both.stderr.contains("--no-sale-end"),
        "{}",
        both.stderr
    );
    stop.trigger();
}
