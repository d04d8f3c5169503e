//! The soak: one sale that lasts S seconds, restocked every ten seconds, through which the faults
//! the suite knows are injected one at a time at moments a seeded RNG chose; then quiescence and
//! the same checks as every scenario. The same seed gives the same schedule and the same buyers.

use std::time::Duration;

use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use tokio::time::Instant;

use crate::{
    check::Figures,
    driver,
    proxy::Mode,
    scenario::{self, Server, Size, World},
};

/// Buyers arriving per second of the soak.
const BUYERS_PER_SECOND: u32 = 15;
/// Units on sale at the start, and added by each restock.
const INITIAL_UNITS: i64 = 100;
const RESTOCK_UNITS: i64 = 30;
const RESTOCK_EVERY: Duration = Duration::from_secs(10);
/// Longest one restock is retried (with its request id) across a fault.
const RESTOCK_RETRY_FOR: Duration = Duration::from_secs(30);
/// No fault starts this close to the end of the sale, so each one's recovery overlaps orders.
const QUIET_TAIL: Duration = Duration::from_secs(5);
/// The hold TTL of the soak: longer than any outage it injects (the broker's included).
const HOLD_TTL: Duration = Duration::from_secs(30);

/// The faults of a soak on clusters that stand for the single-server ones: a master failover
/// for Redis's restart, a node kill for the broker's bounce. Every third fault of such a soak
/// is one of these.
const CLUSTER_FAULTS: [Fault; 2] = [Fault::RedisFailover, Fault::BrokerNodeKill];

/// A fault the soak may inject; each one is over (the broken part back) when `inject` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    KillOrder,
    KillProductStock,
    KillOutbound,
    PauseProductStock,
    PauseOrder,
    RedisRestartEmpty,
    PgTerminateBackends,
    PgRestart,
    BrokerBounce,
    NetCut,
    NetDelay,
    DuplicatesAndPoison,
    PauseOutbound,
    NetCutPostgres,
    NetCutRedis,
    NetCutBroker,
    RedisFailover,
    BrokerNodeKill,
}

const FAULTS: [Fault; 16] = [
    Fault::KillOrder,
    Fault::KillProductStock,
    Fault::KillOutbound,
    Fault::PauseProductStock,
    Fault::PauseOrder,
    Fault::RedisRestartEmpty,
    Fault::PgTerminateBackends,
    Fault::PgRestart,
    Fault::BrokerBounce,
    Fault::NetCut,
    Fault::NetDelay,
    Fault::DuplicatesAndPoison,
    Fault::PauseOutbound,
    Fault::NetCutPostgres,
    Fault::NetCutRedis,
    Fault::NetCutBroker,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillOrder => "kill_order",
            Fault::KillProductStock => "kill_product_stock",
            Fault::KillOutbound => "kill_outbound",
            Fault::PauseProductStock => "pause_product_stock",
            Fault::PauseOrder => "pause_order",
            Fault::RedisRestartEmpty => "redis_restart_empty",
            Fault::PgTerminateBackends => "pg_terminate_backends",
            Fault::PgRestart => "pg_restart",
            Fault::BrokerBounce => "broker_bounce",
            Fault::NetCut => "net_cut",
            Fault::NetDelay => "net_delay",
            Fault::DuplicatesAndPoison => "duplicates_and_poison",
            Fault::PauseOutbound => "pause_outbound",
            Fault::NetCutPostgres => "net_cut_to_postgres",
            Fault::NetCutRedis => "net_cut_stock_to_redis",
            Fault::NetCutBroker => "net_cut_to_broker",
            Fault::RedisFailover => "redis_failover",
            Fault::BrokerNodeKill => "broker_node_kill",
        }
    }

    /// Whether the fault acts on the single Redis or RabbitMQ server, or on a link to one.
    fn needs_one_server(self) -> bool {
        matches!(
            self,
            Fault::RedisRestartEmpty
                | Fault::BrokerBounce
                | Fault::NetCutRedis
                | Fault::NetCutBroker
        )
    }

    /// Roughly how long the fault lasts (the schedule leaves room for it).
    fn lasts(self) -> Duration {
        Duration::from_millis(match self {
            Fault::KillOrder | Fault::KillProductStock | Fault::KillOutbound => 3000,
            Fault::PauseProductStock | Fault::PauseOrder | Fault::PauseOutbound => 3000,
            Fault::NetCutPostgres | Fault::NetCutRedis | Fault::NetCutBroker => 3000,
            Fault::RedisRestartEmpty => 1000,
            Fault::PgTerminateBackends => 2500,
            Fault::PgRestart => 4000,
            Fault::BrokerBounce => 12_000,
            Fault::NetCut => 4000,
            Fault::NetDelay => 3000,
            Fault::DuplicatesAndPoison => 1000,
            // The failover itself (node timeout, election) and the dead node's return.
            Fault::RedisFailover => 9000,
            Fault::BrokerNodeKill => 12_000,
        })
    }

    /// Injects the fault and brings the broken part back; the poison messages it published.
    async fn inject(self, w: &mut World) -> anyhow::Result<u64> {
        match self {
            Fault::KillOrder => {
                w.order.kill().await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
                w.order.start(None).await?;
            }
            Fault::KillProductStock => {
                w.product_stock.kill().await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
                w.product_stock.start(None).await?;
            }
            Fault::KillOutbound => {
                w.outbound.kill().await;
                tokio::time::sleep(Duration::from_millis(1000)).await;
                w.outbound.start(None).await?;
            }
            Fault::PauseProductStock => {
                w.product_stock.pause();
                tokio::time::sleep(Duration::from_millis(3000)).await;
                w.product_stock.resume();
            }
            Fault::PauseOrder => {
                w.order.pause();
                tokio::time::sleep(Duration::from_millis(3000)).await;
                w.order.resume();
            }
            Fault::PauseOutbound => {
                w.outbound.pause();
                tokio::time::sleep(Duration::from_millis(3000)).await;
                w.outbound.resume();
            }
            Fault::NetCutPostgres | Fault::NetCutRedis | Fault::NetCutBroker => {
                let to = match self {
                    Fault::NetCutPostgres => Server::Postgres,
                    Fault::NetCutRedis => Server::Redis,
                    _ => Server::Broker,
                };
                w.set_links(to, Mode::Blackhole);
                tokio::time::sleep(Duration::from_millis(2000)).await;
                w.set_links(to, Mode::Reset);
                tokio::time::sleep(Duration::from_millis(500)).await;
                w.set_links(to, Mode::Delay(Duration::from_millis(20)));
                tokio::time::sleep(Duration::from_millis(500)).await;
                w.set_links(to, Mode::Pass);
            }
            Fault::RedisRestartEmpty => {
                w.redis.kill();
                tokio::time::sleep(Duration::from_millis(500)).await;
                w.redis.start_again().await?;
            }
            Fault::PgTerminateBackends => {
                scenario::pg_terminate(w).await?;
            }
            Fault::PgRestart => {
                w.pg.crash();
                tokio::time::sleep(Duration::from_millis(2000)).await;
                w.pg.start_again().await?;
            }
            Fault::BrokerBounce => {
                let Some(b) = w.own_broker.as_mut() else {
                    anyhow::bail!("the soak needs a broker of its own");
                };
                b.stop(false);
                // Down for far less than the hold TTL (restarting the node takes seconds more).
                tokio::time::sleep(Duration::from_millis(2000)).await;
                b.start_again().await?;
            }
            Fault::NetCut => {
                w.proxy.set(Mode::Blackhole);
                tokio::time::sleep(Duration::from_millis(2000)).await;
                w.proxy.set(Mode::Reset);
                tokio::time::sleep(Duration::from_millis(500)).await;
                w.proxy.set(Mode::Pass);
            }
            Fault::NetDelay => {
                w.proxy.set(Mode::Delay(Duration::from_millis(200)));
                tokio::time::sleep(Duration::from_millis(3000)).await;
                w.proxy.set(Mode::Pass);
            }
            Fault::DuplicatesAndPoison => {
                return scenario::duplicates_and_poison(w).await;
            }
            Fault::RedisFailover => {
                scenario::redis_failover(w).await?;
            }
            Fault::BrokerNodeKill => {
                scenario::broker_node_kill(w).await?;
            }
        }
        Ok(0)
    }
}

/// The faults of a soak of `seconds` seconds seeded by `seed`, with their planned start (from
/// the start of the sale), one after the other with 3–8 s between them, none in the last 5 s.
/// On `clusters`, the faults that need one server (its restart, the links to it) give way to
/// [`CLUSTER_FAULTS`], one of which is every third fault.
pub fn schedule(seed: u64, seconds: u64, clusters: bool) -> Vec<(Duration, Fault)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Duration::from_secs(seconds).saturating_sub(QUIET_TAIL);
    let mut at = Duration::from_millis(rng.random_range(1500..3500));
    let mut plan = Vec::new();
    let candidates: Vec<Fault> = FAULTS
        .into_iter()
        .filter(|f| !clusters || !f.needs_one_server())
        .collect();
    loop {
        let fault = if clusters && plan.len() % 3 == 2 {
            CLUSTER_FAULTS[rng.random_range(0..CLUSTER_FAULTS.len())]
        } else {
            candidates[rng.random_range(0..candidates.len())]
        };
        if at + fault.lasts() > end {
            break;
        }
        plan.push((at, fault));
        at += fault.lasts() + Duration::from_millis(rng.random_range(3000..8000));
    }
    plan
}

/// One restock: its request id, and whether AdjustStock acknowledged it.
struct Restock {
    request_id: String,
    acknowledged: bool,
}

/// Restocks every ten seconds of the sale, each retried with its request id across faults.
async fn restocks(c: driver::Clients, sku: String, seconds: u64) -> Vec<Restock> {
    let start = Instant::now();
    let mut done = Vec::new();
    let mut k = 1u32;
    while start.elapsed() + RESTOCK_EVERY < Duration::from_secs(seconds) {
        tokio::time::sleep_until(start + RESTOCK_EVERY * k).await;
        let request_id = format!("soak-restock-{k}");
        let acknowledged =
            driver::adjust_stock(&c, &sku, &request_id, RESTOCK_UNITS, RESTOCK_RETRY_FOR)
                .await
                .is_ok();
        done.push(Restock {
            request_id,
            acknowledged,
        });
        k += 1;
    }
    done
}

/// Runs the soak (on a Redis Cluster and a RabbitMQ cluster when `clusters`); prints the
/// schedule, the figures line and the detail line.
pub async fn run(seed: u64, seconds: u64, clusters: bool) -> anyhow::Result<Figures> {
    anyhow::ensure!(
        (10..=3600).contains(&seconds),
        "--seconds must be between 10 and 3600"
    );
    let plan = schedule(seed, seconds, clusters);
    let names: Vec<&str> = plan.iter().map(|(_, f)| f.name()).collect();
    eprintln!(
        "  soak seed={seed} seconds={seconds} schedule: {}",
        plan.iter()
            .map(|(at, f)| format!("{:.1}s {}", at.as_secs_f64(), f.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let started = Instant::now();
    let size = Size {
        buyers: BUYERS_PER_SECOND * u32::try_from(seconds).unwrap_or(u32::MAX),
        units: INITIAL_UNITS,
        flood: Duration::from_secs(seconds),
        hold_ttl: HOLD_TTL,
    };
    let mut w = World::start(
        "soak",
        seed,
        size,
        None,
        scenario::Wiring {
            links: true,
            clusters,
            ..scenario::Wiring::default()
        },
    )
    .await?;
    let clients = w.clients()?;
    driver::create_product(&clients, &w.sale.sku, w.sale.units).await?;
    let sale_start = Instant::now();
    let sale = tokio::spawn(driver::run(clients.clone(), w.sale.clone()));
    let restocking = tokio::spawn(restocks(clients.clone(), w.sale.sku.clone(), seconds));
    let mut poison = 0;
    for (at, fault) in &plan {
        tokio::time::sleep_until(sale_start + *at).await;
        let late = sale_start.elapsed().saturating_sub(*at);
        eprintln!(
            "  soak: {} at {:.1}s{}",
            fault.name(),
            sale_start.elapsed().as_secs_f64(),
            if late > Duration::from_millis(500) {
                " (the previous fault ran late)"
            } else {
                ""
            }
        );
        match fault.inject(&mut w).await {
            Ok(n) => poison += n,
            Err(e) => w
                .violations
                .push(format!("{} could not recover: {e:#}", fault.name())),
        }
        // A service a fault left dead is brought back before the next one.
        let _ = w.revive().await;
    }
    let fault_over = Instant::now();
    let seen = match tokio::time::timeout(Duration::from_secs(seconds + 180), sale).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => anyhow::bail!("the sale driver failed: {e}"),
        Err(_) => anyhow::bail!("the sale driver did not end in time"),
    };
    let restocked = restocking
        .await
        .map_err(|e| anyhow::anyhow!("the restocks failed: {e}"))?;
    // A restock that was never acknowledged may or may not have been applied: sent again with
    // its request id it is applied once either way.
    for r in &restocked {
        if !r.acknowledged
            && let Err(e) = driver::adjust_stock(
                &clients,
                &w.sale.sku,
                &r.request_id,
                RESTOCK_UNITS,
                RESTOCK_RETRY_FOR,
            )
            .await
        {
            w.violations.push(format!(
                "restock {} never acknowledged: {e:#}",
                r.request_id
            ));
        }
    }
    w.adjusted = RESTOCK_UNITS * restocked.len() as i64;
    w.notes.push(format!(
        "restocks={} late_restocks={}",
        restocked.len(),
        restocked.iter().filter(|r| !r.acknowledged).count()
    ));
    let label = format!(
        "soak seed={seed} seconds={seconds}{} faults={}",
        if clusters { " clusters" } else { "" },
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(",")
        }
    );
    scenario::conclude(&mut w, &label, &seen, poison, fault_over, started).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        assert_eq!(schedule(7, 60, false), schedule(7, 60, false));
        assert_ne!(schedule(7, 60, false), schedule(8, 60, false));
        assert_eq!(schedule(7, 60, true), schedule(7, 60, true));
    }

    #[test]
    fn a_soak_on_clusters_fails_a_cluster_node_every_third_fault_and_nothing_single() {
        for seed in 0..50 {
            let plan = schedule(seed, 120, true);
            assert!(plan.len() >= 6, "seed {seed}: {plan:?}");
            for (i, (_, f)) in plan.iter().enumerate() {
                assert!(!f.needs_one_server(), "seed {seed}: {f:?}");
                assert_eq!(
                    CLUSTER_FAULTS.contains(f),
                    i % 3 == 2,
                    "seed {seed}: fault {i} is {f:?}"
                );
            }
        }
        // The single-server soak never draws a cluster fault.
        for seed in 0..50 {
            assert!(
                schedule(seed, 120, false)
                    .iter()
                    .all(|(_, f)| !CLUSTER_FAULTS.contains(f)),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn faults_never_overlap_and_end_before_the_quiet_tail() {
        for seed in 0..50 {
            let plan = schedule(seed, 60, false);
            assert!(!plan.is_empty(), "seed {seed}: no fault in a minute");
            for pair in plan.windows(2) {
                assert!(
                    pair[0].0 + pair[0].1.lasts() < pair[1].0,
                    "seed {seed}: {plan:?}"
                );
            }
            let (at, last) = plan[plan.len() - 1];
            assert!(at + last.lasts() <= Duration::from_secs(55), "seed {seed}");
        }
    }
}
