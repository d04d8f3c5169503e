//! Deduct, then ship: a shipment remembers whether its stock was committed on product-stock, the
//! last transient error, and when it is tried again; transient failures delay a shipment and
//! never fail it.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000002_deduct_then_ship"
    }
}

const UP: &str = r#"
ALTER TABLE shipments
    ADD COLUMN stock_committed boolean NOT NULL DEFAULT false,
    ADD COLUMN last_error      text NOT NULL DEFAULT '',
    ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now();
UPDATE shipments SET stock_committed = true
    WHERE status = 'SHIPPED' AND policy = 'RESERVE_THEN_COMMIT';
DROP INDEX IF EXISTS shipments_open;
CREATE INDEX shipments_due ON shipments (next_attempt_at) WHERE status = 'PICKING';
"#;

// async_trait cannot take `SchemaManager<'_>` here (early/late-bound lifetime mismatch).
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(UP)
            .await
            .map(drop)
    }
}
