//! The `flashsale` binary against real services: token, health, the product commands and the
//! order commands (with bad input refused with the server's reason).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod basics;
mod helpers;
mod order;
mod product;
