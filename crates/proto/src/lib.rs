//! The flashsale v1 contract as Rust: tonic clients and servers and prost messages generated
//! at build time from `proto/`, and the encoded file-descriptor set for server reflection and
//! gateways. Nothing else lives here.

#![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]

/// Encoded `google.protobuf.FileDescriptorSet` of every `.proto` file under `proto/` with all
/// their imports: the flashsale packages, the `google.rpc` error details a refusal carries
/// (`Status`, `ErrorInfo`, `BadRequest`, …) and the `google.protobuf` types they use. It is
/// self-contained, so a gateway or `grpcurl --protoset` can load it alone; `flashsale contract
/// descriptor-set --out FILE` writes it to a file.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/flashsale_descriptor.bin"));

pub mod product {
    pub mod v1 {
        tonic::include_proto!("flashsale.product.v1");
    }
}

pub mod order {
    pub mod v1 {
        tonic::include_proto!("flashsale.order.v1");
    }
}

pub mod outbound {
    pub mod v1 {
        tonic::include_proto!("flashsale.outbound.v1");
    }
}

pub mod payment {
    pub mod v1 {
        tonic::include_proto!("flashsale.payment.v1");
    }
}

pub mod admin {
    pub mod v1 {
        tonic::include_proto!("flashsale.admin.v1");
    }
}

pub mod events {
    pub mod v1 {
        tonic::include_proto!("flashsale.events.v1");
    }
}

/// Names of every gRPC service in the contract. Each service's reflection lists only the ones
/// it serves.
pub const SERVICE_NAMES: &[&str] = &[
    "flashsale.product.v1.ProductStockService",
    "flashsale.order.v1.OrderService",
    "flashsale.order.v1.PaymentNotificationService",
    "flashsale.outbound.v1.OutboundService",
    "flashsale.admin.v1.DeadLetterService",
    "flashsale.admin.v1.OrderTimelineService",
    "flashsale.payment.v1.PaymentProviderService",
];
