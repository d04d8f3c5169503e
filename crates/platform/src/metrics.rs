//! Prometheus `/metrics`. The recorder is process-global (installed once); each service instance
//! serves the rendered text on its own `metrics.addr`, so tests can run several in one process
//! (the exporter's own listener serves one address per process). Histograms are rendered with
//! explicit buckets — latencies in seconds ([`SECONDS_BUCKETS`]), the steps of an order's saga
//! ([`SAGA_BUCKETS`]), batch sizes ([`SIZE_BUCKETS`]) — so replicas' histograms can be summed;
//! a thread drains the samples
//! recorded since into them every [`UPKEEP`], so a service nobody scrapes holds no growing list
//! of samples. The same thread reads the process's CPU time and resident memory
//! ([`PROCESS_CPU_SECONDS`], [`PROCESS_RESIDENT_BYTES`]), for the dashboards' per-service CPU and
//! memory.

use std::{
    net::SocketAddr,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
/// Upkeeps run since the recorder was installed.
static UPKEEPS: AtomicU64 = AtomicU64::new(0);

/// Buckets of every histogram whose name ends in `_seconds`: 100 µs to 10 s.
pub const SECONDS_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Buckets of every histogram whose name ends in `_size` (calls per batch).
pub const SIZE_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Buckets of every histogram whose name ends in `_saga_seconds`: the steps of an order's life,
/// which wait for the buyer to pay, 50 ms to an hour.
pub const SAGA_BUCKETS: [f64; 15] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
/// How often the samples recorded since are drained into the histograms.
pub const UPKEEP: Duration = Duration::from_secs(5);

/// The global Prometheus recorder, installed on first use (once, even when several services
/// start at the same moment in one test process), with its upkeep thread.
pub fn handle() -> anyhow::Result<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_size".into()), &SIZE_BUCKETS)
                })
                // Suffix matchers are tried in the order of their text: `_saga_seconds` before
                // `_seconds`.
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Suffix("_saga_seconds".into()), &SAGA_BUCKETS)
                })
                .ok()?
                .build_recorder();
            let h = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            describe();
            let upkeep = h.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        record_process();
                        std::thread::sleep(UPKEEP);
                        upkeep.run_upkeep();
                        UPKEEPS.fetch_add(1, Ordering::Release);
                    }
                })
                .ok()?;
            Some(h)
        })
        .clone()
        .context("a metrics recorder from elsewhere is already installed")
}

/// How many upkeeps have run since the recorder was installed: once it has moved past a value
/// read after some samples were recorded, those samples are in their histograms' buckets.
pub fn upkeeps() -> u64 {
    UPKEEPS.load(Ordering::Acquire)
}

/// Gauge: CPU time the process has used, user and system, seconds (Prometheus's usual process
/// metric; `rate()` of it is the cores the process keeps busy).
pub const PROCESS_CPU_SECONDS: &str = "process_cpu_seconds_total";
/// Gauge: the process's resident memory, bytes.
pub const PROCESS_RESIDENT_BYTES: &str = "process_resident_memory_bytes";

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU times (Linux's `USER_HZ`, 100 on every
/// architecture it runs on).
const USER_HZ: f64 = 100.0;

/// The process's CPU seconds and resident bytes, from `/proc/self` (`None` off Linux or when it
/// cannot be read).
pub fn process_usage() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let cpu = cpu_seconds(&stat)?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss = resident_bytes(&status)?;
    Some((cpu, rss))
}

/// utime + stime of a `/proc/<pid>/stat` line, seconds. The fields are counted after the
/// command name's closing parenthesis (the name may hold spaces).
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based, as proc(5) counts).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// `VmRSS` of a `/proc/<pid>/status`, bytes.
fn resident_bytes(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

fn record_process() {
    if let Some((cpu, rss)) = process_usage() {
        metrics::gauge!(PROCESS_CPU_SECONDS).set(cpu);
        metrics::gauge!(PROCESS_RESIDENT_BYTES).set(rss);
    }
}

/// The help text of the families every service exports (the services and the messaging layer
/// describe their own).
fn describe() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        crate::rpc_metrics::REQUESTS,
        "gRPC calls answered, by method and status code."
    );
    describe_histogram!(
        crate::rpc_metrics::DURATION,
        "gRPC calls from arrival to their answer's headers, seconds, by method and status code."
    );
    describe_histogram!(
        crate::batch::BATCH_SIZE,
        "Calls gathered in one batch, by batcher."
    );
    describe_histogram!(
        crate::batch::BATCH_WAIT_SECONDS,
        "How long a batch's oldest call waited for the batch to start, seconds, by batcher."
    );
    describe_histogram!(
        crate::batch::BATCH_RUN_SECONDS,
        "How long a batch ran, seconds, by batcher."
    );
    describe_counter!(
        crate::shed::SHED_TOTAL,
        "gRPC calls refused at once because grpc.max_concurrent_requests were in flight."
    );
    describe_counter!(
        crate::peer::BODY_TIMEOUT_TOTAL,
        "Calls whose body did not arrive within its deadline."
    );
    describe_counter!(
        crate::limit::RATE_LIMITED_TOTAL,
        "Calls refused by a per-caller rate limit, by RPC."
    );
    metrics::describe_gauge!(
        PROCESS_CPU_SECONDS,
        "CPU time the process has used, user and system, seconds."
    );
    metrics::describe_gauge!(
        PROCESS_RESIDENT_BYTES,
        "Resident memory of the process, bytes."
    );
    crate::pools::describe();
    describe_counter!(
        "flashsale_singleton_skips_total",
        "Rounds of a one-replica-at-a-time job skipped because another replica held its lease, by job."
    );
}

/// `flashsale_build_info{service, version}` = 1: which build each replica runs.
pub fn record_build_info(service: &'static str) {
    metrics::describe_gauge!(
        "flashsale_build_info",
        "Always 1; its labels name the service and the version of the build it runs."
    );
    metrics::gauge!("flashsale_build_info", "service" => service, "version" => env!("CARGO_PKG_VERSION"))
        .set(1.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name_even_with_spaces_and_parentheses() {
        let stat = "4242 (flash (sale) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 130 0 0 20 0 9 0 100 0 0";
        assert_eq!(cpu_seconds(stat), Some(3.8));
        assert_eq!(cpu_seconds("4242 (no fields)"), None);
        assert_eq!(cpu_seconds("no parenthesis at all"), None);
    }

    #[test]
    fn resident_memory_is_vm_rss_in_bytes() {
        let status = "Name:\tflashsale\nVmPeak:\t  9000 kB\nVmRSS:\t  2048 kB\n";
        assert_eq!(resident_bytes(status), Some(2048.0 * 1024.0));
        assert_eq!(resident_bytes("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_uses_some_memory_and_its_cpu_time_only_grows() {
        let (cpu, rss) = process_usage().unwrap();
        assert!(rss > 0.0);
        // Burn a little CPU: the second reading is never below the first.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let (again, _) = process_usage().unwrap();
        assert!(again >= cpu, "{again} < {cpu}");
    }
}
