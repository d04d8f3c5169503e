//! Product-stock use cases over the database, the Redis gate and the outbox. The gRPC adapter
//! and the event consumers call these; nothing here knows about tonic or lapin.

use std::{collections::HashMap, sync::Arc};

use sea_orm::DatabaseConnection;
use tokio::sync::RwLock;

use crate::{
    adapters::redis::gate::RedisGate,
    config::StockSettings,
    domain::{ProductTerms, Sku, StockError},
};

mod catalog;
mod reconcile;
mod reserve;
mod saga;
mod saga_batch;

pub use reconcile::DriftReport;
pub use reserve::Reserved;
pub use saga_batch::{Created, CreatedBatcher, created_batcher};

/// The name this service signs its events with.
pub const PRODUCER: &str = "product-stock";

/// Everything the use cases need. Cheap to clone.
#[derive(Clone)]
pub struct StockService {
    db: DatabaseConnection,
    gate: RedisGate,
    settings: StockSettings,
    /// Product terms never change after creation, so the hot path reads them from memory.
    terms: Arc<RwLock<HashMap<Sku, ProductTerms>>>,
    failpoints: flashsale_platform::failpoint::Failpoints,
}

impl StockService {
    pub fn new(
        db: DatabaseConnection,
        gate: RedisGate,
        settings: StockSettings,
        failpoints: flashsale_platform::failpoint::Failpoints,
    ) -> Self {
        Self {
            db,
            gate,
            settings,
            terms: Arc::default(),
            failpoints,
        }
    }

    pub fn settings(&self) -> &StockSettings {
        &self.settings
    }

    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    pub fn gate(&self) -> &RedisGate {
        &self.gate
    }

    /// The terms of `sku`, from memory or the database.
    async fn terms(&self, sku: &Sku) -> Result<ProductTerms, StockError> {
        if let Some(t) = self.terms.read().await.get(sku) {
            return Ok(t.clone());
        }
        let t = crate::adapters::db::terms(&self.db, sku)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        self.terms.write().await.insert(sku.clone(), t.clone());
        Ok(t)
    }

    async fn failpoint(&self, name: &str) -> Result<(), StockError> {
        self.failpoints
            .hit(name)
            .await
            .map_err(|e| StockError::Internal(anyhow::Error::new(e)))
    }
}

fn gate_err(e: crate::adapters::redis::gate::GateError) -> StockError {
    use crate::adapters::redis::gate::GateError;
    match e {
        GateError::Unavailable(m) => StockError::GateUnavailable(m.to_string()),
        other => StockError::Internal(anyhow::anyhow!("stock gate: {other}")),
    }
}
