//! Product-stock use cases over the database, the Redis gate and the outbox. The gRPC service
//! and the event consumers call these; nothing here knows about tonic or lapin.
//!
//! One small handle per group of use cases, each holding only what it needs and cheap to
//! clone: [`Catalog`] (products and their adjustments), [`Reservations`] (reservations through the
//! Redis gate and the gate's buyers), [`StockSaga`] (product-stock's steps of the order saga,
//! `CommitReservation` included) and [`Reconciler`] (the gate against the database, and the
//! sweeper of expired holds). [`Terms`] is the cache of product terms they share.

use flashsale_platform::failpoint::Failpoints;

use crate::{domain::StockError, infra::gate::GateError};

mod catalog;
mod commit_batch;
mod metric_help;
mod reconcile;
mod reservations;
mod saga;
mod saga_batch;
mod terms;

pub use catalog::Catalog;
pub use metric_help::describe as describe_metrics;
pub use commit_batch::{CommitBatcher, Committed, commit_batcher};
pub use reconcile::{DriftReport, GATE_DRIFT, HOLD_SWEEP, Reconciler, Settled};
pub use reservations::{Reservations, Reserved};
pub use saga::StockSaga;
pub use saga_batch::{Created, CreatedBatcher, created_batcher};
pub use terms::Terms;

/// The name this service signs its events with.
pub const PRODUCER: &str = "product-stock";

async fn failpoint(failpoints: &Failpoints, name: &str) -> Result<(), StockError> {
    failpoints
        .hit(name)
        .await
        .map_err(|e| StockError::Internal(anyhow::Error::new(e)))
}

fn gate_err(e: GateError) -> StockError {
    match e {
        GateError::Unavailable(m) => StockError::GateUnavailable(m.to_string()),
        other => StockError::Internal(anyhow::anyhow!("stock gate: {other}")),
    }
}
