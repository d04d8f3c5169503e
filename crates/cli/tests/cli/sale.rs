//! `flashsale sale` end to end against the three services in-process: a small sale sells
//! exactly its stock and passes every invariant; a warehouse that fails every shipment ends in
//! refunds and still passes; bad options are refused naming the flag.

use serde_json::Value;

use crate::{
    full_stack::{FullStack, orders_with_plan, report},
    helpers::flashsale,
};

/// Asserts every invariant of a report passed, showing the failing ones.
fn assert_invariants_pass(report: &Value) {
    let checks = report["invariants"].as_array().unwrap();
    // A sale with a window checks that it opened on time too.
    let opening = usize::from(report["beforeOpening"].is_object());
    assert_eq!(checks.len(), 8 + opening, "{report}");
    let failed: Vec<&Value> = checks.iter().filter(|c| c["pass"] != true).collect();
    assert!(failed.is_empty(), "failed invariants: {failed:?}");
    assert_eq!(report["pass"], true);
    assert_eq!(report["timeBoundHit"], false, "{}", report["timeBound"]);
}

#[tokio::test]
async fn a_small_sale_sells_exactly_its_stock_and_refunds_late_payments() {
    let stack = FullStack::spawn(|_| {}).await;
    // The services run inside this test process: its memory is theirs.
    let me = format!("stack={}", std::process::id());
    let run = stack
        .sale(&[
            "--service-pid",
            &me,
            "--sku",
            "CLI-SALE-1",
            "--buyers",
            "60",
            "--stock",
            "20",
            "--concurrency",
            "16",
            "--pay",
            "0.5",
            "--never-pay",
            "0.25",
            "--pay-late",
            "0.25",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(r["requests"], 60, "{r}");
    assert_eq!(r["plannedRequests"], 60, "{r}");
    assert_eq!(r["floodEnded"], "requests", "{r}");
    assert_eq!(
        r["offers"],
        serde_json::json!([{"sku": "CLI-SALE-1", "stock": 20, "perUserLimit": 1}])
    );
    assert_eq!(r["accepted"], 20, "{r}");
    assert_eq!(r["refused"]["SOLD_OUT"], 40, "{r}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert!(r["latencyUs"]["p50"].as_u64().unwrap() > 0, "{r}");
    assert!(r["latencyUs"]["max"].as_u64() >= r["latencyUs"]["p99"].as_u64());
    assert!(r["confirmationMs"].is_number(), "{r}");
    assert_eq!(r["memory"][0]["service"], "stack", "{r}");
    assert!(
        r["memory"][0]["peak_rss_mib"].as_f64().unwrap() > 1.0,
        "{r}"
    );
    assert_invariants_pass(&r);

    let payers = orders_with_plan(&r, "pay");
    let never = orders_with_plan(&r, "never-pay");
    let late = orders_with_plan(&r, "pay-late");
    assert_eq!((payers.len(), never.len(), late.len()), (10, 5, 5), "{r}");
    for o in &payers {
        assert_eq!(
            (&o["status"], &o["shipment"], &o["refundStatus"]),
            (
                &Value::from("SHIPPED"),
                &Value::from("SHIPPED"),
                &Value::from("NONE")
            ),
            "{o}"
        );
    }
    for o in &never {
        assert_eq!(
            (&o["status"], &o["cancelReason"], &o["refundStatus"]),
            (
                &Value::from("CANCELLED"),
                &Value::from("PAYMENT_TIMEOUT"),
                &Value::from("NONE")
            ),
            "{o}"
        );
    }
    for o in &late {
        // Started in time, paid at the provider after the deadline: cancelled and refunded
        // (requested from the provider, or already paid back).
        assert_eq!(
            (&o["status"], &o["outcome"]),
            (&Value::from("CANCELLED"), &Value::from("paid")),
            "{o}"
        );
        assert!(refunded(o), "{o}");
        assert_eq!(o["refundCents"], 1999, "{o}");
    }
    assert_eq!(r["totals"]["shippedUnits"], 10, "{r}");
    assert_eq!(r["totals"]["refunds"], 5, "{r}");
    assert_eq!(
        (&r["product"]["available"], &r["product"]["reserved"]),
        (&Value::from(10), &Value::from(0)),
        "{r}"
    );
}

#[tokio::test]
async fn a_sale_whose_shipments_all_fail_refunds_every_payment_and_still_passes() {
    let stack = FullStack::spawn(|s| s.warehouse.fail_skus = "CLI-SALE-BROKEN".into()).await;
    let run = stack
        .sale(&[
            "--sku",
            "CLI-SALE-BROKEN",
            "--policy",
            "commit-at-order",
            "--buyers",
            "20",
            "--stock",
            "8",
            "--price-cents",
            "500",
            "--pay",
            "0.75",
            "--never-pay",
            "0.25",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(r["accepted"], 8, "{r}");
    assert_eq!(r["policy"], "COMMIT_AT_ORDER");
    assert_invariants_pass(&r);

    let payers = orders_with_plan(&r, "pay");
    assert_eq!(payers.len(), 6, "{r}");
    for o in &payers {
        assert_eq!(
            (
                &o["status"],
                &o["cancelReason"],
                &o["shipment"],
                &o["refundCents"]
            ),
            (
                &Value::from("CANCELLED"),
                &Value::from("OUTBOUND_FAILED"),
                &Value::from("FAILED"),
                &Value::from(500)
            ),
            "{o}"
        );
        assert!(refunded(o), "{o}");
    }
    assert_eq!(r["totals"]["shipments"]["FAILED"], 6, "{r}");
    assert_eq!(r["totals"]["shippedUnits"], 0, "{r}");
    assert_eq!(r["totals"]["refunds"], 6, "{r}");
    // Every unit is back on sale.
    assert_eq!(r["product"]["available"], 8, "{r}");
    assert_eq!(r["product"]["gateAvailable"], 8, "{r}");
}

#[tokio::test]
async fn a_sale_of_several_products_sells_each_exactly_its_stock() {
    let stack = FullStack::spawn(|_| {}).await;
    let run = stack
        .sale(&[
            "--sku",
            "CLI-MULTI",
            "--products",
            "3",
            "--buyers",
            "40",
            "--requests-per-buyer",
            "3",
            "--stock",
            "5",
            "--concurrency",
            "16",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(r["requests"], 120, "{r}");
    assert_eq!(r["accepted"], 15, "5 units of each of 3 products: {r}");
    assert_eq!(
        r["skus"],
        serde_json::json!(["CLI-MULTI-1", "CLI-MULTI-2", "CLI-MULTI-3"])
    );
    assert_invariants_pass(&r);
    let products = r["products"].as_array().unwrap();
    assert_eq!(products.len(), 3, "{r}");
    for p in products {
        assert_eq!(
            (&p["onHand"], &p["available"], &p["reserved"], &p["drift"]),
            (
                &Value::from(0),
                &Value::from(0),
                &Value::from(0),
                &Value::from(0)
            ),
            "every unit of {p} shipped"
        );
    }
    let shipped_by_sku = |sku: &str| {
        r["orders"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["status"] == "SHIPPED" && o["sku"] == sku)
            .count()
    };
    for k in 1..=3 {
        assert_eq!(shipped_by_sku(&format!("CLI-MULTI-{k}")), 5, "{r}");
    }
    // Each product's check is folded into one line naming every product.
    let conserved = r["invariants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stock conserved")
        .unwrap();
    for k in 1..=3 {
        assert!(
            conserved["detail"]
                .as_str()
                .unwrap()
                .contains(&format!("CLI-MULTI-{k}:")),
            "{conserved}"
        );
    }
}

#[tokio::test]
async fn products_with_stock_and_limits_of_their_own_each_sell_exactly_their_stock() {
    let stack = FullStack::spawn(|_| {}).await;
    let run = stack
        .sale(&[
            "--product",
            "CLI-OFFER-A=3",
            "--product",
            "CLI-OFFER-B=6:2",
            "--per-user-limit",
            "1",
            "--buyers",
            "10",
            "--requests-per-buyer",
            "4",
            "--concurrency",
            "8",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(
        r["offers"],
        serde_json::json!([
            {"sku": "CLI-OFFER-A", "stock": 3, "perUserLimit": 1},
            {"sku": "CLI-OFFER-B", "stock": 6, "perUserLimit": 2},
        ])
    );
    // Every buyer asks for each product twice: A sells its 3 units to 3 buyers, B its 6 units
    // to buyers that may take 2 each; the other calls are refused, never errors.
    assert_eq!(r["requests"], 40, "{r}");
    assert_eq!(r["accepted"], 9, "{r}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert_invariants_pass(&r);
    let shipped = |sku: &str| {
        r["orders"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["status"] == "SHIPPED" && o["sku"] == sku)
            .map(|o| o["buyer"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let a = shipped("CLI-OFFER-A");
    let b = shipped("CLI-OFFER-B");
    assert_eq!((a.len(), b.len()), (3, 6), "{r}");
    let distinct = |v: &[String]| v.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert_eq!(distinct(&a), 3, "A's limit is 1 per buyer: {a:?}");
    assert!(distinct(&b) >= 3, "B's limit is 2 per buyer: {b:?}");
    for p in r["products"].as_array().unwrap() {
        assert_eq!(
            (&p["available"], &p["reserved"]),
            (&Value::from(0), &Value::from(0)),
            "{p}"
        );
    }
}

#[tokio::test]
async fn a_sale_with_a_duration_stops_flooding_then_finishes_and_passes() {
    let stack = FullStack::spawn(|_| {}).await;
    // Far more calls than one second allows: the duration, not the count, ends the flood.
    let run = stack
        .sale(&[
            "--sku",
            "CLI-DURATION",
            "--stock",
            "5",
            "--buyers",
            "5000",
            "--requests-per-buyer",
            "20",
            "--concurrency",
            "8",
            "--duration-secs",
            "1",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    assert_eq!(r["floodEnded"], "duration", "{r}");
    assert_eq!(r["plannedRequests"], 100_000, "{r}");
    let requests = r["requests"].as_u64().unwrap();
    assert!(requests > 5 && requests < 100_000, "{r}");
    assert!(r["floodSecs"].as_f64().unwrap() < 30.0, "{r}");
    assert_eq!(r["accepted"], 5, "{r}");
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert_invariants_pass(&r);
    assert_eq!(r["totals"]["shippedUnits"], 5, "{r}");
}

#[tokio::test]
async fn a_sale_that_opens_later_refuses_the_early_crowd_then_sells_at_the_sale_price() {
    let stack = FullStack::spawn(|_| {}).await;
    let run = stack
        .sale(&[
            "--sku",
            "CLI-OPENING",
            "--stock",
            "10",
            "--buyers",
            "40",
            "--concurrency",
            "8",
            "--price-cents",
            "2499",
            "--sale-price-cents",
            "1999",
            "--opens-in-secs",
            "2",
            "--pay",
            "1",
            "--never-pay",
            "0",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "120",
            "--json",
        ])
        .await;
    let r = report(&run);
    let early = &r["beforeOpening"];
    let refused = early["refusedNotStarted"].as_u64().unwrap();
    assert!(
        refused >= 8,
        "every worker was refused before the opening: {r}"
    );
    assert!(
        early["fromMemory"].as_u64().unwrap() > 0,
        "the order service answered from memory: {r}"
    );
    assert_eq!(early["otherAnswers"], serde_json::json!({}), "{r}");
    assert_eq!(early["notStartedAfterOpening"], 0, "{r}");
    assert_eq!(r["accepted"], 10, "{r}");
    assert_eq!(r["salePriceCents"], 1999, "{r}");
    assert_invariants_pass(&r);
    let opened = r["invariants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "the sale opened on time");
    assert!(opened.is_some_and(|c| c["pass"] == true), "{r}");
    for o in orders_with_plan(&r, "pay") {
        assert_eq!(o["totalCents"], 1999, "{o}");
    }
}

#[tokio::test]
async fn sale_refuses_bad_options_naming_the_flag() {
    let nowhere = "http://127.0.0.1:1";
    let cases: [(&[&str], &[&str]); 31] = [
        (&["--opens-in-secs", "0"], &["--opens-in-secs"]),
        (&["--opens-in-secs", "3601"], &["--opens-in-secs"]),
        (&["--sale-price-cents", "-1"], &["--sale-price-cents"]),
        (&["--pay-concurrency", "0"], &["--pay-concurrency"]),
        (&["--pay-concurrency", "10001"], &["--pay-concurrency"]),
        (
            &["--arrival-rate", "0", "--sustain-secs", "5"],
            &["--arrival-rate"],
        ),
        (&["--arrival-rate", "10"], &["--sustain-secs"]),
        (&["--sustain-secs", "10"], &["--arrival-rate"]),
        (
            &[
                "--arrival-rate",
                "10",
                "--sustain-secs",
                "300",
                "--order-database-url",
                "postgres://x",
            ],
            &["--sustain-secs", "--max-duration-secs"],
        ),
        (
            &[
                "--arrival-rate",
                "20000",
                "--sustain-secs",
                "100",
                "--max-duration-secs",
                "1000",
                "--order-database-url",
                "postgres://x",
            ],
            &["--arrival-rate", "--sustain-secs"],
        ),
        (
            &["--arrival-rate", "10", "--sustain-secs", "5"],
            &["--arrival-rate", "--order-database-url"],
        ),
        (&["--products", "0"], &["--products"]),
        (&["--products", "51"], &["--products"]),
        (
            &["--pay", "0.8", "--never-pay", "0.5"],
            &["--pay", "--never-pay"],
        ),
        (&["--buyers", "0"], &["--buyers"]),
        (&["--pay-late", "1.5"], &["--pay-late"]),
        (&["--concurrency", "0"], &["--concurrency"]),
        (&["--service-pid", "order"], &["--service-pid"]),
        (&["--service-pid", "order=-3"], &["--service-pid"]),
        (&["--sku", "A{B}"], &["--sku"]),
        (&["--product", "A"], &["--product"]),
        (&["--product", "=5"], &["--product"]),
        (&["--product", "A=-1"], &["--product"]),
        (&["--product", "A=many"], &["--product"]),
        (&["--product", "A=5:x"], &["--product"]),
        (&["--product", "A=5:-1"], &["--product"]),
        (&["--product", "A=1", "--product", "A=2"], &["--product"]),
        (
            &["--product", "A=1", "--stock", "5"],
            &["--product", "--stock"],
        ),
        (&["--product", "A=1", "--sku", "B"], &["--product", "--sku"]),
        (&["--duration-secs", "0"], &["--duration-secs"]),
        (
            &["--duration-secs", "10", "--max-duration-secs", "10"],
            &["--duration-secs", "--max-duration-secs"],
        ),
    ];
    for (args, flags) in cases {
        let mut full = vec!["sale", "--order-url", nowhere, "--outbound-url", nowhere];
        full.extend_from_slice(args);
        let run = flashsale(&full, nowhere).await;
        assert!(!run.ok, "{args:?} was accepted: {}", run.stdout);
        for flag in flags {
            assert!(
                run.stderr.contains(flag),
                "{args:?}: stderr does not name {flag}: {}",
                run.stderr
            );
        }
        assert!(
            !run.stderr.contains("connect"),
            "{args:?} got as far as connecting: {}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn a_sale_that_cannot_finish_within_its_bound_stops_by_itself_and_fails() {
    let stack = FullStack::spawn(|_| {}).await;
    let started = std::time::Instant::now();
    // Every winner leaves its order unpaid: the payment timeout (2 s) cancels them only after
    // the run's 2 s bound, so the sale must give up rather than wait.
    let run = stack
        .sale(&[
            "--buyers",
            "10",
            "--stock",
            "5",
            "--pay",
            "0",
            "--never-pay",
            "1",
            "--pay-late",
            "0",
            "--max-duration-secs",
            "2",
            "--json",
        ])
        .await;
    let wall = started.elapsed();
    assert!(!run.ok, "a sale past its bound passed: {}", run.stdout);
    let r: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}\n{}", run.stdout, run.stderr));
    assert_eq!(r["timeBoundHit"], true, "{r}");
    assert_eq!(r["pass"], false, "{r}");
    assert!(r["elapsedSecs"].as_f64().unwrap() <= 2.5, "{r}");
    assert!(wall.as_secs() < 15, "the sale took {wall:?}");
}

/// A refund recorded and requested from the provider, or already paid back by it.
pub(crate) fn refunded(o: &Value) -> bool {
    o["refundStatus"] == "RECORDED" || o["refundStatus"] == "COMPLETED"
}
