//! Adapters between the outside world and the product-stock use cases.

pub mod grpc;
