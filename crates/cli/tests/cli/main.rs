//! The `flashsale` binary against real services: token, health, the product commands, the
//! order commands (with bad input refused with the server's reason), the shipment commands and
//! the sale driver, the benchmark, and the contract checks against a running deployment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basics;
mod bench;
mod deploy_settings;
mod dlq;
mod full_stack;
mod health;
mod helpers;
mod logs;
mod order;
mod product;
mod sale;
mod sale_deadlines;
mod shipment;
mod timeline;
mod trace_sink;
mod verify;
