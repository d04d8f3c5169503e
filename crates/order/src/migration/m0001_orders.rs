//! Orders with their status history, payments (PayOrder idempotency), refunds (one per order)
//! and a NOTIFY on every order change for WatchOrder.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

/// The `NOTIFY` channel carrying the id of every changed order.
pub const ORDER_CHANGES_CHANNEL: &str = "flashsale_order_changes";

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000001_orders"
    }
}

const UP: &str = r#"
CREATE TABLE orders (
    order_id         uuid PRIMARY KEY,
    user_id          text NOT NULL,
    request_id       text NOT NULL,
    sku              text NOT NULL,
    quantity         bigint NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint NOT NULL CHECK (unit_price_cents >= 0),
    total_cents      bigint NOT NULL CHECK (total_cents = quantity * unit_price_cents),
    deduction_policy text NOT NULL,
    status           text NOT NULL CHECK (status IN ('PENDING', 'AWAITING_PAYMENT', 'PAID', 'SHIPPED', 'CANCELLED')),
    cancel_reason    text CHECK ((status = 'CANCELLED') = (cancel_reason IS NOT NULL)),
    payment_deadline timestamptz,
    payment_id       text UNIQUE,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT orders_one_per_key UNIQUE (user_id, request_id)
);
CREATE INDEX orders_by_user ON orders (user_id, created_at DESC, order_id DESC);
CREATE INDEX orders_by_time ON orders (created_at DESC, order_id DESC);
CREATE INDEX orders_due ON orders (payment_deadline) WHERE status = 'AWAITING_PAYMENT';

CREATE TABLE order_status_history (
    id          bigserial PRIMARY KEY,
    order_id    uuid NOT NULL REFERENCES orders (order_id),
    from_status text,
    to_status   text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_status_history_by_order ON order_status_history (order_id, id);

-- Every PayOrder ever answered, accepted or refused: a repeat gets the same answer.
CREATE TABLE payments (
    payment_id   text PRIMARY KEY,
    order_id     uuid NOT NULL REFERENCES orders (order_id),
    amount_cents bigint NOT NULL,
    accepted     boolean NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE refunds (
    order_id     uuid PRIMARY KEY REFERENCES orders (order_id),
    payment_id   text NOT NULL,
    amount_cents bigint NOT NULL CHECK (amount_cents >= 0),
    reason       text NOT NULL,
    status       text NOT NULL DEFAULT 'RECORDED' CHECK (status IN ('RECORDED', 'COMPLETED')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION flashsale_order_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('flashsale_order_changes', NEW.order_id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER orders_notify AFTER INSERT OR UPDATE ON orders
    FOR EACH ROW EXECUTE FUNCTION flashsale_order_changed();
CREATE TRIGGER refunds_notify AFTER INSERT OR UPDATE ON refunds
    FOR EACH ROW EXECUTE FUNCTION flashsale_order_changed();
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
