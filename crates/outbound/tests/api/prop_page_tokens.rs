//! Generated page tokens against the outbound service's listings, ListShipments and
//! ListDeadLetters: arbitrary Unicode (multi-byte and control characters among it), bytes made
//! text, and near misses of a token the service issued. A token it issued is served; anything
//! else is INVALID_ARGUMENT naming `page_token`, never another code (a handler that panics reads
//! as CANCELLED), and no answer changes a row (see `flashsale_test_support::page_tokens`).

use flashsale_messaging::envelope;
use flashsale_proto::{
    events::v1::{OrderPaid, envelope::Payload},
    outbound::v1::{
        ListShipmentsRequest, ShipmentStatus, outbound_service_client::OutboundServiceClient,
    },
    product::v1::DeductionPolicy,
};
use flashsale_test_support::{
    generated::{park, table_digest},
    grpc::channel,
    page_tokens::{check_dead_letter_page_tokens, check_page_tokens},
};
use sea_orm::{ConnectionTrait as _, DatabaseConnection};
use uuid::Uuid;

use crate::{helpers::spawn_app, stack::admin};

/// Every table of the outbound service.
const TABLES: [&str; 5] = [
    "shipments",
    "shipment_attempts",
    "outbox:message_id,routing_key,payload",
    "inbox",
    "dead_letters",
];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn shipments_req(page_token: String) -> ListShipmentsRequest {
    ListShipmentsRequest {
        status: ShipmentStatus::Shipped as i32,
        page_size: 1,
        page_token,
        older_than_ms: 60_000,
    }
}

async fn list_shipments(port: u16, page_token: String) -> Result<String, tonic::Status> {
    let ch = channel(port)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:#}")))?;
    let page = OutboundServiceClient::new(ch)
        .list_shipments(admin(shipments_req(page_token)))
        .await?;
    Ok(page.into_inner().next_page_token)
}

#[test]
fn list_shipments_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, conn, issued) = rt.block_on(async {
        let app = spawn_app().await;
        let conn: DatabaseConnection = app.db.connect().await.unwrap();
        // Shipped ones, all older than the filter's minute: nothing for the shipping worker to
        // do.
        for minutes in [5, 4, 3] {
            let id = Uuid::new_v4();
            conn.execute_unprepared(&format!(
                "INSERT INTO shipments (shipment_id, order_id, user_id, sku, quantity, policy, \
                 payment_id, status, attempts, created_at) VALUES ('{id}', '{id}', 'alice', \
                 'TOK', 1, 'RESERVE_THEN_COMMIT', 'pay-{id}', 'SHIPPED', 1, \
                 now() - make_interval(mins => {minutes}))"
            ))
            .await
            .unwrap();
        }
        let mut issued = Vec::new();
        let mut next = list_shipments(app.grpc_port, String::new()).await.unwrap();
        while !next.is_empty() {
            issued.push(next.clone());
            next = list_shipments(app.grpc_port, next).await.unwrap();
        }
        (app, conn, issued)
    });
    assert_eq!(issued.len(), 2, "{issued:?}");
    let port = app.grpc_port;
    let result = check_page_tokens(
        &rt,
        issued,
        128,
        |t| async move { list_shipments(port, t).await.map(drop) },
        || table_digest(&conn, &TABLES),
    );
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn list_dead_letters_answers_any_page_token_with_a_page_or_invalid_argument_naming_it() {
    let rt = runtime();
    let (app, conn, queue) = rt.block_on(async {
        let app = spawn_app().await;
        let conn: DatabaseConnection = app.db.connect().await.unwrap();
        let queue = flashsale_outbound::api::amqp::topology(&app.settings.amqp)
            .queue()
            .to_owned();
        for _ in 0..3 {
            let order = Uuid::new_v4();
            let paid = OrderPaid {
                order_id: order.to_string(),
                user_id: "alice".into(),
                sku: "GONE".into(),
                quantity: 1,
                payment_id: format!("pay-{order}"),
                amount_cents: 100,
                deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
            };
            let env = envelope::new(Payload::OrderPaid(paid), order.to_string(), "", "order");
            park(&conn, &queue, &env).await.unwrap();
        }
        (app, conn, queue)
    });
    let result = check_dead_letter_page_tokens(&rt, app.grpc_port, &conn, &TABLES, &queue, 96);
    drop(app);
    if let Err(e) = result {
        panic!("{e}");
    }
}
