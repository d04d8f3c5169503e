//! The sold-out short-circuit: once a product is sold out, a request that cannot be a replay of
//! an accepted one is refused from memory (no gate call), replays still get their order, and
//! units coming back (heard by every replica) reopen the product at once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_order::{
    adapters::stock::{GateBuyers, Granted, StockPort},
    app::{Orders, SOLD_OUT_REMEMBERED, WatchHub, write_pending},
    config::SagaSettings,
    domain::{OrderError, PlaceOrder, Policy},
};
use flashsale_proto::{
    order::v1::{CancelOrderRequest, CreateOrderResponse, OrderStatus},
    product::v1::ReconcileStockRequest,
};
use sea_orm_migration::MigratorTrait as _;

use crate::helpers::{TestApp, as_admin, as_user, create_req, reason, spawn_stack};

/// A gate that is sold out and lists `buyers`; counts the reservations it is asked for.
struct SoldOutGate {
    reserves: AtomicUsize,
    buyers: Vec<String>,
}

#[tonic::async_trait]
impl StockPort for SoldOutGate {
    async fn reserve(
        &self,
        _order_id: uuid::Uuid,
        _user_id: &str,
        _sku: &str,
        _quantity: i64,
    ) -> Result<Granted, OrderError> {
        self.reserves.fetch_add(1, Ordering::SeqCst);
        Err(OrderError::Refused("SOLD_OUT".into(), "sold out".into()))
    }

    async fn buyers(&self, _sku: &str) -> Result<GateBuyers, OrderError> {
        Ok(GateBuyers {
            available: 0,
            users: Some(self.buyers.clone()),
        })
    }
}

fn refused_reason(r: Result<(flashsale_order::domain::Order, bool), OrderError>) -> String {
    match r {
        Err(OrderError::Refused(reason, _)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn after_a_sell_out_only_possible_replayers_reach_the_gate() {
    let db = flashsale_test_support::TestDatabase::create()
        .await
        .unwrap();
    let conn = db.connect().await.unwrap();
    flashsale_order::migration::Migrator::up(&conn, None)
        .await
        .unwrap();
    // erin has an order in this database (e.g. cancelled since, so the gate no longer counts
    // her); alice holds units in the gate.
    write_pending(
        &conn,
        &PlaceOrder::new("erin", "e1", "HOT", 1, 10).unwrap(),
        100,
        Policy::ReserveThenCommit,
    )
    .await
    .unwrap();
    let gate = Arc::new(SoldOutGate {
        reserves: AtomicUsize::new(0),
        buyers: vec!["alice".into()],
    });
    let settings = SagaSettings {
        sold_out_cache_ms: 60_000,
        ..SagaSettings::default()
    };
    let amqp = flashsale_messaging::AmqpConfig::default();
    let orders = Orders::new(
        conn.clone(),
        gate.clone(),
        settings,
        flashsale_order::adapters::amqp::payment_timeout_queue(&amqp, Duration::from_secs(60)),
        WatchHub::new(),
        flashsale_platform::failpoint::Failpoints::default(),
    );
    let place = |user: &str, key: &str| PlaceOrder::new(user, key, "HOT", 1, 10).unwrap();
    let calls = || gate.reserves.load(Ordering::SeqCst);

    // The first SOLD_OUT comes from the gate; the list of possible replayers is read meanwhile.
    assert_eq!(
        refused_reason(orders.place(place("bob", "b1")).await),
        "SOLD_OUT"
    );
    assert_eq!(calls(), 1);
    flashsale_test_support::eventually(Duration::from_secs(10), "refused from memory", || {
        let (orders, gate) = (orders.clone(), gate.clone());
        let place = place("carol", "c1");
        async move {
            let before = gate.reserves.load(Ordering::SeqCst);
            let r = orders.place(place).await;
            (refused_reason(r) == "SOLD_OUT" && gate.reserves.load(Ordering::SeqCst) == before)
                .then_some(())
        }
    })
    .await
    .unwrap();
    let before = calls();
    for i in 0..50 {
        let r = orders.place(place(&format!("u{i}"), "k")).await;
        assert_eq!(refused_reason(r), "SOLD_OUT");
    }
    assert_eq!(calls(), before, "no gate call for users who bought nothing");
    // A buyer in the gate and a user with an order here still ask the gate.
    orders.place(place("alice", "a1")).await.unwrap_err();
    assert_eq!(calls(), before + 1, "alice asks the gate");
    orders.place(place("erin", "e2")).await.unwrap_err();
    assert_eq!(calls(), before + 2, "erin asks the gate");
    // Units came back: the product is open again.
    orders.sold_out().forget("HOT");
    orders.place(place("zed", "z1")).await.unwrap_err();
    assert_eq!(calls(), before + 3, "after forget, the gate answers");
}

#[tokio::test]
async fn units_coming_back_reopen_a_sold_out_product_at_once() {
    // A minute-long cache: only the broadcast of the released units can reopen the product
    // within the test's bound.
    let app = spawn_stack(|s| s.saga.sold_out_cache_ms = 60_000).await;
    app.product("BACK", 1, 0).await;
    let mut c = app.client().await;
    let first = app.order("alice", "a", "BACK", 1).await.unwrap();
    app.wait_status("alice", &first.order_id, OrderStatus::AwaitingPayment)
        .await;
    let sold = app.order("bob", "b0", "BACK", 1).await.unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    refused_from_memory(&app, "bob", "BACK").await;
    c.cancel_order(as_user(
        "alice",
        CancelOrderRequest {
            order_id: first.order_id.clone(),
        },
    ))
    .await
    .unwrap();
    let order = buy_when_open(&app, "bob", "BACK").await;
    assert!(!order.replayed);
    assert_eq!(
        order.order.unwrap().status,
        OrderStatus::Pending as i32,
        "a new order for the returned unit"
    );
}

/// Waits until `user`'s orders for `sku` are refused from this replica's sold-out memory (the
/// list of possible replayers is read in the background after the first SOLD_OUT).
async fn refused_from_memory(app: &TestApp, user: &str, sku: &str) {
    order_until(app, user, sku, "a refusal from the sold-out memory", |r| {
        let err = r.err()?;
        (reason(&err) == "SOLD_OUT" && err.message() == SOLD_OUT_REMEMBERED).then_some(())
    })
    .await;
}

/// Retries `user`'s order for `sku` until one is accepted.
async fn buy_when_open(app: &TestApp, user: &str, sku: &str) -> CreateOrderResponse {
    order_until(
        app,
        user,
        sku,
        "the buyer gets the unit that came back",
        Result::ok,
    )
    .await
}

/// Orders one unit of `sku` as `user`, a new request id each time, until `pick` takes the
/// answer (within 20 s).
async fn order_until<T>(
    app: &TestApp,
    user: &str,
    sku: &str,
    what: &str,
    pick: impl Fn(Result<CreateOrderResponse, tonic::Status>) -> Option<T>,
) -> T {
    let c = app.client().await;
    let (mut n, pick) = (0, &pick);
    flashsale_test_support::eventually(Duration::from_secs(20), what, || {
        n += 1;
        let (key, mut c) = (format!("{user}-try-{n}"), c.clone());
        async move {
            pick(
                c.create_order(as_user(user, create_req(&key, sku, 1)))
                    .await
                    .map(tonic::Response::into_inner),
            )
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_gate_repaired_upwards_reopens_a_sold_out_product_at_once() {
    // A minute-long cache: only product-stock's stock.gate_refilled can reopen the product
    // within the test's bound.
    let app = spawn_stack(|s| s.saga.sold_out_cache_ms = 60_000).await;
    app.product("FIX", 1, 0).await;
    let first = app.order("alice", "a", "FIX", 1).await.unwrap();
    app.wait_status("alice", &first.order_id, OrderStatus::AwaitingPayment)
        .await;
    let sold = app.order("bob", "b0", "FIX", 1).await.unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    refused_from_memory(&app, "bob", "FIX").await;

    // The database holds a unit the gate does not know of (a drift); an operator repairs it.
    app.stock_exec("UPDATE stock SET on_hand = on_hand + 1 WHERE sku = 'FIX'")
        .await;
    let report = app
        .stock()
        .await
        .reconcile_stock(as_admin(ReconcileStockRequest {
            skus: vec!["FIX".into()],
            repair: true,
        }))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!((report[0].drift, report[0].repaired), (-1, true));

    let order = buy_when_open(&app, "bob", "FIX").await;
    assert!(!order.replayed);
    assert_eq!(
        order.order.unwrap().status,
        OrderStatus::Pending as i32,
        "a new order for the repaired unit"
    );
}
