//! `flashsale bench`: the platform measured back to back with its baselines on the same
//! machine, at the same concurrency, with the same buyers — the naive design it replaces, the
//! raw gate and raw insert ceilings, and the no-op gRPC ceiling — and the ratios between them.
//! Every mode is bounded in requests and in time, and stops by itself. Before each mode it waits
//! for the services to go idle; during each it samples their resident memory.
//! Opt-in beside them: the naive design tuned for the machine (`naive-sweep`, see sweep.rs),
//! its one-round-trip variant (`naive-fn`), the order service's batched write as the intake's
//! write ceiling (`insert-batch`), and open-loop latency curves at fixed arrival rates for the
//! platform and the naive design (`open-loop-platform`, `open-loop-naive`, see openloop.rs),
//! and what `WAIT` after every gate batch would cost on a Redis Cluster (`cluster-wait`, see
//! cluster_wait.rs); the platform across concurrencies (`platform-sweep`, see
//! platform_sweep.rs).

mod amqp_version;
mod baselines;
mod batches;
mod cluster_wait;
pub(crate) mod counters;
pub(crate) mod dbwork;
mod invariants;
mod measure;
pub(crate) mod meta;
mod openloop;
mod platform;
mod platform_sweep;
mod refusals;
mod report;
mod saga;
mod sweep;

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::ValueEnum;

use baselines::Load;
use report::ModeReport;

use flashsale_platform::auth::Role;

use crate::{
    client::Secret,
    cpustat,
    procstat::{self, PidArgs},
};

/// The bench's own PostgreSQL pool is at most this large by default.
const DEFAULT_DB_POOL: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// 1,000 units, 200,000 requests from 50,000 buyers: most are refused.
    Flood,
    /// 20,000 units, 40,000 buyers, one request each.
    BigSale,
    /// big-sale with COMMIT_AT_ORDER.
    Ticketing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Noop,
    Naive,
    /// The naive design in one round trip per request (a PL/pgSQL function): opt-in.
    NaiveFn,
    /// The naive design at its best: a sweep of pools, concurrencies and both variants, then
    /// the best point at full size, which the ratios then use as the naive baseline: opt-in.
    NaiveSweep,
    /// The naive design's hot row alone (no per-user limit, no order record): opt-in.
    NaiveBare,
    Gate,
    Insert,
    /// The order service's own batched write, full batches, straight on PostgreSQL: opt-in.
    InsertBatch,
    Platform,
    /// The platform's product sold out, then a flood that is all refused, with the servers'
    /// work counters read around it (PostgreSQL transactions and tuples, Redis commands).
    Refusals,
    /// A flood that starts 5 s before the product's sale opens and is all refused
    /// SALE_NOT_STARTED, its counters read as the refusals mode reads them: opt-in.
    RefusalsBeforeOpening,
    /// The platform under a fixed arrival rate (open loop), for each of --open-loop-rates.
    OpenLoopPlatform,
    /// The naive design under a fixed arrival rate (open loop): the best of a naive-sweep run
    /// before it in the same run, else --open-loop-naive-pool/--open-loop-naive-variant.
    OpenLoopNaive,
    /// The gate's reservation batches on a private Redis Cluster, plain and each followed by
    /// `WAIT 1 <ms>` (a replica has the holds), alternated: what waiting for a replica costs.
    ClusterWait,
    /// The platform at each concurrency of --platform-concurrency, short runs of the sweep's
    /// shape, each saga followed and each product read back: opt-in.
    PlatformSweep,
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "flood")]
    scenario: Scenario,
    /// Modes to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "noop,naive,gate,insert,platform"
    )]
    modes: Vec<Mode>,
    /// Overrides of the scenario's figures.
    #[arg(long)]
    requests: Option<usize>,
    #[arg(long)]
    buyers: Option<usize>,
    #[arg(long)]
    stock: Option<i64>,
    /// Stock buckets of the platform mode's product, 1..=64 (docs/architecture.md#stock-buckets);
    /// without it the product gets the service's default.
    #[arg(long)]
    stock_buckets: Option<u32>,
    /// Calls in flight at once (every mode).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections of the no-op and platform modes (a gateway's pool); the calls are
    /// spread over them.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Runs the whole list of modes this many times, one round after the other; the ratios
    /// are then the median over the rounds (each round's are in the JSON report). A shared
    /// machine's speed drifts between runs: rounds show by how much.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Bound of each mode, in seconds (and, in the platform mode, of following the saga).
    #[arg(long, default_value_t = 60)]
    max_seconds_per_mode: u64,
    /// Connections of the bench's PostgreSQL pool (naive and raw-insert modes), 1..=100;
    /// default min(--concurrency, 32). With the services' pools it must fit under PostgreSQL's
    /// max_connections.
    #[arg(long)]
    db_pool: Option<usize>,
    /// Longest wait, before each mode, for the services to go idle (0 = do not wait).
    #[arg(long, default_value_t = 60)]
    max_idle_wait_secs: u64,
    #[command(flatten)]
    sweep: sweep::SweepArgs,
    #[command(flatten)]
    platform_sweep: platform_sweep::PlatformSweepArgs,
    #[command(flatten)]
    open_loop: openloop::OpenLoopArgs,
    #[command(flatten)]
    insert_batch: baselines::InsertBatchArgs,
    #[command(flatten)]
    cluster_wait: cluster_wait::ClusterWaitArgs,
    #[command(flatten)]
    pids: PidArgs,
    #[arg(
        long,
        env = "FLASHSALE_PRODUCT_STOCK_URL",
        default_value = "http://127.0.0.1:50051"
    )]
    product_stock_url: String,
    /// The order service, or several replicas of it separated by commas: the no-op and platform
    /// modes spread their connections over them in turn (connection i to replica i mod n).
    #[arg(
        long,
        env = "FLASHSALE_ORDER_URL",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:50052"
    )]
    order_url: Vec<String>,
    /// PostgreSQL server (no database) for the naive and raw-insert modes.
    #[arg(
        long,
        env = "FLASHSALE_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432"
    )]
    postgres_url: String,
    /// Database (created when missing, emptied before each use) of the naive modes.
    #[arg(long, default_value = "flashsale_bench_naive")]
    naive_db: String,
    /// Database (created when missing, emptied before each use) of the raw-insert mode.
    #[arg(long, default_value = "flashsale_bench_orders")]
    insert_db: String,
    /// The order service's own database. When given, the platform mode's saga follower reads
    /// the accepted orders' states from it, one query per poll, instead of one GetOrder per
    /// order as their buyers: following 20,000 orders through the API loads the very service
    /// (and database) whose saga is being timed, which the raw-insert baseline does not pay.
    #[arg(long, env = "FLASHSALE_BENCH_ORDERS_DB_URL")]
    orders_db_url: Option<String>,
    /// Redis for the raw-gate mode.
    #[arg(
        long,
        env = "FLASHSALE_BENCH_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// RabbitMQ, only asked for its version (for the report).
    #[arg(
        long,
        env = "FLASHSALE_BENCH_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// The services' Prometheus endpoints, read before and after each mode for what their
    /// batchers did (endpoints that do not answer are left out; "" reads none).
    #[arg(
        long,
        env = "FLASHSALE_BENCH_METRICS_URLS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:9101/metrics,http://127.0.0.1:9102/metrics,http://127.0.0.1:9103/metrics"
    )]
    metrics_url: Vec<String>,
    /// Databases (on --postgres-url) whose tables' counters (`pg_stat_user_tables`) the
    /// refusals mode sums; `pg_stat_database` is read for every database in any case.
    #[arg(long, env = "FLASHSALE_BENCH_STATS_DBS", value_delimiter = ',')]
    stats_db: Vec<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    secret: Secret,
}

impl Args {
    fn load(&self) -> anyhow::Result<(Load, u32, bool)> {
        let (requests, buyers, stock, limit, ticketing) = match self.scenario {
            Scenario::Flood => (200_000, 50_000, 1_000, 1, false),
            Scenario::BigSale => (40_000, 40_000, 20_000, 1, false),
            Scenario::Ticketing => (40_000, 40_000, 20_000, 1, true),
        };
        let load = Load {
            requests: self.requests.unwrap_or(requests),
            buyers: self.buyers.unwrap_or(buyers),
            concurrency: self.concurrency,
            connections: self.connections,
            stock: self.stock.unwrap_or(stock),
            deadline: Duration::from_secs(self.max_seconds_per_mode),
        };
        anyhow::ensure!(
            (1..=10_000_000).contains(&load.requests),
            "--requests must be 1..=10000000"
        );
        anyhow::ensure!(
            (1..=10_000_000).contains(&load.buyers),
            "--buyers must be 1..=10000000"
        );
        anyhow::ensure!(
            (1..=1_000_000_000).contains(&load.stock),
            "--stock must be 1..=1000000000"
        );
        anyhow::ensure!(
            (1..=4096).contains(&load.concurrency),
            "--concurrency must be 1..=4096"
        );
        anyhow::ensure!(
            (1..=64).contains(&load.connections),
            "--connections must be 1..=64"
        );
        anyhow::ensure!((1..=20).contains(&self.rounds), "--rounds must be 1..=20");
        if let Some(b) = self.stock_buckets {
            anyhow::ensure!(
                (1..=64).contains(&b),
                "--stock-buckets must be 1..=64 (got {b})"
            );
        }
        anyhow::ensure!(
            !self.order_url.is_empty() && self.order_url.iter().all(|u| !u.trim().is_empty()),
            "--order-url must name one or more URLs separated by commas, none empty"
        );
        anyhow::ensure!(
            (1..=3600).contains(&self.max_seconds_per_mode),
            "--max-seconds-per-mode must be 1..=3600"
        );
        anyhow::ensure!(
            self.max_idle_wait_secs <= 600,
            "--max-idle-wait-secs must be 0..=600 (got {})",
            self.max_idle_wait_secs
        );
        self.db_pool()?;
        self.sweep.validate()?;
        self.platform_sweep.validate()?;
        self.open_loop.validate()?;
        self.insert_batch.validate()?;
        self.cluster_wait.validate()?;
        let named = [
            ("--naive-db", &self.naive_db),
            ("--insert-db", &self.insert_db),
        ];
        let stats = self.stats_db.iter().map(|n| ("--stats-db", n));
        for (flag, name) in named.into_iter().chain(stats) {
            let ok = (1..=63).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            anyhow::ensure!(
                ok,
                "{flag} must be a database name of 1..=63 characters a-z, 0-9 and _ (got {name:?})"
            );
        }
        if let Some(url) = &self.orders_db_url {
            let ok = url::Url::parse(url)
                .is_ok_and(|u| matches!(u.scheme(), "postgres" | "postgresql") && u.has_host());
            anyhow::ensure!(ok, "--orders-db-url must be a postgres://host/database URL");
        }
        Ok((load, limit, ticketing))
    }

    fn db_pool(&self) -> anyhow::Result<u32> {
        let pool = self
            .db_pool
            .unwrap_or(self.concurrency.min(DEFAULT_DB_POOL));
        anyhow::ensure!(
            (1..=100).contains(&pool),
            "--db-pool must be 1..=100 (got {pool}); PostgreSQL's max_connections bounds it"
        );
        u32::try_from(pool).context("--db-pool")
    }
}

/// The databases whose work a mode's orders are charged with, and what the orders reached:
/// the naive design's database per accepted order, the services' per confirmed order.
fn db_work_of(mode: &Mode, args: &Args) -> Option<(Vec<(String, String)>, &'static str)> {
    match mode {
        Mode::Naive | Mode::NaiveFn | Mode::NaiveSweep => Some((
            vec![("naive".to_owned(), args.naive_db.clone())],
            "accepted",
        )),
        Mode::Platform => Some((
            args.stats_db
                .iter()
                .map(|db| (owner_of(db), db.clone()))
                .collect(),
            "confirmed",
        )),
        _ => None,
    }
}

/// The service a database belongs to, by its name (`flashsale_bench_svc_orders` → `order`).
fn owner_of(db: &str) -> String {
    ["product", "order", "outbound"]
        .into_iter()
        .find(|s| db.contains(s))
        .map_or_else(
            || db.to_owned(),
            |s| if s == "product" { "product-stock" } else { s }.to_owned(),
        )
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (load, limit, ticketing) = args.load()?;
    let db_pool = args.db_pool()?;
    let services = args.pids.services();
    let metrics_urls = batches::parse_urls(&args.metrics_url)?;
    let admin = args
        .secret
        .mint("bench", Role::Admin, Duration::from_secs(3600))?;
    let sources = if args.modes.contains(&Mode::Refusals)
        || args.modes.contains(&Mode::RefusalsBeforeOpening)
    {
        Some(counters::Sources::connect(&args.postgres_url, &args.stats_db, &args.redis_url).await?)
    } else {
        // The database work per order is counted wherever the servers can be read.
        counters::Sources::connect(&args.postgres_url, &args.stats_db, &args.redis_url)
            .await
            .inspect_err(|e| eprintln!("bench: no database work per order: {e:#}"))
            .ok()
    };
    let mut results: Vec<ModeReport> = Vec::new();
    let mut sweeps: Vec<sweep::Sweep> = Vec::new();
    let mut curves: Vec<openloop::Curve> = Vec::new();
    let mut waits: Vec<cluster_wait::Report> = Vec::new();
    let mut platform_sweeps: Vec<platform_sweep::Report> = Vec::new();
    for (round, mode) in (1..=args.rounds).flat_map(|r| args.modes.iter().map(move |m| (r, m))) {
        // A product (and gate keys) of its own per mode and round: a sale sells out once.
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_uppercase();
        let sku = format!("BENCH-{tag}");
        let idle =
            procstat::wait_idle(&services, Duration::from_secs(args.max_idle_wait_secs)).await;
        match idle {
            Some(w) if w.idle => {
                eprintln!("bench: services idle after {:.1} s", w.waited.as_secs_f64())
            }
            Some(w) => eprintln!(
                "bench: services still busy after {:.1} s (--max-idle-wait-secs); going on",
                w.waited.as_secs_f64()
            ),
            None => {}
        }
        if args.rounds > 1 {
            eprintln!("bench: round {round} of {}: {mode:?} …", args.rounds);
        } else {
            eprintln!("bench: {mode:?} …");
        }
        if matches!(mode, Mode::OpenLoopPlatform | Mode::OpenLoopNaive) {
            let best = sweeps.last().and_then(sweep::Sweep::best_point);
            let platform = *mode == Mode::OpenLoopPlatform;
            curves.push(openloop::run_mode(&args, platform, &services, limit, round, best).await?);
            continue;
        }
        if *mode == Mode::ClusterWait {
            waits.push(cluster_wait::run(&args.cluster_wait, round, load.deadline).await?);
            continue;
        }
        if *mode == Mode::PlatformSweep {
            let target = platform_sweep::Target {
                product_stock_url: &args.product_stock_url,
                order_urls: &args.order_url,
                stock_buckets: args.stock_buckets.unwrap_or(0),
                secret: &args.secret,
                admin: &admin,
                ticketing,
                follow_db: args.follow_db().await?,
            };
            let idle_bound = Duration::from_secs(args.max_idle_wait_secs);
            let r = platform_sweep::run(
                &args.platform_sweep,
                &target,
                &load,
                args.sweep.sweep_requests,
                limit,
                round,
                || async {
                    procstat::wait_idle(&services, idle_bound).await;
                },
            )
            .await?;
            for c in r.checks.iter().filter(|c| !c.pass) {
                eprintln!(
                    "bench: {mode:?}: invariant FAILED: {}: {}",
                    c.name, c.detail
                );
            }
            platform_sweeps.push(r);
            continue;
        }
        let batches_before = batches::scrape(&metrics_urls).await;
        let db_before = match (&sources, db_work_of(mode, &args)) {
            (Some(src), Some(_)) => src.read().await.ok(),
            _ => None,
        };
        let sampler = procstat::Sampler::start(services.clone());
        let cpu = cpustat::Sampler::start(cpustat::groups(&services));
        let mut refused_stretch = None;
        let (m, saga, checks) = match mode {
            Mode::Noop => {
                let m = baselines::noop(&args.order_url, &load).await?;
                let checks = vec![invariants::no_errors(&m)];
                (m, None, checks)
            }
            Mode::Naive => {
                let db = baselines::bench_db(&args.postgres_url, &args.naive_db, db_pool).await?;
                let m = baselines::naive(db.clone(), &load, &sku, limit).await?;
                let mut checks = vec![invariants::no_errors(&m)];
                checks.extend(
                    invariants::naive_database(
                        &db,
                        &sku,
                        load.stock,
                        (m.accepted, m.errored()),
                        limit,
                    )
                    .await,
                );
                (m, None, checks)
            }
            Mode::NaiveFn => {
                let db = baselines::bench_db(&args.postgres_url, &args.naive_db, db_pool).await?;
                let variant = baselines::NaiveVariant::NaiveFn;
                let m = baselines::naive_with(db.clone(), &load, &sku, limit, variant).await?;
                let mut checks = vec![invariants::no_errors(&m)];
                checks.extend(
                    invariants::naive_database(
                        &db,
                        &sku,
                        load.stock,
                        (m.accepted, m.errored()),
                        limit,
                    )
                    .await,
                );
                (m, None, checks)
            }
            Mode::NaiveSweep => {
                let (s, m, rows) = sweep::run(
                    &args.sweep,
                    &args.postgres_url,
                    &args.naive_db,
                    &load,
                    limit,
                    round,
                )
                .await?;
                sweeps.push(s);
                // The sweep's points and its full-size run: each on a product of its own,
                // its rows read back and checked like any naive run's.
                let mut checks = vec![invariants::no_errors(&m)];
                checks.extend(rows);
                (m, None, checks)
            }
            Mode::NaiveBare => {
                let db = baselines::bench_db(&args.postgres_url, &args.naive_db, db_pool).await?;
                let m = baselines::naive_bare(db, &load, &sku).await?;
                let checks = vec![
                    invariants::no_errors(&m),
                    invariants::sold_within_stock(m.accepted, load.stock),
                ];
                (m, None, checks)
            }
            Mode::Gate => {
                let settings = flashsale_platform::settings::RedisSettings {
                    url: args.redis_url.clone(),
                    key_prefix: format!("fs_bench_gate_{tag}:"),
                    pool_size: load.concurrency.clamp(1, 256),
                    ..Default::default()
                };
                let gate = flashsale_product_stock::testing::Gate::connect(
                    &settings,
                    Duration::from_secs(600),
                )?;
                let m = baselines::raw_gate(gate, &load, &sku, limit).await?;
                let checks = vec![
                    invariants::no_errors(&m),
                    invariants::sold_within_stock(m.accepted, load.stock),
                ];
                (m, None, checks)
            }
            Mode::Insert => {
                let db = baselines::bench_db(&args.postgres_url, &args.insert_db, db_pool).await?;
                let m = baselines::raw_insert(db.clone(), &load, &sku).await?;
                let checks = vec![
                    invariants::no_errors(&m),
                    invariants::insert_database(&db, &sku, m.accepted).await,
                ];
                (m, None, checks)
            }
            Mode::InsertBatch => {
                let b = &args.insert_batch;
                let pool = u32::try_from(b.insert_batches_in_flight).unwrap_or(1);
                let db = baselines::bench_db(&args.postgres_url, &args.insert_db, pool).await?;
                let (size, in_flight) = (b.insert_batch_size, b.insert_batches_in_flight);
                let m = baselines::batched_insert(db.clone(), &load, &sku, size, in_flight).await?;
                let checks = vec![
                    invariants::no_errors(&m),
                    invariants::insert_database(&db, &sku, m.accepted).await,
                ];
                (m, None, checks)
            }
            Mode::OpenLoopPlatform
            | Mode::OpenLoopNaive
            | Mode::ClusterWait
            | Mode::PlatformSweep => {
                unreachable!("the open-loop, cluster-wait and platform-sweep modes run above")
            }
            Mode::Platform => {
                let (m, saga) = platform::flood(
                    &args.product_stock_url,
                    &args.order_url,
                    args.stock_buckets.unwrap_or(0),
                    &args.secret,
                    &load,
                    &sku,
                    limit,
                    ticketing,
                    args.follow_db().await?,
                )
                .await?;
                let mut checks = vec![invariants::no_errors(&m)];
                checks.extend(
                    invariants::platform(
                        &args.product_stock_url,
                        &admin,
                        &sku,
                        load.stock,
                        m.accepted,
                        &saga,
                    )
                    .await,
                );
                (m, Some(saga), checks)
            }
            Mode::Refusals => {
                let Some(sources) = &sources else {
                    anyhow::bail!("the refusals mode has no counters to read");
                };
                let target = refusals::Target {
                    product_stock_url: &args.product_stock_url,
                    order_urls: &args.order_url,
                    stock_buckets: args.stock_buckets.unwrap_or(0),
                    secret: &args.secret,
                    follow_db: args.follow_db().await?,
                    services: &services,
                    sources,
                };
                let (m, r) = refusals::run(target, &load, &sku).await?;
                let mut checks = vec![
                    invariants::no_errors(&m),
                    invariants::Check {
                        name: "a sold-out product accepts nothing",
                        pass: m.accepted == 0,
                        detail: format!("{} accepted of {} calls", m.accepted, m.requests),
                    },
                ];
                // The product's own stock against every order it accepted, in the sell-out
                // and in the stretch after it.
                checks.extend(
                    invariants::platform(
                        &args.product_stock_url,
                        &admin,
                        &sku,
                        i64::try_from(refusals::SELL_OUT_STOCK).unwrap_or(i64::MAX),
                        r.sell_out_accepted + m.accepted,
                        &r.sell_out_saga,
                    )
                    .await,
                );
                refused_stretch = Some(r);
                (m, None, checks)
            }
            Mode::RefusalsBeforeOpening => {
                let Some(sources) = &sources else {
                    anyhow::bail!("the refusals-before-opening mode has no counters to read");
                };
                let target = refusals::Target {
                    product_stock_url: &args.product_stock_url,
                    order_urls: &args.order_url,
                    stock_buckets: args.stock_buckets.unwrap_or(0),
                    secret: &args.secret,
                    follow_db: None,
                    services: &services,
                    sources,
                };
                let (m, r) = refusals::run_before_opening(target, &load, &sku).await?;
                let reasons: Vec<&String> = m.refused.keys().collect();
                let checks = vec![
                    invariants::no_errors(&m),
                    invariants::Check {
                        name: "nothing is sold before the opening",
                        pass: m.accepted == 0 && reasons == ["SALE_NOT_STARTED"],
                        detail: format!(
                            "{} accepted of {} calls; refused {:?}",
                            m.accepted, m.requests, m.refused
                        ),
                    },
                ];
                refused_stretch = Some(r);
                (m, None, checks)
            }
        };
        let memory = sampler.finish().await;
        let cpu = report::Cpu::of(&m, saga.as_ref(), &cpu.finish().await);
        let dbwork = match (&sources, &db_before, db_work_of(mode, &args)) {
            (Some(src), Some(before), Some((dbs, per))) => {
                // The statement counts are live; the commit counters are published within
                // PG_STATS_SETTLE of the work.
                tokio::time::sleep(counters::PG_STATS_SETTLE).await;
                let orders = match (mode, per, &saga) {
                    (_, "confirmed", Some(s)) => s.confirmed,
                    // Every point of the sweep wrote its orders, besides its full-size run.
                    (Mode::NaiveSweep, _, _) => {
                        m.accepted
                            + sweeps
                                .last()
                                .map_or(0, |s| s.points.iter().map(|p| p.accepted).sum())
                    }
                    _ => m.accepted,
                };
                let after = src.read().await.ok();
                after.and_then(|a| {
                    dbwork::between(before, &a, &dbs, per, u64::try_from(orders).unwrap_or(0))
                })
            }
            _ => None,
        };
        let batches = batches::between(&batches_before, &batches::scrape(&metrics_urls).await);
        for c in checks.iter().filter(|c| !c.pass) {
            eprintln!(
                "bench: {mode:?}: invariant FAILED: {}: {}",
                c.name, c.detail
            );
        }
        results.push(ModeReport {
            round,
            m,
            saga,
            memory,
            idle,
            cpu,
            batches,
            checks,
            refusals: refused_stretch,
            dbwork,
        });
    }
    let machine = machine(&args).await;
    let meta = meta::collect(&args.postgres_url, &args.redis_url, &args.amqp_url).await;
    let figures = report::Figures {
        rounds: args.rounds,
        scenario: format!("{:?}", args.scenario),
        load: &load,
        db_pool,
        machine,
        services: &services,
        order_urls: &args.order_url,
        stock_buckets: args.stock_buckets,
        meta,
        options: std::env::args().skip(1).collect(),
    };
    let passed = invariants::all_pass(results.iter().flat_map(|r| r.checks.iter()))
        && curves.iter().all(openloop::Curve::passed)
        && waits.iter().all(cluster_wait::Report::all_reserved)
        && platform_sweeps.iter().all(platform_sweep::Report::passed);
    if args.json {
        let mut v = report::json(&figures, &results);
        v["naive_sweep"] = sweeps.iter().map(sweep::Sweep::to_json).collect();
        v["open_loop"] = curves.iter().map(openloop::Curve::to_json).collect();
        v["cluster_wait"] = waits.iter().map(cluster_wait::Report::to_json).collect();
        v["platform_sweep"] = platform_sweeps
            .iter()
            .map(platform_sweep::Report::to_json)
            .collect();
        // Every check of the run: the modes', the open-loop points' and the waits'.
        v["passed"] = serde_json::json!(passed);
        let rendered = serde_json::to_string_pretty(&v).context("render report")?;
        println!("{rendered}");
    } else {
        report::print_text(&figures, &results);
        sweeps.iter().for_each(sweep::Sweep::print_text);
        curves.iter().for_each(openloop::Curve::print_text);
        waits.iter().for_each(cluster_wait::Report::print_text);
        platform_sweeps
            .iter()
            .for_each(platform_sweep::Report::print_text);
    }
    if passed {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("bench: FAILED: an invariant broke or a mode had errors (see the checks above)");
        Ok(ExitCode::FAILURE)
    }
}

impl Args {
    /// A small pool on the order service's own database, for the saga follower, when
    /// --orders-db-url is given.
    async fn follow_db(&self) -> anyhow::Result<Option<sea_orm::DatabaseConnection>> {
        let Some(url) = &self.orders_db_url else {
            return Ok(None);
        };
        let db = sea_orm::Database::connect(
            sea_orm::ConnectOptions::new(url.clone())
                .max_connections(2)
                .sqlx_logging(false)
                .to_owned(),
        )
        .await
        .context("connect to --orders-db-url")?;
        Ok(Some(db))
    }
}

/// Cores and server versions, for the report.
async fn machine(args: &Args) -> String {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let pg = async {
        let db = sea_orm::Database::connect(format!("{}/postgres", args.postgres_url))
            .await
            .ok()?;
        let row = sea_orm::ConnectionTrait::query_one_raw(
            &db,
            sea_orm::Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                "SELECT current_setting('server_version') AS v",
            ),
        )
        .await
        .ok()??;
        row.try_get::<String>("", "v").ok()
    }
    .await
    .unwrap_or_else(|| "?".into());
    let redis = async {
        let client = deadpool_redis::redis::Client::open(args.redis_url.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = deadpool_redis::redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(str::to_owned)
    }
    .await
    .unwrap_or_else(|| "?".into());
    let broker = amqp_version::probe(&args.amqp_url, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| "broker ?".into());
    format!("{cores} cores, PostgreSQL {pg}, Redis {redis}, {broker}")
}
