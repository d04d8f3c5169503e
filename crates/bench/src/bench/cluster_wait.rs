//! The `cluster-wait` mode (opt-in): what answering a buyer only once a replica holds the
//! reservation would cost the stock gate on a Redis Cluster, whose replication is asynchronous.
//! It starts a private cluster (3 masters + 3 replicas on loopback; `redis-server` and
//! `redis-cli` needed, no service), loads two products per master, and for each count of
//! `--wait-callers` and size of `--wait-batch-sizes` runs the gate's reservation batch
//! (`reserve_many`: one pipeline, as `ReserveStockBatch`) plain (A) and followed by
//! `WAIT 1 <--wait-timeout-ms>` (B), alternated A B A B for `--wait-pairs` pairs. Each caller has
//! a gate over a pool of ONE connection, so its WAIT runs on the cluster connection that carried
//! its batch (WAIT counts the replicas holding that connection's last write). redis-rs sends WAIT
//! on a cluster connection to every master at once and answers the smallest count (routing
//! `AllPrimaries`, response policy `Aggregate(Min)`). Its check: every reservation granted. Each
//! run stops after `--wait-batches` batches or `--max-seconds-per-mode`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use deadpool_redis::redis;
use flashsale_platform::{redis::key_slot, settings::RedisSettings};
use flashsale_product_stock::testing::{
    Gate, ReserveArgs, ReserveOutcome, SaleWindow, product_tag,
};
use flashsale_test_support::redis_cluster::RedisCluster;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use uuid::Uuid;

/// Stock of each product: more than any run can take (below 2^53).
const STOCK: i64 = 1_000_000_000_000;
/// Buyers the reservations cycle through (no per-user limit), so the gate's buyer sets stay small.
const USERS: u64 = 1_000;

/// The cluster-wait flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterWaitArgs {
    /// Reservations per batch of the cluster-wait mode (each 1..=1024), separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub wait_batch_sizes: Vec<usize>,
    /// Callers of the cluster-wait mode (each 1..=64), separated by commas; each sends its
    /// batches one after the other through a gate and a pool of one connection of its own.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub wait_callers: Vec<usize>,
    /// Batches of each cluster-wait run (1..=100000), shared among its callers.
    #[arg(long, default_value_t = 400)]
    pub wait_batches: u64,
    /// Runs of each arm (plain, with WAIT) per cluster-wait point (1..=20), alternated.
    #[arg(long, default_value_t = 3)]
    pub wait_pairs: usize,
    /// Timeout of the cluster-wait mode's `WAIT 1 <ms>` (1..=10000).
    #[arg(long, default_value_t = 100)]
    pub wait_timeout_ms: u64,
}

impl ClusterWaitArgs {
    /// Refuses bad values, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        let (sizes, callers) = (&self.wait_batch_sizes, &self.wait_callers);
        anyhow::ensure!(
            !sizes.is_empty() && sizes.iter().all(|s| (1..=1024).contains(s)),
            "--wait-batch-sizes must list sizes of 1..=1024"
        );
        anyhow::ensure!(
            !callers.is_empty() && callers.iter().all(|c| (1..=64).contains(c)),
            "--wait-callers must list caller counts of 1..=64"
        );
        let (b, p, t) = (self.wait_batches, self.wait_pairs, self.wait_timeout_ms);
        anyhow::ensure!(
            (1..=100_000).contains(&b),
            "--wait-batches must be 1..=100000"
        );
        anyhow::ensure!((1..=20).contains(&p), "--wait-pairs must be 1..=20");
        anyhow::ensure!(
            (1..=10_000).contains(&t),
            "--wait-timeout-ms must be 1..=10000"
        );
        Ok(())
    }
}

/// One caller: a gate over a pool of one connection, and that pool for its WAIT.
#[derive(Clone)]
struct Caller {
    gate: Gate,
}

impl Caller {
    /// Reserves one unit for each of `size` new orders in one pipeline, then (B) WAITs. Returns
    /// the batch's time, the items not reserved, and WAIT's replica count.
    async fn batch(
        &self,
        skus: &[String],
        seq: u64,
        size: usize,
        wait_ms: Option<u64>,
    ) -> anyhow::Result<(Duration, usize, Option<i64>)> {
        let users: Vec<String> = (0..size as u64)
            .map(|i| format!("buyer-{}", (seq * size as u64 + i) % USERS))
            .collect();
        let now_ms = chrono::Utc::now().timestamp_millis();
        let items: Vec<ReserveArgs<'_>> = users
            .iter()
            .enumerate()
            .map(|(i, user_id)| ReserveArgs {
                sku: &skus[(seq as usize + i) % skus.len()],
                bucket: 0,
                order_id: Uuid::new_v4(),
                user_id,
                qty: 1,
                per_user_limit: 0,
                now_ms,
                window: SaleWindow::ALWAYS,
            })
            .collect();
        let started = Instant::now();
        let outcomes = self.gate.reserve_many(&items).await?;
        let acked = match wait_ms {
            None => None,
            Some(ms) => {
                let mut conn = self.gate.pool().get().await.context("the caller's pool")?;
                let mut wait = redis::cmd("WAIT");
                wait.arg(1).arg(ms);
                Some(wait.query_async::<i64>(&mut *conn).await?)
            }
        };
        let granted = |o: &&Result<_, _>| matches!(o, Ok(ReserveOutcome::Reserved { .. }));
        let failed = outcomes.len() - outcomes.iter().filter(granted).count();
        Ok((started.elapsed(), failed, acked))
    }
}

/// One arm (A or B) of a point, summed over its runs.
struct Arm {
    batches: u64,
    elapsed: Duration,
    latency_us: Histogram<u64>,
    failed: usize,
    short_waits: u64,
    cut_short: usize,
}

impl Arm {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            batches: 0,
            elapsed: Duration::ZERO,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .map_err(|e| anyhow::anyhow!("histogram: {e}"))?,
            failed: 0,
            short_waits: 0,
            cut_short: 0,
        })
    }

    fn rate(&self) -> f64 {
        self.batches as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    /// One run: `batches` shared among `callers`, each caller's one after the other.
    async fn run(
        &mut self,
        callers: &[Caller],
        skus: &Arc<[String]>,
        size: usize,
        batches: u64,
        wait_ms: Option<u64>,
        bound: Duration,
    ) -> anyhow::Result<f64> {
        let (n, deadline) = (callers.len() as u64, Instant::now() + bound);
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for (i, caller) in (0..n).zip(callers.iter().cloned()) {
            let (skus, share) = (skus.clone(), batches / n + u64::from(i < batches % n));
            tasks.spawn(async move {
                let mut got = Vec::with_capacity(share as usize);
                for b in 0..share {
                    if Instant::now() >= deadline {
                        break;
                    }
                    got.push(
                        caller
                            .batch(&skus, i * 1_000_003 + b, size, wait_ms)
                            .await?,
                    );
                }
                anyhow::Ok((got, share))
            });
        }
        let mut done = 0;
        while let Some(joined) = tasks.join_next().await {
            let (got, share) = joined.context("a cluster-wait caller panicked")??;
            self.cut_short += usize::from((got.len() as u64) < share);
            for (took, failed, acked) in got {
                self.latency_us
                    .saturating_record(took.as_micros().max(1) as u64);
                self.failed += failed;
                self.short_waits += u64::from(acked.is_some_and(|a| a < 1));
                done += 1;
            }
        }
        let elapsed = started.elapsed();
        self.batches += done;
        self.elapsed += elapsed;
        Ok(done as f64 / elapsed.as_secs_f64().max(1e-9))
    }
}

/// One point: a caller count and a batch size, both arms.
pub struct Point {
    callers: usize,
    size: usize,
    plain: Arm,
    waited: Arm,
    /// B/A batches/s of each pair of runs.
    pair_ratios: Vec<f64>,
}

/// The mode's figures.
pub struct Report {
    round: usize,
    args: ClusterWaitArgs,
    products: usize,
    points: Vec<Point>,
}

/// Two products on each master of `cluster`.
async fn products(cluster: &RedisCluster) -> anyhow::Result<Vec<String>> {
    let masters = cluster.masters().await?;
    let mut per_master = vec![0_usize; masters.len()];
    let mut skus = Vec::new();
    for i in 0..10_000 {
        let sku = format!("WAIT-{i}");
        let slot = key_slot(product_tag(&sku).as_bytes());
        if let Some(m) = masters.iter().position(|m| m.serves(slot))
            && per_master[m] < 2
        {
            per_master[m] += 1;
            skus.push(sku);
        }
        if per_master.iter().all(|&c| c == 2) {
            return Ok(skus);
        }
    }
    anyhow::bail!("could not place two products on each master")
}

pub async fn run(args: &ClusterWaitArgs, round: usize, bound: Duration) -> anyhow::Result<Report> {
    let cluster = RedisCluster::start()
        .await
        .context("start a private Redis Cluster (needs redis-server and redis-cli)")?;
    let prefix = format!(
        "fs_bench_wait_{}:",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let settings = RedisSettings {
        key_prefix: prefix.clone(),
        pool_size: 1,
        ..RedisSettings::cluster(cluster.urls())
    };
    let most = args.wait_callers.iter().copied().max().unwrap_or(1);
    let mut callers = Vec::with_capacity(most);
    for _ in 0..most {
        let gate = Gate::connect(&settings, Duration::from_secs(3600))?;
        callers.push(Caller { gate });
    }
    let skus: Arc<[String]> = products(&cluster).await?.into();
    for sku in skus.iter() {
        anyhow::ensure!(
            callers[0].gate.load(sku, STOCK).await?,
            "{sku} was already loaded"
        );
    }
    // Every caller's connection opened, the script cached and one WAIT answered before timing.
    for (i, c) in callers.iter().enumerate() {
        c.batch(&skus, i as u64, 4, Some(args.wait_timeout_ms))
            .await?;
    }
    let mut points = Vec::new();
    for &n in &args.wait_callers {
        for &size in &args.wait_batch_sizes {
            eprintln!("bench: cluster-wait: {n} caller(s), batches of {size} …");
            let (mut plain, mut waited) = (Arm::new()?, Arm::new()?);
            let mut pair_ratios = Vec::with_capacity(args.wait_pairs);
            for _ in 0..args.wait_pairs {
                let (c, b) = (&callers[..n], args.wait_batches);
                let a = plain.run(c, &skus, size, b, None, bound).await?;
                let w = waited
                    .run(c, &skus, size, b, Some(args.wait_timeout_ms), bound)
                    .await?;
                pair_ratios.push(w / a.max(1e-9));
            }
            points.push(Point {
                callers: n,
                size,
                plain,
                waited,
                pair_ratios,
            });
        }
    }
    drop(callers);
    drop(cluster);
    let (args, products) = (args.clone(), skus.len());
    Ok(Report {
        round,
        args,
        products,
        points,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `b / a`, 0 when `a` is 0.
fn ratio(b: f64, a: f64) -> f64 {
    if a > 0.0 { b / a } else { 0.0 }
}

impl Point {
    /// B/A of batches/s, p50 and p99.
    fn ratios(&self) -> [f64; 3] {
        let (a, b) = (&self.plain, &self.waited);
        [
            ratio(b.rate(), a.rate()),
            ratio(b.ms(0.5), a.ms(0.5)),
            ratio(b.ms(0.99), a.ms(0.99)),
        ]
    }
}

impl Report {
    /// Whether every reservation was granted (the stock covers them all): its check.
    pub fn all_reserved(&self) -> bool {
        let failed: usize = self
            .points
            .iter()
            .map(|p| p.plain.failed + p.waited.failed)
            .sum();
        if failed > 0 {
            eprintln!("bench: cluster-wait: {failed} reservation(s) were not granted");
        }
        failed == 0
    }

    pub fn to_json(&self) -> Value {
        let arm = |a: &Arm| {
            json!({"batches": a.batches, "batches_per_s": round2(a.rate()),
                "p50_ms": round2(a.ms(0.5)), "p99_ms": round2(a.ms(0.99)),
                "failed_reservations": a.failed, "waits_short_of_a_replica": a.short_waits,
                "runs_cut_short": a.cut_short})
        };
        let point = |p: &Point| {
            let [rate, p50, p99] = p.ratios().map(round2);
            let pairs: Vec<f64> = p.pair_ratios.iter().copied().map(round2).collect();
            json!({"callers": p.callers, "batch_size": p.size, "plain": arm(&p.plain),
                "with_wait": arm(&p.waited), "ratio_batches_per_s": rate, "ratio_p50": p50,
                "ratio_p99": p99, "pair_ratios_batches_per_s": pairs})
        };
        let a = &self.args;
        json!({"round": self.round, "wait": format!("WAIT 1 {}", a.wait_timeout_ms),
            "cluster": "3 masters + 3 replicas on loopback", "products": self.products,
            "pairs": a.wait_pairs, "batches_per_run": a.wait_batches,
            "points": self.points.iter().map(point).collect::<Vec<_>>()})
    }

    pub fn print_text(&self) {
        println!(
            "cluster wait (round {}): WAIT 1 {} after each reservation batch; 3 masters + 3 replicas on loopback, {} products; {} A/B pairs of {} batches per point",
            self.round,
            self.args.wait_timeout_ms,
            self.products,
            self.args.wait_pairs,
            self.args.wait_batches
        );
        println!(
            "  callers batch A batch/s B batch/s   B/A A p50 ms B p50 ms   B/A A p99 ms B p99 ms   B/A  short failed  pairs' B/A batch/s"
        );
        for p in &self.points {
            let (a, b, [rate, p50, p99]) = (&p.plain, &p.waited, p.ratios());
            let pairs: Vec<String> = p.pair_ratios.iter().map(|r| format!("{r:.2}")).collect();
            let cut = a.cut_short + b.cut_short > 0;
            println!(
                "  {:>7} {:>5} {:>9.0} {:>9.0} {rate:>5.2} {:>8.3} {:>8.3} {p50:>5.2} {:>8.3} {:>8.3} {p99:>5.2} {:>6} {:>6}  {}{}",
                p.callers,
                p.size,
                a.rate(),
                b.rate(),
                a.ms(0.5),
                b.ms(0.5),
                a.ms(0.99),
                b.ms(0.99),
                b.short_waits,
                a.failed + b.failed,
                pairs.join(" "),
                if cut { "  (runs cut short)" } else { "" },
            );
        }
    }
}
