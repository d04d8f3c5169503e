//! What calls the order use cases: the gRPC API (the buyers' and operators' `OrderService`, the
//! provider's `PaymentNotificationService`) and the event consumers.

pub mod amqp;
pub mod grpc;
pub mod payment;
