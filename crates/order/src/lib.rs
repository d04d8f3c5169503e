//! The order service: the API buyers reach through their gateway, and the order saga
//! (ARCHITECTURE §3). This crate is the library; `main.rs` only loads settings and runs
//! what [`startup::build`] returns.

pub mod adapters;
pub mod app;
pub mod config;
pub mod domain;
pub mod migration;
pub mod startup;
