//! Many callers at once: the scripts' atomicity is what keeps the stock and the limits.

use std::collections::HashMap;

use flashsale_product_stock::infra::gate::{ReleaseOutcome, ReserveOutcome};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_concurrent_reserves_admit_exactly_the_stock_and_respect_the_user_limit() {
    const STOCK: i64 = 100;
    const USERS: usize = 500;
    const REQUESTS: usize = 2_000;
    const LIMIT: u32 = 2;
    let t = TestGate::with_pool_size(32);
    t.loaded(SKU, STOCK).await;

    let mut tasks = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let gate = t.gate.clone();
        // Each user's four requests are spawned back to back, so they race one another.
        let user = format!("user-{}", i / (REQUESTS / USERS));
        tasks.push(tokio::spawn(async move {
            let outcome = gate
                .reserve(SKU, Uuid::new_v4(), &user, 1, LIMIT, NOW)
                .await
                .unwrap();
            (user, outcome)
        }));
    }
    let mut reserved_by_user: HashMap<String, i64> = HashMap::new();
    let (mut reserved, mut sold_out, mut over_limit) = (0, 0, 0);
    for task in tasks {
        let (user, outcome) = task.await.unwrap();
        match outcome {
            ReserveOutcome::Reserved {
                remaining,
                replayed: false,
                ..
            } => {
                assert!((0..STOCK).contains(&remaining), "{remaining}");
                reserved += 1;
                *reserved_by_user.entry(user).or_default() += 1;
            }
            ReserveOutcome::SoldOut => sold_out += 1,
            ReserveOutcome::UserLimitExceeded { bought } => {
                assert_eq!(bought, i64::from(LIMIT));
                over_limit += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    assert_eq!(reserved, STOCK);
    assert_eq!(reserved + sold_out + over_limit, REQUESTS as i64);
    assert!(
        reserved_by_user.values().all(|&n| n <= i64::from(LIMIT)),
        "{reserved_by_user:?}"
    );
    let mut expected_users: Vec<(String, i64)> = reserved_by_user.into_iter().collect();
    expected_users.sort();
    assert_eq!(t.users(SKU).await, expected_users);
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (0, STOCK));
    assert_eq!(t.pending(SKU).await.len(), STOCK as usize);
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_loads_load_once_and_a_late_load_cannot_reset_live_counters() {
    let t = TestGate::with_pool_size(16);
    let mut tasks = Vec::new();
    for i in 0..16_i64 {
        let gate = t.gate.clone();
        tasks.push(tokio::spawn(async move {
            let users = [(format!("user-{i}"), 1)];
            (i, gate.load(SKU, 100 + i, &users).await.unwrap())
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (i, loaded) = task.await.unwrap();
        if loaded {
            winners.push(i);
        }
    }

    assert_eq!(winners.len(), 1, "{winners:?}");
    let winner = winners[0];
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (100 + winner, 0));
    assert_eq!(t.users(SKU).await, vec![(format!("user-{winner}"), 1)]);

    // A replica that read the database before this reservation must not wipe it out.
    t.reserve(SKU, "alice", 5).await;
    assert!(!t.gate.load(SKU, 100 + winner, &[]).await.unwrap());
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (95 + winner, 5));
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_replays_of_one_release_give_the_units_back_once() {
    let t = TestGate::with_pool_size(16);
    t.loaded(SKU, 10).await;
    let order = t.reserve(SKU, "alice", 4).await;

    let mut tasks = Vec::new();
    for _ in 0..50 {
        let gate = t.gate.clone();
        tasks.push(tokio::spawn(async move {
            gate.release(SKU, order, "alice", 4).await.unwrap()
        }));
    }
    let mut released = 0;
    for task in tasks {
        match task.await.unwrap() {
            ReleaseOutcome::ReleasedHold { qty: 4, .. } => released += 1,
            ReleaseOutcome::AlreadyReleased => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    assert_eq!(released, 1);
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (10, 0));
    t.cleanup().await;
}
