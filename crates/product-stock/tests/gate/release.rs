//! The two halves of a release that follows a database change: prepared inside the database
//! transaction (nothing moves), finished after its commit (the units come back once), reverted
//! when the transaction rolled back, and finished without moving units when the gate was
//! rebuilt in between (the rebuild counted them from the database).

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::{
    PrepareOutcome, ReleaseFrom, ReleaseOutcome, ReserveOutcome, SettleOutcome,
};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate};

/// A gate of 10 units with one order of `qty` units for alice persisted in the database.
async fn persisted(t: &TestGate, qty: i64) -> Uuid {
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", qty).await;
    assert!(t.gate.mark_persisted(SKU, order).await.unwrap());
    order
}

#[tokio::test]
async fn nothing_moves_until_the_release_is_finished_and_then_only_once() {
    let t = TestGate::new();
    let order = persisted(&t, 3).await;
    let before = t.snapshot(SKU).await;
    assert_eq!((before.available, before.held), (7, 0));

    let prepared = PrepareOutcome::Prepared {
        from: ReleaseFrom::Persisted,
        qty: 3,
    };
    assert_eq!(
        t.gate
            .prepare_release(SKU, order, "alice", 3)
            .await
            .unwrap(),
        prepared
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!(
        (snap.available, snap.held),
        (7, 0),
        "prepared: nothing moves"
    );
    assert_eq!(t.users(SKU).await, vec![("alice".to_owned(), 3)]);
    // A retry of the transaction prepares again, and a replay of the order cannot retake it.
    assert_eq!(
        t.gate
            .prepare_release(SKU, order, "alice", 3)
            .await
            .unwrap(),
        prepared
    );
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 3, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Released
    );
    assert_eq!(
        t.gate
            .releasing_older_than(SKU, i64::MAX, 10)
            .await
            .unwrap(),
        vec![order]
    );

    assert_eq!(
        t.gate.finish_release(SKU, order).await.unwrap(),
        SettleOutcome::Released {
            from: ReleaseFrom::Persisted,
            qty: 3,
            available: 10
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (10, 0));
    assert!(t.users(SKU).await.is_empty());
    assert!(
        t.gate
            .releasing_older_than(SKU, i64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        t.gate.finish_release(SKU, order).await.unwrap(),
        SettleOutcome::NothingPrepared
    );
    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        t.gate
            .prepare_release(SKU, order, "alice", 3)
            .await
            .unwrap(),
        PrepareOutcome::AlreadyReleased
    );
    assert_eq!(t.snapshot(SKU).await, snap);
    t.cleanup().await;
}

#[tokio::test]
async fn a_release_that_never_committed_is_reverted_to_what_it_was() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let hold = t.reserve(SKU, "bob", 2).await;
    let before = t.snapshot(SKU).await;
    assert_eq!(
        t.gate.prepare_release_unpersisted(SKU, hold).await.unwrap(),
        PrepareOutcome::Prepared {
            from: ReleaseFrom::Hold,
            qty: 2
        }
    );
    assert_eq!(
        t.gate.revert_release(SKU, hold).await.unwrap(),
        SettleOutcome::Reverted {
            from: ReleaseFrom::Hold
        }
    );
    assert_eq!(t.snapshot(SKU).await, before);
    assert_eq!(t.order_state(SKU, hold).await.as_deref(), Some("H"));
    assert_eq!(t.pending(SKU).await, vec![hold.to_string()]);
    // Still a hold: a later release gives its units back once.
    assert_eq!(
        t.gate.release_unpersisted(SKU, hold).await.unwrap(),
        ReleaseOutcome::ReleasedHold {
            qty: 2,
            available: 10
        }
    );

    // An order the gate has no record of: the revert leaves no record behind.
    let unknown = Uuid::new_v4();
    assert_eq!(
        t.gate
            .prepare_release(SKU, unknown, "carol", 1)
            .await
            .unwrap(),
        PrepareOutcome::Prepared {
            from: ReleaseFrom::Unrecorded,
            qty: 1
        }
    );
    assert_eq!(
        t.gate.revert_release(SKU, unknown).await.unwrap(),
        SettleOutcome::Reverted {
            from: ReleaseFrom::Unrecorded
        }
    );
    assert_eq!(t.order_state(SKU, unknown).await, None);
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (10, 0));
    // The hold-only prepare refuses what is not a hold.
    assert_eq!(
        t.gate
            .prepare_release_unpersisted(SKU, unknown)
            .await
            .unwrap(),
        PrepareOutcome::NothingHeld
    );
    t.cleanup().await;
}

#[tokio::test]
async fn a_release_prepared_before_a_rebuild_is_finished_without_moving_units() {
    let t = TestGate::new();
    let order = persisted(&t, 3).await;
    t.gate
        .prepare_release(SKU, order, "alice", 3)
        .await
        .unwrap();
    // The counters are lost but the order's record survives; the release commits and the
    // rebuild reads the database after it: all 10 units are free.
    let keys = t.keys(SKU);
    let _: u64 = t
        .query(
            redis::cmd("DEL")
                .arg(keys.avail())
                .arg(keys.held())
                .arg(keys.pending())
                .arg(keys.users()),
        )
        .await;
    assert!(t.gate.load(SKU, 10, &[]).await.unwrap());
    assert_eq!(
        t.gate.finish_release(SKU, order).await.unwrap(),
        SettleOutcome::Stale {
            from: ReleaseFrom::Persisted
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (10, 0), "counted once");
    assert_eq!(
        t.gate.release(SKU, order, "alice", 3).await.unwrap(),
        ReleaseOutcome::AlreadyReleased
    );

    // Everything lost (a Redis restarted empty): nothing is left to finish.
    let other = Uuid::new_v4();
    t.gate.prepare_release(SKU, other, "bob", 2).await.unwrap();
    t.gate.forget(SKU).await.unwrap();
    assert!(t.gate.load(SKU, 10, &[]).await.unwrap());
    assert_eq!(
        t.gate.finish_release(SKU, other).await.unwrap(),
        SettleOutcome::NothingPrepared
    );
    assert_eq!(t.snapshot(SKU).await.available, 10);
    t.cleanup().await;
}

#[tokio::test]
async fn a_release_prepared_before_a_rebuild_that_did_not_commit_starts_again() {
    let t = TestGate::new();
    let order = persisted(&t, 3).await;
    t.gate
        .prepare_release(SKU, order, "alice", 3)
        .await
        .unwrap();
    // Lost and rebuilt while the release had not committed: the database still reserves 3.
    t.gate.forget(SKU).await.unwrap();
    assert!(
        t.gate
            .load(SKU, 7, &[("alice".to_owned(), 3)])
            .await
            .unwrap()
    );
    // The retry prepares afresh (no record) and its finish gives the units back once.
    assert_eq!(
        t.gate
            .prepare_release(SKU, order, "alice", 3)
            .await
            .unwrap(),
        PrepareOutcome::Prepared {
            from: ReleaseFrom::Unrecorded,
            qty: 3
        }
    );
    assert_eq!(
        t.gate.finish_release(SKU, order).await.unwrap(),
        SettleOutcome::Released {
            from: ReleaseFrom::Unrecorded,
            qty: 3,
            available: 10
        }
    );
    assert!(t.users(SKU).await.is_empty());
    t.cleanup().await;
}

#[tokio::test]
async fn bad_input_is_refused_before_redis() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = Uuid::new_v4();
    for (user, qty) in [("", 1), ("alice", 0), ("alice", -1)] {
        assert!(
            t.gate.prepare_release(SKU, order, user, qty).await.is_err(),
            "{user:?} {qty}"
        );
    }
    assert!(
        t.gate
            .prepare_release("bad sku", order, "a", 1)
            .await
            .is_err()
    );
    assert!(t.gate.finish_release("a{b", order).await.is_err());
    assert!(t.gate.revert_release("", order).await.is_err());
    assert!(
        t.gate
            .releasing_older_than("a b", i64::MAX, 1)
            .await
            .is_err()
    );
    assert_eq!(t.order_state(SKU, order).await, None);
    assert_eq!(t.snapshot(SKU).await.available, 10);
    t.cleanup().await;
}
