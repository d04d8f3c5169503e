//! `flashsale order stuck` and `flashsale dlq list|replay|discard` against product-stock and
//! order running in-process: a stuck order shows the event parked in the order service or in
//! product-stock, a replay moves the order on, a discard clears the parking, and bad flags are
//! refused before anything is called.

use flashsale_messaging::envelope;
use flashsale_platform::auth::Role;
use flashsale_proto::{
    events::v1::{OrderCreated, StockReserved, envelope::Payload},
    order::v1::OrderStatus,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use uuid::Uuid;

use crate::helpers::{Stack, command, output};

async fn connect(url: &str) -> DatabaseConnection {
    sea_orm::Database::connect(url).await.unwrap()
}

/// A PENDING order of alice's, last changed half an hour ago.
async fn stale_pending_order(db: &DatabaseConnection) -> Uuid {
    let id = Uuid::new_v4();
    db.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
         total_cents, deduction_policy, status, created_at, updated_at) \
         VALUES ($1, 'alice', $2, 'DLQ-1', 1, 100, 100, 'RESERVE_THEN_COMMIT', 'PENDING', \
                 now() - interval '30 minutes', now() - interval '30 minutes')",
        [id.into(), id.to_string().into()],
    ))
    .await
    .unwrap();
    id
}

/// Parks `payload` of order `id` in `db`'s dead-letter store for `queue`; its message id.
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

fn ids_of(list: &serde_json::Value) -> Vec<String> {
    list["deadLetters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["messageId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_stuck_order_shows_its_parked_event_and_a_replay_moves_it_on() {
    let stack = Stack::spawn().await;
    let (orders, stock) = (
        connect(&stack.order_db).await,
        connect(&stack.stock_db).await,
    );
    let reserved_here = stale_pending_order(&orders).await;
    let created_there = stale_pending_order(&orders).await;
    let reserved = Payload::StockReserved(StockReserved {
        order_id: reserved_here.to_string(),
        sku: "DLQ-1".into(),
        quantity: 1,
        ..Default::default()
    });
    let parked = park(&orders, &stack.order_queue, reserved, reserved_here).await;
    let created = Payload::OrderCreated(OrderCreated {
        order_id: created_there.to_string(),
        sku: "DLQ-1".into(),
        quantity: 1,
        ..Default::default()
    });
    let parked_there = park(&stock, &stack.stock_order_queue, created, created_there).await;

    // order stuck: both orders, each with where its event is parked.
    let stuck = stack
        .run(&["order", "stuck", "--older-than", "10m", "--json"])
        .await
        .json();
    assert_eq!(stuck["olderThanMs"], "600000", "{stuck}");
    let listed = stuck["orders"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{stuck}");
    let of = |id: Uuid| {
        listed
            .iter()
            .find(|o| o["orderId"] == id.to_string())
            .unwrap_or_else(|| panic!("{id} not listed: {stuck}"))
    };
    let here = of(reserved_here);
    assert_eq!(here["status"], "ORDER_STATUS_PENDING");
    assert_eq!(here["events"][0]["place"], "WAITING_PLACE_DEAD_LETTER");
    assert_eq!(here["events"][0]["type"], "stock.reserved");
    assert_eq!(here["events"][0]["messageId"], parked.as_str());
    let there = of(created_there);
    assert!(there["events"].as_array().is_none_or(Vec::is_empty));
    assert_eq!(there["parkedElsewhere"][0]["service"], "product-stock");
    assert_eq!(there["parkedElsewhere"][0]["type"], "order.created");
    assert_eq!(
        there["parkedElsewhere"][0]["correlationId"],
        created_there.to_string()
    );

    // The text form says how to replay each.
    let text = stack.run(&["order", "stuck"]).await;
    assert!(text.ok, "{}", text.stderr);
    let replay_hint = format!(
        "flashsale dlq replay --service order --queue {} --id {parked}",
        stack.order_queue
    );
    assert!(text.stdout.contains(&replay_hint), "{}", text.stdout);
    assert!(text.stdout.contains("2 stuck order(s)"), "{}", text.stdout);

    // dlq list, with and without a correlation filter.
    let list = stack
        .run(&["dlq", "list", "--service", "order"])
        .await
        .json();
    assert_eq!(ids_of(&list), std::slice::from_ref(&parked), "{list}");
    assert_eq!(
        list["deadLetters"][0]["correlationId"],
        reserved_here.to_string()
    );
    let other = Uuid::new_v4().to_string();
    let none = stack
        .run(&[
            "dlq",
            "list",
            "--service",
            "order",
            "--correlation-id",
            &other,
        ])
        .await
        .json();
    assert!(ids_of(&none).is_empty(), "{none}");

    // A queue the service does not have is the server's refusal, passed on.
    let unknown = stack
        .run(&[
            "dlq",
            "replay",
            "--service",
            "order",
            "--queue",
            "no.such.queue",
            "--id",
            &parked,
        ])
        .await;
    assert!(!unknown.ok);
    assert!(unknown.stderr.contains("NotFound"), "{}", unknown.stderr);

    // Replay: the order moves on, and is no longer stuck.
    let replay = stack
        .run(&[
            "dlq",
            "replay",
            "--service",
            "order",
            "--queue",
            &stack.order_queue,
            "--id",
            &parked,
        ])
        .await
        .json();
    assert_eq!(replay["replayed"], 1, "{replay}");
    stack
        .wait_status(
            "alice",
            &reserved_here.to_string(),
            OrderStatus::AwaitingPayment,
        )
        .await;
    let list = stack
        .run(&["dlq", "list", "--service", "order"])
        .await
        .json();
    assert!(ids_of(&list).is_empty(), "{list}");

    // Discard at product-stock: gone from its list.
    let discard = stack
        .run(&[
            "dlq",
            "discard",
            "--service",
            "product-stock",
            "--queue",
            &stack.stock_order_queue,
            "--id",
            &parked_there,
            "--reason",
            "the order is cancelled by hand",
        ])
        .await
        .json();
    assert_eq!(discard["discarded"], 1, "{discard}");
    let list = stack
        .run(&["dlq", "list", "--service", "product-stock"])
        .await
        .json();
    assert!(ids_of(&list).is_empty(), "{list}");

    let stuck = stack
        .run(&["order", "stuck", "--older-than", "10m", "--json"])
        .await
        .json();
    let left: Vec<_> = stuck["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["orderId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, [created_there.to_string()], "{stuck}");

    // Only an admin may list stuck orders.
    let user = flashsale_test_support::grpc::token("alice", Role::User);
    let denied = stack.run(&["order", "--token", &user, "stuck"]).await;
    assert!(!denied.ok);
    assert!(
        denied.stderr.contains("PermissionDenied"),
        "{}",
        denied.stderr
    );
}

#[tokio::test]
async fn bad_dlq_and_stuck_flags_are_refused_with_a_clear_message() {
    let id = Uuid::new_v4().to_string();
    let cases: [(&[&str], &str); 9] = [
        (&["dlq", "list"], "--service is required"),
        (&["dlq", "list", "--service", "nowhere"], "invalid value"),
        (
            &["dlq", "replay", "--service", "order", "--queue", "q"],
            "name the messages with --id",
        ),
        (
            &[
                "dlq",
                "replay",
                "--service",
                "order",
                "--queue",
                "q",
                "--all",
            ],
            "add --yes",
        ),
        (
            &[
                "dlq",
                "replay",
                "--service",
                "order",
                "--queue",
                "q",
                "--id",
                "nope",
            ],
            "not a message id",
        ),
        (
            &[
                "dlq",
                "replay",
                "--service",
                "order",
                "--queue",
                "q",
                "--id",
                &id,
                "--all",
            ],
            "cannot be used with",
        ),
        (
            &[
                "dlq",
                "discard",
                "--service",
                "order",
                "--queue",
                "q",
                "--id",
                &id,
            ],
            "--reason",
        ),
        (
            &[
                "dlq",
                "discard",
                "--service",
                "order",
                "--queue",
                "q",
                "--id",
                &id,
                "--reason",
                " ",
            ],
            "--reason must be 1..=500 characters",
        ),
        (&["order", "stuck", "--older-than", "10x"], "not an age"),
    ];
    for (args, says) in cases {
        let mut cmd = command(args);
        // Nothing listens here: a refusal must come before any call.
        cmd.env("FLASHSALE_ORDER_URL", "http://127.0.0.1:1");
        let run = output(cmd).await;
        assert!(!run.ok, "{args:?} was accepted: {}", run.stdout);
        assert!(
            run.stderr.contains(says),
            "{args:?}: `{}` does not say `{says}`",
            run.stderr
        );
        assert!(
            !run.stderr.contains("connect to"),
            "{args:?} called a service: {}",
            run.stderr
        );
    }
}
