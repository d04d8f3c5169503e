//! An admin's write-off takes only the units that are free: on hand, less reserved, less the
//! units the gate holds for orders acknowledged to their buyers whose `order.created` has not
//! reached the database yet (a broker outage, a backlog). Taking those would cancel the
//! acknowledged orders once their event arrives.

use flashsale_proto::product::v1::{AdjustStockRequest, DeductionPolicy, Product};
use tonic::Code;
use uuid::Uuid;

use crate::{
    buckets::{try_reserve_with, user_in},
    helpers::{TestApp, admin, reason, spawn_app},
    saga::created,
};

const RTC: DeductionPolicy = DeductionPolicy::ReserveThenCommit;

pub fn write_off_req(request_id: &str, sku: &str, units: i64) -> AdjustStockRequest {
    AdjustStockRequest {
        request_id: request_id.into(),
        sku: sku.into(),
        delta: -units,
        reason: "breakage".into(),
    }
}

/// An order acknowledged to its buyer: units held in the gate, its `order.created` not applied.
pub struct Acked {
    pub order: Uuid,
    pub user: String,
    pub qty: i64,
}

impl TestApp {
    pub async fn acknowledge(&self, user: &str, sku: &str, qty: i64) -> Acked {
        let order = Uuid::new_v4();
        try_reserve_with(&mut self.client().await, order, user, sku, qty)
            .await
            .unwrap();
        Acked {
            order,
            user: user.to_owned(),
            qty,
        }
    }

    pub async fn write_off(
        &self,
        request_id: &str,
        sku: &str,
        units: i64,
    ) -> Result<Product, tonic::Status> {
        self.client()
            .await
            .adjust_stock(admin(write_off_req(request_id, sku, units)))
            .await
            .map(|r| r.into_inner().product.unwrap())
    }

    /// The product's (available, held) in the gate, summed over its buckets.
    pub async fn gate_of(&self, sku: &str, buckets: u32) -> (i64, i64) {
        let s = self
            .gate
            .product_snapshot(sku, buckets)
            .await
            .unwrap()
            .expect("the gate holds the product");
        (s.available, s.held)
    }

    /// (on_hand, reserved, adjustments, write-off ledger rows, stock.adjusted events).
    pub async fn stock_rows(&self, sku: &str) -> (i64, i64, i64, i64, usize) {
        let q = |col: &str| format!("SELECT {col} AS n FROM stock WHERE sku = '{sku}'");
        (
            self.count(&q("on_hand")).await,
            self.count(&q("reserved")).await,
            self.count(&format!(
                "SELECT COUNT(*) AS n FROM stock_adjustments WHERE sku = '{sku}'"
            ))
            .await,
            self.count(&format!(
                "SELECT COUNT(*) AS n FROM stock_ledger WHERE sku = '{sku}' AND kind = 'WRITE_OFF'"
            ))
            .await,
            self.outbox_of("stock.adjusted").await.len(),
        )
    }
}

/// Delivers every acknowledged order's `order.created` and checks each was persisted, none
/// refused for want of stock.
pub async fn persist_all(app: &TestApp, sku: &str, acked: &[Acked]) {
    let before = app
        .count(&format!(
            "SELECT reserved AS n FROM stock WHERE sku = '{sku}'"
        ))
        .await;
    for a in acked {
        app.publish(created(a.order, &a.user, sku, a.qty), &a.order.to_string())
            .await;
    }
    let units: i64 = acked.iter().map(|a| a.qty).sum();
    app.wait_count(
        &format!(
            "SELECT COUNT(*) AS n FROM reservations WHERE sku = '{sku}' AND state = 'RESERVED'"
        ),
        i64::try_from(acked.len()).unwrap(),
    )
    .await;
    assert_eq!(
        app.count(&format!(
            "SELECT reserved AS n FROM stock WHERE sku = '{sku}'"
        ))
        .await,
        before + units
    );
    assert!(
        app.outbox_of("stock.reservation_failed").await.is_empty(),
        "an acknowledged order was refused by the database"
    );
}

fn assert_refused_naming(err: &tonic::Status, free: i64) {
    assert_eq!(
        (err.code(), reason(err).as_str()),
        (Code::FailedPrecondition, "INSUFFICIENT_STOCK"),
        "{err:?}"
    );
    assert!(
        err.message()
            .contains(&format!("only {free} units are free")),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_write_off_of_more_than_is_free_is_refused_naming_the_free_units_and_changes_nothing() {
    let app = spawn_app().await;
    app.create("WO", 10, 0, RTC).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(app.acknowledge(&format!("u{i}"), "WO", 1).await);
    }
    assert_eq!(app.gate_of("WO", 1).await, (7, 3));

    for units in [10, 8] {
        let err = app.write_off("w-10", "WO", units).await.unwrap_err();
        assert_refused_naming(&err, 7);
        assert_eq!(app.stock_rows("WO").await, (10, 0, 0, 0, 0));
        assert_eq!(app.gate_of("WO", 1).await, (7, 3));
    }

    // The refusal left no trace of its request id: once units are free, the same request is
    // judged afresh and succeeds.
    app.client()
        .await
        .adjust_stock(admin(AdjustStockRequest {
            request_id: "restock".into(),
            sku: "WO".into(),
            delta: 3,
            reason: "delivery".into(),
        }))
        .await
        .unwrap();
    let p = app.write_off("w-10", "WO", 10).await.unwrap();
    assert_eq!((p.on_hand, p.gate_available), (3, 0));
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 2).await;
    assert_eq!(app.gate_of("WO", 1).await, (0, 3));
    persist_all(&app, "WO", &acked).await;
    assert_eq!(app.gate_of("WO", 1).await, (0, 0));
}

#[tokio::test]
async fn a_write_off_of_exactly_the_free_units_leaves_every_acknowledged_order_its_units() {
    let app = spawn_app().await;
    app.create("WX", 10, 0, RTC).await;
    let mut acked = Vec::new();
    for i in 0..3 {
        acked.push(app.acknowledge(&format!("u{i}"), "WX", 1).await);
    }
    let p = app.write_off("w-7", "WX", 7).await.unwrap();
    assert_eq!((p.on_hand, p.reserved, p.gate_available), (3, 0, 0));
    assert_eq!(app.stock_rows("WX").await, (3, 0, 1, 1, 1));
    // The stock.adjusted event applies it again: nothing more leaves the gate.
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(app.gate_of("WX", 1).await, (0, 3));
    // The broker is back: every acknowledged order is persisted, none cancelled.
    persist_all(&app, "WX", &acked).await;
    assert_eq!(app.gate_of("WX", 1).await, (0, 0));
    // Nothing is free now.
    let err = app.write_off("w-1", "WX", 1).await.unwrap_err();
    assert_refused_naming(&err, 0);
}

#[tokio::test]
async fn a_write_off_of_a_bucketed_product_counts_the_holds_of_every_bucket() {
    const BUCKETS: u32 = 4;
    let app = spawn_app().await;
    app.create_bucketed("WB", 12, 0, BUCKETS).await;
    assert_eq!(
        app.buckets_of("WB", BUCKETS).await,
        [(3, 0, 0), (3, 0, 0), (3, 0, 0), (3, 0, 0)]
    );
    let mut acked = Vec::new();
    for (tag, bucket) in [("a", 0), ("b", 0), ("c", 2)] {
        let user = user_in(tag, bucket, BUCKETS);
        acked.push(app.acknowledge(&user, "WB", 1).await);
    }
    let before = app.buckets_of("WB", BUCKETS).await;
    assert_eq!(before, [(1, 2, 0), (3, 0, 0), (2, 1, 0), (3, 0, 0)]);

    let err = app.write_off("wb-10", "WB", 10).await.unwrap_err();
    assert_refused_naming(&err, 9);
    assert_eq!(app.stock_rows("WB").await, (12, 0, 0, 0, 0));
    assert_eq!(app.buckets_of("WB", BUCKETS).await, before);

    // Exactly what is free: every bucket's counter empties, every hold stays.
    let p = app.write_off("wb-9", "WB", 9).await.unwrap();
    assert_eq!((p.on_hand, p.gate_available), (3, 0));
    app.wait_count("SELECT COUNT(*) AS n FROM inbox", 1).await;
    assert_eq!(
        app.buckets_of("WB", BUCKETS).await,
        [(0, 2, 0), (0, 0, 0), (0, 1, 0), (0, 0, 0)]
    );
    persist_all(&app, "WB", &acked).await;
    assert_eq!(app.gate_of("WB", BUCKETS).await, (0, 0));
}

/// Reservations and write-offs of `sku` at once: every write-off is applied whole or refused
/// INSUFFICIENT_STOCK, the gate never drops below the units held for acknowledged orders, and
/// every acknowledged order is persisted afterwards.
async fn race_write_offs_with_reservations(app: &TestApp, sku: &str, buckets: u32) {
    const STOCK: i64 = 60;
    const BUYERS: usize = 40;
    const WRITE_OFFS: usize = 12;
    const UNITS: i64 = 3;
    let client = app.client().await;
    let buyers = (0..BUYERS).map(|i| {
        let mut c = client.clone();
        let user = format!("{sku}-buyer-{i}");
        async move {
            let order = Uuid::new_v4();
            try_reserve_with(&mut c, order, &user, sku, 1)
                .await
                .ok()
                .map(|()| Acked {
                    order,
                    user,
                    qty: 1,
                })
        }
    });
    let write_offs = (0..WRITE_OFFS).map(|i| {
        let mut c = client.clone();
        async move {
            loop {
                match c
                    .adjust_stock(admin(write_off_req(&format!("{sku}-w{i}"), sku, UNITS)))
                    .await
                {
                    Ok(_) => return true,
                    Err(e) if e.code() == Code::Unavailable => continue,
                    Err(e) => {
                        assert_eq!(reason(&e), "INSUFFICIENT_STOCK", "{e:?}");
                        return false;
                    }
                }
            }
        }
    });
    let (acked, applied) = tokio::join!(
        futures_util::future::join_all(buyers),
        futures_util::future::join_all(write_offs)
    );
    let acked: Vec<Acked> = acked.into_iter().flatten().collect();
    let written_off = UNITS * applied.iter().filter(|a| **a).count() as i64;
    let held = acked.len() as i64;
    let (on_hand, reserved, ..) = app.stock_rows(sku).await;
    assert_eq!((on_hand, reserved), (STOCK - written_off, 0));
    let (available, gate_held) = app.gate_of(sku, buckets).await;
    assert_eq!(gate_held, held, "every acknowledged order keeps its hold");
    assert!(available >= 0);
    assert_eq!(
        available + gate_held,
        on_hand,
        "nothing was clamped: the gate and the database agree"
    );
    assert!(held + written_off <= STOCK);
    persist_all(app, sku, &acked).await;
}

#[tokio::test]
async fn write_offs_racing_reservations_never_take_an_acknowledged_orders_units() {
    let app = spawn_app().await;
    app.create("RACE", 60, 0, RTC).await;
    race_write_offs_with_reservations(&app, "RACE", 1).await;
}

#[tokio::test]
async fn write_offs_racing_reservations_of_a_bucketed_product_never_take_held_units() {
    let app = spawn_app().await;
    app.create_bucketed("RACEB", 60, 0, 4).await;
    race_write_offs_with_reservations(&app, "RACEB", 4).await;
}
