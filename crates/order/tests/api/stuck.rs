//! Stuck orders: counted per status, listed oldest first with the event that would move them
//! (an unsent outbox row, a parked dead letter), and bad input refused.

use std::time::Duration;

use flashsale_messaging::{envelope, waiting::Place};
use flashsale_order::{
    app::Stuck,
    config::{SagaSettings, Settings},
    domain::Status,
};
use flashsale_proto::{
    events::v1::{OrderPaid, StockReserved, envelope::Payload},
    order::v1::{ListStuckOrdersRequest, OrderStatus, WaitingPlace},
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{as_admin, as_user, migrated_orders_db, spawn_stack};

/// Writes an order in `status`, last changed `minutes` ago (AWAITING_PAYMENT: its deadline
/// `minutes` ago); returns its id.
async fn order_in(db: &DatabaseConnection, status: &str, minutes: i32) -> Uuid {
    let id = Uuid::new_v4();
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status, cancel_reason, payment_deadline, payment_id, \
         created_at, updated_at) \
         VALUES ($1, 'alice', $2, 'STUCK-1', 1, 100, 100, 'RESERVE_THEN_COMMIT', $3, \
                 CASE WHEN $3 = 'CANCELLED' THEN 'USER_CANCELLED' END, \
                 CASE WHEN $3 = 'AWAITING_PAYMENT' THEN now() - make_interval(mins => $4) END, \
                 CASE WHEN $3 IN ('PAID', 'SHIPPED') THEN $2 END, \
                 now() - make_interval(mins => $4 + 1), \
                 CASE WHEN $3 = 'AWAITING_PAYMENT' THEN now() - make_interval(mins => $4 + 1) \
                      ELSE now() - make_interval(mins => $4) END)",
        [
            id.into(),
            id.to_string().into(),
            status.into(),
            minutes.into(),
        ],
    ))
    .await
    .unwrap();
    id
}

/// Parks `payload` (for order `id`) in the dead-letter store of queue `queue`.
async fn park(db: &DatabaseConnection, queue: &str, payload: Payload, id: Uuid) -> String {
    let env = envelope::new(payload, id.to_string(), "", "test");
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO dead_letters (queue, message_id, routing_key, message_type, error, \
         attempts, parked_at, payload) VALUES ($1, $2, $3, $3, 'handler failed', 3, now(), $4)",
        [
            queue.into(),
            Uuid::parse_str(&env.message_id).unwrap().into(),
            env.r#type.clone().into(),
            envelope::encode(&env).into(),
        ],
    ))
    .await
    .unwrap();
    env.message_id
}

fn reserved(id: Uuid) -> Payload {
    Payload::StockReserved(StockReserved {
        order_id: id.to_string(),
        sku: "STUCK-1".into(),
        quantity: 1,
        ..Default::default()
    })
}

#[tokio::test]
async fn stuck_orders_are_counted_and_listed_with_the_event_that_would_move_them() {
    let (_tdb, db) = migrated_orders_db().await;
    let pending = order_in(&db, "PENDING", 30).await;
    let paid = order_in(&db, "PAID", 20).await;
    let overdue = order_in(&db, "AWAITING_PAYMENT", 15).await;
    // Not stuck: young, within the payment deadline's grace, or ended.
    order_in(&db, "PENDING", 1).await;
    order_in(&db, "AWAITING_PAYMENT", 5).await;
    order_in(&db, "SHIPPED", 60).await;
    order_in(&db, "CANCELLED", 60).await;

    let parked = park(&db, "order.saga-events", reserved(pending), pending).await;
    let paid_event = envelope::new(
        Payload::OrderPaid(OrderPaid {
            order_id: paid.to_string(),
            ..Default::default()
        }),
        paid.to_string(),
        "",
        "order",
    );
    flashsale_messaging::outbox::enqueue(&db, &paid_event)
        .await
        .unwrap();

    let saga = SagaSettings {
        stuck_after_ms: 10 * 60 * 1000,
        ..SagaSettings::default()
    };
    let stuck = Stuck::new(db.clone(), &saga);
    assert_eq!(
        stuck.count().await.unwrap(),
        [
            (Status::Pending, 1),
            (Status::AwaitingPayment, 1),
            (Status::Paid, 1)
        ]
    );

    let page = stuck.list(0, 0, "").await.unwrap();
    let seen: Vec<_> = page
        .orders
        .iter()
        .map(|s| (s.order.order_id, s.order.status))
        .collect();
    assert_eq!(
        seen,
        [
            (pending, Status::Pending),
            (paid, Status::Paid),
            (overdue, Status::AwaitingPayment)
        ],
        "longest stuck first"
    );
    let events = |i: usize| {
        page.orders[i]
            .events
            .iter()
            .map(|w| (w.place, w.message_type.clone(), w.message_id.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        events(0),
        [(Place::DeadLetter, "stock.reserved".to_owned(), parked)]
    );
    assert_eq!(page.orders[0].events[0].queue, "order.saga-events");
    assert_eq!(
        events(1),
        [(
            Place::Outbox,
            "order.paid".to_owned(),
            paid_event.message_id
        )]
    );
    assert!(events(2).is_empty());

    // A longer threshold leaves the younger ones out; paging walks the rest.
    let older = stuck.list(25 * 60 * 1000, 0, "").await.unwrap();
    assert_eq!(older.orders.len(), 1);
    let first = stuck.list(0, 2, "").await.unwrap();
    assert_eq!(first.orders.len(), 2);
    let rest = stuck.list(0, 2, &first.next_page_token).await.unwrap();
    assert_eq!(rest.orders.len(), 1);
    assert_eq!(rest.orders[0].order.order_id, overdue);
    assert!(rest.next_page_token.is_empty());
    // A token is only good for the threshold it was issued with.
    assert!(stuck.list(60_000, 2, &first.next_page_token).await.is_err());
}

#[tokio::test]
async fn list_stuck_orders_over_grpc_is_for_admins_and_refuses_bad_input() {
    let app = spawn_stack(|s| s.saga.stuck_check_interval_ms = 1_000).await;
    let pending = order_in(&app.conn, "PENDING", 30).await;
    let queue = flashsale_order::api::amqp::topology(&app.settings.amqp)
        .queue()
        .to_owned();
    let parked = park(&app.conn, &queue, reserved(pending), pending).await;
    let mut c = app.client().await;

    let page = c
        .list_stuck_orders(as_admin(ListStuckOrdersRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        page.older_than_ms,
        i64::try_from(Settings::default().saga.stuck_after_ms).unwrap()
    );
    assert_eq!(page.orders.len(), 1, "{page:?}");
    let o = &page.orders[0];
    assert_eq!(
        (
            o.order_id.as_str(),
            o.status,
            o.sku.as_str(),
            o.user_id.as_str()
        ),
        (
            pending.to_string().as_str(),
            OrderStatus::Pending as i32,
            "STUCK-1",
            "alice"
        )
    );
    assert!(o.since.is_some() && o.update_time.is_some());
    assert_eq!(o.events.len(), 1);
    let e = &o.events[0];
    assert_eq!(
        (
            e.place,
            e.message_id.as_str(),
            e.r#type.as_str(),
            e.queue.as_str(),
            e.error.as_str(),
            e.attempts
        ),
        (
            WaitingPlace::DeadLetter as i32,
            parked.as_str(),
            "stock.reserved",
            queue.as_str(),
            "handler failed",
            3
        )
    );

    let denied = c
        .list_stuck_orders(as_user("alice", ListStuckOrdersRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    let bad = [
        (
            ListStuckOrdersRequest {
                older_than_ms: -1,
                ..Default::default()
            },
            "older_than_ms",
        ),
        (
            ListStuckOrdersRequest {
                older_than_ms: 31 * 86_400_000,
                ..Default::default()
            },
            "older_than_ms",
        ),
        (
            ListStuckOrdersRequest {
                page_size: -1,
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListStuckOrdersRequest {
                page_size: 501,
                ..Default::default()
            },
            "page_size",
        ),
        (
            ListStuckOrdersRequest {
                page_token: "o1.1.2.3".into(),
                ..Default::default()
            },
            "page_token",
        ),
    ];
    for (req, field) in bad {
        let e = c
            .list_stuck_orders(as_admin(req.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{req:?}");
        let fields = flashsale_platform::error::violated_fields(&e);
        assert!(fields.iter().any(|f| f == field), "{req:?}: {fields:?}");
    }
    assert_eq!(app.parked().await, 1, "listing changes nothing");

    // The gauge counts it at the next check.
    flashsale_test_support::eventually(Duration::from_secs(10), "stuck gauge", || async {
        let (_, body) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
            .await
            .unwrap();
        let at = |status: &str| {
            let series = format!("flashsale_orders_stuck{{status=\"{status}\"}} ");
            body.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .map(|v| v.trim().to_owned())
        };
        (at("PENDING").as_deref() == Some("1")
            && at("PAID").as_deref() == Some("0")
            && at("AWAITING_PAYMENT").as_deref() == Some("0"))
        .then_some(())
    })
    .await
    .unwrap();
}
