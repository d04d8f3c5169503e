//! A product's sale window and sale price (docs/adr/0008-sale-window-on-the-product.md).
//! Existing products have none: they stay on sale from their creation, at their price.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261207_000003_sale_window"
    }
}

const UP: &str = r#"
ALTER TABLE products
    ADD COLUMN sale_start timestamptz,
    ADD COLUMN sale_end timestamptz,
    ADD COLUMN sale_price_cents bigint,
    ADD CONSTRAINT products_sale_window CHECK (sale_end > sale_start),
    ADD CONSTRAINT products_sale_price CHECK (sale_price_cents BETWEEN 0 AND price_cents);
"#;

// See m0001_stock for why the elided lifetime stays.
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
