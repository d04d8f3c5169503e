//! Integration tests of the product-stock service against real PostgreSQL (one fresh database per test).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod foundation;
mod helpers;
