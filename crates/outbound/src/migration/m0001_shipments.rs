//! Shipments (one per paid order) and every attempt to ship one.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000001_shipments"
    }
}

const UP: &str = r#"
CREATE TABLE shipments (
    shipment_id    uuid PRIMARY KEY,
    order_id       uuid NOT NULL UNIQUE,
    user_id        text NOT NULL,
    sku            text NOT NULL,
    quantity       bigint NOT NULL CHECK (quantity > 0),
    policy         text NOT NULL CHECK (policy IN ('RESERVE_THEN_COMMIT', 'COMMIT_AT_ORDER')),
    payment_id     text NOT NULL,
    status         text NOT NULL CHECK (status IN ('PICKING', 'SHIPPED', 'FAILED')),
    failure_reason text,
    attempts       integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shipments_by_time ON shipments (created_at DESC, shipment_id DESC);
CREATE INDEX shipments_open ON shipments (updated_at) WHERE status = 'PICKING';

CREATE TABLE shipment_attempts (
    id          bigserial PRIMARY KEY,
    shipment_id uuid NOT NULL REFERENCES shipments (shipment_id),
    attempt     integer NOT NULL,
    step        text NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('OK', 'TRANSIENT', 'PERMANENT')),
    detail      text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shipment_attempts_by_shipment ON shipment_attempts (shipment_id, id);
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
