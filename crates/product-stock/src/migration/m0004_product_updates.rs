//! UpdateProduct: each product's terms carry a version (its etag, AIP-154), and every applied
//! update its request id, so a retry is answered as a replay.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261207_000004_product_updates"
    }
}

const UP: &str = r#"
ALTER TABLE products ADD COLUMN version bigint NOT NULL DEFAULT 1 CHECK (version >= 1);

CREATE TABLE product_updates (
    request_id text PRIMARY KEY,
    sku        text NOT NULL REFERENCES products (sku),
    -- What the request changed (its fields and values), to tell a replay from a reuse.
    digest     text NOT NULL,
    -- The product's version the update made.
    version    bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
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
