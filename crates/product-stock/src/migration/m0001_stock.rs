//! Products, stock (with the CHECK that is the last line of defence against overselling),
//! reservations keyed by order id, the append-only stock ledger and adjustment idempotency.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000001_product_stock"
    }
}

const UP: &str = r#"
CREATE TABLE products (
    sku              text PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9._-]{1,64}$'),
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_cents      bigint NOT NULL CHECK (price_cents >= 0),
    per_user_limit   integer NOT NULL CHECK (per_user_limit >= 0),
    deduction_policy text NOT NULL CHECK (deduction_policy IN ('RESERVE_THEN_COMMIT', 'COMMIT_AT_ORDER')),
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE stock (
    sku        text PRIMARY KEY REFERENCES products (sku),
    on_hand    bigint NOT NULL,
    reserved   bigint NOT NULL DEFAULT 0,
    version    bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_never_oversold CHECK (0 <= reserved AND reserved <= on_hand)
);

-- One row per order that ever touched the stock. A RELEASED row with quantity 0 and cause
-- 'CANCELLED_BEFORE_CREATED' or 'HOLD_EXPIRED' is a tombstone: a late order.created is refused.
CREATE TABLE reservations (
    order_id   uuid PRIMARY KEY,
    sku        text NOT NULL,
    user_id    text NOT NULL,
    quantity   bigint NOT NULL CHECK (quantity >= 0),
    state      text NOT NULL CHECK (state IN ('RESERVED', 'COMMITTED', 'RELEASED')),
    policy     text NOT NULL,
    cause      text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reservations_live_by_user ON reservations (sku, user_id)
    WHERE state IN ('RESERVED', 'COMMITTED');

-- Every movement of on_hand or reserved, with its cause (order id or adjustment request id).
-- Conservation: per sku, on_hand = Σ on_hand_delta and reserved = Σ reserved_delta.
CREATE TABLE stock_ledger (
    id             bigserial PRIMARY KEY,
    sku            text NOT NULL REFERENCES products (sku),
    kind           text NOT NULL CHECK (kind IN ('INITIAL', 'RESTOCK', 'WRITE_OFF', 'RESERVE', 'RELEASE', 'COMMIT')),
    on_hand_delta  bigint NOT NULL,
    reserved_delta bigint NOT NULL,
    cause          text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stock_ledger_by_sku ON stock_ledger (sku, id);

CREATE FUNCTION stock_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stock_ledger is append-only';
END $$;
CREATE TRIGGER stock_ledger_append_only BEFORE UPDATE OR DELETE ON stock_ledger
    FOR EACH ROW EXECUTE FUNCTION stock_ledger_append_only();

-- AdjustStock idempotency: the first answer of each request id.
CREATE TABLE stock_adjustments (
    request_id     text PRIMARY KEY,
    sku            text NOT NULL REFERENCES products (sku),
    delta          bigint NOT NULL,
    reason         text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
"#;

// `SchemaManager<'_>` would satisfy the lint, but after `async_trait`'s expansion its lifetime no
// longer matches the trait's (E0195), so the elided form stays.
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
