//! A refusal-only stretch: the platform's product is sold out first (and its saga confirmed),
//! then buyers who never bought anything flood it, and every call is refused. The servers' own
//! counters (PostgreSQL transactions and tuples, Redis commands) are read before and after the
//! stretch, and again after an equally long quiet stretch with the same services idle: the
//! difference of the two is what the refusals cost the servers, per refused request — which the
//! design says is no database work at all (docs/architecture.md, the sold-out memory).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::order_service_client::OrderServiceClient,
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use serde_json::{Value, json};

use super::{
    baselines::Load,
    counters::{Counters, PG_STATS_SETTLE, Sources},
    measure::{Measurement, drive},
    platform,
    saga::Saga,
};
use crate::{
    client::{Secret, authorized, connect, place_order, status_error},
    procstat::{self, ServicePid},
};

/// Units of the product sold out before the stretch.
pub const SELL_OUT_STOCK: usize = 200;

/// How long before its sale opens the flood of the refusals-before-opening mode starts.
pub const BEFORE_OPENING: Duration = Duration::from_secs(5);
/// The stretch ends this long before the opening: nearer to it, the order service lets the
/// gate decide (docs/architecture.md#sale-windows).
const STOP_BEFORE_OPENING: Duration = Duration::from_millis(500);

/// The servers' counters around the stretch.
pub struct Refusals {
    /// What the product was refused for: `"sold out"`, or `"before the opening"` (the
    /// refusals-before-opening mode, which sells nothing first).
    pub stretch: &'static str,
    /// What the sell-out before the stretch did (its own measurement and saga).
    pub sell_out_accepted: usize,
    pub sell_out_saga: Saga,
    pub refused: usize,
    /// During the stretch (and the wait for PostgreSQL to publish its counters).
    pub during: Counters,
    /// During a quiet stretch as long, right after.
    pub background: Counters,
    /// `during - background`.
    pub net: Counters,
    pub quiet: Duration,
}

impl Refusals {
    pub fn to_json(&self) -> Value {
        json!({
            "stretch": self.stretch,
            "sell_out_units": SELL_OUT_STOCK,
            "sell_out_accepted": self.sell_out_accepted,
            "sell_out_saga": self.sell_out_saga.to_json(),
            "refused": self.refused,
            "window_s": self.quiet.as_secs_f64(),
            "during": self.during.to_json(),
            "background": self.background.to_json(),
            "net": self.net.to_json(),
            "net_per_refused": self.net.per(self.refused),
        })
    }

    /// The headline: transactions, tuples written and Redis commands per refused request.
    pub fn text(&self) -> String {
        let per = |name: &str| self.net.get(name) as f64 / self.refused.max(1) as f64;
        format!(
            "{} refused ({}); per refused request, beyond the background: {:.4} PostgreSQL transactions \
             ({} committed, {} rolled back in all), {:.4} tuples written, {:.4} Redis commands \
             (during {} vs background {} commands over {:.1} s each)",
            self.refused,
            self.stretch,
            per("pg.xact_commit") + per("pg.xact_rollback"),
            self.net.get("pg.xact_commit"),
            self.net.get("pg.xact_rollback"),
            per("pg.tup_inserted") + per("pg.tup_updated") + per("pg.tup_deleted"),
            per("redis.calls"),
            self.during.get("redis.calls"),
            self.background.get("redis.calls"),
            self.quiet.as_secs_f64(),
        )
    }
}

/// Where the stretch runs and what it reads.
pub struct Target<'a> {
    pub product_stock_url: &'a str,
    pub order_urls: &'a [String],
    pub stock_buckets: u32,
    pub secret: &'a Secret,
    pub follow_db: Option<sea_orm::DatabaseConnection>,
    pub services: &'a [ServicePid],
    pub sources: &'a Sources,
}

/// Sells out `sku` (a product of [`SELL_OUT_STOCK`] units), then sends `load.requests` calls
/// from `load.buyers` buyers who bought nothing, and reads the counters around them.
pub async fn run(t: Target<'_>, load: &Load, sku: &str) -> anyhow::Result<(Measurement, Refusals)> {
    let sell_out = Load {
        requests: SELL_OUT_STOCK,
        buyers: SELL_OUT_STOCK,
        stock: i64::try_from(SELL_OUT_STOCK).unwrap_or(i64::MAX),
        ..load.clone()
    };
    let (sold, sell_out_saga) = platform::flood(
        t.product_stock_url,
        t.order_urls,
        t.stock_buckets,
        t.secret,
        &sell_out,
        sku,
        1,
        false,
        t.follow_db.clone(),
    )
    .await?;
    anyhow::ensure!(
        sold.accepted == SELL_OUT_STOCK,
        "the sell-out before the refusal stretch accepted {} of {SELL_OUT_STOCK} orders (errors {:?})",
        sold.accepted,
        sold.errors
    );
    eprintln!("bench: sold out; waiting for the services and PostgreSQL's counters to settle");
    procstat::wait_idle(t.services, Duration::from_secs(60)).await;
    tokio::time::sleep(PG_STATS_SETTLE).await;

    let (m, r) = stretch(
        &t,
        load,
        sku,
        "refusals (CreateOrder, sold out)",
        load.deadline,
    )
    .await?;
    Ok((
        m,
        Refusals {
            stretch: "sold out",
            sell_out_accepted: sold.accepted,
            sell_out_saga,
            ..r
        },
    ))
}

/// Creates `sku` ([`SELL_OUT_STOCK`] units) with its sale opening [`BEFORE_OPENING`] from now,
/// then sends `load.requests` calls from `load.buyers` buyers until shortly before the opening,
/// and reads the counters around them: what a refusal `SALE_NOT_STARTED` costs.
pub async fn run_before_opening(
    t: Target<'_>,
    load: &Load,
    sku: &str,
) -> anyhow::Result<(Measurement, Refusals)> {
    let admin = t
        .secret
        .mint("bench", Role::Admin, Duration::from_secs(3600))?;
    let opening = chrono::Utc::now() + BEFORE_OPENING;
    let create = CreateProductRequest {
        sku: sku.into(),
        name: "bench: before the opening".into(),
        price_cents: 1999,
        initial_stock: i64::try_from(SELL_OUT_STOCK).unwrap_or(i64::MAX),
        per_user_limit: 1,
        deduction_policy: DeductionPolicy::ReserveThenCommit as i32,
        stock_buckets: t.stock_buckets,
        sale_start: Some(flashsale_contract::to_timestamp(opening)),
        ..Default::default()
    };
    ProductStockServiceClient::new(connect(t.product_stock_url, Duration::from_secs(10)).await?)
        .create_product(authorized(create, &admin)?)
        .await
        .map_err(status_error)?;
    let left = (opening - chrono::Utc::now())
        .to_std()
        .unwrap_or_default()
        .saturating_sub(STOP_BEFORE_OPENING);
    let (m, r) = stretch(
        &t,
        load,
        sku,
        "refusals (CreateOrder, before the opening)",
        load.deadline.min(left),
    )
    .await?;
    Ok((
        m,
        Refusals {
            stretch: "before the opening",
            ..r
        },
    ))
}

/// The refused stretch itself and the quiet one after it.
async fn stretch(
    t: &Target<'_>,
    load: &Load,
    sku: &str,
    name: &str,
    deadline: Duration,
) -> anyhow::Result<(Measurement, Refusals)> {
    let tokens: Vec<String> = (0..load.buyers.max(1))
        .map(|b| {
            t.secret
                .mint(&format!("late{b}"), Role::User, Duration::from_secs(3600))
        })
        .collect::<anyhow::Result<_>>()?;
    let tokens = Arc::new(tokens);
    let mut channels = Vec::new();
    for c in 0..load.connections.max(1) {
        let url = &t.order_urls[c % t.order_urls.len().max(1)];
        channels.push(OrderServiceClient::new(
            connect(url, Duration::from_secs(30)).await?,
        ));
    }
    let before = t.sources.read().await?;
    let started = Instant::now();
    let sku_owned = sku.to_owned();
    let m = drive(name, load.requests, load.concurrency, deadline, move |i| {
        let mut c = channels[i % channels.len()].clone();
        let (tokens, sku) = (tokens.clone(), sku_owned.clone());
        async move {
            let request_id = format!("{sku}-late-{i}");
            place_order(&mut c, &tokens[i % tokens.len()], sku, request_id)
                .await
                .into()
        }
    })
    .await?;
    tokio::time::sleep(PG_STATS_SETTLE).await;
    let after = t.sources.read().await?;
    let quiet = started.elapsed();
    eprintln!(
        "bench: {} refused; now {:.1} s of quiet for the servers' background",
        m.refused.values().sum::<usize>(),
        quiet.as_secs_f64()
    );
    tokio::time::sleep(quiet).await;
    let end = t.sources.read().await?;
    let during = after.since(&before);
    let background = end.since(&after);
    let net = during.beyond(&background);
    let refused = m.refused.values().sum();
    Ok((
        m,
        Refusals {
            stretch: "",
            sell_out_accepted: 0,
            sell_out_saga: Saga::default(),
            refused,
            during,
            background,
            net,
            quiet,
        },
    ))
}
