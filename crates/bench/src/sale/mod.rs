//! `flashsale sale`: a gateway in front of many buyers, end to end, that always stops by itself.
//! It (a) creates a product, (b) floods CreateOrder with bounded concurrency (one user token
//! per buyer), (c) waits for the saga to confirm the accepted orders, (d) has the winners pay,
//! never pay, pay too late or cancel, (e) waits for quiescence, then (f) reports throughput,
//! latency and the outcome of every order — and checks the platform's invariants
//! (docs/invariants.md) read back over gRPC.
//! Progress goes to stderr, the report to stdout; the exit code is non-zero when an invariant
//! fails or the run hit its time bound.

mod checks;
mod flood;
mod follow;
mod latency;
pub(crate) mod read;
mod report;
mod sold;
mod sustain;

use std::{
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::ValueEnum;
use flashsale_contract::{SKU_MAX_LEN, check_sku};
use flashsale_platform::auth::Role;
use flashsale_proto::{
    order::v1::order_service_client::OrderServiceClient,
    outbound::v1::outbound_service_client::OutboundServiceClient,
    payment::v1::payment_provider_service_client::PaymentProviderServiceClient,
    product::v1::{
        CreateProductRequest, DeductionPolicy,
        product_stock_service_client::ProductStockServiceClient,
    },
};
use tonic::transport::Channel;

use crate::{
    client::{Secret, ServiceUrls, authorized, connect, status_error},
    procstat::{PidArgs, Sampler},
};

/// Deadline of one gRPC call (and of connecting).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Most requests one run may make.
const MAX_REQUESTS: u64 = 10_000_000;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    urls: ServiceUrls,
    /// The payment provider the order service uses (`flashsale-payment-sim`): paying buyers
    /// pay on its checkout after PayOrder started their payment.
    #[arg(
        long,
        env = "FLASHSALE_PAYMENT_SIM_URL",
        default_value = "http://127.0.0.1:50054"
    )]
    payment_sim_url: String,
    /// The product to create and sell; `SALE-<8 random hex>` when unset. With `--products N`
    /// above 1, the products are `<sku>-1` … `<sku>-N`.
    #[arg(long, value_parser = sku_arg)]
    sku: Option<String>,
    /// A product on sale with stock and a per-user limit of its own: `SKU=STOCK` or
    /// `SKU=STOCK:LIMIT` (LIMIT 0 = none; `--per-user-limit` when left out). Repeat it for a sale
    /// of several products (at most 50); it replaces `--sku`, `--products` and `--stock`.
    #[arg(
        long = "product",
        value_name = "SKU=STOCK[:LIMIT]",
        value_parser = offer_arg,
        conflicts_with_all = ["sku", "products", "stock"]
    )]
    product: Vec<Offer>,
    /// How many products are on sale at once, each with `--stock` units, `--per-user-limit`,
    /// `--policy` and `--price-cents`; each buyer's calls go to the products in turn.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    products: u32,
    /// Units on sale, per product.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..=1_000_000_000))]
    stock: i64,
    /// Most units one buyer may buy of each product; 0 = no limit.
    #[arg(long, default_value_t = 1)]
    per_user_limit: u32,
    /// When the product's stock is deducted.
    #[arg(long, value_enum, default_value = "reserve-then-commit")]
    policy: Policy,
    /// Unit price in cents.
    #[arg(long, default_value_t = 1999, value_parser = clap::value_parser!(i64).range(0..=1_000_000_000))]
    price_cents: i64,
    /// The sale opens this many seconds after the products are created (their `sale_start`):
    /// the flood starts at once, and a buyer refused SALE_NOT_STARTED presses buy again until
    /// the sale opens; the report counts those refusals and checks that no order was accepted
    /// before the opening. On sale at once when unset.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    opens_in_secs: Option<u64>,
    /// The sale price in cents (at most --price-cents): every order is accepted at it.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..=1_000_000_000))]
    sale_price_cents: Option<i64>,
    /// Distinct buyers (each with a user token of its own).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    buyers: u32,
    /// CreateOrder calls per buyer, each with its own request id.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    requests_per_buyer: u32,
    /// CreateOrder calls in flight at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Share of the winners that pay at once (0..=1): PayOrder starts the payment and the buyer
    /// pays on the provider's checkout; the provider's notification pays the order.
    #[arg(long, default_value_t = 0.7, value_parser = share)]
    pay: f64,
    /// Share of the winners that never pay: the payment timeout cancels them (0..=1).
    #[arg(long, default_value_t = 0.2, value_parser = share)]
    never_pay: f64,
    /// Share of the winners that start paying in time but pay at the provider after their
    /// payment deadline: the order is cancelled and the payment refunded (0..=1).
    /// The winners not in --pay, --never-pay or --pay-late cancel their order.
    #[arg(long, default_value_t = 0.1, value_parser = share)]
    pay_late: f64,
    /// PayOrder calls (each followed by the buyer's checkout at the provider) in flight at once
    /// for the winners who pay at once. A gateway serves every buyer at once; too few here
    /// and the sale itself makes buyers miss their payment deadline (reported as payments
    /// late by the sale, and a failed run).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pay_concurrency: u32,
    /// Stop making new CreateOrder calls after this many seconds (the calls in flight are
    /// answered) and go on to the payments and the report, as after the last call; unset: the
    /// flood makes every one of `--buyers` × `--requests-per-buyer` calls. Shorter than
    /// `--max-duration-secs`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration_secs: Option<u64>,
    /// A sustained sale instead of a burst: this many buyers arrive each second (open loop,
    /// each a new buyer ordering one unit), for --sustain-secs, and the paying ones (--pay)
    /// pay as soon as their order is confirmed; the report is a per-second timeline of
    /// accepted, confirmed, paid and shipped orders and the backlog. Needs
    /// --order-database-url; give it a large --stock.
    #[arg(long, requires = "sustain_secs", value_parser = clap::value_parser!(u32).range(1..=20_000))]
    arrival_rate: Option<u32>,
    /// How long the sustained arrivals last, in seconds (with --arrival-rate); shorter than
    /// --max-duration-secs, which bounds the drain after them.
    #[arg(long, requires = "arrival_rate", value_parser = clap::value_parser!(u64).range(1..=3_600))]
    sustain_secs: Option<u64>,
    #[command(flatten)]
    backlog: sustain::Backlog,
    /// Hard bound on the whole run, in seconds; hitting it fails the run.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    max_duration_secs: u64,
    /// Print the final report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// No per-order lines in the report.
    #[arg(long)]
    quiet: bool,
    /// The service processes whose resident memory the report shows.
    #[command(flatten)]
    pids: PidArgs,
    #[command(flatten)]
    secret: Secret,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Policy {
    /// Retail: reserve at order, deduct at shipment.
    ReserveThenCommit,
    /// Ticketing: deduct at order.
    CommitAtOrder,
}

impl Policy {
    fn to_proto(self) -> DeductionPolicy {
        match self {
            Policy::ReserveThenCommit => DeductionPolicy::ReserveThenCommit,
            Policy::CommitAtOrder => DeductionPolicy::CommitAtOrder,
        }
    }

    /// RESERVE_THEN_COMMIT or COMMIT_AT_ORDER.
    pub(crate) fn name(self) -> &'static str {
        self.to_proto()
            .as_str_name()
            .trim_start_matches("DEDUCTION_POLICY_")
    }
}

/// One product of the sale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    pub sku: String,
    /// Units on sale.
    pub stock: i64,
    /// Most units one buyer may buy; `None` = `--per-user-limit`.
    pub per_user_limit: Option<u32>,
}

/// Most buyers of a sustained sale (--arrival-rate × --sustain-secs).
const MAX_SUSTAINED_BUYERS: u64 = 1_000_000;
/// Most units of one product.
const MAX_STOCK: i64 = 1_000_000_000;
/// Most products of one sale.
const MAX_PRODUCTS: usize = 50;

/// A sku every service accepts (the contract's rule: 1..=64 characters of `[A-Za-z0-9._-]`).
fn sku_arg(s: &str) -> Result<String, String> {
    check_sku(s)
        .map(|()| s.to_owned())
        .map_err(|_| format!("`{s}` is not a sku: 1..={SKU_MAX_LEN} characters of [A-Za-z0-9._-]"))
}

/// `SKU=STOCK` or `SKU=STOCK:LIMIT`.
fn offer_arg(s: &str) -> Result<Offer, String> {
    let (sku, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not SKU=STOCK[:LIMIT]"))?;
    let sku = sku_arg(sku)?;
    let (stock, limit) = match rest.split_once(':') {
        Some((stock, limit)) => (stock, Some(limit)),
        None => (rest, None),
    };
    let stock: i64 = stock
        .parse()
        .ok()
        .filter(|n| (0..=MAX_STOCK).contains(n))
        .ok_or_else(|| format!("`{stock}` in `{s}` is not a stock within 0..={MAX_STOCK}"))?;
    let per_user_limit = limit
        .map(|l| {
            l.parse::<u32>()
                .map_err(|_| format!("`{l}` in `{s}` is not a per-user limit (0 = none)"))
        })
        .transpose()?;
    Ok(Offer {
        sku,
        stock,
        per_user_limit,
    })
}

/// A share of the winners: a number within 0..=1.
fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not within 0..=1"))
    }
}

/// What the phases share: the clients, the tokens and the time bound.
pub(crate) struct Ctx {
    pub stock: ProductStockServiceClient<Channel>,
    pub orders: OrderServiceClient<Channel>,
    pub outbound: OutboundServiceClient<Channel>,
    /// The payment provider's checkout, where the buyers pay.
    pub provider: PaymentProviderServiceClient<Channel>,
    /// An admin token, for reading everything back.
    pub admin: String,
    /// Buyer names and their user tokens, by buyer index.
    pub buyers: Vec<String>,
    pub tokens: Vec<String>,
    /// The products on sale (one unless `--products` or several `--product`).
    pub skus: Vec<String>,
    /// Each product's units and per-user limit, in the order of `skus`.
    pub offers: Vec<Offer>,
    /// When the flood stops making new calls (`--duration-secs`); `None`: after the last one.
    pub flood_until: Option<Duration>,
    /// When the sale opens (`--opens-in-secs`), by this machine's clock, in milliseconds since
    /// the Unix epoch; `None`: on sale at once.
    pub opening_ms: Option<i64>,
    /// When the flood and the waits give up, leaving time for the report before the hard bound.
    pub work_deadline: tokio::time::Instant,
    /// The hard bound on the whole run.
    pub hard_deadline: tokio::time::Instant,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let shares = args.shares()?;
    let requests = u64::from(args.buyers) * u64::from(args.requests_per_buyer);
    anyhow::ensure!(
        requests <= MAX_REQUESTS,
        "--buyers × --requests-per-buyer must be at most {MAX_REQUESTS} (got {requests})"
    );
    let offers = args.offers()?;
    let skus: Vec<String> = offers.iter().map(|o| o.sku.clone()).collect();
    if let Some(d) = args.duration_secs {
        anyhow::ensure!(
            d < args.max_duration_secs,
            "--duration-secs ({d}) must be shorter than --max-duration-secs ({}): the run needs \
             time for the payments and the report after the flood",
            args.max_duration_secs
        );
    }
    let sustained = args.sustained()?;
    let buyer_count = match sustained {
        Some((rate, secs)) => u64::from(rate) * secs,
        None => u64::from(args.buyers),
    };
    let bound = Duration::from_secs(args.max_duration_secs);
    // Tokens outlive the run: a late payment near the bound must still be accepted.
    let ttl = bound + CALL_TIMEOUT * 6;
    let buyers: Vec<String> = (0..buyer_count).map(|i| format!("buyer-{i:04}")).collect();
    let tokens = buyers
        .iter()
        .map(|b| args.secret.mint(b, Role::User, ttl))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let now = tokio::time::Instant::now();
    let hard_deadline = now + bound;
    let setup = async {
        let ctx = Arc::new(Ctx {
            stock: ProductStockServiceClient::new(
                connect(&args.urls.product_stock_url, CALL_TIMEOUT).await?,
            ),
            orders: OrderServiceClient::new(connect(&args.urls.order_url, CALL_TIMEOUT).await?),
            outbound: OutboundServiceClient::new(
                connect(&args.urls.outbound_url, CALL_TIMEOUT).await?,
            ),
            // Connected on first use: a sale where nobody pays needs no provider.
            provider: PaymentProviderServiceClient::new(
                flashsale_platform::grpc::lazy_channel(
                    &args.payment_sim_url,
                    CALL_TIMEOUT,
                    &flashsale_platform::tls::GrpcTlsSettings::default(),
                )
                .context("--payment-sim-url")?,
            ),
            admin: args.secret.mint("sale", Role::Admin, ttl)?,
            buyers,
            tokens,
            skus: skus.clone(),
            offers: offers.clone(),
            flood_until: args.duration_secs.map(Duration::from_secs),
            opening_ms: args.opens_in_secs.map(|s| {
                chrono::Utc::now().timestamp_millis() + i64::try_from(s).unwrap_or(3_600) * 1_000
            }),
            // The report's read-back gets the last fifth of the bound (0.5..=10 s).
            work_deadline: hard_deadline
                - (bound / 5).clamp(Duration::from_millis(500), CALL_TIMEOUT),
            hard_deadline,
        });
        for o in &offers {
            progress(&format!(
                "creating {}: {} units at {} cents, {}, per-user limit {}",
                o.sku,
                o.stock,
                args.price_cents,
                args.policy.name(),
                o.per_user_limit.unwrap_or(args.per_user_limit)
            ));
        }
        create_product(&ctx, &args).await?;
        anyhow::Ok(ctx)
    };
    let ctx = tokio::time::timeout_at(hard_deadline, setup)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "connecting and creating the product took longer than --max-duration-secs ({} s)",
                args.max_duration_secs
            )
        })??;

    if let Some((rate, secs)) = sustained {
        let sampler = Sampler::start(args.pids.services());
        let cpu = crate::cpustat::Sampler::start(crate::cpustat::groups(&args.pids.services()));
        let cpu_from = std::time::Instant::now();
        let mut run = sustain::run(ctx.clone(), rate, secs, shares.pay, &args.backlog).await?;
        let memory = sampler.finish().await;
        run.check_memory(&memory);
        let cpu = cpu
            .finish()
            .await
            .window(cpu_from, std::time::Instant::now());
        if args.json {
            let mut v = run.to_json();
            v["memory"] = memory
                .iter()
                .map(crate::procstat::Memory::to_json)
                .collect();
            v["elapsedSecs"] = serde_json::json!(started.elapsed().as_secs_f64());
            v["cpu"] = cost_per_order(cpu.as_ref(), &v);
            v["meta"] = crate::bench::meta::from_env().await;
            println!(
                "{}",
                serde_json::to_string(&v).context("encode the report")?
            );
        } else {
            run.print_text();
            println!(
                "memory      peak VmRSS during the sale: {}",
                crate::procstat::memory_line(&memory)
            );
        }
        return Ok(if run.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    // The services' resident memory and everyone's CPU, sampled from the flood until
    // quiescence.
    let sampler = Sampler::start(args.pids.services());
    let cpu = crate::cpustat::Sampler::start(crate::cpustat::groups(&args.pids.services()));
    let cpu_from = std::time::Instant::now();
    progress(&format!(
        "flood: {requests} CreateOrder calls from {} buyers, {} at a time",
        args.buyers, args.concurrency
    ));
    let flood = flood::run(ctx.clone(), args.requests_per_buyer, args.concurrency).await?;
    progress(&format!(
        "{} accepted, {} refused, {} errors in {:.2} s",
        flood.accepted.len(),
        flood.refused.values().sum::<u64>(),
        flood.errors.values().sum::<u64>(),
        flood.elapsed.as_secs_f64()
    ));
    let pay_concurrency = usize::try_from(args.pay_concurrency).unwrap_or(usize::MAX);
    let mut run = follow::Run::new(ctx.clone(), &flood, pay_concurrency).await;
    run.confirm(flood.last_accept).await;
    run.assign(shares);
    run.act().await;
    run.quiesce().await;
    let memory = sampler.finish().await;
    let cpu = cpu
        .finish()
        .await
        .window(cpu_from, std::time::Instant::now());

    let report = report::build(&ctx, &args, shares, &flood, run, memory, started).await;
    if args.json {
        let mut v = report.to_json(args.quiet);
        v["cpu"] = cost_per_order(cpu.as_ref(), &v);
        v["meta"] = crate::bench::meta::from_env().await;
        println!(
            "{}",
            serde_json::to_string(&v).context("encode the report")?
        );
    } else {
        report.print_text(args.quiet);
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The winners' shares: pay at once, never pay, pay late (the rest cancel).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shares {
    pub pay: f64,
    pub never_pay: f64,
    pub pay_late: f64,
}

impl Args {
    /// The products on sale, each with its stock and per-user limit resolved.
    fn offers(&self) -> anyhow::Result<Vec<Offer>> {
        if self.product.is_empty() {
            let sku = self.sku.clone().unwrap_or_else(|| {
                let hex = uuid::Uuid::new_v4().simple().to_string();
                format!("SALE-{}", hex[..8].to_uppercase())
            });
            let skus: Vec<String> = if self.products == 1 {
                vec![sku]
            } else {
                (1..=self.products).map(|k| format!("{sku}-{k}")).collect()
            };
            return Ok(skus
                .into_iter()
                .map(|sku| Offer {
                    sku,
                    stock: self.stock,
                    per_user_limit: Some(self.per_user_limit),
                })
                .collect());
        }
        anyhow::ensure!(
            self.product.len() <= MAX_PRODUCTS,
            "--product may be given at most {MAX_PRODUCTS} times (got {})",
            self.product.len()
        );
        let mut seen = std::collections::BTreeSet::new();
        let mut offers = Vec::with_capacity(self.product.len());
        for o in &self.product {
            anyhow::ensure!(
                seen.insert(o.sku.as_str()),
                "--product names {} twice",
                o.sku
            );
            offers.push(Offer {
                per_user_limit: Some(o.per_user_limit.unwrap_or(self.per_user_limit)),
                ..o.clone()
            });
        }
        Ok(offers)
    }

    /// `(arrival rate, seconds)` of a sustained sale, checked against the other options.
    fn sustained(&self) -> anyhow::Result<Option<(u32, u64)>> {
        let (Some(rate), Some(secs)) = (self.arrival_rate, self.sustain_secs) else {
            return Ok(None);
        };
        anyhow::ensure!(
            secs < self.max_duration_secs,
            "--sustain-secs ({secs}) must be shorter than --max-duration-secs ({}): the run \
             needs time to drain after the arrivals",
            self.max_duration_secs
        );
        let buyers = u64::from(rate) * secs;
        anyhow::ensure!(
            buyers <= MAX_SUSTAINED_BUYERS,
            "--arrival-rate × --sustain-secs must be at most {MAX_SUSTAINED_BUYERS} buyers (got {buyers})"
        );
        anyhow::ensure!(
            self.duration_secs.is_none(),
            "--duration-secs bounds a burst; a sustained sale (--arrival-rate) lasts --sustain-secs"
        );
        anyhow::ensure!(
            self.backlog.order_database_url.is_some(),
            "--arrival-rate needs --order-database-url (the timeline reads the order database)"
        );
        Ok(Some((rate, secs)))
    }

    fn shares(&self) -> anyhow::Result<Shares> {
        let sum = self.pay + self.never_pay + self.pay_late;
        anyhow::ensure!(
            sum <= 1.0 + 1e-9,
            "--pay + --never-pay + --pay-late must be at most 1.0 (got {} + {} + {} = {sum})",
            self.pay,
            self.never_pay,
            self.pay_late
        );
        Ok(Shares {
            pay: self.pay,
            never_pay: self.never_pay,
            pay_late: self.pay_late,
        })
    }
}

async fn create_product(ctx: &Ctx, args: &Args) -> anyhow::Result<()> {
    let deduction_policy = args.policy.to_proto() as i32;
    for o in &ctx.offers {
        let sku = &o.sku;
        let req = CreateProductRequest {
            sku: sku.clone(),
            name: format!("Flash sale {sku}"),
            price_cents: args.price_cents,
            initial_stock: o.stock,
            per_user_limit: o.per_user_limit.unwrap_or(args.per_user_limit),
            deduction_policy,
            stock_buckets: 0,
            sale_start: ctx.opening_ms.and_then(flashsale_contract::ms_to_timestamp),
            sale_end: None,
            sale_price_cents: args.sale_price_cents,
        };
        ctx.stock
            .clone()
            .create_product(authorized(req, &ctx.admin)?)
            .await
            .map_err(status_error)
            .with_context(|| format!("create product {sku}"))?;
    }
    Ok(())
}

impl Ctx {
    /// The units on sale of `sku` (0 for a product not in the sale).
    pub fn stock_of(&self, sku: &str) -> i64 {
        self.offers
            .iter()
            .find(|o| o.sku == sku)
            .map_or(0, |o| o.stock)
    }
}

/// One line of progress on stderr (stdout carries the report).
pub(crate) fn progress(line: &str) {
    eprintln!("sale: {line}");
}

/// The machine's CPU over the whole sale, per accepted and per completed (shipped) order, each
/// process group's and the machine's milliseconds: the cost of an order through its whole saga.
fn cost_per_order(
    cpu: Option<&crate::cpustat::Usage>,
    report: &serde_json::Value,
) -> serde_json::Value {
    let Some(u) = cpu else {
        return serde_json::Value::Null;
    };
    let count = |v: &serde_json::Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
    let accepted = count(&report["accepted"]);
    // A burst sale counts its shipped orders by status; a sustained one in its last sample.
    let shipped = count(&report["totals"]["byStatus"]["SHIPPED"]).or_else(|| {
        report["timeline"]
            .as_array()
            .and_then(|t| t.last())
            .and_then(|s| count(&s["shipped"]))
    });
    let mut v = u.to_json(None);
    for (key, n) in [("ms_per_accepted", accepted), ("ms_per_completed", shipped)] {
        if let Some(ms) = u
            .to_json(n)
            .get_mut("ms_per_accepted")
            .map(serde_json::Value::take)
        {
            v[key] = ms;
        }
    }
    v["accepted"] = serde_json::json!(accepted);
    v["completed"] = serde_json::json!(shipped);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser as _;
        Cli::try_parse_from(std::iter::once("sale").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn a_product_is_sku_stock_and_an_optional_limit() {
        let offer = |sku: &str, stock, limit| Offer {
            sku: sku.into(),
            stock,
            per_user_limit: limit,
        };
        assert_eq!(offer_arg("WINE-1=1000"), Ok(offer("WINE-1", 1000, None)));
        assert_eq!(offer_arg("a.b_c=0:0"), Ok(offer("a.b_c", 0, Some(0))));
        assert_eq!(offer_arg("X=7:3"), Ok(offer("X", 7, Some(3))));
        for bad in [
            "",
            "X",
            "=5",
            "X=",
            "X=-1",
            "X=1.5",
            "X=1000000001",
            "X=5:",
            "X=5:-2",
            "X=5:a",
            "X{1}=5",
            "X:Y=5",
            "X=5:1:2",
        ] {
            assert!(offer_arg(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn products_resolve_their_limits_and_refuse_repeats_and_too_many() {
        let args = parse(&[
            "--product",
            "A=3",
            "--product",
            "B=6:2",
            "--per-user-limit",
            "4",
        ])
        .unwrap();
        let offers = args.offers().unwrap();
        assert_eq!(
            offers
                .iter()
                .map(|o| (o.sku.as_str(), o.stock, o.per_user_limit))
                .collect::<Vec<_>>(),
            [("A", 3, Some(4)), ("B", 6, Some(2))]
        );
        let twice = parse(&["--product", "A=3", "--product", "A=4"]).unwrap();
        let e = twice.offers().unwrap_err().to_string();
        assert!(e.contains("--product") && e.contains("A twice"), "{e}");

        let many: Vec<String> = (0..=MAX_PRODUCTS)
            .flat_map(|k| ["--product".to_owned(), format!("P{k}=1")])
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = parse(&many).unwrap().offers().unwrap_err().to_string();
        assert!(e.contains("at most 50"), "{e}");

        // Without --product: --sku, --products and --stock as before.
        let plain = parse(&["--sku", "S", "--products", "2", "--stock", "9"]).unwrap();
        let offers = plain.offers().unwrap();
        assert_eq!(
            offers
                .iter()
                .map(|o| (o.sku.as_str(), o.stock))
                .collect::<Vec<_>>(),
            [("S-1", 9), ("S-2", 9)]
        );
        assert!(parse(&["--product", "A=1", "--stock", "2"]).is_err());
    }

    #[test]
    fn shares_must_be_numbers_within_zero_and_one() {
        assert_eq!(share("0.25"), Ok(0.25));
        assert_eq!(share("1"), Ok(1.0));
        assert!(share("1.01").is_err());
        assert!(share("-0.1").is_err());
        assert!(share("half").is_err());
        assert!(share("NaN").is_err());
    }
}
