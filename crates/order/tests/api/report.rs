//! GetSaleReport: a sale's figures agree with the order database and with what the buyers
//! were answered, second by second; bad requests are refused naming their field.

use std::time::Duration;

use flashsale_proto::order::v1::{
    CancelOrderRequest, GetSaleReportRequest, OrderStatus, SaleReport,
};
use flashsale_test_support::eventually;
use tonic::Code;

use crate::helpers::{TestApp, as_admin, as_user, create_req, reason, spawn_stack};

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn report(app: &TestApp, sku: &str) -> Result<SaleReport, tonic::Status> {
    app.client()
        .await
        .get_sale_report(as_admin(GetSaleReportRequest { sku: sku.into() }))
        .await
        .map(|r| r.into_inner().report.unwrap_or_default())
}

#[tokio::test]
async fn a_sale_s_report_matches_the_database_and_what_the_buyers_were_answered() {
    let app = spawn_stack(|_| {}).await;
    let start = now_ms() + 2_000;
    app.product_on_sale("REPORT-1", 6, 1, start, start + 600_000)
        .await;
    let mut client = app.client().await;
    let mut answered: std::collections::BTreeMap<String, i64> = Default::default();
    // The early crowd.
    for i in 0..3 {
        let e = client
            .create_order(as_user(
                &format!("early-{i}"),
                create_req("r", "REPORT-1", 1),
            ))
            .await
            .unwrap_err();
        *answered.entry(reason(&e)).or_default() += 1;
    }
    let left = start - now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
    }
    let mut orders = Vec::new();
    for i in 0..10 {
        let user = format!("buyer-{i}");
        match client
            .create_order(as_user(&user, create_req("r", "REPORT-1", 1)))
            .await
        {
            Ok(r) => orders.push((user, r.into_inner().order.unwrap().order_id)),
            Err(e) => *answered.entry(reason(&e)).or_default() += 1,
        }
    }
    assert_eq!(orders.len(), 6);
    assert_eq!(answered["SALE_NOT_STARTED"], 3);
    assert_eq!(answered["SOLD_OUT"], 4);
    // One pays, one cancels.
    let (payer, paid) = &orders[0];
    app.wait_status(payer, paid, OrderStatus::AwaitingPayment)
        .await;
    app.pay(payer, paid).await;
    let (canceller, cancelled) = &orders[1];
    app.wait_status(canceller, cancelled, OrderStatus::AwaitingPayment)
        .await;
    client
        .cancel_order(as_user(
            canceller,
            CancelOrderRequest {
                order_id: cancelled.clone(),
            },
        ))
        .await
        .unwrap();

    // The refusals are written once a second: wait for them, then compare.
    let want: std::collections::HashMap<String, i64> = answered.clone().into_iter().collect();
    let r = eventually(Duration::from_secs(10), "the refusals counted", || async {
        let r = report(&app, "REPORT-1").await.ok()?;
        (r.refused == want).then_some(r)
    })
    .await
    .unwrap_or_else(|_| panic!("the report never counted {want:?}"));
    assert_eq!(r.sku, "REPORT-1");
    assert_eq!(
        r.sale_start
            .as_ref()
            .and_then(flashsale_contract::timestamp_to_ms),
        Some(start)
    );
    assert_eq!((r.price_cents, r.sale_price_cents), (2_500, Some(1_999)));
    assert_eq!((r.accepted, r.accepted_units), (6, 6));
    assert_eq!(
        app.count("SELECT count(*) AS n FROM orders WHERE sku = 'REPORT-1'")
            .await,
        r.accepted
    );
    assert_eq!(r.confirmed, 6);
    assert_eq!((r.paid, r.revenue_cents), (1, 1_999));
    assert_eq!(r.cancelled.get("USER_CANCELLED"), Some(&1), "{r:?}");
    assert_eq!(r.shipped, 0);
    // From product-stock: the cancelled order's unit is back on sale.
    assert_eq!(r.on_hand, 6);
    // Second by second, the same calls; none accepted before the opening.
    let accepted: i64 = r.seconds.iter().map(|s| s.accepted).sum();
    assert_eq!(accepted, r.accepted);
    let mut refused: std::collections::HashMap<String, i64> = Default::default();
    for s in &r.seconds {
        let second = s
            .second
            .as_ref()
            .and_then(flashsale_contract::timestamp_to_ms)
            .unwrap();
        if s.accepted > 0 {
            assert!(second + 1_000 > start, "accepted in the second of {second}");
        }
        for (k, n) in &s.refused {
            *refused.entry(k.clone()).or_default() += n;
        }
    }
    assert_eq!(refused, want);
    let ms = |s: &flashsale_proto::order::v1::SaleSecond| {
        s.second
            .as_ref()
            .and_then(flashsale_contract::timestamp_to_ms)
    };
    assert!(r.seconds.windows(2).all(|w| ms(&w[0]) < ms(&w[1])));
    let sold_out = r.opening_to_sold_out_ms.expect("it sold out");
    assert!((0..60_000).contains(&sold_out), "{sold_out} ms");
    assert!(r.sold_out_time.is_some());
}

#[tokio::test]
async fn a_report_of_a_bad_or_unknown_sku_or_for_a_buyer_is_refused() {
    let app = spawn_stack(|_| {}).await;
    let e = report(&app, "not a sku!").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(flashsale_platform::error::violated_fields(&e), ["sku"]);
    let e = report(&app, "NO-SUCH-SKU").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = app
        .client()
        .await
        .get_sale_report(as_user(
            "alice",
            GetSaleReportRequest {
                sku: "NO-SUCH-SKU".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // A product nobody ordered: zeros, and no second.
    app.product("QUIET", 5, 1).await;
    let r = report(&app, "QUIET").await.unwrap();
    assert_eq!((r.accepted, r.on_hand, r.available), (0, 5, 5));
    assert!(r.seconds.is_empty() && r.refused.is_empty() && r.sold_out_time.is_none());
}
