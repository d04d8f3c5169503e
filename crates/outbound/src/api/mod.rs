//! What calls the outbound use cases: the gRPC API and the `order.paid` consumer.

pub mod amqp;
pub mod grpc;
