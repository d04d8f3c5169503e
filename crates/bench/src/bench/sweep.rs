//! The naive design at its best: before the naive baseline is measured, a sweep over its pool
//! size, its concurrency and its two variants (four round trips or one per request), each point a
//! short bounded run on a fresh product; the point that accepted the most orders per second is
//! then run again at the scenario's full size, and that run is the naive baseline the ratios use.
//! A baseline tuned for the machine is the fair one to beat: a pool larger than the machine's
//! cores makes the hot row's lock holders wait for CPU while they hold it.
//!
//! The mode is `naive-sweep`; `--naive-pools`, `--naive-concurrency` and `--sweep-requests` shape
//! it. The plain `naive` and `naive-fn` modes stay single runs at `--db-pool` and
//! `--concurrency`.

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    baselines::{self, Load, NaiveVariant},
    invariants::{self, Check},
    measure::Measurement,
};

/// Most connections one point's pool may hold: PostgreSQL's `max_connections` (100 here) is
/// shared with the services' pools.
pub const MAX_POOL: usize = 100;
/// Most requests of one sweep point.
pub const MAX_SWEEP_REQUESTS: usize = 1_000_000;

/// The sweep's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SweepArgs {
    /// Pool sizes the naive-sweep mode tries (each 1..=100), separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    pub naive_pools: Vec<usize>,
    /// Concurrencies the naive-sweep mode tries (each 1..=4096), separated by commas; default
    /// the run's --concurrency.
    #[arg(long, value_delimiter = ',')]
    pub naive_concurrency: Vec<usize>,
    /// Requests of each sweep point (1..=1000000); buyers and stock scale with them as in the
    /// scenario (at least one of each).
    #[arg(long, default_value_t = 4_000)]
    pub sweep_requests: usize,
}

impl SweepArgs {
    /// Refuses bad values, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.naive_pools.is_empty(),
            "--naive-pools must list one or more pool sizes"
        );
        for &p in &self.naive_pools {
            anyhow::ensure!(
                (1..=MAX_POOL).contains(&p),
                "--naive-pools: each pool must be 1..={MAX_POOL} (got {p}); PostgreSQL's max_connections bounds it"
            );
        }
        for &c in &self.naive_concurrency {
            anyhow::ensure!(
                (1..=4096).contains(&c),
                "--naive-concurrency: each concurrency must be 1..=4096 (got {c})"
            );
        }
        anyhow::ensure!(
            (1..=MAX_SWEEP_REQUESTS).contains(&self.sweep_requests),
            "--sweep-requests must be 1..={MAX_SWEEP_REQUESTS} (got {})",
            self.sweep_requests
        );
        Ok(())
    }

    /// The concurrencies to try: the list, or the run's own.
    fn concurrencies(&self, run: usize) -> Vec<usize> {
        if self.naive_concurrency.is_empty() {
            vec![run]
        } else {
            self.naive_concurrency.clone()
        }
    }
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub variant: NaiveVariant,
    pub pool: usize,
    pub concurrency: usize,
    pub requests: usize,
    pub accepted: usize,
    pub errors: usize,
    pub accepted_per_s: f64,
    pub throughput: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub accepted_p99_ms: f64,
}

impl Point {
    fn of(variant: NaiveVariant, pool: usize, concurrency: usize, m: &Measurement) -> Self {
        Self {
            variant,
            pool,
            concurrency,
            requests: m.requests,
            accepted: m.accepted,
            errors: m.errored(),
            accepted_per_s: m.accepted_per_sec(),
            throughput: m.throughput(),
            p50_ms: m.p(0.5),
            p99_ms: m.p(0.99),
            accepted_p99_ms: m.accepted_p(0.99),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "variant": self.variant.label(),
            "pool": self.pool,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "accepted": self.accepted,
            "errors": self.errors,
            "accepted_per_s": round(self.accepted_per_s),
            "throughput_rps": round(self.throughput),
            "p50_ms": round(self.p50_ms),
            "p99_ms": round(self.p99_ms),
            "accepted_p99_ms": round(self.accepted_p99_ms),
        })
    }
}

/// The best point: the most accepted orders per second among the points without errors (among
/// all of them when every point had errors); ties go to the smaller pool, then the lower p99.
pub fn best(points: &[Point]) -> Option<usize> {
    let clean = points.iter().any(|p| p.errors == 0 && p.accepted > 0);
    points
        .iter()
        .enumerate()
        .filter(|(_, p)| !clean || (p.errors == 0 && p.accepted > 0))
        .max_by(|(_, a), (_, b)| {
            a.accepted_per_s
                .total_cmp(&b.accepted_per_s)
                .then(b.pool.cmp(&a.pool))
                .then(b.p99_ms.total_cmp(&a.p99_ms))
        })
        .map(|(i, _)| i)
}

/// A finished sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub round: usize,
    /// The shape of each point.
    pub requests: usize,
    pub buyers: usize,
    pub stock: i64,
    pub points: Vec<Point>,
    /// Index of the best point in `points`.
    pub best: Option<usize>,
}

impl Sweep {
    pub fn best_point(&self) -> Option<&Point> {
        self.best.and_then(|i| self.points.get(i))
    }

    pub fn to_json(&self) -> Value {
        json!({
            "round": self.round,
            "requests_per_point": self.requests,
            "buyers_per_point": self.buyers,
            "stock_per_point": self.stock,
            "points": self.points.iter().map(Point::to_json).collect::<Vec<_>>(),
            "best": self.best_point().map(Point::to_json),
        })
    }

    pub fn print_text(&self) {
        println!(
            "naive sweep (round {}): {} requests from {} buyers for {} units per point, best by accepted/s",
            self.round, self.requests, self.buyers, self.stock
        );
        println!(
            "  {:<9} {:>5} {:>6} {:>9} {:>8} {:>7} {:>10} {:>8} {:>8} {:>9}",
            "variant",
            "pool",
            "conc",
            "requests",
            "accepted",
            "errors",
            "accept/s",
            "p50 ms",
            "p99 ms",
            "acc p99"
        );
        for (i, p) in self.points.iter().enumerate() {
            println!(
                "  {:<9} {:>5} {:>6} {:>9} {:>8} {:>7} {:>10.0} {:>8.2} {:>8.2} {:>9.2}{}",
                p.variant.label(),
                p.pool,
                p.concurrency,
                p.requests,
                p.accepted,
                p.errors,
                p.accepted_per_s,
                p.p50_ms,
                p.p99_ms,
                p.accepted_p99_ms,
                if Some(i) == self.best {
                    "  <- best"
                } else {
                    ""
                }
            );
        }
    }
}

/// The load of one sweep point: `requests` calls, the scenario's buyers and stock scaled by
/// `requests / load.requests` (at least one of each), the point's concurrency.
pub fn point_load(load: &Load, requests: usize, concurrency: usize) -> Load {
    let scale = requests as f64 / load.requests.max(1) as f64;
    Load {
        requests,
        buyers: ((load.buyers as f64 * scale).round() as usize).max(1),
        stock: ((load.stock as f64 * scale).round() as i64).max(1),
        concurrency,
        connections: load.connections,
        deadline: load.deadline,
    }
}

/// The sweep and the full-size run of its best point (named `naive best of sweep (…)`), with
/// the checks of the full run's rows and one check over every point's rows (each point sells
/// a product of its own, read back like any naive run's).
pub async fn run(
    args: &SweepArgs,
    postgres_url: &str,
    naive_db: &str,
    load: &Load,
    per_user_limit: u32,
    round: usize,
) -> anyhow::Result<(Sweep, Measurement, Vec<Check>)> {
    let shape = point_load(load, args.sweep_requests, load.concurrency);
    let mut points = Vec::new();
    let mut broken_points = Vec::new();
    for variant in NaiveVariant::ALL {
        for &concurrency in &args.concurrencies(load.concurrency) {
            for &pool in &args.naive_pools {
                let point = Load {
                    concurrency,
                    ..shape.clone()
                };
                let (m, checks) = run_one(
                    postgres_url,
                    naive_db,
                    pool,
                    &point,
                    per_user_limit,
                    variant,
                )
                .await?;
                let p = Point::of(variant, pool, concurrency, &m);
                broken_points.extend(checks.iter().filter(|c| !c.pass).map(|c| {
                    format!(
                        "{} pool {pool} concurrency {concurrency}: {}: {}",
                        variant.label(),
                        c.name,
                        c.detail
                    )
                }));
                eprintln!(
                    "bench: naive sweep {} pool {pool} concurrency {concurrency}: {:.0} accepted/s, p99 {:.2} ms, {} errors",
                    variant.label(),
                    p.accepted_per_s,
                    p.p99_ms,
                    p.errors
                );
                points.push(p);
            }
        }
    }
    let best = best(&points);
    let sweep = Sweep {
        round,
        requests: shape.requests,
        buyers: shape.buyers,
        stock: shape.stock,
        points,
        best,
    };
    let b = sweep
        .best_point()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the naive sweep has no point"))?;
    eprintln!(
        "bench: naive best of sweep: {} pool {} concurrency {}; full run …",
        b.variant.label(),
        b.pool,
        b.concurrency
    );
    let full = Load {
        concurrency: b.concurrency,
        ..load.clone()
    };
    let (mut m, mut checks) = run_one(
        postgres_url,
        naive_db,
        b.pool,
        &full,
        per_user_limit,
        b.variant,
    )
    .await?;
    m.name = format!(
        "naive best of sweep ({}, pool {}, concurrency {})",
        b.variant.label(),
        b.pool,
        b.concurrency
    );
    checks.push(points_consistent(sweep.points.len(), &broken_points));
    Ok((sweep, m, checks))
}

/// Every sweep point's rows passed their checks.
fn points_consistent(points: usize, broken: &[String]) -> Check {
    Check {
        name: "every sweep point's database consistent",
        pass: broken.is_empty(),
        detail: if broken.is_empty() {
            format!("{points} points read back, all consistent")
        } else {
            format!("{} failed: {}", broken.len(), broken.join("; "))
        },
    }
}

/// One naive run on a product of its own with a pool of its own, and the checks of its rows.
async fn run_one(
    postgres_url: &str,
    naive_db: &str,
    pool: usize,
    load: &Load,
    per_user_limit: u32,
    variant: NaiveVariant,
) -> anyhow::Result<(Measurement, Vec<Check>)> {
    let pool = u32::try_from(pool.clamp(1, MAX_POOL)).unwrap_or(1);
    let db = baselines::bench_db(postgres_url, naive_db, pool).await?;
    let sku = fresh_sku();
    let m = baselines::naive_with(db.clone(), load, &sku, per_user_limit, variant).await;
    let checks = match &m {
        Ok(m) => {
            invariants::naive_database(
                &db,
                &sku,
                load.stock,
                (m.accepted, m.errored()),
                per_user_limit,
            )
            .await
        }
        Err(_) => Vec::new(),
    };
    db.close().await.ok();
    // Let the closed connections' backends go before the next pool opens.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok((m?, checks))
}

/// A product of its own: a sale sells out once.
pub fn fresh_sku() -> String {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_uppercase();
    format!("BENCH-{tag}")
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn point(variant: NaiveVariant, pool: usize, accepted_per_s: f64, errors: usize) -> Point {
        Point {
            variant,
            pool,
            concurrency: 64,
            requests: 100,
            accepted: 50,
            errors,
            accepted_per_s,
            throughput: accepted_per_s,
            p50_ms: 1.0,
            p99_ms: 10.0 / accepted_per_s.max(1.0),
            accepted_p99_ms: 1.0,
        }
    }

    #[test]
    fn a_sweep_point_whose_rows_broke_fails_the_sweep_naming_it() {
        assert!(points_consistent(12, &[]).pass);
        let c = points_consistent(
            12,
            &["naive pool 4 concurrency 64: stock conserved: x".into()],
        );
        assert!(!c.pass);
        assert!(c.detail.contains("pool 4 concurrency 64"), "{c:?}");
    }

    #[test]
    fn the_best_point_accepts_the_most_per_second_without_errors() {
        let points = vec![
            point(NaiveVariant::Naive, 32, 585.0, 0),
            point(NaiveVariant::Naive, 8, 1_192.0, 0),
            point(NaiveVariant::NaiveFn, 4, 2_400.0, 0),
            // Faster but with errors (pool timeouts): not a baseline anyone could ship.
            point(NaiveVariant::NaiveFn, 16, 3_000.0, 7),
        ];
        assert_eq!(best(&points), Some(2));
        // A tie goes to the smaller pool.
        let tie = vec![
            point(NaiveVariant::Naive, 16, 1_000.0, 0),
            point(NaiveVariant::Naive, 8, 1_000.0, 0),
        ];
        assert_eq!(best(&tie), Some(1));
        // When every point had errors, the fastest of them.
        let all_bad = vec![
            point(NaiveVariant::Naive, 1, 10.0, 1),
            point(NaiveVariant::Naive, 2, 20.0, 3),
        ];
        assert_eq!(best(&all_bad), Some(1));
        assert_eq!(best(&[]), None);
    }

    #[test]
    fn a_point_keeps_the_scenarios_shape() {
        let big_sale = Load {
            requests: 40_000,
            buyers: 40_000,
            concurrency: 64,
            connections: 4,
            stock: 20_000,
            deadline: Duration::from_secs(60),
        };
        let p = point_load(&big_sale, 4_000, 8);
        assert_eq!(
            (p.requests, p.buyers, p.stock, p.concurrency),
            (4_000, 4_000, 2_000, 8)
        );
        let flood = Load {
            requests: 200_000,
            buyers: 50_000,
            stock: 1_000,
            ..big_sale
        };
        let p = point_load(&flood, 100, 64);
        assert_eq!((p.buyers, p.stock), (25, 1));
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sweep: SweepArgs,
    }

    fn refused(args: &[&str]) -> String {
        let mut all = vec!["t"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all) {
            Ok(cli) => match cli.sweep.validate() {
                Ok(()) => panic!("{args:?} was accepted"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_sweep_flags_are_refused_by_name() {
        assert!(refused(&["--naive-pools", ""]).contains("--naive-pools"));
        assert!(refused(&["--naive-pools", "0"]).contains("--naive-pools"));
        assert!(refused(&["--naive-pools", "8,101"]).contains("--naive-pools"));
        assert!(refused(&["--naive-pools", "x"]).contains("--naive-pools"));
        assert!(refused(&["--naive-concurrency", "0"]).contains("--naive-concurrency"));
        assert!(refused(&["--naive-concurrency", "5000"]).contains("--naive-concurrency"));
        assert!(refused(&["--sweep-requests", "0"]).contains("--sweep-requests"));
        assert!(refused(&["--sweep-requests", "2000000"]).contains("--sweep-requests"));
        let ok = Cli::try_parse_from([
            "t",
            "--naive-pools",
            "1,2,100",
            "--naive-concurrency",
            "8,64",
        ])
        .unwrap();
        ok.sweep.validate().unwrap();
        assert_eq!(ok.sweep.concurrencies(64), vec![8, 64]);
        let default = Cli::try_parse_from(["t"]).unwrap();
        default.sweep.validate().unwrap();
        assert_eq!(default.sweep.naive_pools, vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(default.sweep.concurrencies(64), vec![64]);
    }
}
