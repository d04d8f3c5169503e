//! What every flashsale service stands on: the command line of its binary, layered
//! configuration, telemetry, the gRPC server builder (health, reflection, auth, limits), the one
//! mapping from service errors to `tonic::Status`, per-user rate limits and load shedding,
//! graceful shutdown, Prometheus metrics and named failpoints.

pub mod app;
pub mod auth;
pub mod backoff;
pub mod balance;
pub mod batch;
pub mod cli;
pub mod config;
pub mod db;
pub mod decode;
pub mod error;
pub mod failpoint;
pub mod grpc;
pub mod json_log;
pub mod lease;
pub mod limit;
pub mod metrics;
pub mod peer;
pub mod pools;
pub mod pressure;
pub mod redis;
pub mod rpc_metrics;
pub mod settings;
pub mod shed;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod trace;

pub use error::ApiError;
