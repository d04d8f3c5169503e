//! Creating, reading, listing and restocking products.

use flashsale_contract::MAX_UNITS;
use flashsale_messaging::{envelope, outbox};
use flashsale_platform::failpoint::Failpoints;
use flashsale_proto::events::v1::{ProductUpdated, StockAdjusted, envelope::Payload};
use sea_orm::{DatabaseConnection, TransactionTrait as _};

use super::{PRODUCER, Reservations, failpoint, gate_err};
use crate::{
    domain::{Adjustment, Product, ProductDraft, ProductUpdate, Sku, StockError, etag_of},
    infra::{
        db,
        gate::{NOT_LOADED_GENERATION, RedisGate, WriteOffOutcome},
    },
};

/// Largest and default page of ListProducts.
pub const MAX_PAGE_SIZE: u32 = 500;
pub const DEFAULT_PAGE_SIZE: u32 = 50;
const TOKEN_PREFIX: &str = "p1.";

/// A product and the gate's counter for it (`None` while the gate has not loaded it).
pub type ProductView = (Product, Option<i64>);

/// The catalog's use cases: products and their stock adjustments. Cheap to clone.
#[derive(Clone)]
pub struct Catalog {
    db: DatabaseConnection,
    gate: RedisGate,
    /// Rebuilds a lost gate before a write-off is checked against it.
    reservations: Reservations,
    failpoints: Failpoints,
}

impl Catalog {
    pub fn new(
        db: DatabaseConnection,
        gate: RedisGate,
        reservations: Reservations,
        failpoints: Failpoints,
    ) -> Self {
        Self {
            db,
            gate,
            reservations,
            failpoints,
        }
    }

    /// Creates a product and seeds the gate with its initial stock.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(sku = %draft.sku))]
    pub async fn create_product(&self, draft: ProductDraft) -> Result<ProductView, StockError> {
        let txn = self.db.begin().await?;
        db::insert_product(&txn, &draft).await?;
        let product = db::product(&txn, &draft.sku, false).await?.ok_or_else(|| {
            StockError::Internal(anyhow::anyhow!("product vanished in its own transaction"))
        })?;
        txn.commit().await?;
        // A gate that cannot be seeded now is seeded by the first reservation instead.
        if let Err(e) = self.seed(&product).await {
            tracing::warn!(error = %e, "could not seed the gate; the first reservation will");
        }
        self.view(product).await
    }

    /// Loads a new product's gate. Buckets are seeded under the stock row lock, as a rebuild
    /// loads them, so a reservation that found them missing meanwhile and rebuilt them is not
    /// followed by a second load of some of them.
    async fn seed(&self, product: &Product) -> Result<(), StockError> {
        let sku = product.sku.as_str();
        if product.stock_buckets == 1 {
            self.gate
                .load(sku, product.gate_target(), &[])
                .await
                .map_err(gate_err)?;
            return Ok(());
        }
        let txn = self.db.begin().await?;
        let Some(locked) = db::product(&txn, &product.sku, true).await? else {
            return Ok(());
        };
        let states = self
            .gate
            .bucket_states(sku, locked.stock_buckets)
            .await
            .map_err(gate_err)?;
        if states.iter().all(Option::is_none) {
            let now_ms = chrono::Utc::now().timestamp_millis();
            self.gate
                .load_product(
                    sku,
                    locked.stock_buckets,
                    locked.gate_target(),
                    &[],
                    &[],
                    now_ms,
                )
                .await
                .map_err(gate_err)?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// Changes a product's terms (UpdateProduct): `(product, replayed)`. In one transaction,
    /// under the product row's lock: the etag check, the rules of
    /// [`ProductUpdate::apply`], the new terms, the request id and a `product.updated` event;
    /// then this replica forgets its copy of the terms (the others when the event reaches them).
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(sku = %u.sku))]
    pub async fn update_product(&self, u: ProductUpdate) -> Result<(ProductView, bool), StockError> {
        let digest = u.digest();
        let txn = self.db.begin().await?;
        if let Some(first) = db::product_update(&txn, &u.request_id).await? {
            txn.commit().await?;
            return self.replayed_update(&u, &digest, first).await;
        }
        let current = db::product_for_update(&txn, &u.sku)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(u.sku.to_string()))?;
        if let Some(etag) = u.etag
            && etag != current.version
        {
            return Err(StockError::EtagMismatch {
                given: etag_of(etag),
                current: etag_of(current.version),
            });
        }
        let terms = u.apply(&current, chrono::Utc::now().timestamp_millis())?;
        let version = db::update_terms(&txn, &u.sku, &terms).await?;
        if !db::insert_product_update(&txn, &u.request_id, &u.sku, &digest, version).await? {
            // A concurrent twin with the same request id committed first.
            drop(txn);
            let first = db::product_update(&self.db, &u.request_id)
                .await?
                .ok_or_else(|| StockError::Internal(anyhow::anyhow!("update twin vanished")))?;
            return self.replayed_update(&u, &digest, first).await;
        }
        let event = ProductUpdated {
            sku: u.sku.to_string(),
            etag: etag_of(version),
            fields: u.fields().into_iter().map(str::to_owned).collect(),
        };
        let env = envelope::new(
            Payload::ProductUpdated(event),
            u.sku.as_str(),
            "",
            PRODUCER,
        );
        outbox::enqueue(&txn, &env).await?;
        txn.commit().await?;
        self.reservations.forget_terms(u.sku.as_str()).await;
        tracing::info!(fields = ?u.fields(), version, "product terms updated");
        Ok((self.get_product(&u.sku).await?, false))
    }

    /// The answer to a request id used before: the product as it is now, if the request is
    /// the same.
    async fn replayed_update(
        &self,
        u: &ProductUpdate,
        digest: &str,
        (sku, first): (String, String),
    ) -> Result<(ProductView, bool), StockError> {
        if sku != u.sku.as_str() || first != digest {
            return Err(StockError::IdempotencyKeyReused("request_id"));
        }
        Ok((self.get_product(&u.sku).await?, true))
    }

    /// One product with its figures.
    pub async fn get_product(&self, sku: &Sku) -> Result<ProductView, StockError> {
        let product = db::product(&self.db, sku, false)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        self.view(product).await
    }

    async fn view(&self, product: Product) -> Result<ProductView, StockError> {
        let gate = self
            .gate
            .product_snapshot(product.sku.as_str(), product.stock_buckets)
            .await
            .map_err(gate_err)?;
        Ok((product, gate.map(|g| g.available)))
    }

    /// A page of products by sku and the token of the next page ("" at the end).
    pub async fn list_products(
        &self,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<ProductView>, String), StockError> {
        let size = match page_size {
            n if n < 0 => return Err(StockError::invalid("page_size", "must not be negative")),
            0 => DEFAULT_PAGE_SIZE,
            n => u32::try_from(n).unwrap_or(MAX_PAGE_SIZE).min(MAX_PAGE_SIZE),
        };
        let after = decode_token(page_token)?;
        let mut products = db::list_products(&self.db, &after, u64::from(size) + 1).await?;
        let next = if products.len() > size as usize {
            products.truncate(size as usize);
            products
                .last()
                .map(|p| encode_token(p.sku.as_str()))
                .unwrap_or_default()
        } else {
            String::new()
        };
        let mut views = Vec::with_capacity(products.len());
        for p in products {
            views.push(self.view(p).await?);
        }
        Ok((views, next))
    }

    /// Restock or write-off: the database first, with a `stock.adjusted` event in the same
    /// transaction; the gate follows (now, and again from the event, idempotently).
    ///
    /// A write-off may take only the units that are free: on_hand − reserved in the database,
    /// less the units the gate holds for orders acknowledged to their buyers but not yet
    /// persisted (docs/reliability.md, "Admin stock changes and acknowledged orders"). The
    /// gate checks and takes them atomically under the stock row lock; a refusal rolls the
    /// transaction back and changes nothing.
    #[tracing::instrument(target = "flashsale::log_scope", skip_all, fields(sku = %adj.sku, request_id = %adj.request_id))]
    pub async fn adjust_stock(&self, adj: Adjustment) -> Result<(ProductView, bool), StockError> {
        if adj.delta < 0 {
            self.gate_loaded(&adj).await?;
        }
        let txn = self.db.begin().await?;
        if let Some(first) = db::adjustment(&txn, &adj.request_id).await? {
            txn.commit().await?;
            return self.replayed_adjustment(&adj, first).await;
        }
        let product = db::product(&txn, &adj.sku, true)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(adj.sku.to_string()))?;
        // A restock may not take on_hand past the largest stock figure (the gate's arithmetic
        // stays exact below it); checked before anything is written.
        let on_hand = product
            .on_hand
            .checked_add(adj.delta)
            .filter(|n| *n <= MAX_UNITS)
            .ok_or_else(|| {
                StockError::invalid("delta", format!("would take on_hand above {MAX_UNITS}"))
            })?;
        if !db::insert_adjustment(&txn, &adj).await? {
            // A concurrent twin with the same request id committed first.
            drop(txn);
            let first = db::adjustment(&self.db, &adj.request_id)
                .await?
                .ok_or_else(|| StockError::Internal(anyhow::anyhow!("adjustment twin vanished")))?;
            return self.replayed_adjustment(&adj, first).await;
        }
        // The gate's generation, read under the stock row lock (a rebuild takes it too): the
        // gate follows this adjustment only while it is still in this generation. Without Redis
        // nothing is committed: the admin retries with the same request id.
        let generation = self
            .gate
            .product_generation(adj.sku.as_str(), product.stock_buckets)
            .await
            .map_err(gate_err)?;
        // A write-off leaves the gate first, under the lock, and only if its units are free
        // there: should the commit fail, the gate sells fewer units for a while, never more. A
        // restock reaches the gate only after the commit (see `StockSaga`'s release): units the
        // database does not have yet are never on sale. Either way the `stock.adjusted` event
        // applies it later if this does not, once.
        if adj.delta < 0 {
            self.take_free_units(&adj, &product, &generation).await?;
        }
        if !db::move_stock(&txn, &adj.sku, adj.delta, 0).await? {
            // Unreachable while the gate checked `on_hand − reserved` under the row lock.
            return Err(StockError::WriteOffAboveFree(
                (product.on_hand - product.reserved).max(0),
            ));
        }
        let kind = if adj.delta > 0 {
            "RESTOCK"
        } else {
            "WRITE_OFF"
        };
        db::ledger(&txn, &adj.sku, kind, adj.delta, 0, &adj.request_id).await?;
        let event = StockAdjusted {
            request_id: adj.request_id.clone(),
            sku: adj.sku.to_string(),
            delta: adj.delta,
            on_hand,
            reserved: product.reserved,
            reason: adj.reason.clone(),
            gate_generation: generation.clone(),
        };
        let env = envelope::new(
            Payload::StockAdjusted(event),
            adj.sku.as_str(),
            "",
            PRODUCER,
        );
        outbox::enqueue(&txn, &env).await?;
        failpoint(&self.failpoints, "stock.adjust.before_commit").await?;
        txn.commit().await?;
        if adj.delta > 0 {
            self.gate_follows(&adj, product.stock_buckets, &generation)
                .await;
        }
        Ok((self.get_product(&adj.sku).await?, false))
    }

    /// Before a write-off: a gate that lost the product is rebuilt first (from the database
    /// and the order service's pending orders), so the orders acknowledged while it was lost
    /// hold their units again and the write-off cannot take them. A replay needs no gate.
    async fn gate_loaded(&self, adj: &Adjustment) -> Result<(), StockError> {
        if db::adjustment(&self.db, &adj.request_id).await?.is_some() {
            return Ok(());
        }
        let product = db::product(&self.db, &adj.sku, false)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(adj.sku.to_string()))?;
        let generation = self
            .gate
            .product_generation(adj.sku.as_str(), product.stock_buckets)
            .await
            .map_err(gate_err)?;
        if generation == NOT_LOADED_GENERATION {
            self.reservations.rebuild_gate(&adj.sku).await?;
        }
        Ok(())
    }

    /// Takes a write-off's units out of the gate if they are free (see [`Self::adjust_stock`]);
    /// `product` was read under the stock row lock the caller's transaction holds.
    async fn take_free_units(
        &self,
        adj: &Adjustment,
        product: &Product,
        generation: &str,
    ) -> Result<(), StockError> {
        let db_free = product.on_hand - product.reserved;
        let outcome = if generation == NOT_LOADED_GENERATION {
            WriteOffOutcome::NotLoaded
        } else {
            self.gate
                .write_off_product(
                    adj.sku.as_str(),
                    product.stock_buckets,
                    &adj.request_id,
                    -adj.delta,
                    generation,
                    db_free,
                )
                .await
                .map_err(gate_err)?
        };
        match outcome {
            WriteOffOutcome::Applied => Ok(()),
            WriteOffOutcome::Refused { free } => {
                metrics::counter!("flashsale_write_offs_refused_total").increment(1);
                Err(StockError::WriteOffAboveFree(free))
            }
            // The gate was lost (again) since it was loaded: nothing was taken, and the retry
            // rebuilds it first.
            WriteOffOutcome::NotLoaded | WriteOffOutcome::Rebuilt => {
                Err(StockError::GateUnavailable(
                    "the stock gate lost the product during the write-off; retry".into(),
                ))
            }
        }
    }

    async fn gate_follows(&self, adj: &Adjustment, buckets: u32, generation: &str) {
        if let Err(e) = self
            .gate
            .adjust_product(
                adj.sku.as_str(),
                buckets,
                &adj.request_id,
                adj.delta,
                generation,
            )
            .await
        {
            tracing::warn!(error = %e, "gate not adjusted now; the stock.adjusted event will");
        }
    }

    async fn replayed_adjustment(
        &self,
        adj: &Adjustment,
        (sku, delta, reason): (String, i64, String),
    ) -> Result<(ProductView, bool), StockError> {
        if sku != adj.sku.as_str() || delta != adj.delta || reason != adj.reason {
            return Err(StockError::IdempotencyKeyReused("request_id"));
        }
        Ok((self.get_product(&adj.sku).await?, true))
    }
}

fn encode_token(last_sku: &str) -> String {
    let hex: String = last_sku.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{TOKEN_PREFIX}{hex}")
}

fn decode_token(token: &str) -> Result<String, StockError> {
    if token.is_empty() {
        return Ok(String::new());
    }
    let bad = || StockError::invalid("page_token", "not a token this server issued");
    let hex = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?.as_bytes();
    if hex.len() % 2 != 0 || hex.len() > 128 {
        return Err(bad());
    }
    // Byte pairs, never string slices: a multi-byte character is refused, not split.
    let digit = |b: u8| char::from(b).to_digit(16).ok_or_else(bad);
    let bytes = hex
        .chunks_exact(2)
        .map(|pair| u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).map_err(|_| bad()))
        .collect::<Result<Vec<u8>, StockError>>()?;
    let sku = String::from_utf8(bytes).map_err(|_| bad())?;
    Sku::parse(&sku).map_err(|_| bad())?;
    // Only the spelling this server writes (lowercase hex): one cursor, one token.
    if encode_token(&sku) != token {
        return Err(bad());
    }
    Ok(sku)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_junk_is_refused() {
        assert_eq!(decode_token(&encode_token("WINE-1.x")).unwrap(), "WINE-1.x");
        assert_eq!(decode_token("").unwrap(), "");
        for junk in [
            "abc", "p1.zz", "p1.6", "p1.7b7d", "p1.aéb", "p1.😀", "p1.é", "p1.+1", "p1.4A", "p1.",
        ] {
            assert!(decode_token(junk).is_err(), "{junk} accepted");
        }
    }

    #[test]
    fn no_generated_token_panics_the_decoder_or_passes_unless_the_encoder_wrote_it() {
        let issued = ["WINE-1.x", "A", "Z9_-.Q"].map(encode_token).to_vec();
        flashsale_test_support::page_tokens::check_decoder(issued, 2048, |t| {
            decode_token(t).ok().map(|sku| encode_token(&sku))
        })
        .unwrap();
    }
}
