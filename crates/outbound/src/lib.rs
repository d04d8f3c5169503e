//! The outbound service: ships paid orders, committing the stock at shipment, and reports failed
//! shipments so the saga refunds and returns the unit (docs/architecture.md#the-order-saga).
//! This crate is the library; `main.rs` parses the command line and runs what
//! [`startup::build`] returns or applies the migrations.

/// The layers are the crate's own: private, or public with the `internals` feature, which only
/// the crate's own integration tests turn on.
macro_rules! layers {
    ($($layer:ident),* $(,)?) => {$(
        #[cfg(feature = "internals")]
        pub mod $layer;
        // Without the feature, what only the crate's own tests use is unused here.
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code, unused_imports)]
        mod $layer;
    )*};
}

layers!(api, app, domain, infra, migration);
pub mod config;
pub mod startup;
