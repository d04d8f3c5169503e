//! Products split into stock buckets, through the service: created with N buckets, sold to a
//! flood without overselling or stranding units, the per-user limit across buckets, persisted,
//! released, rebuilt after one bucket is lost, reconciled and restocked per bucket.

use std::collections::HashMap;

use deadpool_redis::redis;
use flashsale_product_stock::{domain::bucket_of, infra::gate::At};
use flashsale_proto::product::v1::{
    CreateProductRequest, DeductionPolicy, GetProductRequest, Product,
};
use flashsale_test_support::TestDatabase;
use tonic::Code;
use uuid::Uuid;

use crate::{
    helpers::{
        FakeStatus, TestApp, admin, reason, service, spawn_app, spawn_with, test_settings, user,
    },
    reserve::reserve_req,
    saga::{cancelled, created},
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

impl TestApp {
    pub(crate) async fn create_bucketed(
        &self,
        sku: &str,
        stock: i64,
        limit: u32,
        buckets: u32,
    ) -> Product {
        let req = CreateProductRequest {
            sku: sku.into(),
            name: format!("{sku} magnum"),
            price_cents: 1999,
            initial_stock: stock,
            per_user_limit: limit,
            deduction_policy: RTC as i32,
            stock_buckets: buckets,
            ..Default::default()
        };
        self.client()
            .await
            .create_product(admin(req))
            .await
            .unwrap()
            .into_inner()
            .product
            .unwrap()
    }

    /// Every bucket's (available, held, moving).
    pub(crate) async fn buckets_of(&self, sku: &str, buckets: u32) -> Vec<(i64, i64, i64)> {
        self.gate
            .bucket_states(sku, buckets)
            .await
            .unwrap()
            .into_iter()
            .map(|s| {
                let s = s.expect("every bucket is loaded");
                (s.available, s.held, s.moving)
            })
            .collect()
    }

    pub(crate) async fn gate_total(&self, sku: &str, buckets: u32) -> (i64, i64) {
        let s = self
            .gate
            .product_snapshot(sku, buckets)
            .await
            .unwrap()
            .unwrap();
        (s.available, s.held)
    }

    /// Reserves through the service, retrying UNAVAILABLE as a caller does; the refusal reason
    /// otherwise.
    pub(crate) async fn try_reserve(
        &self,
        order: Uuid,
        user_id: &str,
        sku: &str,
        q: i64,
    ) -> Result<(), String> {
        try_reserve_with(&mut self.client().await, order, user_id, sku, q).await
    }

    pub(crate) async fn reconcile(&self, sku: &str, repair: bool) -> (i64, i64, i64) {
        let r = self.reconcile_report(sku, repair).await;
        (r.gate_available, r.unpersisted_holds, r.drift)
    }
}

/// Reserves through `c`, retrying UNAVAILABLE as a caller does; the refusal reason otherwise
/// (the code and message when there is no reason).
pub(crate) async fn try_reserve_with(
    c: &mut crate::helpers::Client,
    order: Uuid,
    user_id: &str,
    sku: &str,
    q: i64,
) -> Result<(), String> {
    for _ in 0..20 {
        match c
            .reserve_stock(service(reserve_req(order, user_id, sku, q)))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == Code::Unavailable => continue,
            Err(e) if reason(&e).is_empty() => {
                return Err(format!("{:?} {}", e.code(), e.message()));
            }
            Err(e) => return Err(reason(&e)),
        }
    }
    panic!("no answer after 20 tries");
}

/// Takes `qty` units out of bucket `from` of `sku` for bucket `to`, as at `at_ms`, and lands
/// nothing: a borrower that died between the steps. The script's code and the units taken.
pub(crate) async fn strand(
    app: &TestApp,
    sku: &str,
    from: u32,
    to: u32,
    qty: i64,
    at_ms: i64,
) -> (String, i64) {
    let k = app.gate.keys_at(At::new(sku, from)).unwrap();
    let pool = flashsale_platform::redis::pool(&app.settings.redis).unwrap();
    let mut conn = pool.get().await.unwrap();
    let reply: (String, i64, String) = redis::cmd("EVAL")
        .arg(include_str!("../../src/infra/gate/lua/take.lua"))
        .arg(5)
        .arg(k.avail())
        .arg(k.moving())
        .arg(k.transfers())
        .arg(k.generation())
        .arg(k.refills())
        .arg(Uuid::new_v4().to_string())
        .arg(qty)
        .arg(to)
        .arg(at_ms)
        .query_async(&mut *conn)
        .await
        .unwrap();
    (reply.0, reply.1)
}

/// A user whose bucket (of `buckets`) is `bucket`, named after `tag`.
pub(crate) fn user_in(tag: &str, bucket: u32, buckets: u32) -> String {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|u| bucket_of(u, buckets) == bucket)
        .unwrap()
}

#[tokio::test]
async fn a_product_created_with_buckets_keeps_them_and_spreads_its_stock() {
    let app = spawn_app().await;
    let p = app.create_bucketed("BK-1", 20, 0, 8).await;
    assert_eq!(
        (p.stock_buckets, p.gate_available, p.available),
        (8, 20, 20)
    );
    assert_eq!(
        app.buckets_of("BK-1", 8)
            .await
            .iter()
            .map(|b| b.0)
            .collect::<Vec<_>>(),
        [3, 3, 3, 3, 2, 2, 2, 2]
    );
    let got = app
        .client()
        .await
        .get_product(user(GetProductRequest { sku: "BK-1".into() }))
        .await
        .unwrap()
        .into_inner()
        .product
        .unwrap();
    assert_eq!(got, p);
    // Left out: one bucket, the keys a product always had.
    let plain = app.create_bucketed("BK-2", 5, 0, 0).await;
    assert_eq!((plain.stock_buckets, plain.gate_available), (1, 5));
    assert_eq!(
        app.count("SELECT stock_buckets::bigint AS n FROM products WHERE sku = 'BK-2'")
            .await,
        1
    );
    assert!(
        app.gate
            .snapshot(At::new("BK-2", 1))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_bucketed_product_sells_exactly_its_stock_and_keeps_the_user_limit() {
    const STOCK: i64 = 40;
    const BUCKETS: u32 = 8;
    const LIMIT: i64 = 2;
    let app = spawn_app().await;
    app.create_bucketed("FLOOD", STOCK, LIMIT as u32, BUCKETS)
        .await;
    let clients: Vec<_> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    let mut tasks = Vec::new();
    for i in 0..300 {
        let mut c = clients[i % clients.len()].clone();
        let buyer = format!("fan-{}", i % 60);
        tasks.push(tokio::spawn(async move {
            let order = Uuid::new_v4();
            let got = try_reserve_with(&mut c, order, &buyer, "FLOOD", 1).await;
            (buyer, order, got)
        }));
    }
    let mut bought: HashMap<String, Vec<Uuid>> = HashMap::new();
    let mut refusals: HashMap<String, i64> = HashMap::new();
    for task in tasks {
        let (buyer, order, got) = task.await.unwrap();
        match got {
            Ok(()) => bought.entry(buyer).or_default().push(order),
            Err(reason) => *refusals.entry(reason).or_default() += 1,
        }
    }
    let sold: usize = bought.values().map(Vec::len).sum();
    assert_eq!(sold as i64, STOCK, "refusals: {refusals:?}");
    assert!(
        bought.values().all(|o| o.len() as i64 <= LIMIT),
        "{bought:?}"
    );
    assert!(
        refusals
            .keys()
            .all(|r| r == "SOLD_OUT" || r == "USER_LIMIT_EXCEEDED"),
        "{refusals:?}"
    );
    assert!(
        app.buckets_of("FLOOD", BUCKETS)
            .await
            .iter()
            .all(|(avail, _, moving)| *avail == 0 && *moving == 0),
        "sold out means every bucket is empty"
    );

    // The orders reach the database: every hold is persisted in its buyer's bucket.
    for (buyer, orders) in &bought {
        for order in orders {
            app.publish(created(*order, buyer, "FLOOD", 1), &order.to_string())
                .await;
        }
    }
    app.wait_count("SELECT reserved AS n FROM stock", STOCK)
        .await;
    assert_eq!(app.gate_total("FLOOD", BUCKETS).await, (0, 0));
    assert_eq!(app.reconcile("FLOOD", false).await, (0, 0, 0));

    // Cancelled orders give their units back to their buyers' buckets, and only those sell.
    let returned: Vec<(String, Uuid)> = bought
        .iter()
        .take(3)
        .map(|(b, o)| (b.clone(), o[0]))
        .collect();
    for (buyer, order) in &returned {
        app.publish(cancelled(*order, buyer, "FLOOD", 1), &order.to_string())
            .await;
    }
    app.wait_count("SELECT reserved AS n FROM stock", STOCK - 3)
        .await;
    let mut waited = 0;
    while app.gate_total("FLOOD", BUCKETS).await.0 != 3 && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    let states = app.buckets_of("FLOOD", BUCKETS).await;
    for (buyer, _) in &returned {
        assert!(
            states[bucket_of(buyer, BUCKETS) as usize].0 >= 1,
            "{states:?}"
        );
    }
    let mut again = 0;
    for i in 0..10 {
        if app
            .try_reserve(Uuid::new_v4(), &format!("late-{i}"), "FLOOD", 1)
            .await
            .is_ok()
        {
            again += 1;
        }
    }
    assert_eq!(again, 3);
    assert_eq!(app.reconcile("FLOOD", false).await, (0, 3, 0));
}

#[tokio::test]
async fn a_lost_bucket_rebuilds_the_whole_product_from_the_database_and_pending_orders() {
    const BUCKETS: u32 = 4;
    let db = TestDatabase::create().await.unwrap();
    let app = spawn_with(test_settings(&db), db).await;
    app.create_bucketed("LOST", 12, 0, BUCKETS).await;
    // One order persisted, one acknowledged whose order.created is not here yet.
    let (p_user, a_user) = (user_in("p", 2, BUCKETS), user_in("a", 2, BUCKETS));
    let (persisted, acked) = (Uuid::new_v4(), Uuid::new_v4());
    app.try_reserve(persisted, &p_user, "LOST", 2)
        .await
        .unwrap();
    app.publish(
        created(persisted, &p_user, "LOST", 2),
        &persisted.to_string(),
    )
    .await;
    app.wait_count("SELECT reserved AS n FROM stock", 2).await;
    app.try_reserve(acked, &a_user, "LOST", 3).await.unwrap();
    app.orders
        .put("LOST", acked, &a_user, 3, FakeStatus::Pending);

    // The node holding bucket 2 lost its data; the other buckets live on and keep selling.
    app.gate.forget(At::new("LOST", 2)).await.unwrap();
    assert!(
        app.gate
            .product_snapshot("LOST", BUCKETS)
            .await
            .unwrap()
            .is_none()
    );
    let (early, early_order) = (user_in("b", 1, BUCKETS), Uuid::new_v4());
    app.try_reserve(early_order, &early, "LOST", 1)
        .await
        .unwrap();
    app.orders
        .put("LOST", early_order, &early, 1, FakeStatus::Pending);
    // The first buyer of bucket 2 finds it missing: the product is rebuilt whole.
    let buyer = user_in("c", 2, BUCKETS);
    app.try_reserve(Uuid::new_v4(), &buyer, "LOST", 1)
        .await
        .unwrap();
    // 12 − 2 persisted − 3 + 1 acknowledged − 1 just sold.
    assert_eq!(app.gate_total("LOST", BUCKETS).await, (5, 3 + 1 + 1));
    let states = app.buckets_of("LOST", BUCKETS).await;
    assert_eq!(states[2].1, 3 + 1, "held in their buyers' bucket");
    assert_eq!(states[1].1, 1);
    // The acknowledged order's replay answers with it; its order.created persists it.
    let replay = app
        .client()
        .await
        .reserve_stock(service(reserve_req(acked, &a_user, "LOST", 3)))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed);
    app.publish(created(acked, &a_user, "LOST", 3), &acked.to_string())
        .await;
    app.wait_count("SELECT reserved AS n FROM stock", 5).await;
    assert_eq!(app.reconcile("LOST", false).await, (5, 2, 0));
    // The persisted buyer still counts in bucket 2: released, the units come back there.
    app.publish(
        cancelled(persisted, &p_user, "LOST", 2),
        &persisted.to_string(),
    )
    .await;
    app.wait_count("SELECT reserved AS n FROM stock", 3).await;
    let mut waited = 0;
    while app.gate_total("LOST", BUCKETS).await.0 != 7 && waited < 100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(app.gate_total("LOST", BUCKETS).await.0, 7);
    assert_eq!(app.reconcile("LOST", false).await, (7, 2, 0));
}
