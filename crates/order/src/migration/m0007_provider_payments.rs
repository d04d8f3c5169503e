//! Payments through the provider (docs/architecture.md#payments): one provider payment per
//! order (what PayOrder started and the provider's notification must match), and refunds with
//! real states. A refund is REQUESTED until the provider pays it (SUCCEEDED); the refund worker
//! retries it with backoff (`attempts`, `next_attempt_at`, `last_error`) and parks it FAILED
//! after `payment.refund_max_attempts`.
//!
//! Refunds recorded before this version (RECORDED) were never requested from any provider: the
//! payments they return were the buyers' word. They are parked FAILED with a note, so an
//! operator sees them (ListRefunds, `flashsale_refunds_unsettled`) and settles them by hand;
//! COMPLETED becomes SUCCEEDED.

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261210_000001_provider_payments"
    }
}

const UP: &str = r#"
CREATE TABLE provider_payments (
    provider_payment_id text PRIMARY KEY,
    order_id            uuid NOT NULL UNIQUE REFERENCES orders (order_id),
    amount_cents        bigint NOT NULL CHECK (amount_cents >= 0),
    currency            text NOT NULL,
    checkout_url        text NOT NULL,
    status              text NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'SUCCEEDED')),
    created_at          timestamptz NOT NULL DEFAULT now(),
    confirmed_at        timestamptz
);

ALTER TABLE refunds DROP CONSTRAINT IF EXISTS refunds_status_check;
ALTER TABLE refunds
    ADD COLUMN currency        text NOT NULL DEFAULT '',
    ADD COLUMN attempts        integer NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN last_error      text NOT NULL DEFAULT '',
    ADD COLUMN updated_at      timestamptz NOT NULL DEFAULT now();
UPDATE refunds SET status = 'FAILED',
    last_error = 'recorded before refunds went through the payment provider: settle it by hand'
    WHERE status = 'RECORDED';
UPDATE refunds SET status = 'SUCCEEDED' WHERE status = 'COMPLETED';
ALTER TABLE refunds ALTER COLUMN status SET DEFAULT 'REQUESTED';
ALTER TABLE refunds ADD CONSTRAINT refunds_status_known
    CHECK (status IN ('REQUESTED', 'SUCCEEDED', 'FAILED'));
CREATE INDEX refunds_due ON refunds (next_attempt_at) WHERE status = 'REQUESTED';
CREATE INDEX refunds_by_status ON refunds (status, created_at, order_id);
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
