//! The platform across concurrencies: one short run of `CreateOrder` for each concurrency of
//! `--platform-concurrency`, each on a fresh product of the sweep's shape (`--sweep-requests`,
//! buyers and stock scaled as in the scenario), its saga followed to the end and its product
//! read back like the platform mode's. Beside the naive sweep (whose `--naive-concurrency` does
//! the same for the naive design), it says whether 64 calls in flight flatters either design.
//!
//! The mode is `platform-sweep`; its points are in the report's `platform_sweep`.

use serde_json::{Value, json};

use super::{
    baselines::Load,
    invariants::{self, Check},
    platform,
    sweep::{fresh_sku, point_load},
};
use crate::client::Secret;

/// The platform sweep's flag.
#[derive(clap::Args, Clone, Debug)]
pub struct PlatformSweepArgs {
    /// Concurrencies the platform-sweep mode tries (each 1..=4096), separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    pub platform_concurrency: Vec<usize>,
}

impl PlatformSweepArgs {
    /// Refuses bad values, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.platform_concurrency.is_empty(),
            "--platform-concurrency must list one or more concurrencies"
        );
        for &c in &self.platform_concurrency {
            anyhow::ensure!(
                (1..=4096).contains(&c),
                "--platform-concurrency: each concurrency must be 1..=4096 (got {c})"
            );
        }
        Ok(())
    }
}

/// One concurrency's run.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub concurrency: usize,
    pub requests: usize,
    pub accepted: usize,
    pub errors: usize,
    pub accepted_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub confirmed: usize,
    pub confirmed_per_s: f64,
}

impl Point {
    pub fn to_json(&self) -> Value {
        json!({
            "concurrency": self.concurrency,
            "requests": self.requests,
            "accepted": self.accepted,
            "errors": self.errors,
            "accepted_per_s": round(self.accepted_per_s),
            "p50_ms": round(self.p50_ms),
            "p99_ms": round(self.p99_ms),
            "confirmed": self.confirmed,
            "confirmed_per_s": round(self.confirmed_per_s),
        })
    }
}

/// A finished platform sweep.
#[derive(Clone, Debug)]
pub struct Report {
    pub round: usize,
    pub requests: usize,
    pub buyers: usize,
    pub stock: i64,
    pub points: Vec<Point>,
    /// Every point's product read back; each check's detail names its concurrency.
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        invariants::all_pass(&self.checks)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "round": self.round,
            "requests_per_point": self.requests,
            "buyers_per_point": self.buyers,
            "stock_per_point": self.stock,
            "points": self.points.iter().map(Point::to_json).collect::<Vec<_>>(),
            "checks": self.checks.iter().map(Check::to_json).collect::<Vec<_>>(),
            "passed": self.passed(),
        })
    }

    pub fn print_text(&self) {
        println!(
            "platform sweep (round {}): {} requests from {} buyers for {} units per point",
            self.round, self.requests, self.buyers, self.stock
        );
        println!(
            "  {:>6} {:>9} {:>8} {:>7} {:>10} {:>8} {:>8} {:>9} {:>11}",
            "conc",
            "requests",
            "accepted",
            "errors",
            "accept/s",
            "p50 ms",
            "p99 ms",
            "confirmed",
            "confirmed/s"
        );
        for p in &self.points {
            println!(
                "  {:>6} {:>9} {:>8} {:>7} {:>10.0} {:>8.2} {:>8.2} {:>9} {:>11.0}",
                p.concurrency,
                p.requests,
                p.accepted,
                p.errors,
                p.accepted_per_s,
                p.p50_ms,
                p.p99_ms,
                p.confirmed,
                p.confirmed_per_s
            );
        }
        for c in &self.checks {
            println!(
                "  check {} {}: {}",
                if c.pass { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
    }
}

/// Where the platform is and how its products are made.
pub struct Target<'a> {
    pub product_stock_url: &'a str,
    pub order_urls: &'a [String],
    pub stock_buckets: u32,
    pub secret: &'a Secret,
    pub admin: &'a str,
    pub ticketing: bool,
    pub follow_db: Option<sea_orm::DatabaseConnection>,
}

/// Runs every concurrency of `args` on the sweep's shape (`requests` calls per point), each
/// after `idle` (the services done with the point before).
#[allow(clippy::too_many_arguments)]
pub async fn run<F, Fut>(
    args: &PlatformSweepArgs,
    target: &Target<'_>,
    load: &Load,
    requests: usize,
    per_user_limit: u32,
    round: usize,
    idle: F,
) -> anyhow::Result<Report>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let shape = point_load(load, requests, load.concurrency);
    let mut points = Vec::new();
    let mut checks = Vec::new();
    for &concurrency in &args.platform_concurrency {
        idle().await;
        let point = Load {
            concurrency,
            ..shape.clone()
        };
        let sku = fresh_sku();
        let (m, saga) = platform::flood(
            target.product_stock_url,
            target.order_urls,
            target.stock_buckets,
            target.secret,
            &point,
            &sku,
            per_user_limit,
            target.ticketing,
            target.follow_db.clone(),
        )
        .await?;
        let mut read = vec![invariants::no_errors(&m)];
        read.extend(
            invariants::platform(
                target.product_stock_url,
                target.admin,
                &sku,
                point.stock,
                m.accepted,
                &saga,
            )
            .await,
        );
        checks.extend(at_concurrency(concurrency, read));
        let p = Point {
            concurrency,
            requests: m.requests,
            accepted: m.accepted,
            errors: m.errored(),
            accepted_per_s: m.accepted_per_sec(),
            p50_ms: m.p(0.5),
            p99_ms: m.p(0.99),
            confirmed: saga.confirmed,
            confirmed_per_s: saga.confirmed_per_sec(),
        };
        eprintln!(
            "bench: platform sweep concurrency {concurrency}: {:.0} accepted/s, p99 {:.2} ms, {:.0} confirmed/s, {} errors",
            p.accepted_per_s, p.p99_ms, p.confirmed_per_s, p.errors
        );
        points.push(p);
    }
    Ok(Report {
        round,
        requests: shape.requests,
        buyers: shape.buyers,
        stock: shape.stock,
        points,
        checks,
    })
}

/// `checks` of the point at `concurrency`, their details naming it.
fn at_concurrency(concurrency: usize, checks: Vec<Check>) -> Vec<Check> {
    checks
        .into_iter()
        .map(|c| Check {
            detail: format!("at concurrency {concurrency}: {}", c.detail),
            ..c
        })
        .collect()
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sweep: PlatformSweepArgs,
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
    fn bad_platform_concurrencies_are_refused_by_name() {
        for bad in ["", "0", "16,0", "4097", "-1", "x"] {
            let flag = format!("--platform-concurrency={bad}");
            assert!(
                refused(&[&flag]).contains("--platform-concurrency"),
                "{bad:?}"
            );
        }
        let ok = Cli::try_parse_from(["t"]).unwrap();
        ok.sweep.validate().unwrap();
        assert_eq!(ok.sweep.platform_concurrency, vec![16, 64, 256]);
    }

    #[test]
    fn a_point_whose_product_broke_fails_the_sweep_naming_its_concurrency() {
        let broken = Check {
            name: "stock conserved",
            pass: false,
            detail: "gate 3, database 4".into(),
        };
        let checks = at_concurrency(256, vec![broken]);
        let r = Report {
            round: 1,
            requests: 10,
            buyers: 10,
            stock: 5,
            points: Vec::new(),
            checks,
        };
        assert!(!r.passed());
        assert_eq!(r.to_json()["passed"], json!(false));
        assert!(
            r.checks[0].detail.starts_with("at concurrency 256:"),
            "{:?}",
            r.checks
        );
    }
}
