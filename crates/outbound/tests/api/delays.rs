//! Deduct, then ship, against the real outbound database, with product-stock and the warehouse
//! played by small fakes of their port traits that log every call: the deduction always comes
//! before the warehouse, a dependency that does not answer delays a shipment for as long as it
//! takes and never fails it, and the warehouse is asked once per shipment it ships.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_messaging::envelope;
use flashsale_outbound::{
    app::{Processed, Shipping},
    config::ShippingSettings,
    domain::Shipment,
    infra::{
        db,
        stock::{CommitError, StockCommitter},
        warehouse::{Warehouse, WarehouseError},
    },
    migration::Migrator,
};
use flashsale_proto::{
    events::v1::{OrderPaid, envelope::Payload},
    product::v1::DeductionPolicy,
};
use flashsale_test_support::{TestDatabase, eventually, probe};
use sea_orm::DatabaseConnection;
use sea_orm_migration::MigratorTrait as _;
use uuid::Uuid;

/// Every call the fakes answered, in order: `("commit", order)` or `("warehouse", shipment)`.
type Calls = Arc<Mutex<Vec<(&'static str, Uuid)>>>;

/// How a fake answers: transient for its first `transient` calls, then a refusal if `refuse`,
/// else OK.
struct Script {
    transient: usize,
    refuse: bool,
}

struct FakeStock {
    calls: Calls,
    script: Script,
}

#[tonic::async_trait]
impl StockCommitter for FakeStock {
    async fn commit(&self, order_id: Uuid) -> Result<(), CommitError> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(("commit", order_id));
            calls.iter().filter(|(k, _)| *k == "commit").count()
        };
        if n <= self.script.transient {
            Err(CommitError::Transient(
                "CommitReservation: DeadlineExpired".into(),
            ))
        } else if self.script.refuse {
            Err(CommitError::Permanent("CommitReservation: NotFound".into()))
        } else {
            Ok(())
        }
    }
}

struct FakeWarehouse {
    calls: Calls,
    script: Script,
}

#[tonic::async_trait]
impl Warehouse for FakeWarehouse {
    async fn ship(&self, s: &Shipment) -> Result<(), WarehouseError> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(("warehouse", s.shipment_id));
            calls.iter().filter(|(k, _)| *k == "warehouse").count()
        };
        if n <= self.script.transient {
            Err(WarehouseError::Transient("the warehouse timed out".into()))
        } else if self.script.refuse {
            Err(WarehouseError::Permanent("damaged on the shelf".into()))
        } else {
            Ok(())
        }
    }
}

struct Rig {
    shipping: Shipping,
    conn: DatabaseConnection,
    calls: Calls,
    _db: TestDatabase,
}

async fn rig(stock: Script, warehouse: Script) -> Rig {
    let db = TestDatabase::create().await.unwrap();
    let conn = db.connect().await.unwrap();
    Migrator::up(&conn, None).await.unwrap();
    let calls = Calls::default();
    let settings = ShippingSettings {
        retry_base_ms: 1,
        retry_max_ms: 2,
        ..ShippingSettings::default()
    };
    let shipping = Shipping::new(
        conn.clone(),
        Arc::new(FakeStock {
            calls: calls.clone(),
            script: stock,
        }),
        Arc::new(FakeWarehouse {
            calls: calls.clone(),
            script: warehouse,
        }),
        settings,
    );
    Rig {
        shipping,
        conn,
        calls,
        _db: db,
    }
}

fn paid(order: Uuid) -> flashsale_proto::events::v1::Envelope {
    let ev = OrderPaid {
        order_id: order.to_string(),
        user_id: "alice".into(),
        sku: "WINE-1".into(),
        quantity: 1,
        payment_id: format!("pay-{order}"),
        amount_cents: 100,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
    };
    envelope::new(Payload::OrderPaid(ev), order.to_string(), "", "order")
}

impl Rig {
    /// Delivers `order.paid` once, then sweeps until the shipment is terminal.
    async fn ship(&self, order: Uuid) -> Shipment {
        let env = paid(order);
        let Some(Payload::OrderPaid(ev)) = &env.payload else {
            unreachable!()
        };
        self.shipping.on_order_paid(&env, ev).await.unwrap();
        eventually(Duration::from_secs(30), "shipment terminal", || async {
            self.shipping.sweep_due().await.unwrap();
            let s = db::by_order(&self.conn, order).await.unwrap()?;
            s.status.is_terminal().then_some(s)
        })
        .await
        .unwrap()
    }

    fn calls(&self) -> Vec<(&'static str, Uuid)> {
        self.calls.lock().unwrap().clone()
    }

    async fn count(&self, sql: &str) -> i64 {
        probe::count(&self.conn, sql).await.unwrap()
    }
}

#[tokio::test]
async fn a_long_stock_outage_delays_the_shipment_which_then_ships_with_the_warehouse_asked_once() {
    let rig = rig(
        Script {
            transient: 25,
            refuse: false,
        },
        Script {
            transient: 0,
            refuse: false,
        },
    )
    .await;
    let order = Uuid::new_v4();
    let s = rig.ship(order).await;
    assert_eq!(
        s.status,
        flashsale_outbound::domain::ShipmentStatus::Shipped
    );
    assert!(s.stock_committed);
    assert_eq!(
        s.attempts, 26,
        "25 delayed attempts, then the one that shipped"
    );
    let calls = rig.calls();
    let commits = calls.iter().filter(|(k, _)| *k == "commit").count();
    let asks: Vec<_> = calls.iter().filter(|(k, _)| *k == "warehouse").collect();
    assert_eq!(commits, 26);
    assert_eq!(asks, [&("warehouse", s.shipment_id)], "asked once, by id");
    assert_eq!(
        calls.last().map(|c| c.0),
        Some("warehouse"),
        "the warehouse comes after the deduction: {calls:?}"
    );
    assert_eq!(
        rig.count("SELECT COUNT(*) AS n FROM shipment_attempts WHERE outcome = 'TRANSIENT' AND step = 'commit'")
            .await,
        25
    );
    let completed = probe::outbox(&rig.conn, Some("outbound.completed"))
        .await
        .unwrap();
    assert_eq!(completed.len(), 1);
    assert!(
        probe::outbox(&rig.conn, Some("outbound.failed"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_warehouse_that_does_not_answer_delays_the_shipment_without_a_second_deduction() {
    let rig = rig(
        Script {
            transient: 0,
            refuse: false,
        },
        Script {
            transient: 8,
            refuse: false,
        },
    )
    .await;
    let s = rig.ship(Uuid::new_v4()).await;
    assert_eq!(
        s.status,
        flashsale_outbound::domain::ShipmentStatus::Shipped
    );
    let calls = rig.calls();
    assert_eq!(
        calls.iter().filter(|(k, _)| *k == "commit").count(),
        1,
        "the deduction is remembered across delayed attempts: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|(k, _)| *k == "warehouse").count(), 9);
    assert_eq!(calls[0].0, "commit");
}

#[tokio::test]
async fn only_a_permanent_answer_fails_a_shipment() {
    // The warehouse refuses after the deduction: failed, with the deduction recorded, so the
    // order's cancel gives the unit back.
    let rig_w = rig(
        Script {
            transient: 3,
            refuse: false,
        },
        Script {
            transient: 2,
            refuse: true,
        },
    )
    .await;
    let s = rig_w.ship(Uuid::new_v4()).await;
    assert_eq!(s.status, flashsale_outbound::domain::ShipmentStatus::Failed);
    assert!(s.stock_committed);
    assert_eq!(s.failure_reason.as_deref(), Some("damaged on the shelf"));
    assert_eq!(s.attempts, 6, "3 + 2 delayed attempts, then the refusal");
    let failed = probe::outbox(&rig_w.conn, Some("outbound.failed"))
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);

    // product-stock refuses the deduction: failed, the warehouse never asked.
    let rig_s = rig(
        Script {
            transient: 4,
            refuse: true,
        },
        Script {
            transient: 0,
            refuse: false,
        },
    )
    .await;
    let s = rig_s.ship(Uuid::new_v4()).await;
    assert_eq!(s.status, flashsale_outbound::domain::ShipmentStatus::Failed);
    assert!(!s.stock_committed);
    assert!(rig_s.calls().iter().all(|(k, _)| *k == "commit"));
}

#[tokio::test]
async fn a_delayed_shipment_is_left_alone_by_the_sweeper_until_its_next_attempt_is_due() {
    let rig = rig(
        Script {
            transient: usize::MAX,
            refuse: false,
        },
        Script {
            transient: 0,
            refuse: false,
        },
    )
    .await;
    let settings = ShippingSettings {
        retry_base_ms: 60_000,
        retry_max_ms: 60_000,
        ..ShippingSettings::default()
    };
    let shipping = Shipping::new(
        rig.conn.clone(),
        Arc::new(FakeStock {
            calls: rig.calls.clone(),
            script: Script {
                transient: usize::MAX,
                refuse: false,
            },
        }),
        Arc::new(FakeWarehouse {
            calls: rig.calls.clone(),
            script: Script {
                transient: 0,
                refuse: false,
            },
        }),
        settings,
    );
    let order = Uuid::new_v4();
    let env = paid(order);
    let Some(Payload::OrderPaid(ev)) = &env.payload else {
        unreachable!()
    };
    assert_eq!(
        shipping.on_order_paid(&env, ev).await.unwrap(),
        Processed::Delayed
    );
    // Not due for at least 30 s: a sweep leaves it alone.
    assert_eq!(shipping.sweep_due().await.unwrap(), 0);
    assert_eq!(rig.calls().len(), 1);
    let s = db::by_order(&rig.conn, order).await.unwrap().unwrap();
    assert!(s.next_attempt_at > chrono::Utc::now() + chrono::Duration::seconds(29));
    assert!(!s.last_error.is_empty());
}
