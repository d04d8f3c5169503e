//! Every admin call of every service is in its audit log with its caller, a refused attempt too.

use super::*;

/// Whether `log` has the audit line of `action` by `subject` (`refused`: a refused attempt).
fn audited(log: &str, action: &str, subject: &str, refused: bool) -> bool {
    let what = if refused {
        "admin action refused"
    } else {
        "admin action"
    };
    log.lines().any(|l| {
        l.contains("flashsale::audit")
            && l.contains(what)
            && (refused || !l.contains("admin action refused"))
            && l.contains(&format!("\"{action}\""))
            && l.contains(subject)
    })
}

#[tokio::test]
async fn every_admin_call_of_every_service_is_in_its_audit_log_with_its_caller() {
    use flashsale_proto::{
        admin::v1::{
            DiscardDeadLettersRequest, ListDeadLettersRequest, ReplayDeadLettersRequest,
            dead_letter_service_client::DeadLetterServiceClient,
        },
        order::v1::{
            CancelOrderRequest, ListOrdersRequest, ListRefundsRequest, ListStuckOrdersRequest,
            RetryRefundRequest, WatchOrderRequest,
        },
        outbound::v1::{
            GetShipmentRequest, ListShipmentsRequest,
            outbound_service_client::OutboundServiceClient,
        },
        product::v1::{
            AdjustStockRequest, GetProductRequest, ListProductsRequest, ReconcileStockRequest,
        },
    };

    let stack = Stack::start(&[]).await.unwrap();
    let ops = token("ops-audit", Role::Admin);
    let nil = "00000000-0000-0000-0000-000000000000".to_owned();
    // What each call answers does not matter (most find nothing): the caller is logged before.
    let mut products = ProductStockServiceClient::new(stack.product_stock.channel().await.unwrap());
    let _ = products
        .create_product(with_token(
            CreateProductRequest {
                sku: "AUDIT-1".into(),
                name: "audited".into(),
                price_cents: 100,
                initial_stock: 1,
                per_user_limit: 0,
                deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
                stock_buckets: 0,
                ..Default::default()
            },
            &ops,
        ))
        .await;
    let _ = products
        .get_product(with_token(
            GetProductRequest {
                sku: "AUDIT-1".into(),
            },
            &ops,
        ))
        .await;
    let _ = products
        .list_products(with_token(ListProductsRequest::default(), &ops))
        .await;
    let _ = products
        .adjust_stock(with_token(
            AdjustStockRequest {
                request_id: "audit-adj".into(),
                sku: "AUDIT-1".into(),
                delta: 1,
                reason: "audit".into(),
            },
            &ops,
        ))
        .await;
    let _ = products
        .reconcile_stock(with_token(
            ReconcileStockRequest {
                skus: vec!["AUDIT-1".into()],
                repair: false,
            },
            &ops,
        ))
        .await;

    let mut orders = OrderServiceClient::new(stack.order.channel().await.unwrap());
    let _ = orders
        .get_order(with_token(
            GetOrderRequest {
                order_id: nil.clone(),
            },
            &ops,
        ))
        .await;
    let _ = orders
        .list_orders(with_token(ListOrdersRequest::default(), &ops))
        .await;
    let _ = orders
        .watch_order(with_token(
            WatchOrderRequest {
                order_id: nil.clone(),
            },
            &ops,
        ))
        .await;
    let _ = orders
        .cancel_order(with_token(
            CancelOrderRequest {
                order_id: nil.clone(),
            },
            &ops,
        ))
        .await;
    let _ = orders
        .list_stuck_orders(with_token(ListStuckOrdersRequest::default(), &ops))
        .await;
    let _ = orders
        .list_refunds(with_token(ListRefundsRequest::default(), &ops))
        .await;
    let _ = orders
        .retry_refund(with_token(
            RetryRefundRequest {
                order_id: nil.clone(),
            },
            &ops,
        ))
        .await;

    let mut shipments = OutboundServiceClient::new(stack.outbound.channel().await.unwrap());
    let _ = shipments
        .get_shipment(with_token(
            GetShipmentRequest {
                order_id: nil.clone(),
            },
            &ops,
        ))
        .await;
    let _ = shipments
        .list_shipments(with_token(ListShipmentsRequest::default(), &ops))
        .await;

    for service in [&stack.product_stock, &stack.order, &stack.outbound] {
        let mut dlq = DeadLetterServiceClient::new(service.channel().await.unwrap());
        let _ = dlq
            .list_dead_letters(with_token(ListDeadLettersRequest::default(), &ops))
            .await;
        let _ = dlq
            .replay_dead_letters(with_token(
                ReplayDeadLettersRequest {
                    queue: "audit-queue".into(),
                    message_ids: Vec::new(),
                    all: true,
                },
                &ops,
            ))
            .await;
        let _ = dlq
            .discard_dead_letters(with_token(
                DiscardDeadLettersRequest {
                    queue: "audit-queue".into(),
                    message_ids: Vec::new(),
                    all: true,
                    reason: "audit".into(),
                },
                &ops,
            ))
            .await;
        // A buyer's attempt at an admin-only call is logged too, as refused.
        let e = dlq
            .list_dead_letters(user("mallory", ListDeadLettersRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
    }

    let dead_letters = ["ListDeadLetters", "ReplayDeadLetters", "DiscardDeadLetters"];
    let expected: [(&flashsale_e2e::Service, Vec<&str>); 3] = [
        (
            &stack.product_stock,
            [
                "CreateProduct",
                "GetProduct",
                "ListProducts",
                "AdjustStock",
                "ReconcileStock",
            ]
            .into_iter()
            .chain(dead_letters)
            .collect(),
        ),
        (
            &stack.order,
            [
                "GetOrder",
                "ListOrders",
                "WatchOrder",
                "CancelOrder",
                "ListStuckOrders",
                "ListRefunds",
                "RetryRefund",
            ]
            .into_iter()
            .chain(dead_letters)
            .collect(),
        ),
        (
            &stack.outbound,
            ["GetShipment", "ListShipments"]
                .into_iter()
                .chain(dead_letters)
                .collect(),
        ),
    ];
    for (service, actions) in expected {
        let logged = eventually(Duration::from_secs(10), "audit lines", || async {
            let log = service.log_text();
            (actions.iter().all(|a| audited(&log, a, "ops-audit", false))
                && audited(&log, "ListDeadLetters", "mallory", true))
            .then_some(())
        })
        .await;
        if logged.is_err() {
            let log = service.log_text();
            let missing: Vec<&&str> = actions
                .iter()
                .filter(|a| !audited(&log, a, "ops-audit", false))
                .collect();
            panic!(
                "{}: no audit line for {missing:?} (or for the refused attempt):\n{log}",
                service.name
            );
        }
    }
}
