//! The order service: the API buyers reach through their gateway, and the order saga
//! (docs/architecture.md#the-order-saga). This crate is the library; `main.rs` only loads
//! settings and runs what [`startup::build`] returns.
//!
//! `api` (gRPC handlers, event consumers) calls the use cases in `app`, which call `infra`
//! (the database, product-stock, the change feed); `domain` holds the types and rules.

pub mod api;
pub mod app;
pub mod config;
pub mod domain;
pub mod infra;
pub mod migration;
pub mod startup;
