//! The warehouse port: picking and shipping a unit. The default adapter always succeeds; the
//! flaky one fails a configured fraction of shipments (decided by the shipment id, so a retry of
//! the same shipment gets the same answer) or every shipment of given SKUs — for demos and for
//! tests of the compensation path. Real warehouse integrations implement [`Warehouse`].

use std::collections::HashSet;

use crate::domain::Shipment;

/// Why the warehouse did not ship.
#[derive(Debug, thiserror::Error)]
pub enum WarehouseError {
    /// It cannot ship this, ever (out of stock on the shelf, damaged, …).
    #[error("{0}")]
    Permanent(String),
    /// Try again later.
    #[error("{0}")]
    Transient(String),
}

#[tonic::async_trait]
pub trait Warehouse: Send + Sync + 'static {
    /// Picks and ships `shipment`. The shipment id is the request id: a warehouse must ship
    /// each shipment once however often it is asked (outbound asks again after a crash or a
    /// lost answer). Outbound asks only once the order's units are deducted on product-stock.
    async fn ship(&self, shipment: &Shipment) -> Result<(), WarehouseError>;
}

/// Ships everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct AlwaysShips;

#[tonic::async_trait]
impl Warehouse for AlwaysShips {
    async fn ship(&self, _: &Shipment) -> Result<(), WarehouseError> {
        Ok(())
    }
}

/// Fails `fail_fraction` of shipments and every shipment of `fail_skus`.
#[derive(Clone, Debug)]
pub struct FlakyWarehouse {
    fail_fraction: f64,
    fail_skus: HashSet<String>,
}

impl FlakyWarehouse {
    pub fn new(fail_fraction: f64, fail_skus: impl IntoIterator<Item = String>) -> Self {
        Self {
            fail_fraction,
            fail_skus: fail_skus.into_iter().collect(),
        }
    }

    fn fails(&self, s: &Shipment) -> bool {
        if self.fail_skus.contains(&s.sku) {
            return true;
        }
        // A hash of the id as a fraction of u64::MAX: stable per shipment, uniform even though
        // UUIDs carry fixed version and variant bits.
        let (hi, lo) = s.shipment_id.as_u64_pair();
        let mut x = hi ^ lo.rotate_left(17);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        (x as f64 / u64::MAX as f64) < self.fail_fraction
    }
}

#[tonic::async_trait]
impl Warehouse for FlakyWarehouse {
    async fn ship(&self, s: &Shipment) -> Result<(), WarehouseError> {
        if self.fails(s) {
            Err(WarehouseError::Permanent(format!(
                "the warehouse could not pick {} × {}",
                s.quantity, s.sku
            )))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Policy, ShipmentStatus};

    fn shipment(sku: &str) -> Shipment {
        Shipment {
            shipment_id: uuid::Uuid::new_v4(),
            order_id: uuid::Uuid::new_v4(),
            user_id: "u".into(),
            sku: sku.into(),
            quantity: 1,
            policy: Policy::ReserveThenCommit,
            status: ShipmentStatus::Picking,
            failure_reason: None,
            attempts: 0,
            stock_committed: false,
            last_error: String::new(),
            next_attempt_at: chrono::Utc::now(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        }
    }

    #[tokio::test]
    async fn flaky_warehouse_fails_about_its_fraction_and_always_the_same_shipments() {
        let w = FlakyWarehouse::new(0.25, ["BAD".to_owned()]);
        let all: Vec<Shipment> = (0..4000).map(|_| shipment("OK")).collect();
        let mut failed = 0;
        for s in &all {
            let first = w.ship(s).await.is_err();
            assert_eq!(
                first,
                w.ship(s).await.is_err(),
                "a retry got another answer"
            );
            failed += usize::from(first);
        }
        assert!((800..1200).contains(&failed), "{failed} of 4000 failed");
        assert!(w.ship(&shipment("BAD")).await.is_err());
        assert!(AlwaysShips.ship(&shipment("BAD")).await.is_ok());
    }
}
