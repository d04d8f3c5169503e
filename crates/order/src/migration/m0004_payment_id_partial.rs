//! `payment_id` stays unique, through a partial index over the orders that have one: every
//! order is written PENDING without a payment, and the plain UNIQUE constraint put a NULL entry
//! into its index for each of them (and again at every non-HOT update).
//!
//! The index is built without `CONCURRENTLY` (migrations run as one script), which blocks
//! order writes while it builds: on a large existing `orders` table, create it by hand first
//! with `CREATE UNIQUE INDEX CONCURRENTLY orders_payment_id_uq ON orders (payment_id) WHERE
//! payment_id IS NOT NULL`; this migration then only drops the old constraint.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261130_000003_orders_payment_id_partial"
    }
}

const UP: &str = r#"
CREATE UNIQUE INDEX IF NOT EXISTS orders_payment_id_uq ON orders (payment_id)
    WHERE payment_id IS NOT NULL;
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_payment_id_key;
"#;

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
