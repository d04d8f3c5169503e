//! Adapters between the outside world and the product-stock use cases.

pub mod amqp;
pub mod db;
pub mod grpc;
pub mod redis;
