//! The outbound service: ships paid orders, committing the stock at shipment, and reports failed
//! shipments so the saga refunds and returns the unit (docs/architecture.md#the-order-saga).
//! This crate is the library; `main.rs` parses the command line and runs what
//! [`startup::build`] returns or applies the migrations.

pub mod api;
pub mod app;
pub mod config;
pub mod domain;
pub mod infra;
pub mod migration;
pub mod startup;
