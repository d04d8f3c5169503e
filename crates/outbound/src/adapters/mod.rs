//! Adapters between the outside world and the outbound use cases.

pub mod amqp;
pub mod db;
pub mod grpc;
pub mod stock;
pub mod warehouse;
