//! Checks every flashsale service must pass, whatever its business: it migrates its database,
//! serves health, reflection of the services it serves and `/metrics`, guards its RPCs (the
//! dead-letter admin API's and its own), refuses a bad database URL and stops cleanly.
//! [`foundation_tests!`](crate::foundation_tests) turns them into a service's tests.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use flashsale_platform::{auth::Role, shutdown::Shutdown};
use flashsale_proto::admin::v1::{
    GetOrderTimelineRequest, ListDeadLettersRequest,
    dead_letter_service_client::DeadLetterServiceClient,
    order_timeline_service_client::OrderTimelineServiceClient,
};
use tonic::Code;
use tonic::transport::Channel;

use crate::grpc::{channel, health, http_get, reflection_services, token, with_token};

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;

/// Whether two fully qualified service names are in one package.
fn same_package(a: &str, b: &str) -> bool {
    let package = |n: &str| n.rsplit_once('.').map(|(p, _)| p.to_owned());
    package(a).is_some() && package(a) == package(b)
}

/// Health, reflection (`v1` and `v1alpha`), `/metrics` and dead-letter auth of a running service
/// whose business service is `service_name`.
pub async fn check_endpoints(
    grpc_port: u16,
    metrics_port: u16,
    service_name: &str,
) -> anyhow::Result<()> {
    ensure!(
        health(grpc_port, service_name).await? == SERVING,
        "{service_name} is not SERVING"
    );
    ensure!(
        health(grpc_port, "").await? == SERVING,
        "the server is not SERVING"
    );
    let err = health(grpc_port, "no.such.Service")
        .await
        .err()
        .context("unknown service must fail")?;
    let status = err
        .downcast_ref::<tonic::Status>()
        .context("health error is a status")?;
    ensure!(
        status.code() == Code::NotFound,
        "unknown service: {status:?}"
    );

    let (v1, v1alpha) = reflection_services(grpc_port).await?;
    let served = [
        service_name,
        "flashsale.admin.v1.DeadLetterService",
        "flashsale.admin.v1.OrderTimelineService",
        "grpc.health.v1.Health",
    ];
    for names in [&v1, &v1alpha] {
        for expected in served {
            ensure!(
                names.iter().any(|n| n == expected),
                "reflection lacks {expected}: {names:?}"
            );
        }
        for other in flashsale_proto::SERVICE_NAMES
            .iter()
            .copied()
            // A port serves its own package's services (the order port also receives the
            // payment provider's notifications).
            .filter(|n| !served.contains(n) && !same_package(n, service_name))
        {
            ensure!(
                !names.iter().any(|n| n == other),
                "reflection lists {other}, which this port does not serve: {names:?}"
            );
        }
    }

    let (status, body) = http_get(metrics_port, "/metrics").await?;
    ensure!(status.contains("200"), "/metrics answered {status}");
    ensure!(
        body.is_empty() || body.contains('#') || body.contains('_'),
        "not Prometheus text: {body}"
    );
    let (status, _) = http_get(metrics_port, "/nope").await?;
    ensure!(status.contains("404"), "/nope answered {status}");

    let mut dl = DeadLetterServiceClient::new(channel(grpc_port).await?);
    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.err().map(|s| s.code());
    let anonymous = dl
        .list_dead_letters(ListDeadLettersRequest::default())
        .await;
    ensure!(
        code(anonymous) == Some(Code::Unauthenticated),
        "anonymous dead-letter call"
    );
    let user = dl
        .list_dead_letters(with_token(
            ListDeadLettersRequest::default(),
            &token("alice", Role::User),
        ))
        .await;
    ensure!(
        code(user) == Some(Code::PermissionDenied),
        "user dead-letter call"
    );
    let forged = dl
        .list_dead_letters(with_token(ListDeadLettersRequest::default(), "not.a.jwt"))
        .await;
    ensure!(
        code(forged) == Some(Code::Unauthenticated),
        "forged token dead-letter call"
    );

    let mut timeline = OrderTimelineServiceClient::new(channel(grpc_port).await?);
    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.err().map(|s| s.code());
    let some_order = GetOrderTimelineRequest {
        order_id: uuid::Uuid::new_v4().to_string(),
    };
    let anonymous = timeline.get_order_timeline(some_order.clone()).await;
    ensure!(
        code(anonymous) == Some(Code::Unauthenticated),
        "anonymous timeline call"
    );
    let user = timeline
        .get_order_timeline(with_token(some_order, &token("alice", Role::User)))
        .await;
    ensure!(
        code(user) == Some(Code::PermissionDenied),
        "user timeline call"
    );
    for bad in ["", "42", "not-a-uuid"] {
        let req = GetOrderTimelineRequest {
            order_id: bad.to_owned(),
        };
        let answer = timeline
            .get_order_timeline(with_token(req, &token("ops", Role::Admin)))
            .await;
        ensure!(
            code(answer) == Some(Code::InvalidArgument),
            "timeline of order id {bad:?}"
        );
    }
    Ok(())
}

/// Triggers shutdown and checks the service stops by itself, cleanly, and stops listening.
pub async fn check_clean_stop(
    grpc_port: u16,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    shutdown.trigger();
    let joined = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .context("service did not stop within 15 s")?;
    joined.context("service task panicked")??;
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", grpc_port))
        .await
        .is_err();
    ensure!(refused, "gRPC port still accepts connections after stop");
    Ok(())
}

/// Fails unless every table in `tables` exists in the database at `url`.
pub async fn check_tables(url: &str, tables: &[&str]) -> anyhow::Result<()> {
    use sea_orm::{ConnectionTrait, Statement};
    let conn = sea_orm::Database::connect(url).await.context("connect")?;
    for table in tables {
        let row = conn
            .query_one_raw(Statement::from_string(
                sea_orm::DatabaseBackend::Postgres,
                format!("SELECT to_regclass('public.{table}')::text AS t"),
            ))
            .await?
            .context("no row")?;
        let name: Option<String> = row.try_get("", "t")?;
        ensure!(name.as_deref() == Some(*table), "table {table} missing");
    }
    conn.close().await.ok();
    Ok(())
}

/// Runs the service binary `bin` with `env_var` set to an unparsable database URL and checks
/// it refuses to start, naming `key`.
pub async fn check_refuses_bad_database_url(
    bin: &str,
    env_var: &str,
    key: &str,
) -> anyhow::Result<()> {
    let config_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");
    let out = tokio::process::Command::new(bin)
        .env(env_var, "not a url")
        .env("FLASHSALE_CONFIG_DIR", config_dir)
        .output()
        .await
        .context("run the binary")?;
    ensure!(!out.status.success(), "start-up must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains(key), "stderr does not name {key}: {stderr}");
    Ok(())
}

/// Checks a business RPC checks the token before anything else: `call` (given a channel and the
/// token to send, if any) is refused UNAUTHENTICATED without a token and PERMISSION_DENIED with
/// the `refused` caller's; with the `allowed` caller's it gets past the guard and ends with
/// `allowed_outcome` (`None`: it succeeds; `Some(code)`: the business refuses with `code`).
pub async fn check_guarded_rpc<F, Fut>(
    grpc_port: u16,
    call: F,
    refused: (&str, Role),
    allowed: (&str, Role),
    allowed_outcome: Option<Code>,
) -> anyhow::Result<()>
where
    F: Fn(Channel, Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let ch = channel(grpc_port).await?;
    let anonymous = call(ch.clone(), None).await.err().map(|s| s.code());
    ensure!(
        anonymous == Some(Code::Unauthenticated),
        "anonymous call: {anonymous:?}"
    );
    let weak = call(ch.clone(), Some(token(refused.0, refused.1)))
        .await
        .err()
        .map(|s| s.code());
    ensure!(
        weak == Some(Code::PermissionDenied),
        "call as {refused:?}: {weak:?}"
    );
    let outcome = call(ch, Some(token(allowed.0, allowed.1))).await;
    ensure!(
        outcome.as_ref().err().map(tonic::Status::code) == allowed_outcome,
        "call as {allowed:?}: {outcome:?}, expected {allowed_outcome:?}"
    );
    Ok(())
}

/// `message` with the bearer `token` when there is one.
pub fn request<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    match token {
        Some(t) => with_token(message, t),
        None => tonic::Request::new(message),
    }
}

/// The foundation tests of one service, as `#[tokio::test]` functions in the calling module:
/// `service_serves_health_reflection_metrics_and_stops_cleanly`, `start_up_runs_the_migrations`,
/// `business_rpcs_check_the_token_before_anything_else` and
/// `binary_refuses_an_unparsable_database_url_naming_the_key`.
///
/// `spawn` is an async function returning the service's test app, a value with the fields
/// `grpc_port`, `metrics_port`, `shutdown` ([`Shutdown`]), `task` (the serving task, in an
/// `Option`) and `db` (its [`TestDatabase`](crate::TestDatabase)). `rpc` is a closure for
/// [`check_guarded_rpc`]; `refused`, `allowed` and `allowed_outcome` are its other arguments.
#[macro_export]
macro_rules! foundation_tests {
    (
        spawn: $spawn:path,
        service: $service:expr,
        bin: $bin:expr,
        database_url_env: $env:expr,
        database_url_key: $key:expr,
        tables: [$($table:expr),+ $(,)?],
        rpc: $rpc:expr,
        refused: $refused:expr,
        allowed: $allowed:expr,
        allowed_outcome: $outcome:expr $(,)?
    ) => {
        #[tokio::test]
        async fn service_serves_health_reflection_metrics_and_stops_cleanly() {
            let mut app = $spawn().await;
            $crate::foundation::check_endpoints(app.grpc_port, app.metrics_port, $service)
                .await
                .unwrap();
            let task = app.task.take().expect("the app is serving");
            $crate::foundation::check_clean_stop(app.grpc_port, app.shutdown.clone(), task)
                .await
                .unwrap();
        }

        #[tokio::test]
        async fn start_up_runs_the_migrations() {
            let app = $spawn().await;
            $crate::foundation::check_tables(&app.db.url, &[$($table),+])
                .await
                .unwrap();
            app.shutdown.trigger();
        }

        #[tokio::test]
        async fn business_rpcs_check_the_token_before_anything_else() {
            let app = $spawn().await;
            $crate::foundation::check_guarded_rpc(
                app.grpc_port,
                $rpc,
                $refused,
                $allowed,
                $outcome,
            )
            .await
            .unwrap();
            app.shutdown.trigger();
        }

        #[tokio::test]
        async fn binary_refuses_an_unparsable_database_url_naming_the_key() {
            $crate::foundation::check_refuses_bad_database_url($bin, $env, $key)
                .await
                .unwrap();
        }
    };
}
