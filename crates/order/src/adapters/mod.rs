//! Adapters between the outside world and the order use cases.

pub mod grpc;
