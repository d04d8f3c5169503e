//! The order service: the API buyers reach through their gateway, and the order saga
//! (docs/architecture.md#the-order-saga). This crate is the library; `main.rs` only loads
//! settings and runs what [`startup::build`] returns.
//!
//! `api` (gRPC handlers, event consumers) calls the use cases in `app`, which call `infra`
//! (the database, product-stock, the change feed); `domain` holds the types and rules.

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
