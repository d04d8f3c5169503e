//! `flashsale order …` against product-stock and order running in-process: placing, listing,
//! following, paying and cancelling orders, and the server's refusals on stderr.

use std::time::Duration;

use flashsale_proto::order::v1::OrderStatus;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::helpers::{Stack, piped};

/// Longest wait for one line of a watch or for the watch to exit.
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn order_create_answers_pending_and_list_shows_the_buyers_orders() {
    let stack = Stack::spawn().await;
    stack.product("ORD-1", 1500, 10).await;
    let create = stack
        .order(
            "ann",
            &[
                "create",
                "--sku",
                "ORD-1",
                "--quantity",
                "2",
                "--request-id",
                "r-1",
            ],
        )
        .await
        .json();
    let order = &create["order"];
    assert_eq!(order["status"], "ORDER_STATUS_PENDING", "{create}");
    assert_eq!(
        (
            order["userId"].as_str(),
            order["sku"].as_str(),
            order["quantity"].as_str(),
            order["totalCents"].as_str(),
            order["requestId"].as_str(),
        ),
        (
            Some("ann"),
            Some("ORD-1"),
            Some("2"),
            Some("3000"),
            Some("r-1")
        )
    );
    let id = order["orderId"].as_str().unwrap().to_owned();
    let other = stack.place("ann", "ORD-1", 1).await;
    stack.place("bob", "ORD-1", 1).await;

    let list = stack.order("ann", &["list"]).await.json();
    let ids: Vec<&str> = list["orders"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["orderId"].as_str())
        .collect();
    assert_eq!(ids, [other.as_str(), id.as_str()], "newest first: {list}");

    // One order a page still walks every page.
    let paged = stack
        .order("ann", &["list", "--page-size", "1"])
        .await
        .json();
    assert_eq!(paged["orders"].as_array().unwrap().len(), 1, "{paged}");
    assert!(!paged["nextPageToken"].as_str().unwrap_or("").is_empty());

    let all = stack.order("root", &["--admin", "list"]).await;
    assert!(all.ok, "{}", all.stderr);
    assert_eq!(
        all.stdout.matches("\"orderId\"").count(),
        3,
        "{}",
        all.stdout
    );
    let bobs = stack
        .order("root", &["--admin", "list", "--user-id", "bob"])
        .await
        .json();
    assert_eq!(bobs["orders"].as_array().unwrap().len(), 1, "{bobs}");
    let cancelled = stack
        .order("ann", &["list", "--status", "cancelled"])
        .await
        .json();
    assert!(cancelled["orders"].as_array().is_none_or(Vec::is_empty));

    let get = stack.order("ann", &["get", &id]).await.json();
    assert_eq!(get["order"]["orderId"], id.as_str());
    let admin = stack.order("root", &["--admin", "get", &id]).await;
    assert!(admin.ok, "{}", admin.stderr);
}

#[tokio::test]
async fn order_watch_prints_each_update_until_the_order_is_cancelled() {
    let stack = Stack::spawn().await;
    stack.product("ORD-W", 900, 5).await;
    let id = stack.place("ann", "ORD-W", 1).await;

    let mut watch = piped(stack.order_command("ann", &["watch", &id]));
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("watch printed nothing")
        .unwrap()
        .expect("watch ended before its first update");
    // One compact JSON document per line.
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["order"]["orderId"], id.as_str(), "{first}");
    assert!(
        ["ORDER_STATUS_PENDING", "ORDER_STATUS_AWAITING_PAYMENT"]
            .contains(&first["order"]["status"].as_str().unwrap_or("")),
        "{first}"
    );

    let cancel = stack.order("ann", &["cancel", &id]).await.json();
    assert_eq!(cancel["order"]["status"], "ORDER_STATUS_CANCELLED");

    let mut last = first;
    while let Some(line) = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("watch did not end after the cancel")
        .unwrap()
    {
        last = serde_json::from_str(&line).unwrap();
    }
    assert_eq!(last["order"]["status"], "ORDER_STATUS_CANCELLED", "{last}");
    assert_eq!(
        last["order"]["cancelReason"],
        "CANCEL_REASON_USER_CANCELLED"
    );
    let status = tokio::time::timeout(WAIT, watch.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "watch exited with {status}");
}

#[tokio::test]
async fn order_pay_refuses_a_wrong_amount_and_starts_the_payment_the_provider_confirms() {
    let stack = Stack::spawn().await;
    stack.product("ORD-P", 1250, 5).await;
    let id = stack.place("ann", "ORD-P", 2).await;
    stack
        .wait_status("ann", &id, OrderStatus::AwaitingPayment)
        .await;

    // A watch of an order that does not end gives up at its timeout, having printed the state.
    let watch = stack
        .order("ann", &["watch", &id, "--timeout-secs", "1"])
        .await;
    assert!(!watch.ok, "{}", watch.stdout);
    assert!(watch.stderr.contains("did not end"), "{}", watch.stderr);
    let seen: Value = serde_json::from_str(watch.stdout.lines().next().unwrap_or("")).unwrap();
    assert_eq!(seen["order"]["status"], "ORDER_STATUS_AWAITING_PAYMENT");

    let wrong = stack
        .order("ann", &["pay", &id, "--amount-cents", "1250"])
        .await;
    assert!(
        !wrong.ok
            && wrong.stderr.contains("InvalidArgument")
            && wrong.stderr.contains("amount_cents"),
        "{}",
        wrong.stderr
    );

    // Paying starts the payment at the provider and prints where to pay; the provider's
    // notification, once the buyer paid there, pays the order.
    let started = stack
        .order("ann", &["pay", &id, "--amount-cents", "2500"])
        .await
        .json();
    assert_eq!(
        started["order"]["status"], "ORDER_STATUS_AWAITING_PAYMENT",
        "{started}"
    );
    let payment_id = started["checkout"]["providerPaymentId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        started["checkout"]["checkoutUrl"]
            .as_str()
            .is_some_and(|u| u.contains(&payment_id)),
        "{started}"
    );
    let again = stack.order("ann", &["pay", &id]).await.json();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["checkout"]["providerPaymentId"], payment_id.as_str());
    stack.buyer_pays(&payment_id).await;
    let paid = stack.wait_status("ann", &id, OrderStatus::Paid).await;
    assert_eq!(paid.payment_id, payment_id);

    let listed = stack
        .order("ann", &["list", "--status", "paid"])
        .await
        .json();
    assert_eq!(listed["orders"][0]["orderId"], id.as_str(), "{listed}");
}

#[tokio::test]
async fn order_commands_report_the_servers_refusal() {
    let stack = Stack::spawn().await;
    stack.product("ORD-R", 700, 5).await;

    let zero = stack
        .order("ann", &["create", "--sku", "ORD-R", "--quantity", "0"])
        .await;
    assert!(
        !zero.ok && zero.stderr.contains("InvalidArgument") && zero.stderr.contains("quantity"),
        "{}",
        zero.stderr
    );

    let id = stack.place("ann", "ORD-R", 1).await;
    let foreign = stack.order("bob", &["get", &id]).await;
    assert!(
        !foreign.ok && foreign.stderr.contains("NotFound"),
        "{}",
        foreign.stderr
    );
    let not_bobs = stack.order("bob", &["cancel", &id]).await;
    assert!(
        !not_bobs.ok && not_bobs.stderr.contains("NotFound"),
        "{}",
        not_bobs.stderr
    );
    let snoop = stack.order("bob", &["list", "--user-id", "ann"]).await;
    assert!(
        !snoop.ok && snoop.stderr.contains("PermissionDenied"),
        "{}",
        snoop.stderr
    );
    let forged = stack.order("ann", &["list", "--token", "forged"]).await;
    assert!(
        !forged.ok && forged.stderr.contains("Unauthenticated"),
        "{}",
        forged.stderr
    );
    let sold = stack
        .order("ann", &["create", "--sku", "ORD-R", "--quantity", "9"])
        .await;
    assert!(
        !sold.ok
            && sold.stderr.contains("FailedPrecondition")
            && sold.stderr.contains("INSUFFICIENT_STOCK"),
        "{}",
        sold.stderr
    );
}

#[tokio::test]
async fn order_refunds_lists_and_retries_refunds_for_an_admin_and_reports_bad_input() {
    let stack = Stack::spawn().await;
    let failed = stack
        .order("ops", &["refunds", "--status", "failed"])
        .await
        .json();
    assert!(
        failed
            .get("refunds")
            .is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)),
        "{failed}"
    );
    let bad = stack.order("ops", &["refunds", "--page-size", "-1"]).await;
    assert!(
        !bad.ok && bad.stderr.contains("InvalidArgument") && bad.stderr.contains("page_size"),
        "{}",
        bad.stderr
    );
    let unknown = stack.order("ops", &["refunds", "--status", "lost"]).await;
    assert!(
        !unknown.ok && unknown.stderr.contains("--status"),
        "{}",
        unknown.stderr
    );
    let missing = stack
        .order(
            "ops",
            &["refund-retry", "9b2f0c4e-58c1-4b8e-a0d6-2f64c1f9e7a3"],
        )
        .await;
    assert!(
        !missing.ok && missing.stderr.contains("NotFound"),
        "{}",
        missing.stderr
    );
    let bad = stack.order("ops", &["refund-retry", "nope"]).await;
    assert!(
        !bad.ok && bad.stderr.contains("InvalidArgument") && bad.stderr.contains("order_id"),
        "{}",
        bad.stderr
    );
}

#[tokio::test]
async fn product_report_answers_a_sale_s_figures_and_refuses_a_bad_sku() {
    let stack = Stack::spawn().await;
    stack.product("ORD-REPORT", 1500, 2).await;
    for user in ["alice", "bob", "carol"] {
        // Two win, the third is refused: the report counts both.
        let _ = stack
            .order(user, &["create", "--sku", "ORD-REPORT", "--quantity", "1"])
            .await;
    }
    let run = stack.run(&["product", "report", "ORD-REPORT"]).await;
    assert!(run.ok, "{}", run.stderr);
    let json: Value = serde_json::from_str(&run.stdout).unwrap();
    let r = &json["report"];
    assert_eq!(r["sku"], "ORD-REPORT", "{json}");
    assert_eq!(
        (&r["accepted"], &r["priceCents"]),
        (&Value::from("2"), &Value::from("1500"))
    );
    let bad = stack.run(&["product", "report", "not a sku"]).await;
    assert!(
        !bad.ok && bad.stderr.contains("InvalidArgument") && bad.stderr.contains("sku"),
        "{}",
        bad.stderr
    );
}
