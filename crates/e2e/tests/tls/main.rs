//! TLS everywhere, against real servers: private PostgreSQL, Redis and RabbitMQ that speak only
//! TLS and want a client certificate from a CA made for the test; the gRPC server with mutual
//! TLS; a URL that asks for TLS failing against a plain server instead of falling back; and the
//! three service binaries selling, paying and shipping over mutual TLS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod grpc;
mod stack;
mod stores;
