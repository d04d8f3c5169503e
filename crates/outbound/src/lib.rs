//! The outbound service: ships paid orders, committing the stock at shipment, and reports failed
//! shipments so the saga refunds and returns the unit (ARCHITECTURE §3). This crate is the library;
//! `main.rs` only loads settings and runs what [`startup::build`] returns.

pub mod api;
pub mod app;
pub mod config;
pub mod domain;
pub mod infra;
pub mod migration;
pub mod startup;
