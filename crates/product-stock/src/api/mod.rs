//! What calls the product-stock use cases: the gRPC service and the event consumers.

pub mod amqp;
pub mod grpc;
