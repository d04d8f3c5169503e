//! Prometheus `/metrics`. The recorder is process-global (installed once); each service instance
//! serves the rendered text on its own `metrics.addr`, so tests can run several in one process.

use std::{net::SocketAddr, sync::OnceLock};

use anyhow::Context as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The global Prometheus recorder, installed on first use (once, even when several services
/// start at the same moment in one test process).
pub fn handle() -> anyhow::Result<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let h = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|()| h)
        })
        .clone()
        .context("a metrics recorder from elsewhere is already installed")
}

/// Binds the metrics listener.
pub async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("parse metrics.addr `{addr}`"))?;
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind metrics listener on {addr}"))
}

/// Answers `GET /metrics` (and `/`) with the Prometheus text until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let handle = handle()?;
    tokio::pin!(shutdown);
    loop {
        let (mut socket, _) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    continue;
                }
            },
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = match tokio::time::timeout(
                std::time::Duration::from_secs(5),
                socket.read(&mut buf),
            )
            .await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if path == "/metrics" || path == "/" {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
