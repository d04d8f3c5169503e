//! Operations around the hot path: the script cache, the expiry sweep, repair, load, forget.

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::{
    AdjustOutcome, GateBuyers, GateError, PendingHold, ReleaseOutcome, RepairOutcome,
    ReserveOutcome,
};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate, clock_checked};

/// What a Redis restart or failover does to the script cache.
async fn flush_script_cache(t: &TestGate) {
    let _: () = t.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
}

#[tokio::test]
async fn every_script_still_runs_after_redis_flushed_its_script_cache() {
    let t = TestGate::new();
    t.gate.load_scripts().await.unwrap();
    flush_script_cache(&t).await;
    assert!(t.gate.load(SKU, 10, &[]).await.unwrap());

    flush_script_cache(&t).await;
    let order = Uuid::new_v4();
    let reserved = t
        .gate
        .reserve(SKU, order, "alice", 2, 0, NOW)
        .await
        .unwrap();
    assert_eq!(
        clock_checked(reserved),
        ReserveOutcome::Reserved {
            remaining: 8,
            replayed: false,
            gate_ms: None
        }
    );

    flush_script_cache(&t).await;
    assert_eq!(
        t.gate
            .pending_older_than(SKU, NOW + 1, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    flush_script_cache(&t).await;
    assert!(t.gate.mark_persisted(SKU, order).await.unwrap());
    flush_script_cache(&t).await;
    assert!(matches!(
        t.gate.release(SKU, order, "alice", 2).await.unwrap(),
        ReleaseOutcome::ReleasedPersisted { .. }
    ));
    flush_script_cache(&t).await;
    assert!(matches!(
        t.gate.adjust(SKU, "r-1", 1).await.unwrap(),
        AdjustOutcome::Applied { .. }
    ));
    flush_script_cache(&t).await;
    assert!(matches!(
        t.gate.repair(SKU, 11).await.unwrap(),
        RepairOutcome::Repaired { after: 11, .. }
    ));
    t.cleanup().await;
}

#[tokio::test]
async fn pending_older_than_returns_exactly_the_old_unpersisted_holds() {
    let t = TestGate::new();
    t.loaded(SKU, 100).await;
    let at = |user: &'static str, qty: i64, ms: i64| {
        let gate = t.gate.clone();
        async move {
            let order = Uuid::new_v4();
            let outcome = gate.reserve(SKU, order, user, qty, 0, ms).await.unwrap();
            assert!(matches!(outcome, ReserveOutcome::Reserved { .. }));
            order
        }
    };
    let old = at("alice", 1, 1_000).await;
    let persisted = at("bob", 2, 2_000).await;
    let released = at("carol", 3, 2_500).await;
    let old_too = at("dave", 4, 3_000).await;
    let at_cutoff = at("erin", 5, 4_000).await;
    let young = at("frank", 6, 5_000).await;
    t.gate.mark_persisted(SKU, persisted).await.unwrap();
    t.gate.release(SKU, released, "carol", 3).await.unwrap();
    let hold = |order_id, user: &str, qty, reserved_at_ms| PendingHold {
        order_id,
        user_id: user.to_owned(),
        qty,
        reserved_at_ms,
    };

    assert_eq!(
        t.gate.pending_older_than(SKU, 4_000, 100).await.unwrap(),
        vec![
            hold(old, "alice", 1, 1_000),
            hold(old_too, "dave", 4, 3_000)
        ]
    );
    assert_eq!(
        t.gate.pending_older_than(SKU, 4_000, 1).await.unwrap(),
        vec![hold(old, "alice", 1, 1_000)]
    );
    assert_eq!(
        t.gate.pending_older_than(SKU, 1_000, 100).await.unwrap(),
        vec![]
    );
    assert_eq!(
        t.gate.pending_older_than(SKU, 4_000, 0).await.unwrap(),
        vec![]
    );
    assert_eq!(
        t.gate
            .pending_older_than(SKU, i64::MAX, 100)
            .await
            .unwrap()
            .len(),
        4
    );

    // A hold whose record expired is pruned from the pending set instead of blocking the sweep.
    let _: u64 = t.query(redis::cmd("DEL").arg(t.keys(SKU).order(old))).await;
    assert_eq!(
        t.gate.pending_older_than(SKU, 4_001, 100).await.unwrap(),
        vec![
            hold(old_too, "dave", 4, 3_000),
            hold(at_cutoff, "erin", 5, 4_000)
        ]
    );
    assert!(!t.pending(SKU).await.contains(&old.to_string()));
    assert!(t.pending(SKU).await.contains(&young.to_string()));
    t.cleanup().await;
}

#[tokio::test]
async fn repair_sets_the_counter_to_the_database_figure_minus_held() {
    let t = TestGate::new();
    assert_eq!(
        t.gate.repair(SKU, 10).await.unwrap(),
        RepairOutcome::NotLoaded
    );
    assert_eq!(t.gate.snapshot(SKU).await.unwrap(), None);
    t.loaded(SKU, 10).await;
    t.reserve(SKU, "alice", 3).await;
    let _: () = t
        .query(redis::cmd("SET").arg(t.keys(SKU).avail()).arg(50))
        .await;

    assert_eq!(
        t.gate.repair(SKU, 10).await.unwrap(),
        RepairOutcome::Repaired {
            before: 50,
            after: 7,
            held: 3,
            clamped: false
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (7, 3));

    assert_eq!(
        t.gate.repair(SKU, 2).await.unwrap(),
        RepairOutcome::Repaired {
            before: 7,
            after: 0,
            held: 3,
            clamped: true
        }
    );
    assert_eq!(t.snapshot(SKU).await.available, 0);
    t.cleanup().await;
}

#[tokio::test]
async fn a_guarded_repair_refuses_once_a_database_follow_up_landed_but_not_for_reservations() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", 3).await;
    let epoch = t.snapshot(SKU).await.epoch;

    // Reservations do not move the epoch: a repair under a flood of buyers still goes through.
    t.reserve(SKU, "bob", 1).await;
    assert_eq!(
        t.gate.repair_if_unchanged(SKU, 10, epoch).await.unwrap(),
        RepairOutcome::Repaired {
            before: 6,
            after: 6,
            held: 4,
            clamped: false
        }
    );

    // The database persisted alice's order and the gate followed after the snapshot.
    let epoch = t.snapshot(SKU).await.epoch;
    t.gate.mark_persisted(SKU, order).await.unwrap();
    let stale = t.gate.repair_if_unchanged(SKU, 10, epoch).await.unwrap();
    assert!(
        matches!(stale, RepairOutcome::Stale { epoch: now } if now != epoch),
        "{stale:?}"
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (6, 1));

    assert_eq!(
        t.gate
            .repair_if_unchanged(SKU, 7, snap.epoch)
            .await
            .unwrap(),
        RepairOutcome::Repaired {
            before: 6,
            after: 6,
            held: 1,
            clamped: false
        }
    );
    t.cleanup().await;
}

#[tokio::test]
async fn a_rebuild_restores_what_each_user_bought() {
    let t = TestGate::new();
    assert!(
        t.gate
            .load(SKU, 8, &[("alice".to_owned(), 2), ("bob".to_owned(), 0)])
            .await
            .unwrap()
    );

    assert_eq!(
        t.gate
            .reserve(SKU, Uuid::new_v4(), "alice", 1, 2, NOW)
            .await
            .unwrap(),
        ReserveOutcome::UserLimitExceeded { bought: 2 }
    );
    assert!(matches!(
        t.gate
            .reserve(SKU, Uuid::new_v4(), "bob", 2, 2, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Reserved { remaining: 6, .. }
    ));
    assert_eq!(
        t.users(SKU).await,
        vec![("alice".to_owned(), 2), ("bob".to_owned(), 2)]
    );
    t.cleanup().await;
}

#[tokio::test]
async fn forget_deletes_every_key_of_the_product_and_nothing_else() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    t.loaded("OTHER", 10).await;
    let order = t.reserve(SKU, "alice", 1).await;
    t.gate.mark_persisted(SKU, order).await.unwrap();
    t.gate.adjust(SKU, "r-1", 1).await.unwrap();
    let other = t.reserve("OTHER", "alice", 1).await;
    let other_keys = t
        .all_keys()
        .await
        .into_iter()
        .filter(|k| k.contains("{p:OTHER}"))
        .count();
    assert!(other_keys >= 7, "{other_keys}");

    let deleted = t.gate.forget(SKU).await.unwrap();

    assert_eq!(
        deleted, 8,
        "avail, held, users, epoch, refills, generation, order record, adjustment marker"
    );
    assert_eq!(t.gate.snapshot(SKU).await.unwrap(), None);
    let left = t.all_keys().await;
    assert!(left.iter().all(|k| k.contains("{p:OTHER}")), "{left:?}");
    assert_eq!(left.len(), other_keys);
    assert_eq!(t.order_state("OTHER", other).await.as_deref(), Some("H"));
    t.cleanup().await;
}

/// The buyers read with their refills count, for the checks below.
async fn buyers(t: &TestGate, known: &str) -> GateBuyers {
    t.gate.buyers(SKU, 100, known).await.unwrap()
}

fn refills_of(b: &GateBuyers) -> String {
    match b {
        GateBuyers::Listed { refills, .. }
        | GateBuyers::Unchanged { refills, .. }
        | GateBuyers::TooMany { refills, .. } => refills.clone(),
        GateBuyers::NotLoaded => panic!("not loaded"),
    }
}

fn listed(b: &GateBuyers) -> (i64, Vec<String>) {
    match b {
        GateBuyers::Listed {
            available, users, ..
        } => {
            let mut users = users.clone();
            users.sort();
            (*available, users)
        }
        other => panic!("wanted a list, got {other:?}"),
    }
}

#[tokio::test]
async fn the_refills_count_moves_only_when_units_may_come_back() {
    let t = TestGate::new();
    t.loaded(SKU, 2).await;
    let first = buyers(&t, "").await;
    let r0 = refills_of(&first);
    assert!(
        !r0.is_empty() && r0.bytes().all(|b| b.is_ascii_digit()),
        "{r0:?}"
    );
    assert_eq!(listed(&first), (2, vec![]));

    // Reservations and persisted holds give nothing back: the count stays, and a caller that
    // knows it gets no list.
    let alice = t.reserve(SKU, "alice", 1).await;
    let bob = t.reserve(SKU, "bob", 1).await;
    t.gate.mark_persisted(SKU, alice).await.unwrap();
    assert_eq!(
        buyers(&t, &r0).await,
        GateBuyers::Unchanged {
            available: 0,
            count: 2,
            refills: r0.clone()
        }
    );
    // Without the count, or with another one, the list comes as before.
    let full = buyers(&t, "").await;
    assert_eq!(refills_of(&full), r0);
    assert_eq!(listed(&full), (0, vec!["alice".into(), "bob".into()]));
    assert_eq!(listed(&buyers(&t, "12345").await).1.len(), 2);

    // A release gives units back: a new buyer may take them, so the count moves.
    assert!(matches!(
        t.gate.release(SKU, bob, "bob", 1).await.unwrap(),
        ReleaseOutcome::ReleasedHold { .. }
    ));
    let after_release = buyers(&t, &r0).await;
    let r1 = refills_of(&after_release);
    assert_ne!(r1, r0);
    assert_eq!(listed(&after_release), (1, vec!["alice".into()]));
    let carol = t.reserve(SKU, "carol", 1).await;
    assert_eq!(listed(&buyers(&t, &r0).await).1, ["alice", "carol"]);
    // Dropping a hold (its units not given back) leaves the count alone.
    t.gate.drop_hold(SKU, carol).await.unwrap();
    assert!(matches!(
        buyers(&t, &r1).await,
        GateBuyers::Unchanged { .. }
    ));

    // An adjustment and a repair may raise the counter: each moves the count.
    t.gate.adjust(SKU, "restock-1", 1).await.unwrap();
    let r2 = refills_of(&buyers(&t, "").await);
    assert_ne!(r2, r1);
    assert!(matches!(
        t.gate.repair(SKU, 5).await.unwrap(),
        RepairOutcome::Repaired { .. }
    ));
    let r3 = refills_of(&buyers(&t, "").await);
    assert_ne!(r3, r2);

    // A rebuild after Redis lost the product starts from the clock: no count read before the
    // loss matches again, even after as many bumps as before.
    t.gate.forget(SKU).await.unwrap();
    t.loaded(SKU, 1).await;
    let rebuilt = refills_of(&buyers(&t, "").await);
    for old in [&r0, &r1, &r2, &r3] {
        assert_ne!(&rebuilt, old);
    }
    assert!(matches!(
        buyers(&t, &rebuilt).await,
        GateBuyers::Unchanged { available: 1, .. }
    ));

    // A count longer than any the gate hands out is refused before Redis is asked.
    assert!(matches!(
        t.gate.buyers(SKU, 100, &"1".repeat(33)).await,
        Err(GateError::InvalidInput(_))
    ));
    t.cleanup().await;
}
