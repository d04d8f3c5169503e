//! A scenario's world — private PostgreSQL and Redis, a broker, the three services, a tap on the
//! exchange — and the scenarios themselves: drive a sale, inject one fault mid-flood, recover,
//! wait for quiescence, then read every store and print one line of figures.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use flashsale_platform::{redis::key_slot, settings::RedisSettings};
use flashsale_test_support::{rabbit_cluster::RabbitCluster, redis_cluster::RedisCluster};
use tokio::time::Instant;

use crate::{
    check::{self, Figures, Stores},
    driver::{self, Clients, Sale},
    proxy::{Mode, Proxy},
    servers::{Postgres, Rabbit, Redis, TempDir},
    services::{Kind, Service},
    tap::{self, Tap},
};

/// Every scenario, in the order the suite runs them.
pub const ALL: &[&str] = &[
    "baseline",
    "order_sigkill",
    "redis_restart_empty",
    "broker_down_past_hold_ttl",
    "pg_terminate_backends",
    "pg_restart",
    "fp_order_before_write",
    "fp_relay_after_publish",
    "fp_relay_before_mark",
    "fp_stock_consumer_before_commit",
    "fp_stock_consumer_after_commit",
    "fp_outbound_consumer_after_commit",
    "net_cut_order_to_stock",
    "sigstop_product_stock",
    "sigstop_product_stock_100s",
    "duplicate_and_poison_messages",
    "redis_restore_stale_snapshot",
    "restock_retried",
    "gate_drift_reconcile",
    "fp_outbound_after_stock_commit",
    "fp_order_after_batch_write",
    "fp_order_reserved_before_commit",
    "fp_order_reserved_after_commit",
    "fp_order_timeout_before_commit",
    "fp_order_timeout_after_commit",
    "fp_order_outbound_result_before_commit",
    "fp_order_outbound_result_after_commit",
    "fp_outbound_consumer_before_commit",
    "fp_stock_cancel_consumer_before_commit",
    "fp_stock_cancel_consumer_after_commit",
    "broker_kill",
    "broker_unreachable_30s",
    "net_cut_to_postgres",
    "net_cut_stock_to_redis",
    "net_cut_to_broker",
    "sigstop_order",
    "sigstop_outbound",
    "two_replicas",
    "replica_kill",
    "replica_sigterm",
    "redis_cluster_failover",
    "broker_node_kill",
];

/// How long a gate hold may wait for its order to be persisted when a scenario wants a broker
/// outage to outlast it.
const SHORT_HOLD_TTL: Duration = Duration::from_secs(3);
/// The hold TTL of the other scenarios: well above any fault they inject (the default is five
/// minutes), so a hold expires only where the scenario means it to.
const HOLD_TTL: Duration = Duration::from_secs(30);
/// A buyer's time to pay.
const PAYMENT_TIMEOUT_MS: u64 = 4000;
/// Longest wait for quiescence after the load and the fault are over.
pub(crate) const QUIESCE_FOR: Duration = Duration::from_secs(90);
/// Longest an admin call (AdjustStock, ReconcileStock) is retried across a fault.
const ADMIN_RETRY_FOR: Duration = Duration::from_secs(30);

/// The size of one scenario's sale.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub buyers: u32,
    pub units: i64,
    pub flood: Duration,
    /// product-stock's `stock.hold_ttl_ms`.
    pub hold_ttl: Duration,
}

impl Default for Size {
    fn default() -> Self {
        Self {
            buyers: 300,
            units: 100,
            flood: Duration::from_secs(6),
            hold_ttl: HOLD_TTL,
        }
    }
}

/// A server the services reach, for a [`Link`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Redis,
    Broker,
}

/// A proxy between one service and one server.
pub struct Link {
    pub from: Kind,
    pub to: Server,
    pub proxy: Proxy,
}

/// The same URL with the loopback port `127.0.0.1:<port>` replaced by `port`, and the port it
/// named.
fn via_port(url: &str, port: u16) -> anyhow::Result<(String, u16)> {
    const HOST: &str = "127.0.0.1:";
    let at = url
        .find(HOST)
        .map(|i| i + HOST.len())
        .ok_or_else(|| anyhow::anyhow!("{url} is not a loopback URL"))?;
    let digits = url[at..].bytes().take_while(u8::is_ascii_digit).count();
    let upstream: u16 = url[at..at + digits].parse()?;
    Ok((
        format!("{}{port}{}", &url[..at], &url[at + digits..]),
        upstream,
    ))
}

/// `url` itself, or (when `on`) the URL of a new proxy to it, recorded in `links`.
async fn link(
    links: &mut Vec<Link>,
    on: bool,
    from: Kind,
    to: Server,
    url: String,
) -> anyhow::Result<String> {
    if !on {
        return Ok(url);
    }
    let (_, upstream) = via_port(&url, 0)?;
    let proxy = Proxy::start(upstream).await?;
    let (url, _) = via_port(&url, proxy.port)?;
    links.push(Link { from, to, proxy });
    Ok(url)
}

/// A broker several scenarios share (starting a node takes seconds); scenarios that stop the
/// broker start one of their own.
pub struct SharedBroker(pub Arc<tokio::sync::Mutex<Rabbit>>);

impl SharedBroker {
    pub async fn start() -> anyhow::Result<Self> {
        Ok(Self(Arc::new(tokio::sync::Mutex::new(
            Rabbit::start().await?,
        ))))
    }
}

/// Everything one scenario runs on. Dropping it stops every process and removes every file.
pub struct World {
    pub name: String,
    pub pg: Postgres,
    pub redis: Redis,
    /// A broker of the scenario's own (when it stops the broker).
    pub own_broker: Option<Rabbit>,
    /// The gate's Redis Cluster (three masters, three replicas), in a world on clusters; the
    /// single `redis` then stands unused.
    pub redis_cluster: Option<RedisCluster>,
    /// A three-node RabbitMQ cluster with quorum queues, in a world on clusters. The tap and
    /// the checks use its first node.
    pub broker_cluster: Option<RabbitCluster>,
    pub amqp_url: String,
    pub exchange: String,
    pub product_stock: Service,
    pub order: Service,
    pub outbound: Service,
    /// A second replica of each service, in that order (scenarios that run two); the first
    /// replicas are the fields above.
    pub replicas: Vec<Service>,
    /// Between order and product-stock (unused when there are replicas: order then spreads
    /// its calls over both product-stock replicas directly).
    pub proxy: Proxy,
    /// Between each service and each server it uses (only when the scenario asked for them).
    pub links: Vec<Link>,
    pub tap: Tap,
    pub stores: Stores,
    pub sale: Sale,
    /// Units the scenario's acknowledged AdjustStock calls added.
    pub adjusted: i64,
    /// Promises the scenario checked itself and found broken.
    pub violations: Vec<String>,
    /// What the scenario saw, for the detail line.
    pub notes: Vec<String>,
    _dir: TempDir,
}

/// Failpoints per service at their first start.
#[derive(Default, Clone)]
pub struct Failpoints {
    pub product_stock: Option<String>,
    pub order: Option<String>,
    pub outbound: Option<String>,
}

/// How a scenario's world is wired beyond its defaults.
#[derive(Default, Clone)]
pub struct Wiring {
    pub failpoints: Failpoints,
    /// Every service reaches PostgreSQL, Redis and RabbitMQ through a proxy of its own.
    pub links: bool,
    /// Two replicas of every service, each pair started at the same moment on a fresh database.
    pub replicas: bool,
    /// The gate on a Redis Cluster and the events on a three-node RabbitMQ cluster (quorum
    /// queues) instead of one server each. Only the links to PostgreSQL get proxies then: a
    /// cluster client learns its nodes' real addresses from the nodes themselves.
    pub clusters: bool,
}

impl World {
    pub async fn start(
        name: &str,
        seed: u64,
        size: Size,
        broker: Option<&SharedBroker>,
        wiring: Wiring,
    ) -> anyhow::Result<Self> {
        let fp = wiring.failpoints;
        let dir = TempDir::new("fs_faults")?;
        let pg = Postgres::start().await?;
        let redis = Redis::start().await?;
        let (redis_cluster, broker_cluster) = if wiring.clusters {
            let (r, b) = tokio::join!(RedisCluster::start(), RabbitCluster::start());
            (
                Some(r.context("start the Redis Cluster")?),
                Some(b.context("start the RabbitMQ cluster")?),
            )
        } else {
            (None, None)
        };
        let (own_broker, amqp_url) = match (&broker_cluster, broker) {
            (Some(c), _) => (None, c.url(0)),
            (None, Some(b)) => (None, b.0.lock().await.url()),
            (None, None) => {
                let r = Rabbit::start().await?;
                let url = r.url();
                (Some(r), url)
            }
        };
        let tag = flashsale_test_support::unique_name("f");
        let exchange = format!("fs_faults.{tag}");
        let queue_prefix = format!("{tag}.");
        let gate_prefix = format!("{tag}:");
        let tap = Tap::start(amqp_url.clone(), exchange.clone(), format!("{tag}.tap"));
        // Wait for the tap to declare the exchange and bind, so it sees the first message.
        tokio::time::sleep(Duration::from_millis(300)).await;

        // The proxies a scenario cuts: one per (service, server) when asked for.
        let mut links = Vec::new();
        let on = wiring.links;
        // A cluster client finds the other nodes by their own addresses, past any proxy.
        let on_servers = on && !wiring.clusters;
        let mut wired = Vec::new();
        for (kind, db) in [
            (Kind::ProductStock, "fs_product"),
            (Kind::Order, "fs_orders"),
            (Kind::Outbound, "fs_outbound"),
        ] {
            wired.push((
                link(&mut links, on, kind, Server::Postgres, pg.url(db)).await?,
                link(
                    &mut links,
                    on_servers,
                    kind,
                    Server::Broker,
                    amqp_url.clone(),
                )
                .await?,
            ));
        }
        let ps_redis = link(
            &mut links,
            on_servers,
            Kind::ProductStock,
            Server::Redis,
            redis.url(),
        )
        .await?;
        let [ps_urls, order_urls, outbound_urls]: [(String, String); 3] = wired
            .try_into()
            .map_err(|_| anyhow::anyhow!("three services"))?;
        let broker_nodes = broker_cluster.as_ref().map(|c| c.urls().join(","));
        let common = |(db_url, amqp): &(String, String)| -> Vec<(String, String)> {
            let mut vars = vec![
                ("DATABASE__URL".into(), db_url.clone()),
                ("DATABASE__MAX_CONNECTIONS".into(), "8".into()),
                ("AMQP__URL".into(), amqp.clone()),
                ("AMQP__EXCHANGE".into(), exchange.clone()),
                ("AMQP__QUEUE_PREFIX".into(), queue_prefix.clone()),
                ("AMQP__QUEUE_TYPE".into(), "classic".into()),
                (
                    "AMQP__RETRY_BASE_MS".into(),
                    check::RETRY_BASE_MS.to_string(),
                ),
                ("AMQP__MAX_ATTEMPTS".into(), check::MAX_ATTEMPTS.to_string()),
                ("TELEMETRY__LOG_FORMAT".into(), "json".into()),
                ("AUTH__ALLOW_DEVELOPMENT_SECRET".into(), "true".into()),
            ];
            if let Some(nodes) = &broker_nodes {
                vars.extend([
                    ("AMQP__URLS".into(), nodes.clone()),
                    ("AMQP__QUEUE_TYPE".into(), "quorum".into()),
                ]);
            }
            vars
        };
        // product-stock asks the order service about orders (its hold sweeper, a gate rebuild)
        // and starts first: the order service's port is chosen now.
        let order_port = crate::servers::free_port()?;
        // With replicas, product-stock spreads its questions over both order replicas.
        let two = wiring.replicas;
        let order_port_2 = if two {
            Some(crate::servers::free_port()?)
        } else {
            None
        };
        let order_urls_for_stock = std::iter::once(order_port)
            .chain(order_port_2)
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut ps = common(&ps_urls);
        ps.extend([
            ("ORDER_SERVICE__URL".into(), order_urls_for_stock),
            ("ORDER_SERVICE__REFRESH_MS".into(), "500".into()),
            ("REDIS__URL".into(), ps_redis),
            ("REDIS__KEY_PREFIX".into(), gate_prefix.clone()),
            (
                "STOCK__HOLD_TTL_MS".into(),
                size.hold_ttl.as_millis().to_string(),
            ),
            ("STOCK__SWEEP_INTERVAL_MS".into(), "500".into()),
        ]);
        if let Some(c) = &redis_cluster {
            ps.extend([
                ("REDIS__MODE".into(), "cluster".into()),
                ("REDIS__CLUSTER_NODES".into(), c.urls().join(",")),
            ]);
        }
        let mut replicas = Vec::new();
        let mut product_stock = Service::new(Kind::ProductStock, &dir.0, &ps)?;
        if two {
            let mut second = Service::new(Kind::ProductStock, &dir.0, &ps)?.labelled(2);
            let (a, b) = tokio::join!(
                product_stock.start(fp.product_stock.as_deref()),
                second.start(None)
            );
            a?;
            b?;
            replicas.push(second);
        } else {
            product_stock.start(fp.product_stock.as_deref()).await?;
        }
        let proxy = Proxy::start(product_stock.port).await?;
        // With replicas, order and outbound reach both product-stock replicas and spread their
        // calls (`upstream.product_stock_url` lists both).
        let stock_urls = std::iter::once(&product_stock)
            .chain(replicas.first())
            .map(Service::url)
            .collect::<Vec<_>>()
            .join(",");

        let provider_port = crate::servers::free_port()?;
        let mut os = common(&order_urls);
        os.extend([
            (
                "PAYMENT__PROVIDER_URL".into(),
                format!("http://127.0.0.1:{provider_port}"),
            ),
            (
                "UPSTREAM__PRODUCT_STOCK_URL".into(),
                if two { stock_urls.clone() } else { proxy.url() },
            ),
            ("UPSTREAM__PRODUCT_STOCK_REFRESH_MS".into(), "500".into()),
            (
                "SAGA__PAYMENT_TIMEOUT_MS".into(),
                PAYMENT_TIMEOUT_MS.to_string(),
            ),
            ("SAGA__SWEEP_INTERVAL_MS".into(), "500".into()),
            ("SAGA__STOCK_CALL_TIMEOUT_MS".into(), "1000".into()),
        ]);
        let mut order = Service::on_port(Kind::Order, &dir.0, &os, order_port)?;
        if let Some(port) = order_port_2 {
            let mut second = Service::on_port(Kind::Order, &dir.0, &os, port)?.labelled(2);
            let (a, b) = tokio::join!(order.start(fp.order.as_deref()), second.start(None));
            a?;
            b?;
            replicas.push(second);
        } else {
            order.start(fp.order.as_deref()).await?;
        }

        let mut ob = common(&outbound_urls);
        ob.extend([
            ("UPSTREAM__PRODUCT_STOCK_URL".into(), stock_urls),
            ("UPSTREAM__PRODUCT_STOCK_REFRESH_MS".into(), "500".into()),
            ("SHIPPING__STUCK_AFTER_MS".into(), "5000".into()),
            ("SHIPPING__SWEEP_INTERVAL_MS".into(), "1000".into()),
            ("SHIPPING__COMMIT_TIMEOUT_MS".into(), "1000".into()),
        ]);
        let mut outbound = Service::new(Kind::Outbound, &dir.0, &ob)?;
        if two {
            let mut second = Service::new(Kind::Outbound, &dir.0, &ob)?.labelled(2);
            let (a, b) = tokio::join!(outbound.start(fp.outbound.as_deref()), second.start(None));
            a?;
            b?;
            replicas.push(second);
        } else {
            outbound.start(fp.outbound.as_deref()).await?;
        }

        let sku = format!("FAULT-{}", &tag[2..]);
        let stores = Stores {
            product_db: pg.url("fs_product"),
            order_db: pg.url("fs_orders"),
            outbound_db: pg.url("fs_outbound"),
            redis: RedisSettings {
                key_prefix: String::new(),
                pool_size: 1,
                ..match &redis_cluster {
                    Some(c) => RedisSettings::cluster(c.urls()),
                    None => RedisSettings {
                        url: redis.url(),
                        ..RedisSettings::default()
                    },
                }
            },
            gate_prefix,
            amqp_url: amqp_url.clone(),
            queue_prefix,
            sku: sku.clone(),
        };
        let sale = Sale {
            sku,
            units: size.units,
            buyers: size.buyers,
            concurrency: 64,
            flood: size.flood,
            seed,
            provider_port,
        };
        Ok(Self {
            name: name.to_owned(),
            pg,
            redis,
            own_broker,
            redis_cluster,
            broker_cluster,
            amqp_url,
            exchange,
            product_stock,
            order,
            outbound,
            replicas,
            proxy,
            links,
            tap,
            stores,
            sale,
            adjusted: 0,
            violations: Vec::new(),
            notes: Vec::new(),
            _dir: dir,
        })
    }

    /// The sale's clients; with replicas, buyers' calls are spread over both order replicas.
    pub fn clients(&self) -> anyhow::Result<Clients> {
        let urls = |kind: Kind, first: &Service| {
            std::iter::once(first)
                .chain(self.replicas.iter().filter(|r| r.kind == kind))
                .map(Service::url)
                .collect::<Vec<_>>()
                .join(",")
        };
        Clients::new(
            &urls(Kind::Order, &self.order),
            &urls(Kind::ProductStock, &self.product_stock),
            &format!("http://127.0.0.1:{}", self.sale.provider_port),
        )
    }

    /// Every service process, first replicas first.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        [&self.product_stock, &self.order, &self.outbound]
            .into_iter()
            .chain(self.replicas.iter())
    }

    /// Restarts (without failpoints) every service whose process has ended.
    pub async fn revive(&mut self) -> anyhow::Result<u32> {
        let mut n = 0;
        let firsts = [&mut self.product_stock, &mut self.order, &mut self.outbound];
        for s in firsts.into_iter().chain(self.replicas.iter_mut()) {
            if s.exited() {
                s.start(None).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sets every proxy from a service to `to`.
    pub fn set_links(&self, to: Server, mode: Mode) {
        for l in self.links.iter().filter(|l| l.to == to) {
            l.proxy.set(mode);
        }
    }

    pub fn logs(&self) -> String {
        self.services()
            .map(|s| format!("--- {} ---\n{}", s.label(), s.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Waits until nothing is in flight (or the deadline), restarting services a failpoint ended.
/// Returns (converged, ms from `from`).
pub(crate) async fn quiesce(w: &mut World, from: Instant) -> (bool, u64) {
    let deadline = Instant::now() + QUIESCE_FOR;
    loop {
        let _ = w.revive().await;
        if check::in_flight(&w.stores).await == 0 {
            let at = from.elapsed().as_millis() as u64;
            // Still nothing over the next seconds: a message a consumer holds unacknowledged
            // is in no store the suite can count, so quiet must last past its handling.
            let mut quiet = true;
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                if check::in_flight(&w.stores).await != 0 {
                    quiet = false;
                    break;
                }
            }
            if quiet {
                return (true, at);
            }
        }
        if Instant::now() >= deadline {
            return (false, from.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a scenario does to the world while the sale runs; returns when the fault is over
/// (the point from which convergence is timed).
type Inject = for<'a> fn(
    &'a mut World,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<u64>> + Send + 'a>,
>;

struct Plan {
    size: Size,
    own_broker: bool,
    failpoints: Failpoints,
    /// Proxies between every service and every server.
    links: bool,
    /// Two replicas of every service.
    replicas: bool,
    /// A Redis Cluster and a RabbitMQ cluster.
    clusters: bool,
    /// Delay after the flood starts before the fault.
    at: Duration,
    inject: Inject,
}

fn plan(name: &str) -> Option<Plan> {
    let base = |inject: Inject| Plan {
        size: Size::default(),
        own_broker: false,
        failpoints: Failpoints::default(),
        links: false,
        replicas: false,
        clusters: false,
        at: Duration::from_millis(1500),
        inject,
    };
    let fp = |inject: Inject, f: Failpoints| Plan {
        failpoints: f,
        at: Duration::ZERO,
        ..base(inject)
    };
    Some(match name {
        "baseline" => base(|_| Box::pin(async { Ok(0) })),
        "order_sigkill" => base(|w| Box::pin(order_sigkill(w))),
        "redis_restart_empty" => base(|w| Box::pin(redis_restart_empty(w))),
        "broker_down_past_hold_ttl" => Plan {
            own_broker: true,
            at: Duration::from_millis(1000),
            size: Size {
                flood: Duration::from_secs(8),
                hold_ttl: SHORT_HOLD_TTL,
                ..Size::default()
            },
            ..base(|w| Box::pin(broker_down(w)))
        },
        "pg_terminate_backends" => base(|w| Box::pin(pg_terminate(w))),
        "pg_restart" => base(|w| Box::pin(pg_restart(w))),
        "fp_order_before_write" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("order.create.before_write=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_relay_after_publish" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("outbox.relay.after_publish=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_relay_before_mark" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                product_stock: Some("outbox.relay.before_mark=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_stock_consumer_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                product_stock: Some("stock.order_created.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_stock_consumer_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                product_stock: Some("consumer.after_handle_before_ack=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_outbound_consumer_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                outbound: Some("consumer.after_handle_before_ack=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "net_cut_order_to_stock" => base(|w| Box::pin(net_cut(w))),
        "sigstop_product_stock" => base(|w| Box::pin(sigstop(w))),
        "sigstop_product_stock_100s" => base(|w| Box::pin(sigstop_while_paying(w))),
        "duplicate_and_poison_messages" => Plan {
            at: Duration::from_millis(4000),
            ..base(|w| Box::pin(duplicates_and_poison(w)))
        },
        "redis_restore_stale_snapshot" => Plan {
            at: Duration::from_millis(500),
            ..base(|w| Box::pin(redis_restore_stale(w)))
        },
        "restock_retried" => base(|w| Box::pin(restock_retried(w))),
        "gate_drift_reconcile" => base(|w| Box::pin(gate_drift(w))),
        "fp_outbound_after_stock_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                outbound: Some("outbound.after_commit_before_warehouse=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_reserved_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("order.stock_reserved.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_reserved_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("consumer.after_handle_before_ack:stock.reserved=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_timeout_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("order.payment_timeout.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_timeout_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("consumer.after_handle_before_ack:order.payment_timeout=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_outbound_result_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("order.outbound_result.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_order_outbound_result_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                order: Some("consumer.after_handle_before_ack:outbound.completed=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_outbound_consumer_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                outbound: Some("outbound.order_paid.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_stock_cancel_consumer_before_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                product_stock: Some("stock.order_cancelled.before_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "fp_stock_cancel_consumer_after_commit" => fp(
            |w| Box::pin(until_exit(w)),
            Failpoints {
                product_stock: Some("stock.order_cancelled.after_commit=1*exit".into()),
                ..Failpoints::default()
            },
        ),
        "broker_kill" => Plan {
            own_broker: true,
            ..base(|w| Box::pin(broker_kill(w)))
        },
        "broker_unreachable_30s" => Plan {
            links: true,
            at: Duration::from_millis(1000),
            size: Size {
                flood: Duration::from_secs(10),
                ..Size::default()
            },
            ..base(|w| Box::pin(broker_unreachable(w)))
        },
        "net_cut_to_postgres" => Plan {
            links: true,
            ..base(|w| Box::pin(net_cut_to(w, Server::Postgres)))
        },
        "net_cut_stock_to_redis" => Plan {
            links: true,
            ..base(|w| Box::pin(net_cut_to(w, Server::Redis)))
        },
        "net_cut_to_broker" => Plan {
            links: true,
            ..base(|w| Box::pin(net_cut_to(w, Server::Broker)))
        },
        "sigstop_order" => base(|w| Box::pin(sigstop_service(w, Kind::Order))),
        "sigstop_outbound" => base(|w| Box::pin(sigstop_service(w, Kind::Outbound))),
        "two_replicas" => Plan {
            replicas: true,
            ..base(|_| Box::pin(async { Ok(0) }))
        },
        "replica_kill" => Plan {
            replicas: true,
            ..base(|w| Box::pin(replica_kill(w)))
        },
        "replica_sigterm" => Plan {
            replicas: true,
            ..base(|w| Box::pin(replica_sigterm(w)))
        },
        "redis_cluster_failover" => Plan {
            clusters: true,
            // The master dies while most of the stock is still on sale, so the promoted
            // replica must serve (and rebuild) a gate that is still selling.
            at: Duration::from_millis(500),
            size: Size {
                buyers: 500,
                units: 300,
                ..Size::default()
            },
            ..base(|w| Box::pin(redis_failover(w)))
        },
        "broker_node_kill" => Plan {
            clusters: true,
            ..base(|w| Box::pin(broker_node_kill(w)))
        },
        "fp_order_after_batch_write" => Plan {
            failpoints: Failpoints {
                order: Some("order.create.after_batch_write=1*exit".into()),
                ..Failpoints::default()
            },
            at: Duration::from_millis(1000),
            ..base(|w| Box::pin(order_exit_after_batch_write(w)))
        },
        _ => return None,
    })
}

/// Runs one scenario; prints its figures line (and the detail line) and returns the figures.
pub async fn run(name: &str, seed: u64, broker: Option<&SharedBroker>) -> anyhow::Result<Figures> {
    let p = plan(name).ok_or_else(|| {
        anyhow::anyhow!("no scenario `{name}`; the scenarios: {}", ALL.join(", "))
    })?;
    let started = Instant::now();
    let broker = if p.own_broker { None } else { broker };
    let wiring = Wiring {
        failpoints: p.failpoints.clone(),
        links: p.links,
        replicas: p.replicas,
        clusters: p.clusters,
    };
    let mut w = World::start(name, seed, p.size, broker, wiring).await?;
    let clients = w.clients()?;
    driver::create_product(&clients, &w.sale.sku, w.sale.units).await?;
    let sale = tokio::spawn(driver::run(clients, w.sale.clone()));
    tokio::time::sleep(p.at).await;
    let poison = (p.inject)(&mut w).await?;
    let fault_over = Instant::now();
    // The load is bounded by its own deadlines; this one only guards against a wedge.
    let seen = match tokio::time::timeout(Duration::from_secs(180), sale).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => anyhow::bail!("the sale driver failed: {e}"),
        Err(_) => anyhow::bail!("the sale driver did not end within 180 s"),
    };
    conclude(&mut w, name, &seen, poison, fault_over, started).await
}

/// Waits for quiescence, reads the figures, prints the figures line (labelled `label`) and the
/// detail line, and the services' logs when the scenario failed.
pub(crate) async fn conclude(
    w: &mut World,
    label: &str,
    seen: &driver::Seen,
    poison: u64,
    fault_over: Instant,
    started: Instant,
) -> anyhow::Result<Figures> {
    let (converged, converge_ms) = quiesce(w, fault_over).await;
    if !w.replicas.is_empty() {
        // Only where no replica was stopped must every one of them have worked.
        let undisturbed = w.services().all(|s| s.restarts == 0);
        crate::replicas::shares(w, undisturbed).await;
    }
    if w.redis_cluster.is_some() {
        // Gates product-stock rebuilt: after a failover, the promoted master's.
        let rebuilds = w
            .product_stock
            .counters(&["flashsale_gate_rebuilds_total"])
            .await;
        w.notes.push(format!(
            "gate_rebuilds={}",
            rebuilds.map_or("?".to_owned(), |n| format!("{}", n.abs()))
        ));
    }
    let mut f = check::figures(&w.stores, seen, w.sale.units, w.adjusted).await?;
    f.dup_delivered = w.tap.duplicates();
    f.poison = poison;
    f.converged = converged;
    f.converge_ms = converge_ms;
    f.violations.extend(w.violations.iter().cloned());
    f.notes.extend(w.notes.iter().cloned());
    let name = label.split(' ').next().unwrap_or(label);
    println!("{}", f.line(label));
    println!("{}", f.detail(name));
    eprintln!(
        "  {name}: refused={} gave_up={} retried={:?} paid={} restarts={} took={}s",
        seen.refused,
        seen.gave_up,
        seen.retried,
        seen.paid.len(),
        w.services().map(|s| s.restarts).sum::<u32>(),
        started.elapsed().as_secs()
    );
    if !f.pass() {
        eprintln!("{}", w.logs());
    }
    Ok(f)
}

// ---------------------------------------------------------------------------------------------
// The faults. Each returns the number of poison messages it published.

async fn order_sigkill(w: &mut World) -> anyhow::Result<u64> {
    w.order.kill().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    w.order.start(None).await?;
    Ok(0)
}

/// With two replicas of each service: the first replica of every service SIGKILLed at the same
/// moment; the second ones carry the sale alone for 3 s, then the killed ones start again (as
/// their pods would be restarted).
async fn replica_kill(w: &mut World) -> anyhow::Result<u64> {
    anyhow::ensure!(
        w.replicas.len() == 3,
        "replica_kill needs two replicas of each service"
    );
    tokio::join!(w.product_stock.kill(), w.order.kill(), w.outbound.kill());
    tokio::time::sleep(Duration::from_millis(3000)).await;
    w.notes.push("killed=product-stock,order,outbound".into());
    w.product_stock.start(None).await?;
    w.order.start(None).await?;
    w.outbound.start(None).await?;
    Ok(0)
}

/// With two replicas of each service: the first replica of every service gets SIGTERM at the
/// same moment mid-sale, as a rolling update sends it. Each must stop by itself within the grace
/// period the manifests give it (60 s), exit 0, having finished what it held; the second ones
/// carry the sale meanwhile, then the stopped ones start again.
async fn replica_sigterm(w: &mut World) -> anyhow::Result<u64> {
    anyhow::ensure!(
        w.replicas.len() == 3,
        "replica_sigterm needs two replicas of each service"
    );
    let grace = Duration::from_secs(60);
    let (stock, order, outbound) = tokio::join!(
        w.product_stock.terminate(grace),
        w.order.terminate(grace),
        w.outbound.terminate(grace)
    );
    let mut took = Vec::new();
    for (name, stopped) in [
        ("product-stock", stock),
        ("order", order),
        ("outbound", outbound),
    ] {
        let (status, after) = stopped?;
        anyhow::ensure!(status.success(), "{name} stopped with {status} on SIGTERM");
        took.push(format!("{name}:{}ms", after.as_millis()));
    }
    w.notes.push(format!("terminated={}", took.join(",")));
    w.product_stock.start(None).await?;
    w.order.start(None).await?;
    w.outbound.start(None).await?;
    Ok(0)
}

async fn redis_restart_empty(w: &mut World) -> anyhow::Result<u64> {
    w.redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.redis.start_again().await?;
    Ok(0)
}

async fn broker_down(w: &mut World) -> anyhow::Result<u64> {
    let Some(b) = w.own_broker.as_mut() else {
        anyhow::bail!("broker_down needs a broker of its own");
    };
    b.stop(false);
    // Longer than the hold TTL: orders keep being accepted meanwhile.
    tokio::time::sleep(SHORT_HOLD_TTL * 3 + Duration::from_secs(1)).await;
    b.start_again().await?;
    Ok(0)
}

pub(crate) async fn pg_terminate(w: &mut World) -> anyhow::Result<u64> {
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&w.pg.url("postgres"))
        .await?;
    for _ in 0..3 {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname LIKE 'fs\\_%'",
        )
        .execute(&admin)
        .await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    admin.close().await;
    Ok(0)
}

async fn pg_restart(w: &mut World) -> anyhow::Result<u64> {
    w.pg.crash();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    w.pg.start_again().await?;
    Ok(0)
}

/// For the failpoint scenarios: waits (bounded) until the armed process exits at its step, then
/// restarts it without failpoints.
async fn until_exit(w: &mut World) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if w.revive().await? > 0 {
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("{}: the armed failpoint was never reached", w.name)
}

async fn net_cut(w: &mut World) -> anyhow::Result<u64> {
    w.proxy.set(Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.proxy.set(Mode::Reset);
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.proxy.set(Mode::Delay(Duration::from_millis(50)));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    w.proxy.set(Mode::Pass);
    Ok(0)
}

/// Every link from a service to `to` holds its bytes back for 3 s, then resets its
/// connections for 0.5 s, then delays every chunk by 20 ms for 1.5 s.
async fn net_cut_to(w: &mut World, to: Server) -> anyhow::Result<u64> {
    w.set_links(to, Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    w.set_links(to, Mode::Reset);
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.set_links(to, Mode::Delay(Duration::from_millis(20)));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    w.set_links(to, Mode::Pass);
    Ok(0)
}

/// How long the broker is out of reach in `broker_unreachable_30s`.
const UNREACHABLE_FOR: Duration = Duration::from_secs(30);

/// Every service's connection to RabbitMQ reset, and every new one refused, for 30 s.
async fn broker_unreachable(w: &mut World) -> anyhow::Result<u64> {
    w.set_links(Server::Broker, Mode::Reset);
    tokio::time::sleep(UNREACHABLE_FOR).await;
    w.set_links(Server::Broker, Mode::Pass);
    Ok(0)
}

/// RabbitMQ SIGKILLed under load and started again on its data 2 s later.
async fn broker_kill(w: &mut World) -> anyhow::Result<u64> {
    let Some(b) = w.own_broker.as_mut() else {
        anyhow::bail!("broker_kill needs a broker of its own");
    };
    b.stop(true);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    b.start_again().await?;
    Ok(0)
}

/// How long the master serving the sale's product keeps acknowledging gate writes its replica
/// never gets, before it dies.
const REPLICATION_LAG: Duration = Duration::from_millis(1000);

/// A Redis Cluster master failover under load, with the worst replication lag: the master
/// serving the sale's product stops shipping writes to its replica, goes on acknowledging holds
/// for [`REPLICATION_LAG`], and is SIGKILLed; the cluster promotes the replica, which never saw
/// those holds. The dead node is then started again (empty) and rejoins as the new master's
/// replica.
pub(crate) async fn redis_failover(w: &mut World) -> anyhow::Result<u64> {
    let slot = key_slot(gate_base(w).as_bytes());
    let cluster = w
        .redis_cluster
        .as_mut()
        .context("redis_failover needs a Redis Cluster")?;
    let victim = cluster.master_of(slot).await?;
    // Connected before the cut: the cut master then refuses new clients (a password).
    let pool = flashsale_platform::redis::pool(&w.stores.redis)?;
    let mut conn = pool.get().await.context("connect to the Redis Cluster")?;
    cluster.cut_replication(victim).await?;
    let cut = check::gate_on(&mut conn, &w.stores).await?;
    tokio::time::sleep(REPLICATION_LAG).await;
    let acknowledged = check::gate_on(&mut conn, &w.stores).await?;
    let promoted = cluster.kill_master(victim).await?;
    // What the promoted replica holds before product-stock notices the new master: the
    // counters as they were when replication stopped, the holds since then gone.
    let promoted_state = check::gate_on(&mut conn, &w.stores).await?;
    cluster.restart(victim).await?;
    let show = |g: &check::GateState| format!("{}+{}", g.avail.unwrap_or(-1), g.held);
    w.notes.push(format!(
        "redis_failover(slot={slot},killed={victim},promoted={promoted},\
         gate_at_cut={},gate_at_kill={},gate_on_promoted={})",
        show(&cut),
        show(&acknowledged),
        show(&promoted_state),
    ));
    Ok(0)
}

/// How long a killed RabbitMQ node stays down.
const NODE_DOWN_FOR: Duration = Duration::from_millis(2000);

/// A RabbitMQ cluster node SIGKILLed under load (the last node: the tap and the checks use the
/// first), then started again on its data; it rejoins the cluster by itself. The services
/// connected to it move to another node, and the quorum queues it led elect new leaders.
pub(crate) async fn broker_node_kill(w: &mut World) -> anyhow::Result<u64> {
    let cluster = w
        .broker_cluster
        .as_mut()
        .context("broker_node_kill needs a RabbitMQ cluster")?;
    let victim = cluster.len() - 1;
    cluster.kill(victim).await?;
    tokio::time::sleep(NODE_DOWN_FOR).await;
    cluster.restart(victim).await?;
    w.notes.push(format!("broker_node_kill(node={victim})"));
    Ok(0)
}

/// SIGSTOP of one service for 5 s (past every call and commit timeout), then SIGCONT.
async fn sigstop_service(w: &mut World, kind: Kind) -> anyhow::Result<u64> {
    let s = match kind {
        Kind::ProductStock => &w.product_stock,
        Kind::Order => &w.order,
        Kind::Outbound => &w.outbound,
    };
    s.pause();
    tokio::time::sleep(Duration::from_millis(5000)).await;
    s.resume();
    Ok(0)
}

async fn sigstop(w: &mut World) -> anyhow::Result<u64> {
    w.product_stock.pause();
    // Longer than the order service's stock call timeout and outbound's commit timeout.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    w.product_stock.resume();
    Ok(0)
}

/// How long `sigstop_product_stock_100s` pauses product-stock: longer than any retry ladder
/// a shipment could have had, and than the broker's heartbeat timeout.
const LONG_PAUSE: Duration = Duration::from_secs(100);

/// Pauses product-stock for [`LONG_PAUSE`] once the first `order.paid` is on the exchange, so
/// the orders paid meanwhile meet a product-stock that does not answer their deduction.
async fn sigstop_while_paying(w: &mut World) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.tap.with_key("order.paid").is_empty() {
        if Instant::now() > deadline {
            w.violations
                .push("no order was paid within 30 s: nothing met the pause".into());
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.product_stock.pause();
    tokio::time::sleep(LONG_PAUSE).await;
    w.product_stock.resume();
    let paid = w.tap.with_key("order.paid").len();
    w.notes
        .push(format!("order.paid_by_the_end_of_the_pause={paid}"));
    Ok(0)
}

/// Publishes every `order.created` and `order.paid` seen so far again (same message id and
/// body), and three poison messages: garbage bytes, an empty body, and a well-formed-looking
/// body of the wrong type.
pub(crate) async fn duplicates_and_poison(w: &mut World) -> anyhow::Result<u64> {
    let mut copies = 0;
    for key in ["order.created", "order.paid", "stock.reserved"] {
        for m in w.tap.with_key(key).into_iter().take(50) {
            tap::publish(
                &w.amqp_url,
                &w.exchange,
                &m.routing_key,
                &m.payload,
                m.properties.clone(),
            )
            .await?;
            copies += 1;
        }
    }
    eprintln!("  {}: published {copies} duplicates", w.name);
    let poison: [(&str, &[u8]); 3] = [
        ("order.created", b"\xff\x00not an envelope\x01\x02"),
        ("order.paid", b""),
        ("stock.reserved", b"{\"order_id\":\"x\",\"qty\":-1}"),
    ];
    for (i, (key, body)) in poison.iter().enumerate() {
        let props = lapin::BasicProperties::default()
            .with_message_id(format!("poison-{i}-{}", w.name).into())
            .with_delivery_mode(2);
        tap::publish(&w.amqp_url, &w.exchange, key, body, props).await?;
    }
    Ok(poison.len() as u64)
}

/// Redis snapshotted early in the flood, the sale going on for 2.5 s, then Redis killed and
/// started from that stale snapshot: the gate's counters and holds are as they were seconds
/// ago. An operator then asks product-stock to reconcile with repair.
async fn redis_restore_stale(w: &mut World) -> anyhow::Result<u64> {
    let at_snapshot = gate_counters(w).await.unwrap_or_default();
    set_snapshot_marker(w, true).await?;
    w.redis.save().await?;
    // Gone from the live Redis, back only if Redis is restarted from the snapshot.
    set_snapshot_marker(w, false).await?;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before_kill = gate_counters(w).await.unwrap_or_default();
    w.redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.redis.start_from_snapshot().await?;
    let from_snapshot = snapshot_marker(w).await?;
    let restored = gate_counters(w).await.unwrap_or_default();
    w.notes.push(format!(
        "gate(avail,held):snapshot={at_snapshot:?},before_kill={before_kill:?},restored={restored:?}"
    ));
    // product-stock may already have noticed the restored data and dropped or rebuilt the gate
    // by the time it is read: the marker tells whether Redis came back from the snapshot.
    anyhow::ensure!(
        from_snapshot,
        "Redis did not come back from the snapshot: {restored:?}, before the kill {before_kill:?}"
    );
    let clients = w.clients()?;
    let r = driver::reconcile(&clients, &w.sale.sku, true, ADMIN_RETRY_FOR).await?;
    w.notes.push(format!(
        "reconcile_after_restore(drift={},held={},repaired={})",
        r.drift, r.unpersisted_holds, r.repaired
    ));
    Ok(0)
}

const SNAPSHOT_MARKER: &str = "faults:snapshot_marker";

/// Sets (`true`) or deletes the key that tells a Redis restarted from the snapshot.
async fn set_snapshot_marker(w: &World, set: bool) -> anyhow::Result<()> {
    use deadpool_redis::redis::AsyncCommands as _;
    let client = deadpool_redis::redis::Client::open(w.redis.url())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    if set {
        let _: () = c.set(SNAPSHOT_MARKER, 1).await?;
    } else {
        let _: i64 = c.del(SNAPSHOT_MARKER).await?;
    }
    Ok(())
}

async fn snapshot_marker(w: &World) -> anyhow::Result<bool> {
    use deadpool_redis::redis::AsyncCommands as _;
    let client = deadpool_redis::redis::Client::open(w.redis.url())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    Ok(c.exists(SNAPSHOT_MARKER).await?)
}

/// The gate's `(avail, held)` for the scenario's product, as Redis has them now.
async fn gate_counters(w: &World) -> anyhow::Result<(Option<i64>, Option<i64>)> {
    use deadpool_redis::redis::AsyncCommands as _;
    let client = deadpool_redis::redis::Client::open(w.redis.url())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let base = gate_base(w);
    let avail: Option<i64> = c.get(format!("{base}:avail")).await?;
    let held: Option<i64> = c.get(format!("{base}:held")).await?;
    Ok((avail, held))
}

fn gate_base(w: &World) -> String {
    format!("{}stock:{{p:{}}}", w.stores.gate_prefix, w.sale.sku)
}

/// `INCRBY` of the gate's available counter behind product-stock's back (negative: `DECRBY`).
async fn nudge_gate(w: &World, by: i64) -> anyhow::Result<()> {
    use deadpool_redis::redis::AsyncCommands as _;
    let client = deadpool_redis::redis::Client::open(w.redis.url())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let _: i64 = c.incr(format!("{}:avail", gate_base(w)), by).await?;
    Ok(())
}

/// The restock of this scenario.
const RESTOCK: i64 = 20;

/// AdjustStock +20 while buyers flow, sent twice with one request id, then once more after
/// product-stock was killed and restarted: applied once, the repeats answered as replays.
async fn restock_retried(w: &mut World) -> anyhow::Result<u64> {
    let clients = w.clients()?;
    let (sku, rid) = (w.sale.sku.clone(), "restock-1");
    let mut replays = Vec::new();
    let (first, on_hand) =
        driver::adjust_stock(&clients, &sku, rid, RESTOCK, ADMIN_RETRY_FOR).await?;
    w.adjusted = RESTOCK;
    replays.push(first);
    let (again, _) = driver::adjust_stock(&clients, &sku, rid, RESTOCK, ADMIN_RETRY_FOR).await?;
    replays.push(again);
    w.product_stock.kill().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.product_stock.start(None).await?;
    let (after_restart, _) =
        driver::adjust_stock(&clients, &sku, rid, RESTOCK, ADMIN_RETRY_FOR).await?;
    replays.push(after_restart);
    w.notes.push(format!(
        "restock(on_hand_after_first={on_hand},replayed={replays:?})"
    ));
    if replays != [false, true, true] {
        w.violations.push(format!(
            "restock answers replayed={replays:?}, want [false,true,true]"
        ));
    }
    Ok(0)
}

/// Units the gate is nudged by.
const NUDGE_DOWN: i64 = 10;
const NUDGE_UP: i64 = 5;

/// The gate's counter lowered by 10 behind product-stock's back while orders flow: ReconcileStock
/// must report exactly that drift, repair it, then find none. After the flood the counter is
/// raised by 5 (units that do not exist) and repaired at once the same way.
async fn gate_drift(w: &mut World) -> anyhow::Result<u64> {
    let clients = w.clients()?;
    let sku = w.sale.sku.clone();
    let mut drifts = Vec::new();
    for (nudge, wait) in [
        (-NUDGE_DOWN, Duration::from_millis(300)),
        (NUDGE_UP, Duration::ZERO),
    ] {
        if nudge > 0 {
            // Past the flood: few CreateOrders can still take a unit that does not exist.
            let past = w.sale.flood.saturating_sub(Duration::from_millis(1500));
            tokio::time::sleep(past + Duration::from_secs(1)).await;
        }
        nudge_gate(w, nudge).await?;
        tokio::time::sleep(wait).await;
        let seen = driver::reconcile(&clients, &sku, false, ADMIN_RETRY_FOR).await?;
        let fixed = driver::reconcile(&clients, &sku, true, ADMIN_RETRY_FOR).await?;
        let after = driver::reconcile(&clients, &sku, false, ADMIN_RETRY_FOR).await?;
        drifts.push((nudge, seen.drift, fixed.drift, fixed.repaired, after.drift));
        if seen.drift != nudge {
            w.violations.push(format!(
                "gate nudged by {nudge}: reconcile reported drift {}",
                seen.drift
            ));
        }
        if fixed.drift != 0 && !fixed.repaired {
            w.violations.push(format!(
                "gate nudged by {nudge}: repair left drift {}",
                fixed.drift
            ));
        }
        if after.drift != 0 {
            w.violations.push(format!(
                "gate nudged by {nudge}: drift {} after the repair",
                after.drift
            ));
        }
    }
    w.notes.push(
        format!("reconcile(nudge,reported,at_repair,repaired,after)={drifts:?}").replace(' ', ""),
    );
    Ok(0)
}

/// A replay of an acknowledged CreateOrder (same user, same request id) reaches a write batch
/// that skips it, and the order service exits there, after the batch's commit and before the
/// relay publishes its `order.created` events; restarted.
async fn order_exit_after_batch_write(w: &mut World) -> anyhow::Result<u64> {
    let clients = w.clients()?;
    let sku = w.sale.sku.clone();
    let (user, rid) = ("replayer", "replay-1");
    let first = driver::create_order(&clients, user, rid, &sku, Duration::from_secs(10))
        .await
        .map_err(|s| {
            anyhow::anyhow!("the replayer's CreateOrder: {:?} {}", s.code(), s.message())
        })?;
    // The replay: its batch commits, then the process exits before answering.
    let replay = driver::create_order(&clients, user, rid, &sku, Duration::ZERO).await;
    w.notes.push(format!(
        "replay_answer={}",
        match &replay {
            Ok(_) => "order".to_owned(),
            Err(s) => format!("{:?}", s.code()),
        }
    ));
    until_exit(w).await?;
    // After the restart the replay is answered with the same order.
    match driver::create_order(&clients, user, rid, &sku, Duration::from_secs(20)).await {
        Ok(o) if o.order_id == first.order_id => {}
        Ok(o) => w.violations.push(format!(
            "the replay after the restart got order {}, the first answer was {}",
            o.order_id, first.order_id
        )),
        Err(s) => w.violations.push(format!(
            "the replay after the restart failed: {:?} {}",
            s.code(),
            s.message()
        )),
    }
    Ok(0)
}
