//! The gate on a Redis Cluster of three masters and three replicas (a private one per test,
//! started by `flashsale_test_support::redis_cluster`; these tests fail, never skip, without
//! `redis-server`): the same scripts routed by their first key, pipelines mixing slots, scans
//! of every master, the run-id check per master, and a master killed mid-sale.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use deadpool_redis::redis;
use flashsale_platform::{
    redis::{Pool, key_slot},
    settings::RedisSettings,
};
use flashsale_product_stock::infra::gate::{
    GateError, LoadOutcome, RebuiltHold, RedisGate, ReserveArgs, ReserveOutcome, RunCheck,
    SaleWindow, check_redis_run, product_tag,
};
use flashsale_test_support::redis_cluster::RedisCluster;
use uuid::Uuid;

use crate::helpers::{NOW, clock_checked};

/// A gate over a private cluster, under a fresh key prefix.
struct ClusterGate {
    cluster: RedisCluster,
    gate: RedisGate,
    pool: Pool,
    prefix: String,
}

impl ClusterGate {
    /// A cluster and a gate whose pool checks run ids on every new connection (as the service's).
    async fn start(pool_size: usize) -> Self {
        Self::start_with(pool_size, true).await
    }

    async fn start_with(pool_size: usize, run_check_on_connect: bool) -> Self {
        let cluster = RedisCluster::start().await.unwrap();
        let prefix = format!("{}:", flashsale_test_support::unique_name("gate_cluster"));
        let settings = RedisSettings {
            key_prefix: prefix.clone(),
            pool_size,
            ..RedisSettings::cluster(cluster.urls())
        };
        let pool = if run_check_on_connect {
            RedisGate::pool(&settings, &prefix).unwrap()
        } else {
            flashsale_platform::redis::pool(&settings).unwrap()
        };
        let gate = RedisGate::new(pool.clone(), prefix.clone(), Duration::from_secs(3600));
        Self {
            cluster,
            gate,
            pool,
            prefix,
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.pool.get().await.unwrap();
        cmd.query_async(&mut *conn).await.unwrap()
    }

    /// Every key under the prefix, on every master (KEYS goes to each).
    async fn all_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .query(redis::cmd("KEYS").arg(format!("{}*", self.prefix)))
            .await;
        keys.sort();
        keys
    }

    /// The port of the master serving `sku`'s keys.
    async fn master_of(&self, sku: &str) -> u16 {
        self.cluster.master_of(slot_of(sku)).await.unwrap()
    }

    /// Whether the order's record exists (wherever its slot is served now).
    async fn has_record(&self, sku: &str, order: Uuid) -> bool {
        let key = self.gate.keys(sku).unwrap().order(order);
        self.query::<i64>(redis::cmd("EXISTS").arg(key)).await == 1
    }
}

fn slot_of(sku: &str) -> u16 {
    key_slot(product_tag(sku).as_bytes())
}

/// `count` skus (24 of them spread over all three masters).
fn skus(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("CL-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn products_on_every_master_reserve_persist_release_and_rebuild_as_on_one_redis() {
    let t = ClusterGate::start(4).await;
    let skus = skus(24);
    let mut by_master: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for sku in &skus {
        by_master
            .entry(t.master_of(sku).await)
            .or_default()
            .push(sku.clone());
    }
    assert_eq!(by_master.len(), 3, "{by_master:?}");

    // The pool's first connection recorded each master's run id on that master.
    let mut conn = t.pool.get().await.unwrap();
    assert_eq!(
        check_redis_run(&mut conn, &t.prefix).await.unwrap(),
        RunCheck::Same
    );
    drop(conn);
    assert_eq!(
        t.all_keys()
            .await
            .iter()
            .filter(|k| k.contains("gate_run:"))
            .count(),
        3
    );

    for sku in &skus {
        assert!(t.gate.load(sku, 10, &[]).await.unwrap(), "{sku}");
    }
    // One pipeline of reservations across every slot and master.
    let orders: Vec<Uuid> = skus.iter().map(|_| Uuid::new_v4()).collect();
    let items: Vec<ReserveArgs<'_>> = skus
        .iter()
        .zip(&orders)
        .map(|(sku, &order_id)| ReserveArgs {
            sku,
            bucket: 0,
            order_id,
            user_id: "buyer",
            qty: 2,
            per_user_limit: 0,
            now_ms: NOW,
            window: SaleWindow::ALWAYS,
        })
        .collect();
    for (sku, outcome) in skus.iter().zip(t.gate.reserve_many(&items).await.unwrap()) {
        assert_eq!(
            clock_checked(outcome.unwrap()),
            ReserveOutcome::Reserved {
                remaining: 8,
                replayed: false,
                gate_ms: None
            },
            "{sku}"
        );
    }
    // A replay on a cluster answers from the order's record as on one server.
    assert_eq!(
        t.gate
            .reserve(&skus[0], orders[0], "buyer", 2, 0, NOW)
            .await
            .unwrap(),
        ReserveOutcome::Reserved {
            remaining: 8,
            replayed: true,
            gate_ms: None
        }
    );

    // Half persisted (one pipeline across slots), a quarter released as holds, the persisted
    // ones of the last quarter released after the database (prepare, then finish).
    let (persisted, rest) = skus.split_at(12);
    let marks: Vec<(&str, Uuid)> = persisted
        .iter()
        .zip(&orders)
        .map(|(sku, &order)| (sku.as_str(), order))
        .collect();
    for (sku, marked) in persisted
        .iter()
        .zip(t.gate.mark_persisted_many(&marks).await.unwrap())
    {
        assert!(marked.unwrap(), "{sku}");
    }
    for (sku, &order) in rest.iter().zip(&orders[12..]) {
        t.gate.release_unpersisted(sku, order).await.unwrap();
    }
    for (sku, &order) in persisted[6..].iter().zip(&orders[6..12]) {
        t.gate
            .prepare_release(sku, order, "buyer", 2)
            .await
            .unwrap();
        t.gate.finish_release(sku, order).await.unwrap();
    }
    for (i, sku) in skus.iter().enumerate() {
        let snap = t.gate.snapshot(sku).await.unwrap().unwrap();
        let expected = if i < 6 { 8 } else { 10 };
        assert_eq!((snap.available, snap.held), (expected, 0), "{sku}");
    }

    // A lost product (forget scans every master) rebuilds from the database's figures.
    for products in by_master.values() {
        let sku = &products[0];
        assert!(t.gate.forget(sku).await.unwrap() > 0, "{sku}");
        assert!(t.gate.snapshot(sku).await.unwrap().is_none(), "{sku}");
        assert!(t.gate.load(sku, 7, &[]).await.unwrap());
        assert_eq!(t.gate.snapshot(sku).await.unwrap().unwrap().available, 7);
    }

    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_run_id_on_one_master_drops_only_the_gates_that_master_serves() {
    let t = ClusterGate::start(2).await;
    let skus = skus(12);
    for sku in &skus {
        assert!(t.gate.load(sku, 5, &[]).await.unwrap());
        t.gate
            .reserve(sku, Uuid::new_v4(), "u", 1, 0, NOW)
            .await
            .unwrap();
    }
    let victim = t.master_of(&skus[0]).await;
    // Pretend the victim came back from a snapshot: its recorded run id is not its own.
    let run_keys: Vec<String> = t
        .all_keys()
        .await
        .into_iter()
        .filter(|k| k.contains("gate_run:"))
        .collect();
    let mut faked = 0;
    for key in &run_keys {
        let slot = key_slot(key.as_bytes());
        if t.cluster.master_of(slot).await.unwrap() == victim {
            let _: () = t
                .query(redis::cmd("SET").arg(key).arg("an-earlier-life"))
                .await;
            faked += 1;
        }
    }
    assert_eq!(faked, 1, "{run_keys:?}");

    let mut conn = t.pool.get().await.unwrap();
    let found = check_redis_run(&mut conn, &t.prefix).await.unwrap();
    assert!(
        matches!(found, RunCheck::Stale { deleted, won: true } if deleted > 0),
        "{found:?}"
    );
    assert_eq!(
        check_redis_run(&mut conn, &t.prefix).await.unwrap(),
        RunCheck::Same
    );
    drop(conn);
    for sku in &skus {
        let on_victim = t.master_of(sku).await == victim;
        let snap = t.gate.snapshot(sku).await.unwrap();
        assert_eq!(snap.is_none(), on_victim, "{sku}: {snap:?}");
        if on_victim {
            // Missing: the service rebuilds it; a reserve says so meanwhile.
            assert_eq!(
                t.gate
                    .reserve(sku, Uuid::new_v4(), "u", 1, 0, NOW)
                    .await
                    .unwrap(),
                ReserveOutcome::NotLoaded
            );
        }
    }
    t.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_concurrent_reservations_on_a_cluster_hands_out_exactly_the_stock() {
    const STOCK: i64 = 100;
    const REQUESTS: usize = 1_000;
    let t = ClusterGate::start(16).await;
    // Two products on two different masters.
    let skus = skus(24);
    let first = t.master_of(&skus[0]).await;
    let mut other = None;
    for sku in &skus[1..] {
        if t.master_of(sku).await != first {
            other = Some(sku.clone());
            break;
        }
    }
    let products = [skus[0].clone(), other.unwrap()];
    for sku in &products {
        t.gate.load(sku, STOCK, &[]).await.unwrap();
    }
    let mut tasks = Vec::new();
    for i in 0..REQUESTS {
        let gate = t.gate.clone();
        let sku = products[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let outcome = gate
                .reserve(&sku, Uuid::new_v4(), &format!("user-{i}"), 1, 0, NOW)
                .await
                .unwrap();
            (sku, outcome)
        }));
    }
    let mut reserved: HashMap<String, i64> = HashMap::new();
    for task in tasks {
        let (sku, outcome) = task.await.unwrap();
        match outcome {
            ReserveOutcome::Reserved { .. } => *reserved.entry(sku).or_default() += 1,
            ReserveOutcome::SoldOut => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for sku in &products {
        assert_eq!(reserved[sku], STOCK, "{sku}");
        let snap = t.gate.snapshot(sku).await.unwrap().unwrap();
        assert_eq!((snap.available, snap.held), (0, STOCK), "{sku}");
    }
    t.cleanup().await;
}

/// What the flood below learnt of one order.
#[derive(Clone, Copy, Debug)]
struct Acked {
    order: Uuid,
    /// Acknowledged after the victim stopped replicating and before it was killed: certainly
    /// lost with it.
    in_the_lost_tail: bool,
}

/// Reserves one unit of `sku` for a new order, retrying the same order id while the cluster
/// is unavailable (a failover), as a caller would; `None` once the product is sold out or its
/// gate is not loaded (the service would rebuild it then).
async fn reserve_through_failover(gate: &RedisGate, sku: &str, user: &str) -> Option<Uuid> {
    let order = Uuid::new_v4();
    for _ in 0..200 {
        match gate.reserve(sku, order, user, 1, 0, NOW).await {
            Ok(ReserveOutcome::Reserved { .. }) => return Some(order),
            Ok(
                ReserveOutcome::SoldOut
                | ReserveOutcome::InsufficientStock { .. }
                | ReserveOutcome::NotLoaded,
            ) => return None,
            Ok(other) => panic!("{sku}: unexpected {other:?}"),
            Err(GateError::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{sku}: {e}"),
        }
    }
    panic!("{sku}: the cluster stayed unavailable for 200 tries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_mid_sale_fails_over_without_selling_the_holds_it_lost_again() {
    const STOCK: i64 = 300;
    const BEFORE: usize = 100;
    const LOST_TAIL: usize = 5;
    const FLOOD: usize = 960;
    // The pool does not check run ids by itself here (nor does a cluster connection when it
    // moves to a promoted replica), so only the gate's own check stands between the promoted
    // master's counters and the next buyer.
    let mut t = ClusterGate::start_with(16, false).await;
    let skus = skus(24);
    let victim = t.master_of(&skus[0]).await;
    let mut products = Vec::new();
    let mut bystander = None;
    for sku in &skus {
        if t.master_of(sku).await == victim {
            products.push(sku.clone());
        } else if bystander.is_none() {
            bystander = Some(sku.clone());
        }
    }
    products.truncate(2);
    assert_eq!(products.len(), 2, "{skus:?}");
    let bystander = bystander.unwrap();
    let mut conn = t.pool.get().await.unwrap();
    assert_eq!(
        check_redis_run(&mut conn, &t.prefix).await.unwrap(),
        RunCheck::Recorded
    );
    drop(conn);
    for sku in products.iter().chain([&bystander]) {
        t.gate.load(sku, STOCK, &[]).await.unwrap();
    }
    t.gate
        .reserve(&bystander, Uuid::new_v4(), "b", 3, 0, NOW)
        .await
        .unwrap();

    // Sold and replicated.
    let mut acked: HashMap<String, Vec<Acked>> = HashMap::new();
    for sku in &products {
        for i in 0..BEFORE {
            let order = reserve_through_failover(&t.gate, sku, &format!("a{i}"))
                .await
                .unwrap();
            acked.entry(sku.clone()).or_default().push(Acked {
                order,
                in_the_lost_tail: false,
            });
        }
    }
    // Every pooled connection opened now, while the victim still accepts new ones.
    let mut open = Vec::new();
    for _ in 0..16 {
        let mut conn = t.pool.get().await.unwrap();
        let _: i64 = redis::cmd("EXISTS")
            .arg(t.gate.keys(&products[0]).unwrap().avail())
            .query_async(&mut *conn)
            .await
            .unwrap();
        open.push(conn);
    }
    drop(open);
    // Wait until the replica has all of that, then cut it off: what follows is acknowledged
    // by the master alone.
    let _: i64 = t.query(redis::cmd("WAIT").arg(1).arg(5_000)).await;
    t.cluster.cut_replication(victim).await.unwrap();
    for sku in &products {
        for i in 0..LOST_TAIL {
            let order = reserve_through_failover(&t.gate, sku, &format!("t{i}"))
                .await
                .unwrap();
            acked.get_mut(sku).unwrap().push(Acked {
                order,
                in_the_lost_tail: true,
            });
        }
    }

    // A flood on both products while the master dies and its replica takes over.
    let started = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for worker in 0..16 {
        let (gate, products, started) = (t.gate.clone(), products.clone(), started.clone());
        flood.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..FLOOD / 16 {
                let sku = &products[(worker + i) % 2];
                started.fetch_add(1, Ordering::Relaxed);
                match reserve_through_failover(&gate, sku, &format!("f{worker}-{i}")).await {
                    Some(order) => got.push((sku.clone(), order)),
                    None => break,
                }
                // Paced, so the sale is still on when the master dies.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            got
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while started.load(Ordering::Relaxed) < 16 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let promoted = t.cluster.kill_master(victim).await.unwrap();
    assert_ne!(promoted, victim);
    for task in flood {
        for (sku, order) in task.await.unwrap() {
            acked.get_mut(&sku).unwrap().push(Acked {
                order,
                in_the_lost_tail: false,
            });
        }
    }

    for sku in &products {
        // Whatever the flood did, the promoted master answers "not loaded" from now on.
        assert_eq!(
            t.gate
                .reserve(sku.as_str(), Uuid::new_v4(), "late", 1, 0, NOW)
                .await
                .unwrap(),
            ReserveOutcome::NotLoaded,
            "{sku}"
        );
        assert!(t.gate.snapshot(sku).await.unwrap().is_none(), "{sku}");
        let orders = &acked[sku];
        let unique: HashSet<Uuid> = orders.iter().map(|a| a.order).collect();
        assert_eq!(
            unique.len(),
            orders.len(),
            "{sku}: an order acknowledged twice"
        );
        let mut lost = 0;
        for a in orders {
            if !t.has_record(sku, a.order).await {
                lost += 1;
            }
            if a.in_the_lost_tail {
                assert!(!t.has_record(sku, a.order).await, "{sku}: {a:?} survived");
            }
        }
        assert!(lost >= LOST_TAIL as i64, "{sku}: lost {lost}");
        // The promoted master sold nothing from counters that had forgotten those holds: the
        // gate never handed out more than the stock.
        let handed_out = orders.len() as i64;
        assert!(
            handed_out <= STOCK,
            "{sku}: handed out {handed_out} of {STOCK} ({lost} lost with the master)"
        );
        eprintln!("{sku}: handed out {handed_out} of {STOCK}; lost with the master {lost}");
    }
    // No other master's gate moved.
    let bystander_snap = t.gate.snapshot(&bystander).await.unwrap().unwrap();
    assert_eq!(
        (bystander_snap.available, bystander_snap.held),
        (STOCK - 3, 3)
    );

    // The rebuild counts every acknowledged order again, the lost ones included (the service
    // gets them from the database and the order service): each is a hold once more, and the
    // stock covers them all.
    for sku in &products {
        let orders = &acked[sku];
        let holds: Vec<RebuiltHold> = orders
            .iter()
            .map(|a| RebuiltHold {
                order_id: a.order,
                user_id: format!("buyer-{}", a.order),
                qty: 1,
            })
            .collect();
        let handed_out = orders.len() as i64;
        let outcome = t
            .gate
            .load_with_holds(sku, STOCK, &[], &holds, NOW)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            LoadOutcome::Loaded {
                available: STOCK - handed_out,
                held: handed_out,
                clamped: false,
            },
            "{sku}"
        );
        for a in orders {
            assert!(t.has_record(sku, a.order).await, "{sku}: {a:?}");
        }
        // Loaded on the promoted master, the gate sells again.
        assert!(matches!(
            t.gate
                .reserve(sku.as_str(), Uuid::new_v4(), "after", 1, 0, NOW)
                .await
                .unwrap(),
            ReserveOutcome::Reserved { .. } | ReserveOutcome::SoldOut
        ));
    }
    t.cleanup().await;
}

impl ClusterGate {
    /// Deletes every key under this test's prefix and checks none is left.
    async fn cleanup(self) {
        let keys = self.all_keys().await;
        for chunk in keys.chunks(500) {
            let _: u64 = self.query(redis::cmd("DEL").arg(chunk)).await;
        }
        assert!(self.all_keys().await.is_empty());
    }
}
