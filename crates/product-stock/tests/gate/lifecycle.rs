//! After the reservation: persisted, released (hold, persisted, unrecorded), dropped, adjusted —
//! each once, each keeping `avail + held == on_hand − reserved`.

use flashsale_product_stock::infra::gate::{AdjustOutcome, ReleaseOutcome, ReserveOutcome};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate};

/// The database's figures for one product, as the saga would move them.
struct Db {
    on_hand: i64,
    reserved: i64,
}

async fn assert_invariant(t: &TestGate, db: &Db) {
    let snap = t.snapshot(SKU).await;
    assert_eq!(
        snap.available + snap.held,
        db.on_hand - db.reserved,
        "gate {snap:?} vs on_hand {} reserved {}",
        db.on_hand,
        db.reserved
    );
}

#[tokio::test]
async fn mark_persisted_moves_a_hold_out_of_held_once() {
    let t = TestGate::new();
    let mut db = Db {
        on_hand: 10,
        reserved: 0,
    };
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", 3).await;
    assert_invariant(&t, &db).await;

    db.reserved += 3;
    assert!(t.gate.mark_persisted(SKU, order).await.unwrap());
    assert_invariant(&t, &db).await;
    let after = t.snapshot(SKU).await;
    assert_eq!((after.available, after.held), (7, 0));

    assert!(!t.gate.mark_persisted(SKU, order).await.unwrap());
    assert!(!t.gate.mark_persisted(SKU, Uuid::new_v4()).await.unwrap());
    assert_eq!(
        (t.snapshot(SKU).await.available, t.snapshot(SKU).await.held),
        (7, 0)
    );
    assert_invariant(&t, &db).await;
    assert!(t.pending(SKU).await.is_empty());
    assert_eq!(t.order_state(SKU, order).await.as_deref(), Some("P"));
    // A persisted order still answers its first answer to a replayed reserve.
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 3, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Reserved {
            remaining: 7,
            replayed: true,
            gate_ms: None
        }
    );
    t.cleanup().await;
}

#[tokio::test]
async fn marking_many_in_one_pipeline_answers_each_as_marking_one_would() {
    let t = TestGate::new();
    let other = "GATE-MARK-OTHER";
    t.loaded(SKU, 10).await;
    t.loaded(other, 5).await;
    let a = t.reserve(SKU, "alice", 2).await;
    let b = t.reserve(SKU, "bob", 3).await;
    let c = t.reserve(other, "carol", 1).await;
    // Already persisted before the batch: nothing left to do for it.
    assert!(t.gate.mark_persisted(SKU, b).await.unwrap());
    let unknown = Uuid::new_v4();

    let answers: Vec<bool> = t
        .gate
        .mark_persisted_many(&[(SKU, a), (SKU, b), (other, c), (SKU, unknown)])
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(answers, [true, false, true, false]);
    let (s, o) = (t.snapshot(SKU).await, t.snapshot(other).await);
    assert_eq!((s.available, s.held), (5, 0));
    assert_eq!((o.available, o.held), (4, 0));
    for (sku, order) in [(SKU, a), (SKU, b), (other, c)] {
        assert_eq!(t.order_state(sku, order).await.as_deref(), Some("P"));
    }
    assert!(t.pending(SKU).await.is_empty() && t.pending(other).await.is_empty());

    // Once more: every one is done.
    let again = t
        .gate
        .mark_persisted_many(&[(SKU, a), (other, c)])
        .await
        .unwrap();
    assert!(again.iter().all(|r| matches!(r, Ok(false))), "{again:?}");
    assert!(t.gate.mark_persisted_many(&[]).await.unwrap().is_empty());
    // A bad sku refuses the whole call before anything runs.
    let before = t.snapshot(SKU).await;
    assert!(
        t.gate
            .mark_persisted_many(&[(SKU, a), ("bad{sku}", c)])
            .await
            .is_err()
    );
    assert_eq!(t.snapshot(SKU).await, before);
    t.cleanup().await;
}

#[tokio::test]
async fn releasing_a_hold_restores_the_invariant_and_is_idempotent() {
    let t = TestGate::new();
    let db = Db {
        on_hand: 10,
        reserved: 0,
    };
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", 3).await;
    t.reserve(SKU, "bob", 1).await;

    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::ReleasedHold {
            qty: 3,
            available: 9
        }
    );
    assert_invariant(&t, &db).await;
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (9, 1));
    assert_eq!(t.users(SKU).await, vec![("bob".to_owned(), 1)]);
    assert_eq!(t.pending(SKU).await.len(), 1);

    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        t.gate.release_unpersisted(SKU, order).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert!(!t.gate.mark_persisted(SKU, order).await.unwrap());
    assert_eq!(t.snapshot(SKU).await, snap);
    // The released order cannot take its units again.
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 3, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Released
    );
    assert_eq!(t.snapshot(SKU).await, snap);
    t.cleanup().await;
}

#[tokio::test]
async fn releasing_a_persisted_order_restores_the_invariant_and_is_idempotent() {
    let t = TestGate::new();
    let mut db = Db {
        on_hand: 10,
        reserved: 0,
    };
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", 3).await;
    db.reserved += 3;
    t.gate.mark_persisted(SKU, order).await.unwrap();

    db.reserved -= 3;
    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::ReleasedPersisted {
            qty: 3,
            available: 10
        }
    );
    assert_invariant(&t, &db).await;
    assert!(t.users(SKU).await.is_empty());

    let snap = t.snapshot(SKU).await;
    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(t.snapshot(SKU).await, snap);
    assert_invariant(&t, &db).await;
    t.cleanup().await;
}

#[tokio::test]
async fn releasing_an_order_the_gate_has_no_record_of_uses_the_given_user_and_qty_once() {
    let t = TestGate::new();
    // The gate was rebuilt while alice's order of 3 sat reserved in the database.
    let mut db = Db {
        on_hand: 10,
        reserved: 3,
    };
    assert!(
        t.gate
            .load(SKU, 7, &[("alice".to_owned(), 3)])
            .await
            .unwrap()
    );
    let order = Uuid::new_v4();

    db.reserved -= 3;
    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::ReleasedUnrecorded {
            qty: 3,
            available: 10
        }
    );
    assert_invariant(&t, &db).await;
    assert!(t.users(SKU).await.is_empty());
    assert_eq!(t.order_state(SKU, order).await.as_deref(), Some("X"));

    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 3, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Released
    );
    assert_invariant(&t, &db).await;
    t.cleanup().await;
}

#[tokio::test]
async fn release_on_a_missing_counter_changes_nothing() {
    let t = TestGate::new();

    let outcome = t
        .gate
        .release(SKU, Uuid::new_v4(), "alice", 3)
        .await
        .unwrap();

    assert_eq!(outcome, ReleaseOutcome::NotLoaded);
    assert_eq!(t.all_keys().await, Vec::<String>::new());
    t.cleanup().await;
}

#[tokio::test]
async fn a_refused_order_has_no_hold_to_release_or_drop() {
    let t = TestGate::new();
    t.loaded(SKU, 5).await;
    let refused = Uuid::new_v4();
    assert_eq!(
        t.gate
            .reserve(SKU, refused, "alice", 6, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::InsufficientStock { available: 5 }
    );
    let keys = t.all_keys().await;

    // What a cancel of an order the database never got does (the saga's path for it).
    assert_eq!(
        t.gate.release_unpersisted(SKU, refused).await.unwrap(),
        ReleaseOutcome::NothingHeld
    );
    assert_eq!(
        t.gate.drop_hold(SKU, refused).await.unwrap(),
        ReleaseOutcome::NothingHeld
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (5, 0));
    assert_eq!(t.all_keys().await, keys, "nothing was written");
    t.cleanup().await;
}

#[tokio::test]
async fn release_unpersisted_and_drop_hold_touch_only_unpersisted_holds() {
    let t = TestGate::new();
    let mut db = Db {
        on_hand: 10,
        reserved: 0,
    };
    t.loaded(SKU, 10).await;
    let dropped = t.reserve(SKU, "alice", 2).await;
    let persisted = t.reserve(SKU, "bob", 3).await;
    let returned = t.reserve(SKU, "carol", 1).await;
    db.reserved += 3;
    t.gate.mark_persisted(SKU, persisted).await.unwrap();
    let before = t.snapshot(SKU).await;

    assert_eq!(
        t.gate.release_unpersisted(SKU, persisted).await.unwrap(),
        ReleaseOutcome::NothingHeld
    );
    assert_eq!(
        t.gate.drop_hold(SKU, persisted).await.unwrap(),
        ReleaseOutcome::NothingHeld
    );
    assert_eq!(
        t.gate
            .release_unpersisted(SKU, Uuid::new_v4())
            .await
            .unwrap(),
        ReleaseOutcome::NothingHeld
    );
    assert_eq!(t.snapshot(SKU).await, before);

    assert_eq!(
        t.gate.release_unpersisted(SKU, returned).await.unwrap(),
        ReleaseOutcome::ReleasedHold {
            qty: 1,
            available: 5
        }
    );
    assert_invariant(&t, &db).await;

    // The database refused `dropped` for lack of stock: the gate forgets the hold and keeps
    // the units out, moving towards the database by 2.
    assert_eq!(
        t.gate.drop_hold(SKU, dropped).await.unwrap(),
        ReleaseOutcome::DroppedHold {
            qty: 2,
            available: 5
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (5, 0));
    assert_eq!(t.users(SKU).await, vec![("bob".to_owned(), 3)]);
    assert!(t.pending(SKU).await.is_empty());
    assert_eq!(
        t.gate.drop_hold(SKU, dropped).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        t.gate.release(SKU, dropped, "alice", 2).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(t.snapshot(SKU).await, snap);
    t.cleanup().await;
}

#[tokio::test]
async fn adjust_is_idempotent_and_a_write_off_never_drives_the_counter_below_zero() {
    let t = TestGate::new();
    t.loaded(SKU, 5).await;

    assert_eq!(
        t.gate.adjust(SKU, "restock-1", 10).await.unwrap(),
        AdjustOutcome::Applied {
            applied: 10,
            available: 15,
            clamped: false
        }
    );
    assert_eq!(
        t.gate.adjust(SKU, "restock-1", 10).await.unwrap(),
        AdjustOutcome::Duplicate
    );
    assert_eq!(t.snapshot(SKU).await.available, 15);

    assert_eq!(
        t.gate.adjust(SKU, "write-off-1", -4).await.unwrap(),
        AdjustOutcome::Applied {
            applied: -4,
            available: 11,
            clamped: false
        }
    );
    assert_eq!(
        t.gate.adjust(SKU, "write-off-2", -20).await.unwrap(),
        AdjustOutcome::Applied {
            applied: -11,
            available: 0,
            clamped: true
        }
    );
    assert_eq!(
        t.gate.adjust(SKU, "write-off-2", -20).await.unwrap(),
        AdjustOutcome::Duplicate
    );
    assert_eq!(
        t.gate.adjust(SKU, "write-off-3", -1).await.unwrap(),
        AdjustOutcome::Applied {
            applied: 0,
            available: 0,
            clamped: true
        }
    );
    assert_eq!(t.snapshot(SKU).await.available, 0);
    t.cleanup().await;
}

#[tokio::test]
async fn adjust_on_a_missing_counter_changes_no_stock_and_a_redelivery_after_the_rebuild_is_a_duplicate()
 {
    let t = TestGate::new();

    assert_eq!(
        t.gate.adjust(SKU, "restock-1", 10).await.unwrap(),
        AdjustOutcome::NotLoaded
    );
    assert_eq!(t.gate.snapshot(SKU).await.unwrap(), None);

    // The rebuild reads the database, which already counts the restock.
    t.loaded(SKU, 10).await;
    assert_eq!(
        t.gate.adjust(SKU, "restock-1", 10).await.unwrap(),
        AdjustOutcome::Duplicate
    );
    assert_eq!(t.snapshot(SKU).await.available, 10);
    t.cleanup().await;
}

#[tokio::test]
async fn an_adjustment_from_before_a_rebuild_is_counted_once() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let before = t.gate.generation(SKU).await.unwrap();
    assert!(!before.is_empty());
    assert_eq!(
        t.gate
            .adjust_in_generation(SKU, "restock-1", 5, &before)
            .await
            .unwrap(),
        AdjustOutcome::Applied {
            applied: 5,
            available: 15,
            clamped: false
        }
    );
    // Committed in one generation, delivered after the gate was lost and rebuilt from the
    // database (which already counts it): nothing changes, now or on a repeat.
    let stale = t.gate.generation(SKU).await.unwrap();
    t.gate.forget(SKU).await.unwrap();
    assert_eq!(
        t.gate.generation(SKU).await.unwrap(),
        flashsale_product_stock::infra::gate::NOT_LOADED_GENERATION
    );
    t.loaded(SKU, 22).await;
    assert_ne!(t.gate.generation(SKU).await.unwrap(), stale);
    for _ in 0..2 {
        let outcome = t
            .gate
            .adjust_in_generation(SKU, "restock-2", 7, &stale)
            .await
            .unwrap();
        assert!(
            matches!(outcome, AdjustOutcome::Rebuilt | AdjustOutcome::Duplicate),
            "{outcome:?}"
        );
        assert_eq!(t.snapshot(SKU).await.available, 22);
    }
    assert!(
        t.gate
            .adjust_in_generation(SKU, "restock-3", 1, &"9".repeat(33))
            .await
            .is_err(),
        "an oversized generation is refused"
    );
    assert_eq!(t.snapshot(SKU).await.available, 22);
    t.cleanup().await;
}
