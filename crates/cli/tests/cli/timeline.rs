//! `flashsale order timeline` against the whole stack: a shipped order's life and a cancelled
//! one's, as the three services saw them, merged in time order; an order nobody has fails, and
//! a service that cannot be reached is named while the others' entries are still printed.

use serde_json::Value;

use crate::{
    full_stack::{FullStack, orders_with_plan, report},
    helpers::{Run, command, output},
};

/// `flashsale order timeline args…` against the stack, with outbound at `outbound_url`.
async fn run(stack: &FullStack, args: &[&str], outbound_url: &str) -> Run {
    let mut cmd = command(&["order", "--user", "ops", "timeline"]);
    cmd.args(args)
        .env("FLASHSALE_ORDER_URL", &stack.order_url)
        .env("FLASHSALE_PRODUCT_STOCK_URL", &stack.stock_url)
        .env("FLASHSALE_OUTBOUND_URL", outbound_url);
    output(cmd).await
}

/// `flashsale order timeline <id> --json`.
async fn timeline(stack: &FullStack, id: &str, outbound_url: &str) -> Run {
    run(stack, &[id, "--json"], outbound_url).await
}

/// `(service, kind without its prefix, summary)` of every entry, in the printed order.
fn entries(doc: &Value) -> Vec<(String, String, String)> {
    doc["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {doc}"))
        .iter()
        .map(|e| {
            let kind = e["kind"].as_str().unwrap_or_default();
            (
                e["service"].as_str().unwrap_or_default().to_owned(),
                kind.trim_start_matches("TIMELINE_ENTRY_KIND_").to_owned(),
                e["summary"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The position of the first entry of `service` and `kind` whose summary contains `text`.
fn position(all: &[(String, String, String)], service: &str, kind: &str, text: &str) -> usize {
    all.iter()
        .position(|(s, k, summary)| s == service && k == kind && summary.contains(text))
        .unwrap_or_else(|| panic!("no {kind} of {service} saying {text:?} in {all:#?}"))
}

fn times(doc: &Value) -> Vec<String> {
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["time"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn timeline_tells_a_shipped_and_a_cancelled_order_from_every_service() {
    let stack = FullStack::spawn(|_| {}).await;
    let sale = stack
        .sale(&[
            "--sku",
            "CLI-TIMELINE",
            "--buyers",
            "2",
            "--stock",
            "2",
            "--pay",
            "0.5",
            "--never-pay",
            "0.5",
            "--pay-late",
            "0",
            "--json",
        ])
        .await;
    let r = report(&sale);
    let (paid, never) = (
        orders_with_plan(&r, "pay"),
        orders_with_plan(&r, "never-pay"),
    );
    assert_eq!((paid.len(), never.len()), (1, 1), "{r}");

    // The shipped order: accepted, reserved, paid, committed, shipped, in that order.
    let id = paid[0]["orderId"].as_str().unwrap();
    let doc = timeline(&stack, id, &stack.outbound_url).await.json();
    assert_eq!(doc["orderId"], id);
    assert_eq!(doc["unreadable"], serde_json::json!([]), "{doc}");
    let shipped = entries(&doc);
    let accepted = position(&shipped, "order", "STATUS_CHANGED", "x CLI-TIMELINE");
    let consumed = position(&shipped, "product-stock", "EVENT_CONSUMED", "order.created");
    let reserved = position(&shipped, "product-stock", "STOCK_MOVED", "RESERVE of");
    let awaiting = position(&shipped, "order", "STATUS_CHANGED", "-> AWAITING_PAYMENT");
    let paid_at = position(&shipped, "order", "STATUS_CHANGED", "-> PAID");
    let committed = position(&shipped, "product-stock", "STOCK_MOVED", "COMMIT of");
    let out = position(&shipped, "outbound", "SHIPMENT", "shipment SHIPPED");
    let done = position(&shipped, "order", "STATUS_CHANGED", "-> SHIPPED");
    assert!(
        accepted < consumed
            && consumed < reserved
            && reserved < awaiting
            && awaiting < paid_at
            && paid_at < committed
            && committed <= out
            && out < done,
        "out of order: {shipped:#?}"
    );
    position(&shipped, "order", "EVENT_CONSUMED", "stock.reserved");
    position(&shipped, "order", "EVENT_CONSUMED", "outbound.completed");
    position(&shipped, "order", "PAYMENT", "was paid");
    position(
        &shipped,
        "product-stock",
        "RESERVATION",
        "COMMITTED 1 unit(s)",
    );
    position(&shipped, "outbound", "SHIPMENT", "opened");
    position(&shipped, "outbound", "SHIPMENT_ATTEMPT", "attempt 1");
    let t = times(&doc);
    let mut sorted = t.clone();
    sorted.sort();
    assert_eq!(t, sorted, "entries in time order");
    // Consumed events name their message and their consumer.
    let event = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["eventType"] == "order.created")
        .unwrap();
    assert!(!event["messageId"].as_str().unwrap_or_default().is_empty());
    assert_eq!(event["attempts"], 1, "{event}");

    // The cancelled order: released, never shipped; outbound holds nothing of it.
    let id = never[0]["orderId"].as_str().unwrap();
    let doc = timeline(&stack, id, &stack.outbound_url).await.json();
    let cancelled = entries(&doc);
    position(&cancelled, "order", "STATUS_CHANGED", "-> CANCELLED");
    position(&cancelled, "product-stock", "STOCK_MOVED", "RELEASE of");
    position(
        &cancelled,
        "product-stock",
        "EVENT_CONSUMED",
        "order.cancelled",
    );
    assert!(
        cancelled.iter().all(|(s, ..)| s != "outbound"),
        "{cancelled:#?}"
    );

    // Text: one line per entry under a heading naming the order.
    let text = run(&stack, &[id], &stack.outbound_url).await;
    assert!(text.ok, "{}", text.stderr);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert!(
        lines[0].starts_with(&format!("order {id} (")),
        "{}",
        text.stdout
    );
    assert_eq!(lines.len(), 1 + cancelled.len(), "{}", text.stdout);
    assert!(
        lines.iter().any(|l| l.contains("product-stock")
            && l.contains("STOCK_MOVED")
            && l.contains("RELEASE of CLI-TIMELINE")),
        "{}",
        text.stdout
    );

    // Outbound unreachable: named, the rest printed, exit code 1.
    let partial = timeline(&stack, id, "http://127.0.0.1:1").await;
    assert!(!partial.ok, "{}", partial.stdout);
    let doc: Value = serde_json::from_str(&partial.stdout).unwrap();
    assert_eq!(doc["unreadable"][0]["service"], "outbound", "{doc}");
    assert_eq!(entries(&doc), cancelled);

    // An order the order service does not have; an id that is no order id.
    let unknown = uuid::Uuid::new_v4().to_string();
    let missing = timeline(&stack, &unknown, &stack.outbound_url).await;
    assert!(
        !missing.ok && missing.stderr.contains("NotFound"),
        "{}",
        missing.stderr
    );
    let bad = timeline(&stack, "not-an-order", &stack.outbound_url).await;
    assert!(
        !bad.ok && bad.stderr.contains("not an order id"),
        "{}",
        bad.stderr
    );
}
