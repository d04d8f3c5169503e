//! Provider payments and refunds in the order database: the payment PayOrder started for each
//! order, and the refunds the refund worker claims, settles, retries or parks.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, FromQueryResult, Value};
use uuid::Uuid;

use super::db::{corrupt, stmt};
use crate::domain::{CancelReason, OrderError, ProviderPayment, RefundRecord, RefundState};

/// A payment started at the provider for an order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPayment {
    pub order_id: Uuid,
    pub payment: ProviderPayment,
    /// The provider's success was applied.
    pub succeeded: bool,
}

#[derive(FromQueryResult)]
struct PaymentRow {
    provider_payment_id: String,
    order_id: Uuid,
    amount_cents: i64,
    currency: String,
    checkout_url: String,
    status: String,
}

impl From<PaymentRow> for StoredPayment {
    fn from(r: PaymentRow) -> Self {
        Self {
            order_id: r.order_id,
            succeeded: r.status == "SUCCEEDED",
            payment: ProviderPayment {
                provider_payment_id: r.provider_payment_id,
                checkout_url: r.checkout_url,
                amount_cents: r.amount_cents,
                currency: r.currency,
            },
        }
    }
}

/// The payment in `res`'s `pre`-prefixed columns; `None` when they are NULL (no payment).
pub(super) fn stored_payment(
    res: &sea_orm::QueryResult,
    pre: &str,
) -> Result<Option<StoredPayment>, OrderError> {
    if res
        .try_get::<Option<String>>(pre, "provider_payment_id")?
        .is_none()
    {
        return Ok(None);
    }
    Ok(Some(PaymentRow::from_query_result(res, pre)?.into()))
}

const PAYMENT_SELECT: &str = "SELECT provider_payment_id, order_id, amount_cents, currency, \
                              checkout_url, status FROM provider_payments";

/// The payment started for `order_id`, if any.
pub async fn payment_of_order<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
) -> Result<Option<StoredPayment>, OrderError> {
    let sql = format!("{PAYMENT_SELECT} WHERE order_id = $1");
    Ok(PaymentRow::find_by_statement(stmt(&sql, [order_id.into()]))
        .one(c)
        .await?
        .map(StoredPayment::from))
}

/// The payment with the provider's id `id`, locked until the transaction ends.
pub async fn payment_locked<C: ConnectionTrait>(
    c: &C,
    id: &str,
) -> Result<Option<StoredPayment>, OrderError> {
    let sql = format!("{PAYMENT_SELECT} WHERE provider_payment_id = $1 FOR UPDATE");
    Ok(PaymentRow::find_by_statement(stmt(&sql, [id.into()]))
        .one(c)
        .await?
        .map(StoredPayment::from))
}

/// The payments with the providers' ids `ids` that exist, locked until the transaction ends,
/// taken in the order of their ids.
pub async fn payments_locked<C: ConnectionTrait>(
    c: &C,
    ids: &[String],
) -> Result<Vec<StoredPayment>, OrderError> {
    let sql = format!(
        "{PAYMENT_SELECT} WHERE provider_payment_id = ANY($1) ORDER BY provider_payment_id FOR UPDATE"
    );
    Ok(
        PaymentRow::find_by_statement(stmt(&sql, [ids.to_vec().into()]))
            .all(c)
            .await?
            .into_iter()
            .map(StoredPayment::from)
            .collect(),
    )
}

/// Marks the successes of the payments `ids` applied.
pub async fn mark_succeeded_many<C: ConnectionTrait>(
    c: &C,
    ids: &[String],
) -> Result<u64, OrderError> {
    let res = c
        .execute_raw(stmt(
            "UPDATE provider_payments SET status = 'SUCCEEDED', confirmed_at = now() \
             WHERE provider_payment_id = ANY($1) AND status <> 'SUCCEEDED'",
            [ids.to_vec().into()],
        ))
        .await?;
    Ok(res.rows_affected())
}

/// Records the payment the provider created for `order_id` (the first one wins: the provider
/// returns the same payment for the same order).
pub async fn insert_payment<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
    p: &ProviderPayment,
) -> Result<(), OrderError> {
    c.execute_raw(stmt(
        "INSERT INTO provider_payments (provider_payment_id, order_id, amount_cents, currency, \
         checkout_url) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        [
            p.provider_payment_id.clone().into(),
            order_id.into(),
            p.amount_cents.into(),
            p.currency.clone().into(),
            p.checkout_url.clone().into(),
        ],
    ))
    .await?;
    Ok(())
}

/// Marks the payment's success applied.
pub async fn mark_succeeded<C: ConnectionTrait>(c: &C, id: &str) -> Result<(), OrderError> {
    c.execute_raw(stmt(
        "UPDATE provider_payments SET status = 'SUCCEEDED', confirmed_at = now() \
         WHERE provider_payment_id = $1",
        [id.into()],
    ))
    .await?;
    Ok(())
}

/// Claims up to `limit` payments whose success was never applied, started at least `after` and
/// at most `horizon` ago, that are due a question to the provider: never asked, or asked at
/// least as long ago as the payment was old then (the gap doubles as the payment ages). Stamps
/// `checked_at`, so another replica leaves them alone.
pub async fn claim_unconfirmed<C: ConnectionTrait>(
    c: &C,
    limit: u64,
    after: std::time::Duration,
    horizon: std::time::Duration,
) -> Result<Vec<StoredPayment>, OrderError> {
    let sql = "UPDATE provider_payments p SET checked_at = now() \
         FROM (SELECT provider_payment_id FROM provider_payments \
               WHERE status = 'PENDING' AND created_at <= now() - make_interval(secs => $2) \
                 AND created_at > now() - make_interval(secs => $3) \
                 AND (checked_at IS NULL OR now() - checked_at >= checked_at - created_at) \
               ORDER BY checked_at NULLS FIRST, created_at LIMIT $1 \
               FOR UPDATE SKIP LOCKED) due \
         WHERE p.provider_payment_id = due.provider_payment_id \
         RETURNING p.provider_payment_id, p.order_id, p.amount_cents, p.currency, \
                   p.checkout_url, p.status";
    Ok(PaymentRow::find_by_statement(stmt(
        sql,
        [
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
            after.as_secs_f64().into(),
            horizon.as_secs_f64().into(),
        ],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(StoredPayment::from)
    .collect())
}

/// A refund claimed for one call to the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueRefund {
    pub order_id: Uuid,
    pub payment_id: String,
    pub amount_cents: i64,
    pub currency: String,
    /// Counting the attempt about to be made.
    pub attempts: i32,
}

/// Claims up to `limit` REQUESTED refunds that are due: counts the attempt and moves their
/// next attempt `lease` ahead, so another replica's worker leaves them alone while this one
/// calls the provider (a worker that dies mid-call is retried after the lease).
pub async fn claim_due<C: ConnectionTrait>(
    c: &C,
    limit: u64,
    lease: std::time::Duration,
) -> Result<Vec<DueRefund>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        order_id: Uuid,
        payment_id: String,
        amount_cents: i64,
        currency: String,
        attempts: i32,
    }
    let rows = Row::find_by_statement(stmt(
        "UPDATE refunds r SET attempts = r.attempts + 1, \
             next_attempt_at = now() + make_interval(secs => $2), updated_at = now() \
         FROM (SELECT order_id FROM refunds WHERE status = 'REQUESTED' AND next_attempt_at <= now() \
               ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
         WHERE r.order_id = due.order_id \
         RETURNING r.order_id, r.payment_id, r.amount_cents, r.currency, r.attempts",
        [
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
            lease.as_secs_f64().into(),
        ],
    ))
    .all(c)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DueRefund {
            order_id: r.order_id,
            payment_id: r.payment_id,
            amount_cents: r.amount_cents,
            currency: r.currency,
            attempts: r.attempts,
        })
        .collect())
}

/// What one attempt at the provider came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    Succeeded,
    /// Retry at `next_at`.
    Retry {
        error: String,
        next_at: DateTime<Utc>,
    },
    /// Out of attempts: parked FAILED.
    Park {
        error: String,
    },
}

/// Settles a claimed refund's attempt (only while it is still REQUESTED).
pub async fn settle<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
    attempt: &Attempt,
) -> Result<(), OrderError> {
    let (status, error, next_at): (&str, &str, Option<DateTime<Utc>>) = match attempt {
        Attempt::Succeeded => ("SUCCEEDED", "", None),
        Attempt::Retry { error, next_at } => ("REQUESTED", error, Some(*next_at)),
        Attempt::Park { error } => ("FAILED", error, None),
    };
    c.execute_raw(stmt(
        "UPDATE refunds SET status = $2, last_error = $3, \
             next_attempt_at = COALESCE($4, next_attempt_at), updated_at = now() \
         WHERE order_id = $1 AND status = 'REQUESTED'",
        [order_id.into(), status.into(), error.into(), next_at.into()],
    ))
    .await?;
    Ok(())
}

#[derive(FromQueryResult)]
struct RefundRow {
    order_id: Uuid,
    payment_id: String,
    amount_cents: i64,
    currency: String,
    reason: String,
    status: String,
    attempts: i32,
    last_error: String,
    next_attempt_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<RefundRow> for RefundRecord {
    type Error = OrderError;
    fn try_from(r: RefundRow) -> Result<Self, OrderError> {
        Ok(Self {
            state: RefundState::from_db(&r.status)
                .ok_or_else(|| corrupt("refund status", &r.status))?,
            reason: CancelReason::from_db(&r.reason),
            order_id: r.order_id,
            payment_id: r.payment_id,
            amount_cents: r.amount_cents,
            currency: r.currency,
            attempts: r.attempts,
            last_error: r.last_error,
            next_attempt_at: r.next_attempt_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const REFUND_COLUMNS: &str = "order_id, payment_id, amount_cents, currency, reason, status, \
                              attempts, last_error, next_attempt_at, created_at, updated_at";

/// The refund of `order_id`, if it has one.
pub async fn refund<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
) -> Result<Option<RefundRecord>, OrderError> {
    let sql = format!("SELECT {REFUND_COLUMNS} FROM refunds WHERE order_id = $1");
    RefundRow::find_by_statement(stmt(&sql, [order_id.into()]))
        .one(c)
        .await?
        .map(RefundRecord::try_from)
        .transpose()
}

/// Moves a FAILED refund back to REQUESTED, due now, with its attempts reset; returns the
/// refund as that update left it, or `None` when it was not FAILED.
pub async fn requeue_failed<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
) -> Result<Option<RefundRecord>, OrderError> {
    let sql = format!(
        "UPDATE refunds SET status = 'REQUESTED', attempts = 0, next_attempt_at = now(), \
         updated_at = now() WHERE order_id = $1 AND status = 'FAILED' RETURNING {REFUND_COLUMNS}"
    );
    RefundRow::find_by_statement(stmt(&sql, [order_id.into()]))
        .one(c)
        .await?
        .map(RefundRecord::try_from)
        .transpose()
}

/// A page of refunds (in `state`, or any), oldest first, after the `(created_at, order_id)`
/// cursor.
pub async fn list_refunds<C: ConnectionTrait>(
    c: &C,
    state: Option<RefundState>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u64,
) -> Result<Vec<RefundRecord>, OrderError> {
    let (at, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let values: Vec<Value> = vec![
        state.map(RefundState::as_db).into(),
        at.into(),
        id.into(),
        i64::try_from(limit).unwrap_or(i64::MAX).into(),
    ];
    let sql = format!(
        "SELECT {REFUND_COLUMNS} FROM refunds WHERE ($1::text IS NULL OR status = $1) \
           AND ($2::timestamptz IS NULL OR (created_at, order_id) > ($2, $3)) \
         ORDER BY created_at, order_id LIMIT $4"
    );
    RefundRow::find_by_statement(stmt(&sql, values))
        .all(c)
        .await?
        .into_iter()
        .map(RefundRecord::try_from)
        .collect()
}

/// The refunds not yet paid back, by state (REQUESTED, FAILED).
pub async fn count_unsettled<C: ConnectionTrait>(
    c: &C,
) -> Result<Vec<(RefundState, i64)>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        status: String,
        n: i64,
    }
    Row::find_by_statement(stmt(
        "SELECT status, count(*) AS n FROM refunds WHERE status IN ('REQUESTED', 'FAILED') \
         GROUP BY status",
        [],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(|r| {
        let s =
            RefundState::from_db(&r.status).ok_or_else(|| corrupt("refund status", &r.status))?;
        Ok((s, r.n))
    })
    .collect()
}
