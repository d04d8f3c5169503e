//! Sale windows through CreateOrder: before the opening every buyer is refused
//! `SALE_NOT_STARTED` (from this replica's memory once it knows the window), the opening is the
//! gate's instant whatever the replicas' clocks say, and the stock sells exactly, at the sale
//! price.

use std::{collections::HashMap, time::Duration};

use flashsale_contract::{parse_rfc3339_ms, reason::meta};
use flashsale_order::app::{CLOCK, REMEMBERED};
use flashsale_platform::failpoint::{Action, Failpoints};
use flashsale_proto::product::v1::{Product, UpdateProductRequest};
use tonic::Code;

use crate::helpers::{Client, as_user, create_req, reason, spawn_stack};

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Sleeps until this machine's clock (which its Redis, the gate's clock, shares) reads `ms`.
async fn sleep_until(ms: i64) {
    let left = ms - now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
    }
}

fn instant(s: &tonic::Status, key: &str) -> i64 {
    let m = flashsale_platform::error::info_metadata(s);
    m.get(key)
        .and_then(|v| parse_rfc3339_ms(v))
        .unwrap_or_else(|| panic!("no instant {key} in {m:?}: {s:?}"))
}

/// Asks as fresh buyers until `client` refuses from memory; the refusals seen on the way.
async fn until_remembered(client: &mut Client, sku: &str, tag: &str) -> tonic::Status {
    for i in 0..500 {
        let e = client
            .create_order(as_user(&format!("{tag}-{i}"), create_req("r", sku, 1)))
            .await
            .unwrap_err();
        assert_eq!(reason(&e), "SALE_NOT_STARTED", "{e:?}");
        if e.message().ends_with(REMEMBERED) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{tag}: the replica never refused {sku} from memory");
}

#[tokio::test]
async fn before_the_opening_buyers_are_refused_from_memory_then_the_stock_sells_at_the_sale_price()
{
    let app = spawn_stack(|_| {}).await;
    let start = now_ms() + 3_000;
    app.product_on_sale("SALE-1", 10, 1, start, start + 600_000)
        .await;
    let mut client = app.client().await;

    let first = client
        .create_order(as_user("early", create_req("r1", "SALE-1", 1)))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::FailedPrecondition);
    assert_eq!(reason(&first), "SALE_NOT_STARTED");
    assert_eq!(instant(&first, meta::SALE_START), start);
    assert!(instant(&first, meta::GATE_TIME) < start);
    assert!(
        !first.message().ends_with(REMEMBERED),
        "the gate answered the first: {first:?}"
    );
    let remembered = until_remembered(&mut client, "SALE-1", "crowd").await;
    assert_eq!(instant(&remembered, meta::SALE_START), start);
    assert!(instant(&remembered, meta::GATE_TIME) < start);
    assert_eq!(app.count("SELECT count(*) AS n FROM orders").await, 0);

    sleep_until(start).await;
    let mut accepted = Vec::new();
    for i in 0..25 {
        match client
            .create_order(as_user(&format!("buyer-{i}"), create_req("r", "SALE-1", 1)))
            .await
        {
            Ok(r) => accepted.push(r.into_inner().order.unwrap()),
            Err(e) => assert_eq!(reason(&e), "SOLD_OUT", "{e:?}"),
        }
    }
    assert_eq!(accepted.len(), 10, "exactly the stock");
    for o in &accepted {
        assert_eq!((o.unit_price_cents, o.total_cents), (1999, 1999), "{o:?}");
    }
    // The product's own price is unchanged; the orders keep the price they were accepted at.
    assert_eq!(app.get_product("SALE-1").await.price_cents, 2500);
    assert_eq!(
        app.count("SELECT count(*) AS n FROM orders WHERE unit_price_cents = 1999")
            .await,
        10
    );
}

/// What one call answered, with when it was sent and answered by this machine's clock.
struct Call {
    replica: &'static str,
    sent_ms: i64,
    received_ms: i64,
    answer: Result<(), String>,
    remembered: bool,
}

#[tokio::test]
async fn replicas_whose_clocks_are_four_seconds_apart_open_at_the_gate_s_instant() {
    let skewed = |ms: i64| {
        let fp = Failpoints::default();
        fp.arm(CLOCK, Action::Skew(ms));
        assert_eq!(
            fp.skew_ms(CLOCK),
            ms,
            "a replica's clock is skewed through failpoints: run a build with them (scripts/test.sh)"
        );
        fp
    };
    let app = spawn_stack(|_| {}).await;
    let fast = app.spawn_replica_with(skewed(2_000)).await;
    let slow = app.spawn_replica_with(skewed(-2_000)).await;
    let start = now_ms() + 3_000;
    app.product_on_sale("SKEW-1", 30, 1, start, start + 600_000)
        .await;

    // A crowd on both replicas from before the opening until well after it (bounded in time
    // and count), each call a new buyer.
    let stop = start + 3_000;
    let mut tasks = Vec::new();
    for (name, port) in [("fast", fast.grpc_port), ("slow", slow.grpc_port)] {
        for lane in 0..2 {
            let mut client = crate::helpers::client_at(port).await;
            tasks.push(tokio::spawn(async move {
                let mut calls = Vec::new();
                for i in 0..20_000 {
                    if now_ms() >= stop {
                        break;
                    }
                    let user = format!("{name}-{lane}-{i}");
                    let sent_ms = now_ms();
                    let answer = client
                        .create_order(as_user(&user, create_req("r", "SKEW-1", 1)))
                        .await;
                    let received_ms = now_ms();
                    let (answer, remembered) = match answer {
                        Ok(_) => (Ok(()), false),
                        Err(e) => (Err(reason(&e)), e.message().ends_with(REMEMBERED)),
                    };
                    calls.push(Call {
                        replica: name,
                        sent_ms,
                        received_ms,
                        answer,
                        remembered,
                    });
                    // Paced, so the crowd before the opening does not fill the machine.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                calls
            }));
        }
    }
    let mut calls = Vec::new();
    for t in tasks {
        calls.extend(t.await.unwrap());
    }

    let mut accepted: HashMap<&str, usize> = HashMap::new();
    let mut remembered: HashMap<&str, usize> = HashMap::new();
    for c in &calls {
        match &c.answer {
            Ok(()) => {
                assert!(
                    c.received_ms >= start,
                    "{} accepted an order {} ms before the opening",
                    c.replica,
                    start - c.received_ms
                );
                *accepted.entry(c.replica).or_default() += 1;
            }
            Err(r) if r == "SALE_NOT_STARTED" => {
                assert!(
                    c.sent_ms < start,
                    "{} refused a call sent {} ms after the opening (remembered: {})",
                    c.replica,
                    c.sent_ms - start,
                    c.remembered
                );
                if c.remembered {
                    *remembered.entry(c.replica).or_default() += 1;
                }
            }
            Err(r) => assert_eq!(r, "SOLD_OUT", "{}", c.replica),
        }
    }
    assert_eq!(
        accepted.values().sum::<usize>(),
        30,
        "exactly the stock: {accepted:?}"
    );
    for replica in ["fast", "slow"] {
        assert!(
            remembered.get(replica).copied().unwrap_or(0) > 0,
            "{replica} never refused from memory: {remembered:?}"
        );
    }
}

#[tokio::test]
async fn a_window_moved_by_update_product_is_forgotten_by_every_replica_s_memory() {
    let app = spawn_stack(|_| {}).await;
    let replica = app.spawn_replica().await;
    app.product_on_sale("MOVED-1", 5, 1, now_ms() + 3_600_000, now_ms() + 7_200_000)
        .await;
    let mut one = app.client().await;
    let mut two = replica.client().await;
    until_remembered(&mut one, "MOVED-1", "one").await;
    until_remembered(&mut two, "MOVED-1", "two").await;

    // The opening comes forward by an hour.
    let opening = now_ms() + 1_500;
    app.stock()
        .await
        .update_product(crate::helpers::as_admin(UpdateProductRequest {
            request_id: "move-1".into(),
            product: Some(Product {
                sku: "MOVED-1".into(),
                sale_start: flashsale_contract::ms_to_timestamp(opening),
                ..Product::default()
            }),
            update_mask: Some(flashsale_contract::FieldMask {
                paths: vec!["sale_start".into()],
            }),
        }))
        .await
        .unwrap();
    sleep_until(opening).await;
    // Both replicas sell from the new opening: their memory of the old one is gone.
    for (name, client) in [("one", &mut one), ("two", &mut two)] {
        let mut sold = false;
        for i in 0..100 {
            match client
                .create_order(as_user(
                    &format!("{name}-late-{i}"),
                    create_req("r", "MOVED-1", 1),
                ))
                .await
            {
                Ok(_) => {
                    sold = true;
                    break;
                }
                // Until the event reaches the replica, its memory refuses by the old opening.
                Err(e) => assert_eq!(reason(&e), "SALE_NOT_STARTED", "{name}: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(sold, "{name} never sold after the new opening");
    }
}
