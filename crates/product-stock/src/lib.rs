//! The product-stock service: the catalog, the stock truth in PostgreSQL and the Redis stock gate
//! that lets thousands of concurrent buyers through without ever overselling
//! (docs/architecture.md#services, docs/architecture.md#the-stock-model).
//! This crate is the library; `main.rs` only loads settings and runs what [`startup::build`]
//! returns.
//!
//! Layers: `api` (gRPC and AMQP) calls the use cases in `app`, which call `infra` (the
//! database and the Redis gate); `domain` holds the types and rules every layer shares.

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
#[cfg(feature = "testing")]
pub mod testing;
