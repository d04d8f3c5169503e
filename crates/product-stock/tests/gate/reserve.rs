//! Reservations: decrement and record, replays, limits, refusals, a missing counter.

use deadpool_redis::redis;
use flashsale_product_stock::infra::gate::{GateError, ReserveArgs, ReserveOutcome, SaleWindow};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate, clock_checked};

#[tokio::test]
async fn reserve_moves_units_from_avail_to_held_and_records_the_hold() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = Uuid::new_v4();

    let outcome = t
        .gate
        .reserve(SKU, order, "alice", 3, 0, NOW)
        .await
        .unwrap();

    assert_eq!(
        clock_checked(outcome),
        ReserveOutcome::Reserved {
            remaining: 7,
            replayed: false,
            gate_ms: None
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (7, 3));
    assert_eq!(t.users(SKU).await, vec![("alice".to_owned(), 3)]);
    let score: i64 = t
        .query(
            redis::cmd("ZSCORE")
                .arg(t.keys(SKU).pending())
                .arg(order.to_string()),
        )
        .await;
    assert_eq!(score, NOW);
    assert_eq!(t.order_state(SKU, order).await.as_deref(), Some("H"));
    let ttl: i64 = t
        .query(redis::cmd("PTTL").arg(t.keys(SKU).order(order)))
        .await;
    assert!(
        ttl > 3_500_000 && ttl <= 3_600_000,
        "order record ttl {ttl}"
    );
    t.cleanup().await;
}

#[tokio::test]
async fn a_replayed_reserve_returns_the_first_answer_without_a_second_decrement() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = Uuid::new_v4();
    t.gate
        .reserve(SKU, order, "alice", 3, 0, NOW)
        .await
        .unwrap();
    t.reserve(SKU, "bob", 2).await;

    let replay = t
        .gate
        .reserve(SKU, order, "alice", 3, 0, NOW + 5)
        .await
        .unwrap();

    assert_eq!(
        replay,
        ReserveOutcome::Reserved {
            remaining: 7,
            replayed: true,
            gate_ms: None
        }
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (5, 5));
    assert_eq!(
        t.users(SKU).await,
        vec![("alice".to_owned(), 3), ("bob".to_owned(), 2)]
    );
    assert_eq!(t.pending(SKU).await.len(), 2);
    t.cleanup().await;
}

#[tokio::test]
async fn a_refusal_writes_no_key_and_its_retry_is_judged_afresh() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let first = t
        .gate
        .reserve(SKU, Uuid::new_v4(), "alice", 2, 2, NOW)
        .await
        .unwrap();
    assert!(matches!(first, ReserveOutcome::Reserved { .. }));
    let keys = t.all_keys().await;
    let before = t.snapshot(SKU).await;
    let over = Uuid::new_v4();
    assert_eq!(
        t.gate.reserve(SKU, over, "alice", 1, 2, NOW).await.unwrap(),
        ReserveOutcome::UserLimitExceeded { bought: 2 }
    );
    let big = Uuid::new_v4();
    assert_eq!(
        t.gate.reserve(SKU, big, "bob", 9, 0, NOW).await.unwrap(),
        ReserveOutcome::InsufficientStock { available: 8 }
    );
    assert_eq!(t.order_state(SKU, over).await, None);
    assert_eq!(t.order_state(SKU, big).await, None);
    assert_eq!(t.all_keys().await, keys, "the refusals created no key");
    assert_eq!(t.snapshot(SKU).await, before, "and took nothing");

    // The world changes: the limit is raised and stock arrives; the same orders now pass.
    t.gate.adjust(SKU, "restock-1", 100).await.unwrap();
    assert!(matches!(
        t.gate.reserve(SKU, over, "alice", 1, 5, NOW).await.unwrap(),
        ReserveOutcome::Reserved {
            replayed: false,
            ..
        }
    ));
    assert!(matches!(
        t.gate.reserve(SKU, big, "bob", 9, 0, NOW).await.unwrap(),
        ReserveOutcome::Reserved {
            replayed: false,
            ..
        }
    ));
    assert_eq!(
        t.users(SKU).await,
        vec![("alice".to_owned(), 3), ("bob".to_owned(), 9)]
    );
    t.cleanup().await;
}

#[tokio::test]
async fn a_flood_of_refused_orders_from_one_user_at_their_limit_adds_no_key() {
    let t = TestGate::new();
    t.loaded(SKU, 1_000).await;
    t.gate
        .reserve(SKU, Uuid::new_v4(), "alice", 2, 2, NOW)
        .await
        .unwrap();
    let keys = t.all_keys().await;
    for _ in 0..600 {
        assert_eq!(
            t.gate
                .reserve(SKU, Uuid::new_v4(), "alice", 1, 2, NOW)
                .await
                .unwrap(),
            ReserveOutcome::UserLimitExceeded { bought: 2 }
        );
    }
    assert_eq!(t.all_keys().await, keys);
    t.cleanup().await;
}

#[tokio::test]
async fn a_refusal_recorded_by_an_older_version_is_still_answered_as_first_given() {
    // Versions before refusals stopped writing recorded them for a week; such a record still
    // answers its replay until it expires.
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let old = Uuid::new_v4();
    let _: () = t
        .query(
            redis::cmd("HSET")
                .arg(t.keys(SKU).order(old))
                .arg("s")
                .arg("L")
                .arg("q")
                .arg("1")
                .arg("u")
                .arg("alice")
                .arg("n")
                .arg("2"),
        )
        .await;
    assert_eq!(
        t.gate.reserve(SKU, old, "alice", 1, 5, NOW).await.unwrap(),
        ReserveOutcome::UserLimitExceeded { bought: 2 }
    );
    assert_eq!(t.snapshot(SKU).await.available, 10);
    t.cleanup().await;
}

#[tokio::test]
async fn the_per_user_limit_counts_every_order_of_the_user() {
    let t = TestGate::new();
    t.loaded(SKU, 100).await;
    let reserve = |user: &'static str, qty: i64, limit: u32| {
        let gate = t.gate.clone();
        async move {
            gate.reserve(SKU, Uuid::new_v4(), user, qty, limit, NOW)
                .await
                .unwrap()
        }
    };
    assert!(matches!(
        reserve("alice", 1, 3).await,
        ReserveOutcome::Reserved { .. }
    ));
    assert!(matches!(
        reserve("alice", 1, 3).await,
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(
        reserve("alice", 2, 3).await,
        ReserveOutcome::UserLimitExceeded { bought: 2 }
    );
    assert!(matches!(
        reserve("alice", 1, 3).await,
        ReserveOutcome::Reserved { .. }
    ));
    assert_eq!(
        reserve("alice", 1, 3).await,
        ReserveOutcome::UserLimitExceeded { bought: 3 }
    );
    // Another user has a quota of their own; limit 0 means none.
    assert!(matches!(
        reserve("bob", 3, 3).await,
        ReserveOutcome::Reserved { .. }
    ));
    assert!(matches!(
        reserve("carol", 50, 0).await,
        ReserveOutcome::Reserved { .. }
    ));

    assert_eq!(
        t.users(SKU).await,
        vec![
            ("alice".to_owned(), 3),
            ("bob".to_owned(), 3),
            ("carol".to_owned(), 50)
        ]
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (44, 56));
    t.cleanup().await;
}

#[tokio::test]
async fn sold_out_and_insufficient_stock_are_told_apart_and_the_counter_never_goes_below_zero() {
    let t = TestGate::new();
    t.loaded(SKU, 3).await;
    t.reserve(SKU, "alice", 2).await;
    assert_eq!(
        t.gate
            .reserve(SKU, Uuid::new_v4(), "bob", 2, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::InsufficientStock { available: 1 }
    );
    t.reserve(SKU, "bob", 1).await;
    let mut sold_out = Vec::new();
    for _ in 0..5 {
        let order = Uuid::new_v4();
        assert_eq!(
            t.gate
                .reserve(SKU, order, "carol", 1, 0, NOW)
                .await
                .unwrap(),
            ReserveOutcome::SoldOut
        );
        sold_out.push(order);
    }

    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (0, 3));
    // Sold-out refusals write nothing: no order record, no user entry.
    for order in sold_out {
        assert_eq!(t.order_state(SKU, order).await, None);
    }
    assert_eq!(
        t.users(SKU).await,
        vec![("alice".to_owned(), 2), ("bob".to_owned(), 1)]
    );
    t.cleanup().await;
}

#[tokio::test]
async fn reserve_on_a_missing_counter_answers_not_loaded_and_creates_no_key() {
    let t = TestGate::new();

    let outcome = t
        .gate
        .reserve(SKU, Uuid::new_v4(), "alice", 1, 2, NOW)
        .await
        .unwrap();

    assert_eq!(outcome, ReserveOutcome::NotLoaded);
    assert_eq!(t.gate.snapshot(SKU).await.unwrap(), None);
    assert_eq!(t.all_keys().await, Vec::<String>::new());
    t.cleanup().await;
}

#[tokio::test]
async fn an_order_id_reused_with_another_user_or_quantity_is_a_mismatch() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = Uuid::new_v4();
    t.gate
        .reserve(SKU, order, "alice", 2, 0, NOW)
        .await
        .unwrap();

    assert_eq!(
        t.gate
            .reserve(SKU, order, "mallory", 2, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Mismatch
    );
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 3, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Mismatch
    );
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (8, 2));
    t.cleanup().await;
}

#[tokio::test]
async fn input_a_lua_number_cannot_hold_is_refused_before_redis() {
    let t = TestGate::new();
    t.loaded(SKU, 10).await;
    let order = Uuid::new_v4();
    let bad = [
        t.gate.reserve(SKU, order, "alice", 0, 0, NOW).await,
        t.gate.reserve(SKU, order, "alice", -1, 0, NOW).await,
        t.gate.reserve(SKU, order, "alice", 1_000_001, 0, NOW).await,
        t.gate.reserve(SKU, order, "alice", 1, 0, -1).await,
        t.gate.reserve(SKU, order, "alice", 1, 0, 1 << 53).await,
        t.gate.reserve(SKU, order, "", 1, 0, NOW).await,
        t.gate.reserve("bad sku", order, "alice", 1, 0, NOW).await,
        t.gate.reserve("a{b}", order, "alice", 1, 0, NOW).await,
    ];
    for result in bad {
        assert!(
            matches!(result, Err(GateError::InvalidInput(_))),
            "{result:?}"
        );
    }
    assert!(matches!(
        t.gate.load("S2", 1 << 53, &[]).await,
        Err(GateError::InvalidInput(_))
    ));
    assert!(matches!(
        t.gate.adjust(SKU, "r", i64::MIN).await,
        Err(GateError::InvalidInput(_))
    ));
    assert!(matches!(
        t.gate.repair(SKU, -1).await,
        Err(GateError::InvalidInput(_))
    ));

    assert_eq!(t.order_state(SKU, order).await, None);
    assert_eq!(t.snapshot(SKU).await.available, 10);
    // The largest accepted values go through exactly.
    let max = (1_i64 << 53) - 1;
    assert_eq!(
        t.gate
            .reserve(SKU, order, "alice", 1_000_000, u32::MAX, max)
            .await
            .unwrap(),
        ReserveOutcome::InsufficientStock { available: 10 }
    );
    t.cleanup().await;
}

/// The gate's clock: Redis `TIME`, in milliseconds.
async fn redis_ms(t: &TestGate) -> i64 {
    let (secs, micros): (i64, i64) = t.query(&redis::cmd("TIME")).await;
    secs * 1_000 + micros / 1_000
}

fn args<'a>(order_id: Uuid, user_id: &'a str, window: SaleWindow, now_ms: i64) -> ReserveArgs<'a> {
    ReserveArgs {
        sku: SKU,
        bucket: 0,
        order_id,
        user_id,
        qty: 1,
        per_user_limit: 0,
        // The caller's clock, wildly off: the window is judged by the gate's clock only.
        now_ms,
        window,
    }
}

#[tokio::test]
async fn the_sale_window_is_judged_by_the_redis_server_s_clock_not_the_caller_s() {
    let t = TestGate::new();
    t.loaded(SKU, 3).await;
    let now = redis_ms(&t).await;
    let later = SaleWindow {
        start_ms: now + 3_600_000,
        end_ms: 0,
    };
    // A caller whose clock says the sale opened long ago is still refused.
    let before = t
        .gate
        .reserve_with(&args(Uuid::new_v4(), "alice", later, now + 7_200_000))
        .await
        .unwrap();
    match before {
        ReserveOutcome::NotStarted { gate_ms, start_ms } => {
            assert_eq!(start_ms, now + 3_600_000);
            assert!((now..now + 60_000).contains(&gate_ms), "{gate_ms}");
        }
        other => panic!("{other:?}"),
    }
    let over = SaleWindow {
        start_ms: now - 60_000,
        end_ms: now - 1,
    };
    let after = t
        .gate
        .reserve_with(&args(Uuid::new_v4(), "alice", over, now - 30_000))
        .await
        .unwrap();
    assert!(
        matches!(after, ReserveOutcome::Ended { end_ms, gate_ms } if end_ms == now - 1 && gate_ms >= now),
        "{after:?}"
    );
    // Refusals write nothing.
    let snap = t.snapshot(SKU).await;
    assert_eq!((snap.available, snap.held), (3, 0));
    assert!(t.users(SKU).await.is_empty());

    // In the window the units go, with the gate's clock on the grant.
    let open = SaleWindow {
        start_ms: now - 1_000,
        end_ms: now + 3_600_000,
    };
    let order = Uuid::new_v4();
    let got = t
        .gate
        .reserve_with(&args(order, "alice", open, 0))
        .await
        .unwrap();
    assert!(
        matches!(got, ReserveOutcome::Reserved { remaining: 2, replayed: false, gate_ms: Some(g) } if g >= now),
        "{got:?}"
    );
    // Once it has closed, that order's replay is still its grant.
    let replay = t
        .gate
        .reserve_with(&args(order, "alice", over, 0))
        .await
        .unwrap();
    assert_eq!(
        replay,
        ReserveOutcome::Reserved {
            remaining: 2,
            replayed: true,
            gate_ms: None
        }
    );
    t.cleanup().await;
}

#[tokio::test]
async fn a_lost_counter_is_rebuilt_before_the_opening_not_at_it() {
    let t = TestGate::new();
    let now = redis_ms(&t).await;
    let later = SaleWindow {
        start_ms: now + 3_600_000,
        end_ms: 0,
    };
    // No counter: the crowd before the opening finds it lost, so it is rebuilt then.
    let got = t
        .gate
        .reserve_with(&args(Uuid::new_v4(), "alice", later, 0))
        .await
        .unwrap();
    assert_eq!(got, ReserveOutcome::NotLoaded);
    t.cleanup().await;
}
