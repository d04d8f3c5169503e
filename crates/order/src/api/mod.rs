//! What calls the order use cases: the gRPC API and the event consumers.

pub mod amqp;
pub mod grpc;
