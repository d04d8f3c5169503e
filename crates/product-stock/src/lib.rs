//! The product-stock service: the catalog, the stock truth in PostgreSQL and the Redis stock gate
//! that lets thousands of concurrent buyers through without ever overselling
//! (docs/architecture.md#services, docs/architecture.md#the-stock-model).
//! This crate is the library; `main.rs` only loads settings and runs what [`startup::build`]
//! returns.
//!
//! Layers: `api` (gRPC and AMQP) calls the use cases in `app`, which call `infra` (the
//! database and the Redis gate); `domain` holds the types and rules every layer shares.

pub mod api;
pub mod app;
pub mod config;
pub mod domain;
pub mod infra;
pub mod migration;
pub mod startup;
