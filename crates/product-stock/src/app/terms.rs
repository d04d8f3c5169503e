//! The terms of each product the gate sells it by (price, sale price, per-user limit, sale
//! window), read once and kept in memory for the hot path. UpdateProduct changes them: the
//! replica that applied it forgets its copy at once, and every other replica when the
//! `product.updated` event reaches it (or everything when its broker connection comes back,
//! since events may have been missed meanwhile).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

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
    /// Bumped by every forget: terms read from the database before it are not kept.
    generation: Arc<AtomicU64>,
}

impl Terms {
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            db,
            cache: Arc::default(),
            generation: Arc::default(),
        }
    }

    /// The terms of `sku`, from memory or the database.
    pub async fn get(&self, sku: &Sku) -> Result<ProductTerms, StockError> {
        if let Some(t) = self.cache.read().await.get(sku) {
            return Ok(t.clone());
        }
        let generation = self.generation.load(Ordering::Acquire);
        let t = db::terms(&self.db, sku)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        let mut cache = self.cache.write().await;
        // A change committed while they were read: they may be the old ones, so they are
        // used for this call only.
        if self.generation.load(Ordering::Acquire) == generation {
            cache.insert(sku.clone(), t.clone());
        }
        Ok(t)
    }

    /// `sku`'s terms changed: read them again next time.
    pub async fn forget(&self, sku: &str) {
        let mut cache = self.cache.write().await;
        self.generation.fetch_add(1, Ordering::AcqRel);
        cache.retain(|k, _| k.as_str() != sku);
    }

    /// Every product's terms may have changed (events were missed): read them all again.
    pub async fn clear(&self) {
        let mut cache = self.cache.write().await;
        self.generation.fetch_add(1, Ordering::AcqRel);
        cache.clear();
    }
}
