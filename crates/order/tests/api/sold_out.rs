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
    app::{Admission, Intake, SOLD_OUT_REMEMBERED, Verdict, write_pending},
    config::{AdmissionSettings, SagaSettings},
    domain::{OrderError, PlaceOrder, Policy, Refusal},
    infra::stock::{GateBuyers, Granted, StockPort},
};
use flashsale_proto::{
    order::v1::{CancelOrderRequest, CreateOrderResponse, OrderStatus},
    product::v1::ReconcileStockRequest,
};

use crate::helpers::{Client, TestApp, as_admin, as_user, create_req, reason, spawn_stack};

/// A gate that is sold out and lists its buyers with a refills count (no list when the caller
/// knows the count); counts the reservations it is asked for and the lists it sends.
struct SoldOutGate {
    reserves: AtomicUsize,
    /// The buyers and the refills count.
    state: std::sync::Mutex<(Vec<String>, String)>,
    full_reads: AtomicUsize,
    kept_reads: AtomicUsize,
}

impl SoldOutGate {
    fn new(buyers: &[&str], refills: &str) -> Self {
        Self {
            reserves: AtomicUsize::new(0),
            state: std::sync::Mutex::new((
                buyers.iter().map(|b| (*b).to_owned()).collect(),
                refills.to_owned(),
            )),
            full_reads: AtomicUsize::new(0),
            kept_reads: AtomicUsize::new(0),
        }
    }

    /// Units came back and `buyer` took them: the count moves.
    fn refill_for(&self, buyer: &str, refills: &str) {
        let mut s = self.state.lock().unwrap();
        s.0.push(buyer.to_owned());
        s.1 = refills.to_owned();
    }
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
        Err(OrderError::Refused(Refusal::SoldOut, "sold out".into()))
    }

    async fn buyers(&self, _sku: &str, known_refills: &str) -> Result<GateBuyers, OrderError> {
        let (buyers, refills) = self.state.lock().unwrap().clone();
        let unchanged = !known_refills.is_empty() && known_refills == refills;
        if unchanged {
            self.kept_reads.fetch_add(1, Ordering::SeqCst);
        } else {
            self.full_reads.fetch_add(1, Ordering::SeqCst);
        }
        Ok(GateBuyers {
            available: 0,
            users: (!unchanged).then_some(buyers),
            refills,
            unchanged,
        })
    }
}

/// CreateOrder over `conn` and `gate`, with a sold-out memory of `sold_out_cache_ms`.
fn orders_over(
    conn: &sea_orm::DatabaseConnection,
    gate: Arc<SoldOutGate>,
    sold_out_cache_ms: u64,
) -> Intake {
    let settings = SagaSettings {
        sold_out_cache_ms,
        ..SagaSettings::default()
    };
    Intake::new(
        conn.clone(),
        gate,
        &settings,
        Admission::new(conn.clone(), &AdmissionSettings::default()),
        flashsale_platform::failpoint::Failpoints::default(),
    )
}

fn refusal(r: Result<(flashsale_order::domain::Order, bool), OrderError>) -> Refusal {
    match r {
        Err(OrderError::Refused(refusal, _)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn after_a_sell_out_only_possible_replayers_reach_the_gate() {
    let (_db, conn) = super::helpers::migrated_orders_db().await;
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
    let gate = Arc::new(SoldOutGate::new(&["alice"], "100"));
    let orders = orders_over(&conn, gate.clone(), 60_000);
    let place = |user: &str, key: &str| PlaceOrder::new(user, key, "HOT", 1, 10).unwrap();
    let calls = || gate.reserves.load(Ordering::SeqCst);

    // The first SOLD_OUT comes from the gate; the list of possible replayers is read meanwhile.
    assert_eq!(
        refusal(orders.place(place("bob", "b1")).await),
        Refusal::SoldOut
    );
    assert_eq!(calls(), 1);
    flashsale_test_support::eventually(Duration::from_secs(10), "refused from memory", || {
        let (orders, gate) = (orders.clone(), gate.clone());
        let place = place("carol", "c1");
        async move {
            let before = gate.reserves.load(Ordering::SeqCst);
            let r = orders.place(place).await;
            (refusal(r) == Refusal::SoldOut && gate.reserves.load(Ordering::SeqCst) == before)
                .then_some(())
        }
    })
    .await
    .unwrap();
    let before = calls();
    for i in 0..50 {
        let r = orders.place(place(&format!("u{i}"), "k")).await;
        assert_eq!(refusal(r), Refusal::SoldOut);
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
async fn an_expired_list_is_kept_without_a_read_until_the_gate_says_units_came_back() {
    let (_db, conn) = super::helpers::migrated_orders_db().await;
    let gate = Arc::new(SoldOutGate::new(&["alice"], "100"));
    let orders = orders_over(&conn, gate.clone(), 100);
    let place = |user: &str| PlaceOrder::new(user, "k", "HOT", 1, 10).unwrap();
    // Requests from users who bought nothing keep coming for well over ten periods of the
    // memory: each expiry is followed by a check of the gate's refills count, never by a read
    // of the buyers.
    let until = tokio::time::Instant::now() + Duration::from_millis(1_200);
    let mut i = 0;
    while tokio::time::Instant::now() < until {
        i += 1;
        assert_eq!(
            refusal(orders.place(place(&format!("u{i}"))).await),
            Refusal::SoldOut
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(gate.full_reads.load(Ordering::SeqCst), 1, "one full read");
    let kept = gate.kept_reads.load(Ordering::SeqCst);
    assert!(kept >= 3, "the list was checked and kept {kept} times");
    assert!(
        gate.reserves.load(Ordering::SeqCst) < i / 2,
        "most requests were refused from memory ({} of {i} reached the gate)",
        gate.reserves.load(Ordering::SeqCst)
    );

    // Units came back and dave bought them (the event that says so was missed): the count
    // moved, so the next check reads the buyers again, and dave's replay reaches the gate.
    gate.refill_for("dave", "101");
    flashsale_test_support::eventually(Duration::from_secs(10), "dave in the list", || {
        let (orders, gate) = (orders.clone(), gate.clone());
        async move {
            let _ = orders.place(place("zed")).await;
            let found = gate.full_reads.load(Ordering::SeqCst) == 2
                && orders.sold_out().verdict("HOT", "dave") == Verdict::AskGate
                && orders.sold_out().verdict("HOT", "zed") == Verdict::Refuse;
            tokio::time::sleep(Duration::from_millis(5)).await;
            found.then_some(())
        }
    })
    .await
    .unwrap();
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

/// The value of `flashsale_sold_out_list_reads_total{read="<read>"}` on the service's
/// `/metrics` (0 while it was never counted).
async fn list_reads(app: &TestApp, read: &str) -> u64 {
    let (_, body) = flashsale_test_support::grpc::http_get(app.metrics_port, "/metrics")
        .await
        .unwrap();
    let series = format!("flashsale_sold_out_list_reads_total{{read=\"{read}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn with_the_real_gate_an_unchanged_list_is_kept_without_reading_it_again() {
    // 500 ms, not less: a list that expired more than one period ago is read in full again
    // (by design), and on a loaded test machine one turn of the loop below took over 100 ms.
    let app = spawn_stack(|s| s.saga.sold_out_cache_ms = 500).await;
    app.product("KEEP", 1, 0).await;
    app.order("alice", "a", "KEEP", 1).await.unwrap();
    let sold = app.order("bob", "b0", "KEEP", 1).await.unwrap_err();
    assert_eq!(reason(&sold), "SOLD_OUT");
    refused_from_memory(&app, "bob", "KEEP").await;
    // Several periods of the memory go by with refusals flowing: the list is checked, not read.
    flashsale_test_support::eventually(Duration::from_secs(20), "kept three times", || {
        let app = &app;
        async move {
            let _ = app
                .order("carol", &uuid::Uuid::new_v4().to_string(), "KEEP", 1)
                .await;
            tokio::time::sleep(Duration::from_millis(10)).await;
            (list_reads(app, "kept").await >= 3).then_some(())
        }
    })
    .await
    .unwrap();
    assert_eq!(list_reads(&app, "full").await, 1, "one full read");
}

/// Waits until `user`'s orders for `sku` are refused from this replica's sold-out memory (the
/// list of possible replayers is read in the background after the first SOLD_OUT).
async fn refused_from_memory(app: &TestApp, user: &str, sku: &str) {
    refused_from_memory_by(&app.client().await, user, sku).await
}

async fn refused_from_memory_by(c: &Client, user: &str, sku: &str) {
    order_until(c, user, sku, "a refusal from the sold-out memory", |r| {
        let err = r.err()?;
        (reason(&err) == "SOLD_OUT" && err.message() == SOLD_OUT_REMEMBERED).then_some(())
    })
    .await;
}

/// Retries `user`'s order for `sku` until one is accepted.
async fn buy_when_open(app: &TestApp, user: &str, sku: &str) -> CreateOrderResponse {
    buy_when_open_by(&app.client().await, user, sku).await
}

async fn buy_when_open_by(c: &Client, user: &str, sku: &str) -> CreateOrderResponse {
    order_until(
        c,
        user,
        sku,
        "the buyer gets the unit that came back",
        Result::ok,
    )
    .await
}

/// Orders one unit of `sku` as `user` through `c`, a new request id each time, until `pick`
/// takes the answer (within 20 s).
async fn order_until<T>(
    c: &Client,
    user: &str,
    sku: &str,
    what: &str,
    pick: impl Fn(Result<CreateOrderResponse, tonic::Status>) -> Option<T>,
) -> T {
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

#[tokio::test]
async fn every_order_replica_reopens_a_sold_out_product_when_units_come_back() {
    // Two order replicas over one database and one set of queues, as two pods; a minute-long
    // memory, so only each replica's own broadcast subscription can reopen the product within
    // the test's bound.
    let app = spawn_stack(|s| s.saga.sold_out_cache_ms = 60_000).await;
    let other = app.spawn_replica().await;
    let (a, b) = (app.client().await, other.client().await);
    app.product("TWIN", 1, 0).await;
    let first = app.order("alice", "a", "TWIN", 1).await.unwrap();
    app.wait_status("alice", &first.order_id, OrderStatus::AwaitingPayment)
        .await;
    for (c, user) in [(&a, "bob"), (&b, "carol")] {
        let sold = c
            .clone()
            .create_order(as_user(user, create_req(&format!("{user}-0"), "TWIN", 1)))
            .await
            .unwrap_err();
        assert_eq!(reason(&sold), "SOLD_OUT");
        refused_from_memory_by(c, user, "TWIN").await;
    }

    // Two units come back through a repair: product-stock says so once, and each replica hears
    // it on its own queue.
    app.stock_exec("UPDATE stock SET on_hand = on_hand + 2 WHERE sku = 'TWIN'")
        .await;
    let report = app
        .stock()
        .await
        .reconcile_stock(as_admin(ReconcileStockRequest {
            skus: vec!["TWIN".into()],
            repair: true,
        }))
        .await
        .unwrap()
        .into_inner()
        .reports;
    assert_eq!((report[0].drift, report[0].repaired), (-2, true));

    let on_a = buy_when_open_by(&a, "bob", "TWIN").await;
    let on_b = buy_when_open_by(&b, "carol", "TWIN").await;
    for order in [on_a, on_b] {
        assert!(!order.replayed);
        assert_eq!(order.order.unwrap().status, OrderStatus::Pending as i32);
    }
}
