//! The terms of each product, read once: they never change after creation, so the hot path
//! reads them from memory.

use std::{collections::HashMap, sync::Arc};

use sea_orm::DatabaseConnection;
use tokio::sync::RwLock;

use crate::{
    domain::{ProductTerms, Sku, StockError},
    infra::db,
};

/// The product terms cache every handle shares. Cheap to clone; clones share one cache.
#[derive(Clone)]
pub struct Terms {
    db: DatabaseConnection,
    cache: Arc<RwLock<HashMap<Sku, ProductTerms>>>,
}

impl Terms {
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            cache: Arc::default(),
        }
    }

    /// The terms of `sku`, from memory or the database.
    pub async fn get(&self, sku: &Sku) -> Result<ProductTerms, StockError> {
        if let Some(t) = self.cache.read().await.get(sku) {
            return Ok(t.clone());
        }
        let t = db::terms(&self.db, sku)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        self.cache.write().await.insert(sku.clone(), t.clone());
        Ok(t)
    }
}
