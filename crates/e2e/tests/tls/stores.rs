//! PostgreSQL, Redis and RabbitMQ over TLS with client certificates, through the code the
//! services use (`platform::db::connect`, `platform::redis::pool`, `messaging::Broker`).

use std::time::Duration;

use flashsale_messaging::{AmqpConfig, Broker};
use flashsale_platform::{
    config::Validate as _,
    settings::{DatabaseSettings, RedisSettings},
    tls::StoreTlsSettings,
};
use flashsale_test_support::{
    amqp_url,
    redis_cluster::RedisCluster,
    servers::{Postgres, TlsRabbit, TlsRedis},
    tls::Pki,
};
use sea_orm::{ConnectionTrait as _, Statement};

fn db(url: String) -> DatabaseSettings {
    DatabaseSettings {
        url,
        max_connections: 2,
        migrate_on_start: true,
    }
}

/// `url` with `sslmode`, the CA and, when given, the client certificate of `pki`.
fn tls_url(base: &str, mode: &str, pki: &Pki, client: Option<&(String, String)>) -> String {
    let mut url = url::Url::parse(base).unwrap();
    url.query_pairs_mut()
        .append_pair("sslmode", mode)
        .append_pair("sslrootcert", &pki.ca_path());
    if let Some((cert, key)) = client {
        url.query_pairs_mut()
            .append_pair("sslcert", cert)
            .append_pair("sslkey", key);
    }
    url.into()
}

#[tokio::test]
async fn postgres_is_reached_over_verified_tls_with_a_client_certificate() {
    let pki = Pki::new("pg-ca").unwrap();
    let pg = Postgres::start_tls(&pki).await.unwrap();
    let client = pki.client("postgres").unwrap();
    let client = (client.cert_path(), client.key_path());

    let url = tls_url(&pg.url("fs_tls"), "verify-full", &pki, Some(&client));
    let conn = flashsale_platform::db::connect(&db(url)).await.unwrap();
    let row = conn
        .query_one_raw(Statement::from_string(
            sea_orm::DatabaseBackend::Postgres,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        ))
        .await
        .unwrap()
        .unwrap();
    assert!(
        row.try_get::<bool>("", "ssl").unwrap(),
        "the session is TLS"
    );
    conn.close().await.unwrap();

    // No client certificate: the server's `hostssl … cert` rule refuses the connection.
    let url = tls_url(&pg.url("fs_tls"), "verify-full", &pki, None);
    assert!(flashsale_platform::db::connect(&db(url)).await.is_err());
    // Another CA: the server's certificate does not verify.
    let stranger = Pki::new("stranger").unwrap();
    let url = tls_url(&pg.url("fs_tls"), "verify-full", &stranger, Some(&client));
    assert!(flashsale_platform::db::connect(&db(url)).await.is_err());
    // Plain text is not accepted by this server at all.
    assert!(
        flashsale_platform::db::connect(&db(pg.url("fs_tls")))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn sslmode_require_against_a_plain_postgres_fails_instead_of_falling_back() {
    let pg = Postgres::start_plain().await.unwrap();
    let plain = flashsale_platform::db::connect(&db(pg.url("fs_plain")))
        .await
        .expect("the server answers in plain text");
    plain.close().await.unwrap();
    for mode in ["require", "verify-full"] {
        let url = format!("{}?sslmode={mode}", pg.url("fs_plain"));
        let err = flashsale_platform::db::connect(&db(url))
            .await
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(!err.is_empty(), "sslmode={mode} connected in plain text");
    }
}

fn redis(url: String, tls: StoreTlsSettings) -> RedisSettings {
    RedisSettings {
        url,
        key_prefix: String::new(),
        pool_size: 1,
        tls,
        ..Default::default()
    }
}

async fn ping(settings: &RedisSettings) -> anyhow::Result<String> {
    let pool = flashsale_platform::redis::pool(settings)?;
    let mut conn = tokio::time::timeout(Duration::from_secs(10), pool.get())
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(deadpool_redis::redis::cmd("PING")
        .query_async::<String>(&mut *conn)
        .await?)
}

#[tokio::test]
async fn redis_is_reached_over_tls_with_a_client_certificate_and_never_in_plain_text() {
    let pki = Pki::new("redis-ca").unwrap();
    let server = TlsRedis::start(&pki).await.unwrap();
    let client = pki.client("product-stock").unwrap();
    let full = StoreTlsSettings {
        ca_file: pki.ca_path(),
        cert_file: client.cert_path(),
        key_file: client.key_path(),
    };
    assert_eq!(
        ping(&redis(server.url(), full.clone())).await.unwrap(),
        "PONG"
    );

    // Without a client certificate the server (tls-auth-clients yes) refuses.
    let no_cert = StoreTlsSettings {
        ca_file: pki.ca_path(),
        ..StoreTlsSettings::default()
    };
    assert!(ping(&redis(server.url(), no_cert)).await.is_err());
    // rediss:// against the shared plain-text server fails: no fallback.
    let plain = flashsale_test_support::redis_url().replacen("redis://", "rediss://", 1);
    assert!(ping(&redis(plain, full.clone())).await.is_err());
    // TLS files with a plain redis:// URL are a configuration error, not a silent plain link.
    use flashsale_platform::config::Validate as _;
    let err = redis(server.url().replacen("rediss://", "redis://", 1), full)
        .validate("product_stock.redis")
        .unwrap_err()
        .to_string();
    assert!(err.contains("product_stock.redis.tls"), "{err}");
}

fn amqp(url: String, tls: StoreTlsSettings) -> AmqpConfig {
    AmqpConfig {
        url,
        tls,
        ..AmqpConfig::default()
    }
}

#[tokio::test]
async fn rabbitmq_is_reached_over_tls_with_a_client_certificate_and_never_in_plain_text() {
    let pki = Pki::new("amqp-ca").unwrap();
    let server = TlsRabbit::start(&pki).await.unwrap();
    let client = pki.client("order").unwrap();
    let full = StoreTlsSettings {
        ca_file: pki.ca_path(),
        cert_file: client.cert_path(),
        key_file: client.key_path(),
    };
    full.validate("amqp.tls").unwrap();
    // The node opens its listener a little before it answers handshakes.
    let broker = Broker::connect_within(amqp(server.url(), full.clone()), Duration::from_secs(30))
        .await
        .unwrap();
    let channel = broker.channel().await.unwrap();
    channel
        .queue_declare(
            "fs_tls_probe".into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    broker.close().await;

    let no_cert = StoreTlsSettings {
        ca_file: pki.ca_path(),
        ..StoreTlsSettings::default()
    };
    assert!(Broker::connect(amqp(server.url(), no_cert)).await.is_err());
    // amqps:// against the shared plain-text broker fails: no fallback.
    let plain = amqp_url().replacen("amqp://", "amqps://", 1);
    assert!(Broker::connect(amqp(plain, full.clone())).await.is_err());
    // TLS files with a plain amqp:// URL are refused by validation.
    let err = amqp(amqp_url(), full).validate().unwrap_err();
    assert!(err.starts_with("amqp.tls"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_is_reached_over_tls_with_a_client_certificate() {
    let pki = Pki::new("redis-cluster-ca").unwrap();
    let cluster = RedisCluster::start_tls(&pki).await.unwrap();
    let client = pki.client("product-stock").unwrap();
    let settings = RedisSettings {
        pool_size: 1,
        tls: StoreTlsSettings {
            ca_file: pki.ca_path(),
            cert_file: client.cert_path(),
            key_file: client.key_path(),
        },
        ..RedisSettings::cluster(cluster.urls())
    };
    settings.validate("redis").unwrap();
    let pool = flashsale_platform::redis::pool(&settings).unwrap();
    let mut conn = tokio::time::timeout(Duration::from_secs(10), pool.get())
        .await
        .unwrap()
        .unwrap();
    // Keys on every master: each is reached over TLS.
    for i in 0..32 {
        let key = format!("tls-cluster-{i}");
        let _: () = deadpool_redis::redis::cmd("SET")
            .arg(&key)
            .arg(i)
            .query_async(&mut *conn)
            .await
            .unwrap();
        let back: i64 = deadpool_redis::redis::cmd("GET")
            .arg(&key)
            .query_async(&mut *conn)
            .await
            .unwrap();
        assert_eq!(back, i);
    }
    assert_eq!(conn.masters().await.unwrap().len(), 3);

    // Without a client certificate the nodes refuse.
    let mut anonymous = settings.clone();
    anonymous.tls.cert_file = String::new();
    anonymous.tls.key_file = String::new();
    let refused = match flashsale_platform::redis::pool(&anonymous) {
        Ok(pool) => tokio::time::timeout(Duration::from_secs(10), pool.get())
            .await
            .map_or(true, |r| r.is_err()),
        Err(_) => true,
    };
    assert!(
        refused,
        "a cluster node accepted a client without a certificate"
    );
}
