//! The sustained sale (`--arrival-rate R --sustain-secs N`): instead of one burst, buyers
//! arrive open loop at a fixed rate for N seconds against a large stock, and each paying
//! winner pays shortly after its order is confirmed — so the saga, the payments, the
//! timeouts and the shipping run alongside the intake. Every second the run records what the
//! driver did (accepted, payments started and paid at the provider) and what the platform did
//! (confirmed, paid, shipped, read from the order database), with the backlog: orders waiting
//! for the saga (PENDING) or for shipping (PAID), the unsent outbox rows of each database it is
//! given, and the ready messages of the services' work queues (a passive declare on the
//! broker, when given `--amqp-url`). After the arrivals stop it waits for the backlog to drain
//! (bounded by `--max-duration-secs`) and reports whether the backlog stayed bounded: a
//! backlog that kept growing fails the run, as do units sold beyond a product's stock, a buyer
//! over the per-user limit (both read from the order database) and a gate that differs from
//! the database.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use flashsale_contract::queues;
use flashsale_proto::{
    order::v1::{GetOrderRequest, OrderStatus, PayOrderRequest},
    payment::v1::PayCheckoutRequest,
};
use sea_orm::{ConnectionTrait as _, DatabaseConnection, FromQueryResult, Statement};
use serde_json::{Value, json};
use tokio::time::{Instant, MissedTickBehavior};

use super::{
    Ctx,
    checks::Check,
    latency::{Call, Latencies, Summary},
    progress,
    read::{self, request},
    sold::{Sold, stock_checks},
};
use crate::{
    bench::{
        counters::{PG_STATS_SETTLE, Sources},
        dbwork::{self, DbWork},
    },
    client::{Placed, place_order},
};

/// Most CreateOrder calls (with their payments) the driver keeps in flight; an arrival beyond
/// it is counted as skipped, never queued (the load stays open loop and bounded).
pub(crate) const MAX_IN_FLIGHT: u64 = 20_000;
/// A paying winner pays this long after its order was accepted; while the order is still
/// PENDING it tries again after twice as long each time, up to [`PAY_RETRY_MAX`], and only
/// then also asks whether the order is still payable. A real buyer is not faster, and a driver
/// whose waiting buyers asked at a fixed pace would, once a backlog formed, send calls in
/// proportion to it and keep the saga from ever draining it.
const PAY_RETRY: Duration = Duration::from_millis(200);
/// The longest pause between a waiting buyer's tries.
const PAY_RETRY_MAX: Duration = Duration::from_millis(1_600);
/// How many of each database's most frequent statements the report lists.
const TOP_STATEMENTS: usize = 12;
/// How often the platform is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Where the sustained sale reads the platform's backlog.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Backlog {
    /// The order service's database (PostgreSQL URL): the timeline's confirmed, paid and
    /// shipped orders and the order outbox. Required with --arrival-rate.
    #[arg(long, env = "FLASHSALE_ORDER__DATABASE__URL")]
    pub order_database_url: Option<String>,
    /// product-stock's database: its unsent outbox rows.
    #[arg(long)]
    pub product_database_url: Option<String>,
    /// The outbound service's database: its unsent outbox rows.
    #[arg(long)]
    pub outbound_database_url: Option<String>,
    /// The broker (AMQP URL): ready messages in the services' work queues.
    #[arg(long)]
    pub amqp_url: Option<String>,
    /// The services' `amqp.queue_prefix`.
    #[arg(long, default_value = "")]
    pub queue_prefix: String,
    /// The PostgreSQL server of the three databases (URL without a database), read for the
    /// statements and commits per shipped order where it has `pg_stat_statements`; connect as
    /// the bench's own role (`flashsale_bench_probe`) so that its reads are left out.
    #[arg(long, env = "FLASHSALE_BENCH_PROBE_POSTGRES_URL")]
    pub stats_postgres_url: Option<String>,
    /// Redis, read with the PostgreSQL counters.
    #[arg(
        long,
        env = "FLASHSALE_BENCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub stats_redis_url: String,
}

impl Backlog {
    /// The three databases by owner, named by the last segment of their URLs.
    fn databases(&self) -> Vec<(String, String)> {
        [
            ("order", &self.order_database_url),
            ("product-stock", &self.product_database_url),
            ("outbound", &self.outbound_database_url),
        ]
        .into_iter()
        .filter_map(|(owner, url)| {
            let name = url.as_deref()?.rsplit('/').next()?.split('?').next()?;
            Some((owner.to_owned(), name.to_owned()))
        })
        .collect()
    }
}

/// The driver's own counts, cumulative.
#[derive(Default)]
struct Counts {
    arrivals: AtomicU64,
    skipped: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// Refused `OVERLOADED` by admission control.
    overloaded: AtomicU64,
    errors: AtomicU64,
    pay_started: AtomicU64,
    paid: AtomicU64,
    pay_failed: AtomicU64,
    in_flight: AtomicU64,
}

/// One second of the run.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: f64,
    arriving: bool,
    arrivals: u64,
    accepted: u64,
    pay_started: u64,
    paid_at_provider: u64,
    /// From the order database, cumulative.
    confirmed: Option<i64>,
    paid: Option<i64>,
    shipped: Option<i64>,
    pending: Option<i64>,
    paid_unshipped: Option<i64>,
    /// Unsent outbox rows: order, product-stock, outbound.
    outbox: [Option<i64>; 3],
    /// Ready messages: order, product-stock, outbound work queues.
    queues: [Option<u32>; 3],
}

impl Sample {
    /// Orders waiting on the saga or on shipping.
    fn backlog(&self) -> Option<i64> {
        Some(self.pending? + self.paid_unshipped?)
    }
}

struct Probes {
    orders: DatabaseConnection,
    product: Option<DatabaseConnection>,
    outbound: Option<DatabaseConnection>,
    amqp: Option<lapin::Connection>,
    queues: [String; 3],
    skus: Vec<String>,
}

/// What the sustained run measured.
pub(crate) struct Sustained {
    samples: Vec<Sample>,
    rate: u32,
    secs: u64,
    drain: Option<f64>,
    counts: [u64; 9],
    left_paid: Option<i64>,
    /// Refused `OVERLOADED` by admission control.
    overloaded: u64,
    /// CreateOrder and PayOrder latencies.
    latency: Summary,
    /// Statements and commits per shipped order, where the server counts statements.
    dbwork: Option<DbWork>,
    /// The statements run most often in each database: `(owner, calls, query)`.
    top_statements: Vec<(String, i64, String)>,
    /// Stock, per-user limit and gate, read back after the drain; the refusals' latency; the
    /// services' memory.
    checks: Vec<Check>,
}

/// Runs arrivals at `rate` a second for `secs` seconds, then drains; samples every second.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    rate: u32,
    secs: u64,
    pay_share: f64,
    backlog: &Backlog,
) -> anyhow::Result<Sustained> {
    let probes = Probes::connect(&ctx, backlog).await?;
    let sources = match &backlog.stats_postgres_url {
        Some(url) => Sources::connect(url, &[], &backlog.stats_redis_url)
            .await
            .inspect_err(|e| progress(&format!("no database work per order: {e:#}")))
            .ok(),
        None => None,
    };
    let db_before = match &sources {
        Some(s) => {
            s.reset_statements().await;
            s.read().await.ok()
        }
        None => None,
    };
    let counts = Arc::new(Counts::default());
    let latencies = Arc::new(Latencies::new()?);
    let started = Instant::now();
    let arrivals_end = started + Duration::from_secs(secs);
    let total = u64::from(rate) * secs;
    progress(&format!(
        "sustained sale: {rate} arrivals/s for {secs} s ({total} buyers), {:.0}% of the winners pay",
        pay_share * 100.0
    ));
    let arrivals = tokio::spawn(arrive(
        ctx.clone(),
        counts.clone(),
        latencies.clone(),
        (rate, total),
        pay_share,
    ));
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut drained_at = None;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let mut s = probes.sample(&counts).await;
        s.at = now.duration_since(started).as_secs_f64();
        s.arriving = now < arrivals_end;
        let line = timeline_line(&s);
        progress(&line);
        let arriving = s.arriving;
        let quiet = !arriving
            && arrivals.is_finished()
            && counts.in_flight.load(Ordering::Relaxed) == 0
            && s.pending == Some(0)
            && s.paid_unshipped == Some(0)
            && s.outbox.iter().all(|o| o.is_none_or(|n| n == 0))
            && s.queues.iter().all(|q| q.is_none_or(|n| n == 0));
        samples.push(s);
        if quiet {
            drained_at = Some(now.duration_since(arrivals_end).as_secs_f64());
            break;
        }
        if now >= ctx.work_deadline {
            break;
        }
    }
    arrivals.abort();
    let left_paid = probes.count_paid().await;
    let mut products = Vec::with_capacity(ctx.skus.len());
    let drifts = read::drift(&ctx).await;
    for sku in &ctx.skus {
        let product = read::product(&ctx, sku).await;
        products.push((sku.clone(), product, drifts.get(sku).copied()));
    }
    let mut checks = stock_checks(&ctx.offers, probes.sold().await.as_ref(), &products);
    let latency = latencies.summary();
    checks.push(latency.check());
    let top_statements = match &sources {
        Some(src) => {
            src.top_statements(&backlog.databases(), TOP_STATEMENTS)
                .await
        }
        None => Vec::new(),
    };
    let dbwork = match (&sources, &db_before) {
        (Some(src), Some(before)) => {
            // The commit counters are published within PG_STATS_SETTLE of the work.
            tokio::time::sleep(PG_STATS_SETTLE).await;
            let shipped = samples.last().and_then(|s| s.shipped).unwrap_or(0);
            match src.read().await {
                Ok(after) => dbwork::between(
                    before,
                    &after,
                    &backlog.databases(),
                    "shipped",
                    u64::try_from(shipped).unwrap_or(0),
                ),
                Err(_) => None,
            }
        }
        _ => None,
    };
    let c = &counts;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Sustained {
        samples,
        rate,
        secs,
        drain: drained_at,
        counts: [
            get(&c.arrivals),
            get(&c.skipped),
            get(&c.accepted),
            get(&c.refused),
            get(&c.errors),
            get(&c.pay_started),
            get(&c.paid),
            get(&c.pay_failed),
            get(&c.in_flight),
        ],
        left_paid,
        overloaded: get(&c.overloaded),
        latency,
        dbwork,
        top_statements,
        checks,
    })
}

/// The open-loop arrivals: one CreateOrder every 1/`rate` s (late ticks catch up), each buyer
/// new, skipped when [`MAX_IN_FLIGHT`] calls are already out.
async fn arrive(
    ctx: Arc<Ctx>,
    counts: Arc<Counts>,
    latencies: Arc<Latencies>,
    (rate, total): (u32, u64),
    pay_share: f64,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    for i in 0..total {
        tick.tick().await;
        if Instant::now() >= ctx.work_deadline {
            return;
        }
        counts.arrivals.fetch_add(1, Ordering::Relaxed);
        if counts.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            counts.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        counts.in_flight.fetch_add(1, Ordering::Relaxed);
        let pays = pays(i, pay_share);
        let (ctx, counts, latencies) = (ctx.clone(), counts.clone(), latencies.clone());
        tokio::spawn(async move {
            buyer(&ctx, &counts, &latencies, i, pays).await;
            counts.in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Whether the `i`-th buyer pays: spreads `share` evenly over the arrivals.
pub(crate) fn pays(i: u64, share: f64) -> bool {
    let at = |k: u64| (k as f64 * share).floor();
    at(i + 1) > at(i)
}

/// One buyer: orders, and when it pays, pays as soon as the order is confirmed.
async fn buyer(ctx: &Ctx, counts: &Counts, latencies: &Latencies, i: u64, pays: bool) {
    let Ok(b) = usize::try_from(i) else { return };
    let (Some(token), Some(sku)) = (ctx.tokens.get(b), ctx.skus.get(b % ctx.skus.len().max(1)))
    else {
        return;
    };
    let request_id = uuid::Uuid::new_v4().to_string();
    let asked = Instant::now();
    let placed = place_order(&mut ctx.orders.clone(), token, sku.clone(), request_id).await;
    let took = asked.elapsed();
    let order_id = match placed {
        Placed::Accepted(o) => {
            latencies.record(Call::Accepted, took);
            o.order_id
        }
        Placed::Refused(_) => {
            latencies.record(Call::Refused, took);
            counts.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // A new buyer turned away at once while the backlog is at its bound: answered, and
        // not retried (the next arrival is another buyer).
        Placed::Overloaded => {
            latencies.record(Call::Overloaded, took);
            counts.overloaded.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Placed::Error(_) => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    counts.accepted.fetch_add(1, Ordering::Relaxed);
    if !pays {
        return;
    }
    let mut wait = PAY_RETRY;
    loop {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(PAY_RETRY_MAX);
        if Instant::now() >= ctx.work_deadline {
            counts.pay_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(req) = request(
            PayOrderRequest {
                order_id: order_id.clone(),
                ..Default::default()
            },
            token,
        ) else {
            return;
        };
        let asked = Instant::now();
        let answer = ctx.orders.clone().pay_order(req).await;
        latencies.record(Call::PayOrder, asked.elapsed());
        match answer {
            Ok(r) => {
                counts.pay_started.fetch_add(1, Ordering::Relaxed);
                let Some(c) = r.into_inner().checkout else {
                    counts.pay_failed.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let paid = ctx
                    .provider
                    .clone()
                    .pay_checkout(PayCheckoutRequest {
                        payment_id: c.provider_payment_id,
                    })
                    .await;
                let counter = if paid.is_ok() {
                    &counts.paid
                } else {
                    &counts.pay_failed
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // Not payable yet: still PENDING, or confirmed since (try again); cancelled: give up.
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                if wait == PAY_RETRY_MAX && !may_still_pay(ctx, token, &order_id).await {
                    counts.pay_failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            // Overloaded or rate limited: try again after the pause.
            Err(_) => {}
        }
    }
}

async fn may_still_pay(ctx: &Ctx, token: &str, order_id: &str) -> bool {
    let Ok(req) = request(
        GetOrderRequest {
            order_id: order_id.to_owned(),
        },
        token,
    ) else {
        return false;
    };
    match ctx.orders.clone().get_order(req).await {
        Ok(r) => r.into_inner().order.is_some_and(|o| {
            o.status == OrderStatus::Pending as i32
                || o.status == OrderStatus::AwaitingPayment as i32
        }),
        Err(_) => true,
    }
}

// === impl Probes ===

#[derive(FromQueryResult)]
struct StatusCounts {
    confirmed: i64,
    paid: i64,
    shipped: i64,
    pending: i64,
    paid_unshipped: i64,
}

#[derive(FromQueryResult)]
struct N {
    n: i64,
}

impl Probes {
    async fn connect(ctx: &Ctx, b: &Backlog) -> anyhow::Result<Self> {
        let url = b
            .order_database_url
            .as_deref()
            .context("--order-database-url is required with --arrival-rate (the timeline reads the order database)")?;
        let orders = sea_orm::Database::connect(url)
            .await
            .context("connect to --order-database-url")?;
        let optional = |u: &Option<String>, flag: &'static str| {
            let u = u.clone();
            async move {
                match u {
                    Some(u) => sea_orm::Database::connect(u.as_str())
                        .await
                        .map(Some)
                        .with_context(|| format!("connect to {flag}")),
                    None => Ok(None),
                }
            }
        };
        let product = optional(&b.product_database_url, "--product-database-url").await?;
        let outbound = optional(&b.outbound_database_url, "--outbound-database-url").await?;
        let amqp = match &b.amqp_url {
            Some(u) => Some(
                lapin::Connection::connect(u, lapin::ConnectionProperties::default())
                    .await
                    .context("connect to --amqp-url")?,
            ),
            None => None,
        };
        let p = &b.queue_prefix;
        Ok(Self {
            orders,
            product,
            outbound,
            amqp,
            queues: [
                format!("{p}{}", queues::ORDER_SAGA_EVENTS),
                format!("{p}{}", queues::PRODUCT_STOCK_ORDER_EVENTS),
                format!("{p}{}", queues::OUTBOUND_PAID_ORDERS),
            ],
            skus: ctx.skus.clone(),
        })
    }

    async fn sample(&self, counts: &Counts) -> Sample {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = Sample {
            arrivals: get(&counts.arrivals),
            accepted: get(&counts.accepted),
            pay_started: get(&counts.pay_started),
            paid_at_provider: get(&counts.paid),
            ..Sample::default()
        };
        let sql = "SELECT count(*) FILTER (WHERE payment_deadline IS NOT NULL) AS confirmed, \
                   count(*) FILTER (WHERE payment_id IS NOT NULL) AS paid, \
                   count(*) FILTER (WHERE status = 'SHIPPED') AS shipped, \
                   count(*) FILTER (WHERE status = 'PENDING') AS pending, \
                   count(*) FILTER (WHERE status = 'PAID') AS paid_unshipped \
                   FROM orders WHERE sku = ANY($1)";
        let stmt = Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            sql,
            [self.skus.clone().into()],
        );
        if let Ok(Some(c)) = StatusCounts::find_by_statement(stmt)
            .one(&self.orders)
            .await
        {
            s.confirmed = Some(c.confirmed);
            s.paid = Some(c.paid);
            s.shipped = Some(c.shipped);
            s.pending = Some(c.pending);
            s.paid_unshipped = Some(c.paid_unshipped);
        }
        for (i, db) in [
            Some(&self.orders),
            self.product.as_ref(),
            self.outbound.as_ref(),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(db) = db {
                s.outbox[i] = unsent(db).await;
            }
        }
        if let Some(conn) = &self.amqp {
            for (i, q) in self.queues.iter().enumerate() {
                s.queues[i] = depth(conn, q).await;
            }
        }
        s
    }

    /// Orders of the sale still PAID (neither shipped nor refunded).
    async fn count_paid(&self) -> Option<i64> {
        let stmt = Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT count(*) AS n FROM orders WHERE sku = ANY($1) AND status = 'PAID'",
            [self.skus.clone().into()],
        );
        N::find_by_statement(stmt)
            .one(&self.orders)
            .await
            .ok()
            .flatten()
            .map(|r| r.n)
    }

    /// Per product: the units of its orders not cancelled, and the most of them one buyer
    /// holds. `None` when the order database could not be read.
    async fn sold(&self) -> Option<BTreeMap<String, Sold>> {
        let stmt = Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT sku, COALESCE(sum(units), 0)::bigint AS units, \
                    COALESCE(max(units), 0)::bigint AS most_per_buyer FROM ( \
               SELECT sku, user_id, \
                      COALESCE(sum(quantity) FILTER (WHERE status <> 'CANCELLED'), 0) AS units \
               FROM orders WHERE sku = ANY($1) GROUP BY sku, user_id) per_buyer \
             GROUP BY sku",
            [self.skus.clone().into()],
        );
        let rows = self.orders.query_all_raw(stmt).await.ok()?;
        let mut sold = BTreeMap::new();
        for row in rows {
            let sku: String = row.try_get("", "sku").ok()?;
            let s = Sold {
                units: row.try_get("", "units").ok()?,
                most_per_buyer: row.try_get("", "most_per_buyer").ok()?,
            };
            sold.insert(sku, s);
        }
        Some(sold)
    }
}

/// Outbox rows not yet published.
async fn unsent(db: &DatabaseConnection) -> Option<i64> {
    let stmt = Statement::from_string(
        sea_orm::DbBackend::Postgres,
        "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL",
    );
    let row = db.query_one_raw(stmt).await.ok()??;
    row.try_get::<i64>("", "n").ok()
}

/// Ready messages in `queue` (a passive declare on a channel of its own, since a refused one
/// closes the channel); `None` when it does not exist or the broker does not answer.
async fn depth(conn: &lapin::Connection, queue: &str) -> Option<u32> {
    let ch = conn.create_channel().await.ok()?;
    let q = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions::default().passive(),
            lapin::types::FieldTable::default(),
        )
        .await
        .ok()?;
    let _ = ch.close(200, "ok".into()).await;
    Some(q.message_count())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("?".into(), |v| v.to_string())
}

fn timeline_line(s: &Sample) -> String {
    format!(
        "t={:>5.1}s{} accepted {} confirmed {} paid(provider) {} paid {} shipped {} | backlog pending {} paid-unshipped {} outbox {}/{}/{} queues {}/{}/{}",
        s.at,
        if s.arriving { "" } else { " (draining)" },
        s.accepted,
        opt(s.confirmed),
        s.paid_at_provider,
        opt(s.paid),
        opt(s.shipped),
        opt(s.pending),
        opt(s.paid_unshipped),
        opt(s.outbox[0]),
        opt(s.outbox[1]),
        opt(s.outbox[2]),
        opt(s.queues[0]),
        opt(s.queues[1]),
        opt(s.queues[2]),
    )
}

// === impl Sustained ===

impl Sustained {
    /// Mean backlog over the samples taken while arrivals ran, between `from` and `to` (shares
    /// of the arrival window).
    fn backlog_between(&self, from: f64, to: f64) -> Option<f64> {
        let w = self.secs as f64;
        let v: Vec<i64> = self
            .samples
            .iter()
            .filter(|s| s.arriving && s.at >= from * w && s.at <= to * w)
            .filter_map(Sample::backlog)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<i64>() as f64 / v.len() as f64)
    }

    /// Per second over the second half of the arrival window: (accepted, shipped).
    fn rates(&self) -> Option<(f64, f64)> {
        let half: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.arriving && s.at >= self.secs as f64 / 2.0)
            .collect();
        let (a, b) = (half.first()?, half.last()?);
        let dt = b.at - a.at;
        if dt <= 0.0 {
            return None;
        }
        let accepted = (b.accepted - a.accepted) as f64 / dt;
        let shipped = (b.shipped? - a.shipped?) as f64 / dt;
        Some((accepted, shipped))
    }

    /// Whether the backlog stayed bounded: its mean over the last fifth of the arrival window
    /// is at most half as large again as its mean over the middle fifth, plus one second of
    /// arrivals (a backlog growing steadily from the start ends ~1.8 times its middle).
    fn bounded(&self) -> Option<bool> {
        let middle = self.backlog_between(0.4, 0.6)?;
        let end = self.backlog_between(0.8, 1.0)?;
        Some(end <= 1.5 * middle + f64::from(self.rate))
    }

    /// Adds the memory check: every service measured stayed within
    /// [`crate::procstat::MEMORY_LIMIT_MIB`] of resident memory (none measured: nothing is
    /// claimed).
    pub fn check_memory(&mut self, memory: &[crate::procstat::Memory]) {
        if memory.is_empty() {
            return;
        }
        let over: Vec<String> = memory
            .iter()
            .filter(|m| m.over_limit())
            .map(crate::procstat::Memory::text)
            .collect();
        self.checks.push(Check {
            name: "memory within its limit",
            pass: over.is_empty(),
            detail: if over.is_empty() {
                format!(
                    "every service under {:.0} MiB",
                    crate::procstat::MEMORY_LIMIT_MIB
                )
            } else {
                over.join("; ")
            },
        });
    }

    /// Payments made at the provider whose orders never became PAID (the notification came
    /// after the order's deadline, and the payment is refunded): buyers who paid and got
    /// nothing. `None` when the order database was not read.
    pub fn paid_not_taken(&self) -> Option<i64> {
        let last = self.samples.last()?;
        Some(i64::try_from(last.paid_at_provider).unwrap_or(i64::MAX) - last.paid?)
    }

    /// Passes when the backlog stayed bounded while the buyers arrived and drained before the
    /// bound, no paid order was left unshipped, every payment made became a PAID order, no call
    /// ended in an error, every buyer who meant to pay could, and the stock, per-user limit and
    /// gate checks hold.
    pub fn passed(&self) -> bool {
        let [_, _, _, _, errors, _, _, pay_failed, _] = self.counts;
        self.bounded() != Some(false)
            && self.checks.iter().all(|c| c.pass)
            && self.drain.is_some()
            && self.left_paid == Some(0)
            && self.paid_not_taken().is_none_or(|n| n <= 0)
            && errors == 0
            && pay_failed == 0
    }

    pub fn to_json(&self) -> Value {
        let [
            arrivals,
            skipped,
            accepted,
            refused,
            errors,
            pay_started,
            paid,
            pay_failed,
            _,
        ] = self.counts;
        let rates = self.rates();
        let mut v = json!({
            "mode": "sustained",
            "arrivalRate": self.rate,
            "sustainSecs": self.secs,
            "arrivals": arrivals,
            "skipped": skipped,
            "accepted": accepted,
            "refused": refused,
            "errors": errors,
            "paymentsStarted": pay_started,
            "paidAtProvider": paid,
            "paymentsFailed": pay_failed,
            "acceptedPerSec": rates.map(|r| r.0),
            "shippedPerSec": rates.map(|r| r.1),
            "shippedToAcceptedRatio": rates.and_then(|(a, s)| (a > 0.0).then(|| s / a)),
            "backlogMiddle": self.backlog_between(0.4, 0.6),
            "backlogEnd": self.backlog_between(0.8, 1.0),
            "backlogBounded": self.bounded(),
            "drainSecs": self.drain,
            "paidLeftUnshipped": self.left_paid,
            "paidNotTaken": self.paid_not_taken(),
            "checks": self.checks.iter().map(|c| json!({
                "name": c.name, "pass": c.pass, "detail": c.detail,
            })).collect::<Vec<_>>(),
            "pass": self.passed(),
            "timeline": self.samples.iter().map(|s| json!({
                "t": s.at,
                "arriving": s.arriving,
                "arrivals": s.arrivals,
                "accepted": s.accepted,
                "confirmed": s.confirmed,
                "paymentsStarted": s.pay_started,
                "paidAtProvider": s.paid_at_provider,
                "paid": s.paid,
                "shipped": s.shipped,
                "pending": s.pending,
                "paidUnshipped": s.paid_unshipped,
                "outboxUnsent": {"order": s.outbox[0], "productStock": s.outbox[1], "outbound": s.outbox[2]},
                "queueReady": {"order": s.queues[0], "productStock": s.queues[1], "outbound": s.queues[2]},
            })).collect::<Vec<_>>(),
        });
        v["overloaded"] = json!(self.overloaded);
        v["latency"] = self.latency.to_json();
        v["dbWork"] = self.dbwork.as_ref().map_or(Value::Null, DbWork::to_json);
        v["topStatements"] = self
            .top_statements
            .iter()
            .map(|(owner, calls, query)| json!({"owner": owner, "calls": calls, "query": query}))
            .collect();
        v
    }

    pub fn print_text(&self) {
        let [
            arrivals,
            skipped,
            accepted,
            refused,
            errors,
            pay_started,
            paid,
            pay_failed,
            _,
        ] = self.counts;
        println!(
            "sustained   {} arrivals/s for {} s: {arrivals} arrivals ({skipped} skipped), {accepted} accepted, {refused} refused, {errors} errors",
            self.rate, self.secs
        );
        println!(
            "payments    {pay_started} started, {paid} paid at the provider, {pay_failed} failed"
        );
        println!(
            "overloaded  {} buyers refused OVERLOADED by admission control",
            self.overloaded
        );
        for line in self.latency.lines() {
            println!("latency     {line}");
        }
        if let Some(w) = &self.dbwork {
            println!("database    {}", w.text());
        }
        for (owner, calls, query) in &self.top_statements {
            println!("statement   {owner:<13} {calls:>8}  {query}");
        }
        for s in &self.samples {
            println!("  {}", timeline_line(s));
        }
        match self.rates() {
            Some((a, s)) => println!(
                "rates       second half of the window: {a:.1} accepted/s, {s:.1} shipped/s, ratio {:.3}",
                if a > 0.0 { s / a } else { 0.0 }
            ),
            None => println!("rates       not enough samples"),
        }
        println!(
            "backlog     middle {}, end {} (orders PENDING + PAID): {}",
            self.backlog_between(0.4, 0.6)
                .map_or("?".into(), |v| format!("{v:.0}")),
            self.backlog_between(0.8, 1.0)
                .map_or("?".into(), |v| format!("{v:.0}")),
            match self.bounded() {
                Some(true) => "bounded",
                Some(false) => "GROWING",
                None => "unknown",
            }
        );
        println!(
            "drain       {}",
            self.drain
                .map_or("not drained within the bound".into(), |d| format!(
                    "{d:.1} s after the arrivals stopped"
                ))
        );
        for c in &self.checks {
            println!(
                "check       {} {}: {}",
                if c.pass { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        println!(
            "result      {} (paid orders left unshipped: {})",
            if self.passed() { "PASS" } else { "FAIL" },
            opt(self.left_paid)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paying_share_is_spread_evenly_over_the_arrivals() {
        let n = |share: f64| (0..1000).filter(|&i| pays(i, share)).count();
        assert_eq!(n(1.0), 1000);
        assert_eq!(n(0.0), 0);
        assert_eq!(n(0.7), 700);
        assert!((0..10).filter(|&i| pays(i, 0.5)).count() == 5);
    }

    fn sample(at: f64, arriving: bool, pending: i64, shipped: i64, accepted: u64) -> Sample {
        Sample {
            at,
            arriving,
            accepted,
            pending: Some(pending),
            paid_unshipped: Some(0),
            shipped: Some(shipped),
            ..Sample::default()
        }
    }

    fn sustained(samples: Vec<Sample>) -> Sustained {
        Sustained {
            samples,
            rate: 10,
            secs: 10,
            drain: Some(1.0),
            counts: [0; 9],
            left_paid: Some(0),
            overloaded: 0,
            latency: Summary::default(),
            dbwork: None,
            top_statements: Vec::new(),
            checks: Vec::new(),
        }
    }

    #[test]
    fn a_backlog_that_keeps_growing_is_not_bounded() {
        let growing = sustained(
            (0..10)
                .map(|t| sample(t as f64, true, 100 * t, 0, 10 * t as u64))
                .collect(),
        );
        assert_eq!(growing.bounded(), Some(false));
        let steady = sustained(
            (0..10)
                .map(|t| sample(t as f64, true, 30, 5 * t, 10 * t as u64))
                .collect(),
        );
        assert_eq!(steady.bounded(), Some(true));
        let (a, s) = steady.rates().unwrap();
        assert!((a - 10.0).abs() < 1e-9 && (s - 5.0).abs() < 1e-9, "{a} {s}");
        assert!(steady.passed());
        let growing_but_drained = Sustained {
            drain: Some(1.0),
            ..growing
        };
        assert!(!growing_but_drained.passed());
        let oversold = Sustained {
            checks: vec![Check {
                name: "units sold <= stock",
                pass: false,
                detail: "A: 11 sold of 10".into(),
            }],
            ..sustained(vec![])
        };
        assert!(!oversold.passed());
        let stuck = Sustained {
            left_paid: Some(3),
            ..sustained(vec![])
        };
        assert!(!stuck.passed());
    }

    #[test]
    fn a_payment_that_never_made_its_order_paid_fails_the_run() {
        let at = |paid_at_provider: u64, paid: i64| Sample {
            paid_at_provider,
            paid: Some(paid),
            ..sample(1.0, false, 0, 0, 10)
        };
        assert_eq!(sustained(vec![at(10, 10)]).paid_not_taken(), Some(0));
        assert!(sustained(vec![at(10, 10)]).passed());
        let late = sustained(vec![at(10, 8)]);
        assert_eq!(late.paid_not_taken(), Some(2));
        assert!(!late.passed());
        // Without the order database nothing is known, and nothing is claimed.
        assert_eq!(sustained(vec![]).paid_not_taken(), None);
    }
}
