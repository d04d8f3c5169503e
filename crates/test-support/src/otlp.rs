//! An OTLP trace receiver inside a test or a benchmark: the collector's gRPC trace service on a loopback
//! port, keeping every span the services export, each with the name of the service that sent
//! it, for a test to read back as trees of traces and links.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
};
use tokio::task::JoinHandle;

/// One exported span, reduced to what a test asserts on. Ids are lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `(trace_id, span_id)` of each link.
    pub links: Vec<(String, String)>,
    /// String and integer attributes, as text.
    pub attributes: HashMap<String, String>,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    pub port: u16,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    server: JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Clone)]
struct Collect(Arc<Mutex<Vec<ReceivedSpan>>>);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

#[tonic::async_trait]
impl TraceService for Collect {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|kv| {
                            let v = text(kv.value.as_ref().and_then(|v| v.value.as_ref()))?;
                            Some((kv.key.clone(), v))
                        })
                        .collect(),
                });
            }
        }
        self.0
            .lock()
            .map_err(|_| tonic::Status::internal("receiver poisoned"))?
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_on("127.0.0.1:0".parse()?).await
    }

    /// Listens on `addr`.
    pub async fn start_on(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let port = listener.local_addr()?.port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Collect(spans.clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                eprintln!("OTLP receiver stopped: {e}");
            }
        });
        Ok(Self {
            port,
            spans,
            server,
        })
    }

    /// Where the services export to (`telemetry.otlp_endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }
}
