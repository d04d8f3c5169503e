//! Two-step transfers between buckets: one cut short strands its units until the reconciler
//! returns them, one landed but not settled is settled without moving units again, and one from
//! before a rebuild never lands.

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::{At, ReserveOutcome};
use uuid::Uuid;

use crate::{
    buckets::user_in,
    helpers::{NOW, SKU, TestGate},
};

#[tokio::test]
async fn a_transfer_cut_short_strands_units_until_the_reconciler_returns_them() {
    let t = TestGate::new();
    t.load_buckets(2, 4).await; // [2, 2]
    let alice = user_in(0, 2);
    // A borrower for bucket 0 died after taking units from bucket 1.
    let (id, taken, generation) = t.take_only(1, 0, 1).await;
    assert_eq!(taken, 1);
    let states = t.states(2).await;
    assert_eq!((states[1].available, states[1].moving), (1, 1));
    // Stranded units are never sold twice, and nothing says sold out while units are moving.
    assert!(matches!(
        t.reserve_in(2, &alice, 2, 0).await,
        ReserveOutcome::Reserved { .. }
    ));
    let got = t
        .gate
        .reserve_product(SKU, 2, Uuid::new_v4(), &alice, 1, 0, NOW)
        .await;
    assert!(
        matches!(got, Ok(ReserveOutcome::Reserved { .. })),
        "{got:?}"
    );
    let got = t
        .gate
        .reserve_product(SKU, 2, Uuid::new_v4(), &alice, 1, 0, NOW)
        .await;
    assert!(
        matches!(
            got,
            Err(flashsale_product_stock::infra::gate::GateError::Unavailable(_))
        ),
        "one unit is still moving, so not sold out: {got:?}"
    );

    let (settled, returned) = t.gate.settle_transfers(SKU, 2, i64::MAX).await.unwrap();
    assert_eq!((settled, returned), (1, 1));
    let states = t.states(2).await;
    assert_eq!((states[1].available, states[1].moving), (1, 0));
    let marker = t.gate.keys_at(At::new(SKU, 0)).unwrap().landing(id);
    let ttl: i64 = t.query(redis::cmd("PTTL").arg(&marker)).await;
    assert!(ttl > 0, "a cancelled transfer's marker lives on: {ttl}");
    // The borrower waking up late cannot land them any more.
    assert_eq!(t.land(0, id, taken, &generation, "give").await, "C");
    assert_eq!(t.avails(2).await, [0, 1]);
    assert!(matches!(
        t.reserve_in(2, &alice, 1, 0).await,
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(t.reserve_in(2, &alice, 1, 0).await, ReserveOutcome::SoldOut);
    t.cleanup().await;
}

#[tokio::test]
async fn a_transfer_that_landed_but_was_not_settled_is_settled_without_moving_units_again() {
    let t = TestGate::new();
    t.load_buckets(2, 6).await; // [3, 3]
    let (id, taken, generation) = t.take_only(1, 0, 1).await;
    assert_eq!(t.land(0, id, taken, &generation, "give").await, "G");
    // Given twice: once only.
    assert_eq!(t.land(0, id, taken, &generation, "give").await, "G");
    let states = t.states(2).await;
    assert_eq!(
        (states[0].available, states[1].available, states[1].moving),
        (3 + taken, 3 - taken, taken)
    );
    // Younger than the cutoff: left to its borrower.
    assert_eq!(t.gate.settle_transfers(SKU, 2, NOW).await.unwrap(), (0, 0));
    let (settled, returned) = t.gate.settle_transfers(SKU, 2, NOW + 1).await.unwrap();
    assert_eq!((settled, returned), (1, 0));
    let marker = t.gate.keys_at(At::new(SKU, 0)).unwrap().landing(id);
    let exists: i64 = t.query(redis::cmd("EXISTS").arg(&marker)).await;
    assert_eq!(
        exists, 0,
        "a landed transfer's marker goes once the donor settled"
    );
    let states = t.states(2).await;
    assert_eq!(
        states.iter().map(|s| s.available + s.moving).sum::<i64>(),
        6
    );
    assert_eq!(states[1].moving, 0);
    t.cleanup().await;
}

#[tokio::test]
async fn a_transfer_from_before_a_rebuild_never_lands() {
    let t = TestGate::new();
    t.load_buckets(2, 4).await;
    let (id, taken, generation) = t.take_only(1, 0, 1).await;
    // The product is rebuilt whole from the database (which counts those units).
    t.gate.unload_product(SKU, 2).await.unwrap();
    t.load_buckets(2, 4).await;
    assert_eq!(t.land(0, id, taken, &generation, "give").await, "S");
    assert_eq!(t.avails(2).await, [2, 2]);
    assert_eq!(
        t.gate.settle_transfers(SKU, 2, i64::MAX).await.unwrap(),
        (0, 0)
    );
    t.cleanup().await;
}
