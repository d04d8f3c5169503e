//! The hot path: one order takes units through the Redis gate. Nothing touches the database
//! unless the gate has lost the product's keys (then it is rebuilt from the database first).

use crate::{
    adapters::{
        db,
        redis::gate::{GateBuyers, ReserveOutcome},
    },
    domain::{DeductionPolicy, Refusal, ReserveRequest, Sku, StockError},
};

use super::{StockService, gate_err};

/// A successful reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reserved {
    pub unit_price_cents: i64,
    pub policy: DeductionPolicy,
    pub gate_available: i64,
    pub replayed: bool,
}

impl StockService {
    /// Reserves through the gate; refusals are [`StockError::Refused`].
    pub async fn reserve(&self, req: ReserveRequest) -> Result<Reserved, StockError> {
        let terms = self.terms(&req.sku).await?;
        for _ in 0..2 {
            let outcome = self
                .gate
                .reserve(
                    req.sku.as_str(),
                    req.order_id,
                    &req.user_id,
                    req.quantity,
                    terms.per_user_limit,
                    chrono::Utc::now().timestamp_millis(),
                )
                .await
                .map_err(gate_err)?;
            let refused = |r: Refusal, available: i64| {
                metrics::counter!("flashsale_reserve_refused_total", "reason" => r.reason())
                    .increment(1);
                Err(StockError::Refused(r, available))
            };
            return match outcome {
                ReserveOutcome::Reserved {
                    remaining,
                    replayed,
                } => {
                    metrics::counter!("flashsale_reserve_accepted_total").increment(1);
                    Ok(Reserved {
                        unit_price_cents: terms.price_cents,
                        policy: terms.policy,
                        gate_available: remaining,
                        replayed,
                    })
                }
                ReserveOutcome::SoldOut => refused(Refusal::SoldOut, 0),
                ReserveOutcome::InsufficientStock { available } => {
                    refused(Refusal::InsufficientStock, available)
                }
                ReserveOutcome::UserLimitExceeded { .. } => refused(Refusal::UserLimitExceeded, 0),
                ReserveOutcome::Mismatch => Err(StockError::IdempotencyKeyReused("order_id")),
                ReserveOutcome::Released => Err(StockError::ReservationReleased(req.order_id)),
                ReserveOutcome::NotLoaded => {
                    self.rebuild_gate(&req.sku).await?;
                    continue;
                }
            };
        }
        Err(StockError::GateUnavailable(
            "the gate lost the product again while rebuilding".into(),
        ))
    }

    /// The gate's available counter and its buyers of `sku` (see [`GateBuyers`]), rebuilding
    /// the gate first if it lost the product.
    pub async fn gate_buyers(&self, sku: &Sku, max: u32) -> Result<GateBuyers, StockError> {
        // Unknown products are NOT_FOUND, not an empty list.
        self.terms(sku).await?;
        for _ in 0..2 {
            match self
                .gate
                .buyers(sku.as_str(), max)
                .await
                .map_err(gate_err)?
            {
                GateBuyers::NotLoaded => {
                    self.rebuild_gate(sku).await?;
                }
                found => return Ok(found),
            }
        }
        Err(StockError::GateUnavailable(
            "the gate lost the product again while rebuilding".into(),
        ))
    }

    /// Loads a product's gate keys from the database (ARCHITECTURE §6, cold start). Safe to run
    /// on several replicas at once: the gate loads only if the keys are still missing.
    pub async fn rebuild_gate(&self, sku: &Sku) -> Result<bool, StockError> {
        let product = db::product(&self.db, sku, false)
            .await?
            .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))?;
        let users = db::units_by_user(&self.db, sku).await?;
        let loaded = self
            .gate
            .load(sku.as_str(), product.gate_target(), &users)
            .await
            .map_err(gate_err)?;
        if loaded {
            metrics::counter!("flashsale_gate_rebuilds_total").increment(1);
            tracing::warn!(%sku, available = product.gate_target(), "rebuilt the stock gate from the database");
        }
        Ok(loaded)
    }
}
