//! The platform's promises (docs/invariants.md), checked at quiescence by reading every store
//! directly: the three databases, the Redis gate and the queues.

use std::collections::HashSet;

use anyhow::Context as _;
use deadpool_redis::redis;
use flashsale_platform::settings::RedisSettings;
use sqlx::{PgPool, Row as _, postgres::PgPoolOptions};
use uuid::Uuid;

use crate::driver::Seen;

/// One scenario's figures.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub acknowledged: u64,
    /// Units sold beyond the stock: live orders over the units, reserved over on hand.
    pub oversold: u64,
    /// Acknowledged orders missing from the order database, plus accepted payments whose order
    /// neither shipped nor was refunded.
    pub lost: u64,
    /// Orders not SHIPPED or CANCELLED, shipments still PICKING, unpublished outbox rows and
    /// messages waiting in a work queue, at the end.
    pub stuck: u64,
    /// Deliveries beyond the first of one message id (seen on the tap).
    pub dup_delivered: u64,
    /// Effects applied twice: ledger movements, status transitions or accepted payments
    /// repeated for one order.
    pub dup_effects: u64,
    /// |gate avail + held − (on_hand − reserved)|.
    pub drift: u64,
    pub refunds: u64,
    /// Units unaccounted for: initial ≠ on_hand + committed, reserved ≠ Σ live reservations,
    /// shipped orders ≠ committed reservations ≠ shipped shipments, cancelled orders whose
    /// reservation is still live.
    pub conservation: u64,
    /// Acknowledged orders cancelled OUT_OF_STOCK or HOLD_EXPIRED.
    pub ack_cancelled_for_stock: u64,
    /// Acknowledged orders not released by their own buyer (cancel, payment timeout): must not
    /// exceed the units.
    pub ack_net: u64,
    pub units: u64,
    /// Messages parked where an operator sees them (dead_letters rows and DLQ depth).
    pub parked: u64,
    /// Poison messages the scenario published itself (each must be parked).
    pub poison: u64,
    pub converge_ms: u64,
    /// Quiescence was reached before the deadline.
    pub converged: bool,
    /// What the figures are made of, for whoever investigates a failure.
    pub notes: Vec<String>,
    /// Promises a scenario checks on its own (a drift the reconciler did not report, a restock
    /// replay answered as new, a failpoint never reached): each one fails the scenario.
    pub violations: Vec<String>,
}

impl Figures {
    pub fn pass(&self) -> bool {
        self.converged
            && self.oversold == 0
            && self.lost == 0
            && self.stuck == 0
            && self.dup_effects == 0
            && self.drift == 0
            && self.conservation == 0
            && self.ack_cancelled_for_stock == 0
            && self.ack_net <= self.units
            && self.violations.is_empty()
            // Each poison message is parked once per queue it reaches; nothing else is parked.
            && if self.poison == 0 {
                self.parked == 0
            } else {
                self.parked >= self.poison
            }
    }

    /// The one line of figures.
    pub fn line(&self, scenario: &str) -> String {
        format!(
            "scenario={scenario} acknowledged={} oversold={} lost={} stuck={} dup_delivered={} \
             dup_effects={} drift={} refunds={} ack_cancelled_for_stock={} converge_ms={} result={}",
            self.acknowledged,
            self.oversold,
            self.lost,
            self.stuck,
            self.dup_delivered,
            self.dup_effects,
            self.drift,
            self.refunds,
            self.ack_cancelled_for_stock,
            self.converge_ms,
            if self.pass() { "PASS" } else { "FAIL" }
        )
    }

    /// The figures behind the verdict that the line leaves out.
    pub fn detail(&self, scenario: &str) -> String {
        format!(
            "  detail {scenario}: units={} ack_net={} conservation={} parked={} poison={} converged={} violations={:?} {}",
            self.units,
            self.ack_net,
            self.conservation,
            self.parked,
            self.poison,
            self.converged,
            self.violations,
            self.notes.join(" ")
        )
    }
}

/// Where a scenario's state lives.
pub struct Stores {
    pub product_db: String,
    pub order_db: String,
    pub outbound_db: String,
    /// The gate's Redis: one server, or a Redis Cluster.
    pub redis: RedisSettings,
    pub gate_prefix: String,
    pub amqp_url: String,
    pub queue_prefix: String,
    pub sku: String,
}

/// The consumers of the three services (their work queues without the prefix).
const WORK_QUEUES: [&str; 4] = [
    "order.saga-events",
    "product-stock.order-events",
    "product-stock.stock-adjusted",
    "outbound.paid-orders",
];

/// The services' retry settings (`amqp.max_attempts`, `amqp.retry_base_ms`) in the scenarios.
pub const MAX_ATTEMPTS: u32 = 5;
pub const RETRY_BASE_MS: u64 = 100;

/// A consumer's queues as the services name them: work queue, retry queues, parking lot.
fn topology(prefix: &str, name: &str) -> flashsale_messaging::QueueTopology {
    let config = flashsale_messaging::AmqpConfig {
        queue_prefix: prefix.to_owned(),
        max_attempts: MAX_ATTEMPTS,
        retry_base_ms: RETRY_BASE_MS,
        ..flashsale_messaging::AmqpConfig::default()
    };
    flashsale_messaging::QueueTopology::new(&config, name, &[])
}

async fn pool(url: &str) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect(url)
        .await
        .with_context(|| format!("connect {url}"))
}

async fn count(db: &PgPool, sql: &'static str) -> anyhow::Result<u64> {
    let n: i64 = sqlx::query_scalar(sql)
        .fetch_one(db)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// What is still moving: non-terminal orders, PICKING shipments, unpublished outbox rows, holds
/// not persisted and messages waiting in work queues. Zero means quiescent. An unreachable store
/// counts as one.
pub async fn in_flight(s: &Stores) -> u64 {
    let mut n = 0;
    let order = pool(&s.order_db).await;
    let product = pool(&s.product_db).await;
    let outbound = pool(&s.outbound_db).await;
    let (Ok(order), Ok(product), Ok(outbound)) = (order, product, outbound) else {
        return 1;
    };
    let queries: [(&PgPool, &str); 5] = [
        (
            &order,
            "SELECT count(*) FROM orders WHERE status NOT IN ('SHIPPED','CANCELLED')",
        ),
        (
            &outbound,
            "SELECT count(*) FROM shipments WHERE status = 'PICKING'",
        ),
        (
            &order,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        ),
        (
            &product,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        ),
        (
            &outbound,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        ),
    ];
    for (db, sql) in queries {
        n += count(db, sql).await.unwrap_or(1);
    }
    order.close().await;
    product.close().await;
    outbound.close().await;
    n += gate(s).await.map(|g| g.held.max(0) as u64).unwrap_or(0);
    n += queued(s).await.unwrap_or(1);
    n
}

/// Messages ready in the work queues and waiting in their retry queues.
async fn queued(s: &Stores) -> anyhow::Result<u64> {
    let conn = lapin::Connection::connect(&s.amqp_url, lapin::ConnectionProperties::default())
        .await
        .context("connect to the broker")?;
    let mut n = 0;
    for q in WORK_QUEUES {
        let t = topology(&s.queue_prefix, q);
        let names = std::iter::once(t.queue().to_owned())
            .chain((1..=t.retries()).map(|i| t.retry_queue(i)));
        for name in names {
            n += u64::from(crate::tap::depth(&conn, &name).await.unwrap_or(0));
        }
    }
    let _ = conn.close(200, "ok".into()).await;
    Ok(n)
}

/// Messages in the parking lots (dead-letter queues).
async fn parked_in_queues(s: &Stores) -> anyhow::Result<u64> {
    let conn = lapin::Connection::connect(&s.amqp_url, lapin::ConnectionProperties::default())
        .await
        .context("connect to the broker")?;
    let mut n = 0;
    for q in WORK_QUEUES {
        let dlq = topology(&s.queue_prefix, q).dead_letter_queue();
        n += u64::from(crate::tap::depth(&conn, &dlq).await.unwrap_or(0));
    }
    let _ = conn.close(200, "ok".into()).await;
    Ok(n)
}

pub(crate) struct GateState {
    /// `None` when the gate is not loaded (no avail key).
    pub avail: Option<i64>,
    pub held: i64,
}

async fn gate(s: &Stores) -> anyhow::Result<GateState> {
    let pool = flashsale_platform::redis::pool(&s.redis)?;
    let mut c = pool.get().await.context("connect to the gate's Redis")?;
    gate_on(&mut c, s).await
}

/// The sale's product's gate counters, read through `c`.
pub(crate) async fn gate_on(
    c: &mut flashsale_platform::redis::Connection,
    s: &Stores,
) -> anyhow::Result<GateState> {
    let base = format!("{}stock:{{p:{}}}", s.gate_prefix, s.sku);
    let mut get = async |suffix: &str| -> anyhow::Result<Option<i64>> {
        Ok(redis::cmd("GET")
            .arg(format!("{base}:{suffix}"))
            .query_async(&mut **c)
            .await?)
    };
    let avail = get("avail").await?;
    let held = get("held").await?;
    Ok(GateState {
        avail,
        held: held.unwrap_or(0),
    })
}

/// Every figure, read from the stores. `initial` is the product's first stock, `adjusted` the
/// units the scenario's acknowledged AdjustStock calls added (each request counted once).
pub async fn figures(
    s: &Stores,
    seen: &Seen,
    initial: i64,
    adjusted: i64,
) -> anyhow::Result<Figures> {
    let order = pool(&s.order_db).await?;
    let product = pool(&s.product_db).await?;
    let outbound = pool(&s.outbound_db).await?;
    let units = initial + adjusted;
    let mut f = Figures {
        acknowledged: seen.acknowledged.len() as u64,
        units: u64::try_from(units).unwrap_or(0),
        ..Figures::default()
    };

    // Orders as the order database has them.
    let rows = sqlx::query("SELECT order_id, status, cancel_reason, quantity FROM orders")
        .fetch_all(&order)
        .await
        .context("read orders")?;
    let mut live_units = 0i64;
    let mut present = HashSet::new();
    let mut released_by_buyer = 0u64;
    let mut shipped_orders = 0i64;
    let mut ack_reasons: std::collections::BTreeMap<String, u64> = Default::default();
    for r in &rows {
        let id: Uuid = r.try_get("order_id")?;
        let status: String = r.try_get("status")?;
        let reason: Option<String> = r.try_get("cancel_reason")?;
        let qty: i64 = r.try_get("quantity")?;
        present.insert(id);
        if matches!(status.as_str(), "AWAITING_PAYMENT" | "PAID" | "SHIPPED") {
            live_units += qty;
        }
        if status == "SHIPPED" {
            shipped_orders += qty;
        }
        if seen.acknowledged.contains_key(&id) {
            *ack_reasons
                .entry(reason.clone().unwrap_or_else(|| status.clone()))
                .or_default() += 1;
            match reason.as_deref() {
                Some("OUT_OF_STOCK" | "HOLD_EXPIRED") => f.ack_cancelled_for_stock += 1,
                Some("USER_CANCELLED" | "PAYMENT_TIMEOUT") => released_by_buyer += 1,
                _ => {}
            }
        }
    }
    f.notes
        .push(format!("acknowledged_by_outcome={ack_reasons:?}").replace(' ', ""));
    f.ack_net = f.acknowledged.saturating_sub(released_by_buyer);
    f.oversold += u64::try_from(live_units - units).unwrap_or(0);
    f.lost += seen
        .acknowledged
        .keys()
        .filter(|id| !present.contains(id))
        .count() as u64;
    let paid: Vec<Uuid> = seen.paid.iter().copied().collect();
    f.lost += count_bind(
        &order,
        "SELECT count(*) FROM orders o WHERE o.order_id = ANY($1) AND o.status = 'CANCELLED' \
         AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.order_id = o.order_id)",
        &paid,
    )
    .await?;
    f.refunds = count(&order, "SELECT count(*) FROM refunds").await?;
    f.stuck += count(
        &order,
        "SELECT count(*) FROM orders WHERE status NOT IN ('SHIPPED','CANCELLED')",
    )
    .await?;
    f.stuck += count(
        &outbound,
        "SELECT count(*) FROM shipments WHERE status = 'PICKING'",
    )
    .await?;
    for (name, db) in [
        ("order", &order),
        ("product-stock", &product),
        ("outbound", &outbound),
    ] {
        f.stuck += count(db, "SELECT count(*) FROM outbox WHERE published_at IS NULL").await?;
        f.parked += count(
            db,
            "SELECT count(*) FROM dead_letters WHERE state = 'PARKED'",
        )
        .await
        .unwrap_or(0);
        // Why each kind of message was parked, so a failure explains itself.
        let why: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT routing_key, left(error, 160), count(*) FROM dead_letters \
             WHERE state = 'PARKED' GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 5",
        )
        .fetch_all(db)
        .await
        .unwrap_or_default();
        for (key, error, n) in why {
            f.notes
                .push(format!("parked_in_{name}({key}×{n}: {error})"));
        }
    }
    f.stuck += queued(s).await.unwrap_or(0);
    f.parked += parked_in_queues(s).await.unwrap_or(0);

    // Effects applied twice.
    f.dup_effects += count(
        &product,
        "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM stock_ledger \
         WHERE kind IN ('RESERVE','RELEASE','COMMIT') GROUP BY sku, kind, cause) t",
    )
    .await?;
    // A stock adjustment applied twice (or lost) moves on_hand by other than what was asked.
    let ledger_adjusted: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(on_hand_delta), 0)::bigint FROM stock_ledger \
         WHERE sku = $1 AND kind IN ('RESTOCK','WRITE_OFF')",
    )
    .bind(&s.sku)
    .fetch_one(&product)
    .await
    .context("sum stock adjustments")?;
    f.dup_effects += (ledger_adjusted - adjusted).unsigned_abs();
    if adjusted != 0 || ledger_adjusted != 0 {
        f.notes.push(format!(
            "adjusted(asked={adjusted},ledger={ledger_adjusted})"
        ));
    }
    f.dup_effects += count(
        &order,
        "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM \
         order_status_history GROUP BY order_id, to_status) t",
    )
    .await?;
    f.dup_effects += count(
        &order,
        "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM payments \
         WHERE accepted GROUP BY order_id) t",
    )
    .await?;
    // The warehouse asked more than once for a shipment (a transient non-answer is not an ask
    // that ships).
    let asked_again = count(
        &outbound,
        "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM shipment_attempts \
         WHERE step = 'warehouse' AND outcome <> 'TRANSIENT' GROUP BY shipment_id) t",
    )
    .await?;
    f.dup_effects += asked_again;
    // Outbound deducts, then ships: a RESERVE_THEN_COMMIT shipment the warehouse was asked for
    // before its units were deducted, and a shipment failed on a transient error (a dependency
    // that did not answer delays a shipment, never fails it), each break a promise.
    let shipped_first = count(
        &outbound,
        "SELECT count(*) FROM shipments s WHERE s.policy = 'RESERVE_THEN_COMMIT' AND EXISTS ( \
             SELECT 1 FROM shipment_attempts w WHERE w.shipment_id = s.shipment_id \
             AND w.step = 'warehouse' AND w.outcome <> 'TRANSIENT' AND NOT EXISTS ( \
                 SELECT 1 FROM shipment_attempts c WHERE c.shipment_id = s.shipment_id \
                 AND c.step = 'commit' AND c.outcome = 'OK' AND c.id < w.id))",
    )
    .await?;
    let failed_transient = count(
        &outbound,
        "SELECT count(*) FROM shipments s WHERE s.status = 'FAILED' AND NOT EXISTS ( \
             SELECT 1 FROM shipment_attempts a WHERE a.shipment_id = s.shipment_id \
             AND a.outcome = 'PERMANENT')",
    )
    .await?;
    if shipped_first > 0 {
        f.violations.push(format!(
            "{shipped_first} shipment(s) asked of the warehouse before their units were deducted"
        ));
    }
    if failed_transient > 0 {
        f.violations.push(format!(
            "{failed_transient} shipment(s) failed though nothing refused them for good"
        ));
    }
    let asks = count(
        &outbound,
        "SELECT count(*) FROM shipment_attempts WHERE step = 'warehouse' AND outcome <> 'TRANSIENT'",
    )
    .await?;
    let delayed = count(
        &outbound,
        "SELECT count(*) FROM shipment_attempts WHERE outcome = 'TRANSIENT'",
    )
    .await?;
    f.notes.push(format!(
        "warehouse(asks={asks},asked_again={asked_again},delayed_attempts={delayed})"
    ));

    // Stock.
    let stock = sqlx::query("SELECT on_hand, reserved FROM stock WHERE sku = $1")
        .bind(&s.sku)
        .fetch_one(&product)
        .await
        .context("read stock")?;
    let on_hand: i64 = stock.try_get("on_hand")?;
    let reserved: i64 = stock.try_get("reserved")?;
    let sum = |state: &'static str| {
        let product = product.clone();
        let sku = s.sku.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT coalesce(sum(quantity), 0)::bigint FROM reservations \
                 WHERE sku = $1 AND state = $2",
            )
            .bind(sku)
            .bind(state)
            .fetch_one(&product)
            .await
            .context("sum reservations")
        }
    };
    let committed = sum("COMMITTED").await?;
    let live = sum("RESERVED").await?;
    f.oversold += u64::try_from(reserved - on_hand).unwrap_or(0);
    f.oversold += u64::try_from(committed - units).unwrap_or(0);
    let shipped_shipments: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(quantity), 0)::bigint FROM shipments WHERE status = 'SHIPPED'",
    )
    .fetch_one(&outbound)
    .await
    .context("sum shipments")?;
    // Cancelled orders whose units the stock still holds.
    let cancelled: Vec<Uuid> =
        sqlx::query_scalar("SELECT order_id FROM orders WHERE status = 'CANCELLED'")
            .fetch_all(&order)
            .await?;
    let held_for_cancelled: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT order_id, state, quantity FROM reservations \
         WHERE order_id = ANY($1) AND state <> 'RELEASED'",
    )
    .bind(&cancelled)
    .fetch_all(&product)
    .await
    .context("read reservations of cancelled orders")?;
    let parts = [
        (units - on_hand - committed).unsigned_abs(),
        (reserved - live).unsigned_abs(),
        (shipped_orders - committed).unsigned_abs(),
        (shipped_shipments - committed).unsigned_abs(),
        held_for_cancelled.len() as u64,
    ];
    f.conservation = parts.iter().sum();
    f.notes.push(format!(
        "stock(on_hand={on_hand},reserved={reserved},committed={committed},live={live},\
         shipped_orders={shipped_orders},shipped_shipments={shipped_shipments})"
    ));
    if f.conservation > 0 {
        f.notes.push(
            format!(
                "conservation_parts(initial,reserved,orders,shipments,cancelled_held)={parts:?}"
            )
            .replace(' ', ""),
        );
        for (id, state, qty) in held_for_cancelled.iter().take(5) {
            f.notes
                .push(format!("cancelled_order_still_held={id}:{state}:{qty}"));
        }
        if let Some((id, _, _)) = held_for_cancelled.first() {
            f.notes.push(history(&order, &product, *id).await);
        }
    }

    // The gate against the database (RESERVE_THEN_COMMIT: avail + held = on_hand − reserved).
    if let Ok(g) = gate(s).await
        && let Some(avail) = g.avail
    {
        f.drift = (avail + g.held - (on_hand - reserved)).unsigned_abs();
    }
    order.close().await;
    product.close().await;
    outbound.close().await;
    Ok(f)
}

async fn count_bind(db: &PgPool, sql: &'static str, ids: &[Uuid]) -> anyhow::Result<u64> {
    let n: i64 = sqlx::query_scalar(sql)
        .bind(ids)
        .fetch_one(db)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The order's transitions and the stock's movements for it, oldest first, as one token.
async fn history(order: &PgPool, product: &PgPool, id: Uuid) -> String {
    let steps: Vec<(Option<String>, String, String, String)> = sqlx::query_as(
        "SELECT from_status, to_status, reason, to_char(at, 'HH24:MI:SS.MS') \
         FROM order_status_history WHERE order_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(order)
    .await
    .unwrap_or_default();
    let moves: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT kind, reserved_delta, to_char(created_at, 'HH24:MI:SS.MS') FROM stock_ledger \
         WHERE cause = $1 ORDER BY id",
    )
    .bind(id.to_string())
    .fetch_all(product)
    .await
    .unwrap_or_default();
    let res: Option<(String, String, String, String)> = sqlx::query_as(
        "SELECT state, cause, to_char(created_at, 'HH24:MI:SS.MS'), \
         to_char(updated_at, 'HH24:MI:SS.MS') FROM reservations WHERE order_id = $1",
    )
    .bind(id)
    .fetch_optional(product)
    .await
    .ok()
    .flatten();
    format!("history({id})=orders:{steps:?};ledger:{moves:?};reservation:{res:?}").replace(' ', "")
}
