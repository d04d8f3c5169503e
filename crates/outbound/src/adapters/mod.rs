//! Adapters between the outside world and the outbound use cases.

pub mod grpc;
