//! The `outbox`, `inbox` and `dead_letters` tables, as migrations each service adds to its own
//! migrator:
//!
//! ```text
//! fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!     vec![
//!         Box::new(flashsale_messaging::migration::CreateOutboxAndInbox),
//!         /* … the service's own … */
//!         Box::new(flashsale_messaging::migration::CreateDeadLetters),
//!         Box::new(flashsale_messaging::migration::AddCorrelation),
//!         Box::new(flashsale_messaging::migration::AddDeadLetterCorrelation),
//!     ]
//! }
//! ```

use sea_orm_migration::{
    MigrationName, MigrationTrait, SchemaManager, async_trait,
    sea_orm::{ConnectionTrait as _, DbErr},
};

/// The `NOTIFY` channel the outbox trigger signals on every insert.
pub const OUTBOX_CHANNEL: &str = "flashsale_outbox";

const UP: &str = r#"
CREATE TABLE outbox (
    id              bigserial   PRIMARY KEY,
    message_id      uuid        NOT NULL UNIQUE,
    -- NULL = the relay's configured event exchange; '' = the default exchange (delay queues).
    exchange        text        NULL,
    routing_key     text        NOT NULL,
    message_type    text        NOT NULL,
    payload         bytea       NOT NULL,
    -- Propagation headers captured at enqueue time (traceparent, tracestate).
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NULL,
    -- A row the broker refused (unroutable, nacked) waits before the next try.
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at_idx ON outbox (published_at) WHERE published_at IS NOT NULL;

CREATE FUNCTION flashsale_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('flashsale_outbox', '');
    RETURN NULL;
END
$$;
-- Per statement: one wake-up for a multi-row insert; delivered at commit, never on rollback.
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION flashsale_outbox_notify();

CREATE TABLE inbox (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_processed_at_idx ON inbox (processed_at);
"#;

const DOWN: &str = r#"
DROP TABLE IF EXISTS inbox;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
DROP FUNCTION IF EXISTS flashsale_outbox_notify();
DROP TABLE IF EXISTS outbox;
"#;

/// Creates `outbox` (with its `NOTIFY` trigger) and `inbox`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateOutboxAndInbox;

impl MigrationName for CreateOutboxAndInbox {
    fn name(&self) -> &str {
        "m20260101_000000_messaging_create_outbox_and_inbox"
    }
}

// async_trait cannot take `SchemaManager<'_>` here (early/late-bound lifetime mismatch).
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateOutboxAndInbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(UP).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.get_connection().execute_unprepared(DOWN).await?;
        Ok(())
    }
}

const DEAD_LETTERS_UP: &str = r#"
CREATE TABLE dead_letters (
    id              bigserial   PRIMARY KEY,
    -- The consumer (work) queue the message was parked from.
    queue           text        NOT NULL,
    -- The envelope's id; for undecodable bytes the AMQP message_id, or one derived from the bytes.
    message_id      uuid        NOT NULL,
    -- The routing key it was first published with.
    routing_key     text        NOT NULL,
    message_type    text        NOT NULL DEFAULT '',
    error           text        NOT NULL,
    attempts        integer     NOT NULL,
    parked_at       timestamptz NOT NULL,
    -- The message body exactly as it was parked (an encoded envelope or raw bytes).
    payload         bytea       NOT NULL,
    -- Headers to put back on a replay (trace context …), without the retry bookkeeping.
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state           text        NOT NULL DEFAULT 'PARKED'
                    CHECK (state IN ('PARKED', 'REPLAYED', 'DISCARDED')),
    stored_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz NULL,
    -- The admin (token subject) who replayed or discarded it, and why (discards).
    resolved_by     text        NULL,
    resolved_reason text        NULL,
    CHECK ((state = 'PARKED') = (resolved_at IS NULL))
);
-- One row per parking: the same parked message delivered twice to the drainer is stored once,
-- while a message parked again after a replay gets a row of its own.
CREATE UNIQUE INDEX dead_letters_parking_uq ON dead_letters (queue, message_id, parked_at);
-- The admin API names a parked message by (queue, message_id).
CREATE UNIQUE INDEX dead_letters_parked_uq ON dead_letters (queue, message_id)
    WHERE state = 'PARKED';
CREATE INDEX dead_letters_parked_order_idx ON dead_letters (queue, parked_at, id)
    WHERE state = 'PARKED';
CREATE INDEX dead_letters_resolved_at_idx ON dead_letters (resolved_at)
    WHERE resolved_at IS NOT NULL;
"#;

const DEAD_LETTERS_DOWN: &str = "DROP TABLE IF EXISTS dead_letters;";

/// Creates `dead_letters`, where the
/// [`DeadLetterDrainer`](crate::dead_letter::DeadLetterDrainer) keeps parked messages for the
/// dead-letter admin.
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateDeadLetters;

impl MigrationName for CreateDeadLetters {
    fn name(&self) -> &str {
        "m20261201_000000_messaging_create_dead_letters"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateDeadLetters {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(DEAD_LETTERS_UP)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(DEAD_LETTERS_DOWN)
            .await?;
        Ok(())
    }
}

const CORRELATION_UP: &str = r#"
-- The order (or sku) each message is about, so one order's messages can be found again:
-- the order timeline (flashsale.admin.v1.OrderTimelineService).
ALTER TABLE outbox ADD COLUMN correlation_id text NOT NULL DEFAULT '';
CREATE INDEX outbox_by_correlation ON outbox (correlation_id) WHERE correlation_id <> '';
-- What a consumer applied: besides the id, the event's type, its correlation, the delivery it
-- took (1 = the first) and the trace it carried.
ALTER TABLE inbox
    ADD COLUMN correlation_id text    NOT NULL DEFAULT '',
    ADD COLUMN message_type   text    NOT NULL DEFAULT '',
    ADD COLUMN attempt        integer NOT NULL DEFAULT 1,
    ADD COLUMN trace_id       text    NOT NULL DEFAULT '';
CREATE INDEX inbox_by_correlation ON inbox (correlation_id) WHERE correlation_id <> '';
-- An event is stamped when its row is written, not when its transaction began: a transaction
-- that waited on a remote call first would otherwise date its events before that call.
ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT clock_timestamp();
"#;

const CORRELATION_DOWN: &str = r#"
ALTER TABLE inbox DROP COLUMN IF EXISTS correlation_id, DROP COLUMN IF EXISTS message_type,
    DROP COLUMN IF EXISTS attempt, DROP COLUMN IF EXISTS trace_id;
ALTER TABLE outbox DROP COLUMN IF EXISTS correlation_id;
ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT now();
"#;

/// Adds the correlation id (the order a message is about) to `outbox` and `inbox`, and to
/// `inbox` the event's type, the delivery attempt and the trace id, for the order timeline.
/// Runs after [`CreateOutboxAndInbox`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AddCorrelation;

impl MigrationName for AddCorrelation {
    fn name(&self) -> &str {
        "m20261206_000000_messaging_add_correlation"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for AddCorrelation {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(CORRELATION_UP)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(CORRELATION_DOWN)
            .await?;
        Ok(())
    }
}

const DEAD_LETTER_CORRELATION_UP: &str = r#"
ALTER TABLE dead_letters ADD COLUMN correlation_id text NOT NULL DEFAULT '';
CREATE INDEX dead_letters_by_correlation ON dead_letters (correlation_id)
    WHERE correlation_id <> '';
"#;

const DEAD_LETTER_CORRELATION_DOWN: &str =
    "ALTER TABLE dead_letters DROP COLUMN IF EXISTS correlation_id;";

/// Adds the correlation id (the order a parked message is about, when it could be decoded) to
/// `dead_letters`, for the order timeline. Runs after [`CreateDeadLetters`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AddDeadLetterCorrelation;

impl MigrationName for AddDeadLetterCorrelation {
    fn name(&self) -> &str {
        "m20261206_000001_messaging_add_dead_letter_correlation"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for AddDeadLetterCorrelation {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(DEAD_LETTER_CORRELATION_UP)
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(DEAD_LETTER_CORRELATION_DOWN)
            .await?;
        Ok(())
    }
}
