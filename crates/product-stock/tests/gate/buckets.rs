//! Products split into stock buckets: every bucket on its own hash tag, a buyer's orders in one
//! bucket, dry buckets borrowing through two-step transfers that a crash can only strand, and
//! sold out only when every bucket is empty.

use std::collections::HashMap;

use deadpool_redis::redis;
use flashsale_product_stock::{
    domain::bucket_of,
    infra::gate::{
        AdjustOutcome, At, BucketState, GateBuyers, LoadOutcome, RebuiltHold, ReleaseOutcome,
        ReserveOutcome,
    },
};
use uuid::Uuid;

use crate::helpers::{NOW, SKU, TestGate};

const TAKE: &str = include_str!("../../src/infra/gate/lua/take.lua");
const LAND: &str = include_str!("../../src/infra/gate/lua/land.lua");

impl TestGate {
    pub(crate) async fn load_buckets(&self, buckets: u32, available: i64) {
        let loaded = self
            .gate
            .load_product(SKU, buckets, available, &[], &[], NOW)
            .await
            .unwrap();
        assert!(matches!(loaded, LoadOutcome::Loaded { .. }), "{loaded:?}");
    }

    pub(crate) async fn states(&self, buckets: u32) -> Vec<BucketState> {
        self.gate
            .bucket_states(SKU, buckets)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.expect("every bucket is loaded"))
            .collect()
    }

    pub(crate) async fn avails(&self, buckets: u32) -> Vec<i64> {
        self.states(buckets)
            .await
            .iter()
            .map(|s| s.available)
            .collect()
    }

    pub(crate) async fn reserve_in(
        &self,
        buckets: u32,
        user: &str,
        qty: i64,
        limit: u32,
    ) -> ReserveOutcome {
        self.gate
            .reserve_product(SKU, buckets, Uuid::new_v4(), user, qty, limit, NOW)
            .await
            .unwrap()
    }

    /// Runs the first step of a transfer alone, as a borrower that died right after it would
    /// have: `qty` units (at least) out of `from` for `to`.
    pub(crate) async fn take_only(&self, from: u32, to: u32, qty: i64) -> (Uuid, i64, String) {
        self.take_at(from, to, qty, NOW).await
    }

    /// [`Self::take_only`], as if taken at `at_ms`.
    pub(crate) async fn take_at(
        &self,
        from: u32,
        to: u32,
        qty: i64,
        at_ms: i64,
    ) -> (Uuid, i64, String) {
        let k = self.gate.keys_at(At::new(SKU, from)).unwrap();
        let id = Uuid::new_v4();
        let (code, taken, generation): (String, i64, String) = self
            .query(
                redis::cmd("EVAL")
                    .arg(TAKE)
                    .arg(5)
                    .arg(k.avail())
                    .arg(k.moving())
                    .arg(k.transfers())
                    .arg(k.generation())
                    .arg(k.refills())
                    .arg(id.to_string())
                    .arg(qty)
                    .arg(to)
                    .arg(at_ms),
            )
            .await;
        assert_eq!(code, "T");
        (id, taken, generation)
    }

    /// The second step of a transfer, as its borrower runs it.
    pub(crate) async fn land(
        &self,
        to: u32,
        id: Uuid,
        qty: i64,
        generation: &str,
        mode: &str,
    ) -> String {
        let k = self.gate.keys_at(At::new(SKU, to)).unwrap();
        let reply: Vec<redis::Value> = self
            .query(
                redis::cmd("EVAL")
                    .arg(LAND)
                    .arg(4)
                    .arg(k.avail())
                    .arg(k.landing(id))
                    .arg(k.generation())
                    .arg(k.refills())
                    .arg(mode)
                    .arg(qty)
                    .arg(generation)
                    .arg(60_000),
            )
            .await;
        redis::from_redis_value(reply[0].clone()).unwrap()
    }
}

/// A user whose bucket (of `buckets`) is `bucket`.
pub(crate) fn user_in(bucket: u32, buckets: u32) -> String {
    (0..)
        .map(|i| format!("user-{i}"))
        .find(|u| bucket_of(u, buckets) == bucket)
        .unwrap()
}

#[tokio::test]
async fn one_bucket_keeps_the_keys_of_a_product_without_buckets() {
    let t = TestGate::new();
    t.load_buckets(1, 5).await;
    let order = Uuid::new_v4();
    let outcome = t
        .gate
        .reserve_product(SKU, 1, order, "alice", 2, 0, NOW)
        .await
        .unwrap();
    assert!(matches!(
        outcome,
        ReserveOutcome::Reserved { remaining: 3, .. }
    ));
    let keys = t.all_keys().await;
    let tag = format!("{}stock:{{p:{SKU}}}:", t.prefix);
    assert!(keys.iter().all(|k| k.starts_with(&tag)), "{keys:?}");
    assert_eq!(t.order_state(SKU, order).await.as_deref(), Some("H"));
    assert_eq!(t.snapshot(SKU).await.available, 3);
    t.cleanup().await;
}

#[tokio::test]
async fn stock_is_split_evenly_and_each_bucket_has_its_own_hash_tag() {
    let t = TestGate::new();
    t.load_buckets(4, 10).await;
    assert_eq!(t.avails(4).await, [3, 3, 2, 2]);
    for b in 1..4 {
        let avail = t.gate.keys_at(At::new(SKU, b)).unwrap().avail();
        assert!(avail.contains(&format!("{{p:{SKU}:{b}}}")), "{avail}");
    }
    let sum = t.gate.product_snapshot(SKU, 4).await.unwrap().unwrap();
    assert_eq!((sum.available, sum.held), (10, 0));
    // A second load (another replica) changes nothing.
    let again = t
        .gate
        .load_product(SKU, 4, 99, &[], &[], NOW)
        .await
        .unwrap();
    assert_eq!(again, LoadOutcome::AlreadyLoaded);
    assert_eq!(t.avails(4).await, [3, 3, 2, 2]);
    t.cleanup().await;
}

#[tokio::test]
async fn a_dry_bucket_borrows_and_sold_out_comes_only_when_every_bucket_is_empty() {
    let t = TestGate::new();
    t.load_buckets(4, 5).await;
    let alice = user_in(0, 4);
    // Alice's bucket has 2 units: 3 need a transfer from another bucket.
    let got = t.reserve_in(4, &alice, 3, 0).await;
    assert!(matches!(got, ReserveOutcome::Reserved { .. }), "{got:?}");
    let total: i64 = t.avails(4).await.iter().sum();
    assert_eq!(total, 2);
    let bob = user_in(1, 4);
    let short = t.reserve_in(4, &bob, 3, 0).await;
    assert_eq!(short, ReserveOutcome::InsufficientStock { available: 2 });
    let got = t.reserve_in(4, &bob, 2, 0).await;
    assert!(matches!(got, ReserveOutcome::Reserved { .. }), "{got:?}");
    for b in 0..4 {
        let who = user_in(b, 4);
        assert_eq!(t.reserve_in(4, &who, 1, 0).await, ReserveOutcome::SoldOut);
    }
    let states = t.states(4).await;
    assert!(
        states.iter().all(|s| s.available == 0 && s.moving == 0),
        "{states:?}"
    );
    assert_eq!(states.iter().map(|s| s.held).sum::<i64>(), 5);
    // Every hold sits in its buyer's bucket.
    assert_eq!(states[0].held, 3);
    assert_eq!(states[1].held, 2);
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucketed_product_sells_exactly_its_stock_to_a_concurrent_flood() {
    const STOCK: i64 = 100;
    const BUCKETS: u32 = 8;
    const REQUESTS: usize = 1_500;
    let t = TestGate::with_pool_size(32);
    t.load_buckets(BUCKETS, STOCK).await;

    let mut tasks = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let gate = t.gate.clone();
        let user = format!("buyer-{}", i % 300);
        tasks.push(tokio::spawn(async move {
            let order = Uuid::new_v4();
            // A caller retries UNAVAILABLE (stock moving under it), with the same order id.
            for _ in 0..20 {
                match gate
                    .reserve_product(SKU, BUCKETS, order, &user, 1, 0, NOW)
                    .await
                {
                    Ok(outcome) => return outcome,
                    Err(flashsale_product_stock::infra::gate::GateError::Unavailable(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("no answer after 20 tries");
        }));
    }
    let (mut reserved, mut sold_out) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            ReserveOutcome::Reserved {
                replayed: false, ..
            } => reserved += 1,
            ReserveOutcome::SoldOut => sold_out += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reserved, STOCK, "no oversell, nothing left unsold");
    assert_eq!(sold_out, REQUESTS as i64 - STOCK);
    let states = t.states(BUCKETS).await;
    assert!(
        states.iter().all(|s| s.available == 0 && s.moving == 0),
        "nothing stranded: {states:?}"
    );
    assert_eq!(states.iter().map(|s| s.held).sum::<i64>(), STOCK);
    let (settled, returned) = t
        .gate
        .settle_transfers(SKU, BUCKETS, i64::MAX)
        .await
        .unwrap();
    assert_eq!((settled, returned), (0, 0), "every transfer was settled");
    let markers: Vec<String> = t
        .all_keys()
        .await
        .into_iter()
        .filter(|k| k.contains(":xin:"))
        .collect();
    assert!(markers.is_empty(), "landing markers left: {markers:?}");
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_limits_hold_across_buckets_under_concurrency() {
    const BUCKETS: u32 = 8;
    const LIMIT: u32 = 3;
    let t = TestGate::with_pool_size(32);
    // Little stock per bucket, so buyers borrow while they race one another.
    t.load_buckets(BUCKETS, 120).await;
    let mut tasks = Vec::new();
    for u in 0..40 {
        for i in 0..8 {
            let gate = t.gate.clone();
            let user = format!("racer-{u}");
            let qty = 1 + (i % 2);
            tasks.push(tokio::spawn(async move {
                let order = Uuid::new_v4();
                for _ in 0..20 {
                    match gate
                        .reserve_product(SKU, BUCKETS, order, &user, qty, LIMIT, NOW)
                        .await
                    {
                        Ok(outcome) => return (user, qty, outcome),
                        Err(flashsale_product_stock::infra::gate::GateError::Unavailable(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                panic!("no answer after 20 tries");
            }));
        }
    }
    let mut bought: HashMap<String, i64> = HashMap::new();
    for task in tasks {
        let (user, qty, outcome) = task.await.unwrap();
        match outcome {
            ReserveOutcome::Reserved { .. } => *bought.entry(user).or_default() += qty,
            ReserveOutcome::UserLimitExceeded { bought } => {
                assert!(bought + qty > i64::from(LIMIT), "{bought} + {qty}")
            }
            ReserveOutcome::SoldOut | ReserveOutcome::InsufficientStock { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        bought.values().all(|n| *n <= i64::from(LIMIT)),
        "a user got more than the limit: {bought:?}"
    );
    assert!(bought.values().any(|n| *n == i64::from(LIMIT)));
    let states = t.states(BUCKETS).await;
    let sold: i64 = bought.values().sum();
    assert_eq!(states.iter().map(|s| s.held).sum::<i64>(), sold);
    assert_eq!(
        states.iter().map(|s| s.available + s.moving).sum::<i64>(),
        120 - sold
    );
    // Each buyer is counted in their own bucket only.
    for (user, n) in &bought {
        let b = bucket_of(user, BUCKETS);
        let k = t.gate.keys_at(At::new(SKU, b)).unwrap();
        let counted: i64 = t.query(redis::cmd("HGET").arg(k.users()).arg(user)).await;
        assert_eq!(counted, *n, "{user}");
    }
    t.cleanup().await;
}

#[tokio::test]
async fn rebuild_puts_each_hold_and_buyer_in_their_bucket() {
    let t = TestGate::new();
    let (alice, bob) = (user_in(0, 3), user_in(2, 3));
    let hold = RebuiltHold {
        order_id: Uuid::new_v4(),
        user_id: bob.clone(),
        qty: 2,
    };
    let loaded = t
        .gate
        .load_product(
            SKU,
            3,
            11,
            &[(alice.clone(), 4)],
            std::slice::from_ref(&hold),
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(
        loaded,
        LoadOutcome::Loaded {
            available: 9,
            held: 2,
            clamped: false
        }
    );
    assert_eq!(t.avails(3).await, [3, 3, 3]);
    let states = t.states(3).await;
    assert_eq!(states[2].held, 2);
    let users0: Vec<(String, i64)> = t
        .query(redis::cmd("HGETALL").arg(t.gate.keys_at(At::new(SKU, 0)).unwrap().users()))
        .await;
    assert_eq!(users0, [(alice, 4)]);
    let bob_bucket = t.gate.keys_at(At::new(SKU, 2)).unwrap();
    let state: Option<String> = t
        .query(
            redis::cmd("HGET")
                .arg(bob_bucket.order(hold.order_id))
                .arg("s"),
        )
        .await;
    assert_eq!(state.as_deref(), Some("H"));
    // Persisting and releasing it find it in Bob's bucket.
    assert!(
        t.gate
            .mark_persisted(At::new(SKU, 2), hold.order_id)
            .await
            .unwrap()
    );
    let released = t
        .gate
        .release(At::new(SKU, 2), hold.order_id, &bob, 2)
        .await
        .unwrap();
    assert_eq!(
        released,
        ReleaseOutcome::ReleasedPersisted {
            qty: 2,
            available: 5
        }
    );
    t.cleanup().await;
}

#[tokio::test]
async fn restock_and_write_off_spread_over_buckets_once_per_request() {
    let t = TestGate::new();
    t.load_buckets(4, 8).await; // [2, 2, 2, 2]
    let generation = t.gate.product_generation(SKU, 4).await.unwrap();
    assert_eq!(generation.len(), 32, "{generation}");
    // Committed against a gate that was rebuilt since: every bucket counted it already.
    assert_eq!(
        t.gate
            .adjust_product(SKU, 4, "old", 5, "an-earlier-generation")
            .await
            .unwrap(),
        AdjustOutcome::Rebuilt
    );
    assert_eq!(t.avails(4).await, [2, 2, 2, 2]);
    let restock = t
        .gate
        .adjust_product(SKU, 4, "r1", 10, &generation)
        .await
        .unwrap();
    assert_eq!(
        restock,
        AdjustOutcome::Applied {
            applied: 10,
            available: 18,
            clamped: false
        }
    );
    assert_eq!(t.avails(4).await, [5, 5, 4, 4]);
    assert_eq!(
        t.gate
            .adjust_product(SKU, 4, "r1", 10, &generation)
            .await
            .unwrap(),
        AdjustOutcome::Duplicate
    );
    // A write-off applied to bucket 0 only before its applier died, then replayed whole.
    let first = t.gate.adjust(At::new(SKU, 0), "w1", -7).await.unwrap();
    assert!(
        matches!(first, AdjustOutcome::Applied { applied: -5, .. }),
        "{first:?}"
    );
    let replay = t
        .gate
        .adjust_product(SKU, 4, "w1", -7, &generation)
        .await
        .unwrap();
    assert!(
        matches!(
            replay,
            AdjustOutcome::Applied {
                applied: -2,
                available: 11,
                clamped: false
            }
        ),
        "{replay:?}"
    );
    assert_eq!(t.avails(4).await, [0, 3, 4, 4]);
    assert_eq!(
        t.gate
            .adjust_product(SKU, 4, "w1", -7, &generation)
            .await
            .unwrap(),
        AdjustOutcome::Duplicate
    );
    let too_much = t
        .gate
        .adjust_product(SKU, 4, "w2", -20, &generation)
        .await
        .unwrap();
    assert!(
        matches!(
            too_much,
            AdjustOutcome::Applied {
                applied: -11,
                available: 0,
                clamped: true
            }
        ),
        "{too_much:?}"
    );
    t.cleanup().await;
}

#[tokio::test]
async fn repair_sets_every_bucket_from_the_database_figure() {
    let t = TestGate::new();
    t.load_buckets(3, 9).await;
    let alice = user_in(1, 3);
    t.reserve_in(3, &alice, 2, 0).await;
    // Drift: bucket 2 sells 5 units the database does not have.
    t.gate.repair(At::new(SKU, 2), 8).await.unwrap();
    assert_eq!(t.avails(3).await, [3, 1, 8]);
    t.gate.repair_product(SKU, 3, 9).await.unwrap();
    let states = t.states(3).await;
    assert_eq!(states.iter().map(|s| s.available).sum::<i64>(), 7);
    assert_eq!(states[1].held, 2);
    t.cleanup().await;
}

#[tokio::test]
async fn buyers_of_every_bucket_are_listed_and_a_refill_in_any_moves_the_count() {
    let t = TestGate::new();
    t.load_buckets(4, 8).await;
    let users: Vec<String> = (0..4).map(|b| user_in(b, 4)).collect();
    let mut orders = Vec::new();
    for u in &users {
        let order = Uuid::new_v4();
        let got = t
            .gate
            .reserve_product(SKU, 4, order, u, 2, 0, NOW)
            .await
            .unwrap();
        assert!(matches!(got, ReserveOutcome::Reserved { .. }));
        orders.push(order);
    }
    let GateBuyers::Listed {
        available,
        users: mut listed,
        refills,
    } = t.gate.product_buyers(SKU, 4, 100, "").await.unwrap()
    else {
        panic!("wanted a list");
    };
    listed.sort();
    let mut want = users.clone();
    want.sort();
    assert_eq!((available, listed), (0, want));
    assert!(refills.bytes().all(|b| b.is_ascii_digit()) && refills.len() <= 32);
    assert!(matches!(
        t.gate.product_buyers(SKU, 4, 100, &refills).await.unwrap(),
        GateBuyers::Unchanged {
            available: 0,
            count: 4,
            ..
        }
    ));
    assert!(matches!(
        t.gate.product_buyers(SKU, 4, 3, "").await.unwrap(),
        GateBuyers::TooMany { count: 4, .. }
    ));
    // Units come back to bucket 3 only: the product's count moves.
    t.gate
        .release_unpersisted(At::new(SKU, 3), orders[3])
        .await
        .unwrap();
    let after = t.gate.product_buyers(SKU, 4, 100, &refills).await.unwrap();
    assert!(
        matches!(after, GateBuyers::Listed { available: 2, ref users, .. } if users.len() == 3),
        "{after:?}"
    );
    t.cleanup().await;
}
