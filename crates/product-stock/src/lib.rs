//! The product-stock service: the catalog, the stock truth in PostgreSQL and the Redis stock gate
//! that lets thousands of concurrent buyers through without ever overselling (ARCHITECTURE §2, §4).
//! This crate is the library; `main.rs` only loads settings and runs what [`startup::build`]
//! returns.

pub mod adapters;
pub mod app;
pub mod config;
pub mod domain;
pub mod migration;
pub mod startup;
