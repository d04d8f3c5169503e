//! Adapters between the outside world and the order use cases.

pub mod amqp;
pub mod db;
pub mod grpc;
pub mod stock;
