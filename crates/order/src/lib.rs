//! The order service: the API buyers reach through their gateway, and the order saga
//! (ARCHITECTURE §3). This crate is the library; `main.rs` only loads settings and runs
//! [`startup::Application`].

pub mod adapters;
pub mod config;
pub mod migration;
pub mod startup;
