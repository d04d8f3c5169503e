//! The flashsale v1 contract as Rust: tonic clients and servers and prost messages generated
//! at build time from `proto/`, and the encoded file-descriptor set for server reflection.
//! Nothing else lives here.

#![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]

/// Encoded `google.protobuf.FileDescriptorSet` of every flashsale `.proto` file.
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

/// Names of every gRPC service in the contract, as reflection lists them.
pub const SERVICE_NAMES: &[&str] = &[
    "flashsale.product.v1.ProductStockService",
    "flashsale.order.v1.OrderService",
    "flashsale.outbound.v1.OutboundService",
    "flashsale.admin.v1.DeadLetterService",
];
