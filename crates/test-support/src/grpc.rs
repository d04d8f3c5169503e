//! Typed access to a running service in tests: channels, tokens, health, reflection, metrics.

use std::time::Duration;

use anyhow::Context as _;
use flashsale_platform::auth::{DEV_SECRET, JwtKeys, Role};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;

/// A channel to `127.0.0.1:port`.
pub async fn channel(port: u16) -> anyhow::Result<Channel> {
    Channel::from_shared(format!("http://127.0.0.1:{port}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .context("connect to service")
}

/// A token signed with the development secret (what services use when none is configured).
pub fn token(subject: &str, role: Role) -> String {
    JwtKeys::new(DEV_SECRET.as_bytes())
        .and_then(|k| {
            k.mint(subject, role, Duration::from_secs(600))
                .map_err(anyhow::Error::new)
        })
        .unwrap_or_default()
}

/// `message` with `authorization: Bearer <token>`.
pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert("authorization", v);
    }
    req
}

/// The health status of `service` ("" = the whole server).
pub async fn health(port: u16, service: &str) -> anyhow::Result<i32> {
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel(port).await?);
    let resp = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(resp.into_inner().status)
}

/// The services listed by reflection `v1` and `v1alpha`, in that order.
pub async fn reflection_services(port: u16) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    use tonic_reflection::pb::{v1, v1alpha};
    let ch = channel(port).await?;

    let mut c1 = v1::server_reflection_client::ServerReflectionClient::new(ch.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = c1
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let mut v1_names = Vec::new();
    if let Some(resp) = stream.message().await?
        && let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
            resp.message_response
    {
        v1_names = l.service.into_iter().map(|s| s.name).collect();
    }

    let mut c2 = v1alpha::server_reflection_client::ServerReflectionClient::new(ch);
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = c2
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let mut alpha_names = Vec::new();
    if let Some(resp) = stream.message().await?
        && let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
            resp.message_response
    {
        alpha_names = l.service.into_iter().map(|s| s.name).collect();
    }
    Ok((v1_names, alpha_names))
}

/// `GET /metrics` on `127.0.0.1:port`: the status line and the body.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(String, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut buf)).await??;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    Ok((status, body.to_owned()))
}
