//! The outbound database in SQL through sea-orm.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, FromQueryResult, Statement, Value};
use uuid::Uuid;

use crate::domain::{OutboundError, Policy, Shipment, ShipmentStatus};

pub(crate) fn stmt(sql: &str, values: impl IntoIterator<Item = Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
}

impl From<sea_orm::DbErr> for OutboundError {
    fn from(e: sea_orm::DbErr) -> Self {
        if flashsale_platform::db::unreachable(&e) {
            return Self::DatabaseUnavailable(e.to_string());
        }
        Self::Internal(anyhow::Error::new(e))
    }
}

#[derive(FromQueryResult)]
struct Row {
    shipment_id: Uuid,
    order_id: Uuid,
    user_id: String,
    sku: String,
    quantity: i64,
    policy: String,
    status: String,
    failure_reason: Option<String>,
    attempts: i32,
    stock_committed: bool,
    last_error: String,
    next_attempt_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<Row> for Shipment {
    type Error = OutboundError;
    fn try_from(r: Row) -> Result<Self, OutboundError> {
        let bad = |what: &str, v: &str| {
            OutboundError::Internal(anyhow::anyhow!("unexpected {what} `{v}` in the database"))
        };
        Ok(Shipment {
            policy: Policy::from_db(&r.policy).ok_or_else(|| bad("policy", &r.policy))?,
            status: ShipmentStatus::from_db(&r.status).ok_or_else(|| bad("status", &r.status))?,
            shipment_id: r.shipment_id,
            order_id: r.order_id,
            user_id: r.user_id,
            sku: r.sku,
            quantity: r.quantity,
            failure_reason: r.failure_reason,
            attempts: r.attempts,
            stock_committed: r.stock_committed,
            last_error: r.last_error,
            next_attempt_at: r.next_attempt_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const SELECT: &str = "SELECT shipment_id, order_id, user_id, sku, quantity, policy, status, failure_reason, attempts, \
     stock_committed, last_error, next_attempt_at, created_at, updated_at FROM shipments";

/// A paid order to ship.
pub struct NewShipment<'a> {
    pub order_id: Uuid,
    pub user_id: &'a str,
    pub sku: &'a str,
    pub quantity: i64,
    pub policy: Policy,
    pub payment_id: &'a str,
}

/// Creates the order's shipment unless it has one; returns the shipment id either way. The
/// sweeper takes it up at `retry_at` should the worker that ships it now die first.
pub async fn create<C: ConnectionTrait>(
    c: &C,
    s: &NewShipment<'_>,
    retry_at: DateTime<Utc>,
) -> Result<Uuid, OutboundError> {
    c.execute_raw(stmt(
        "INSERT INTO shipments (shipment_id, order_id, user_id, sku, quantity, policy, payment_id, status, next_attempt_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'PICKING', $8) ON CONFLICT (order_id) DO NOTHING",
        [
            Uuid::now_v7().into(),
            s.order_id.into(),
            s.user_id.into(),
            s.sku.into(),
            s.quantity.into(),
            s.policy.as_db().into(),
            s.payment_id.into(),
            retry_at.into(),
        ],
    ))
    .await?;
    by_order(c, s.order_id)
        .await?
        .map(|x| x.shipment_id)
        .ok_or(OutboundError::NotFound(s.order_id))
}

/// Creates the shipments of the orders that have none, in one statement; returns the
/// shipment of every order of `new` (created now or before). As [`create`], `retry_at`.
pub async fn create_many<C: ConnectionTrait>(
    c: &C,
    new: &[NewShipment<'_>],
    retry_at: DateTime<Utc>,
) -> Result<Vec<Shipment>, OutboundError> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = new.iter().map(|_| Uuid::now_v7()).collect();
    let orders: Vec<Uuid> = new.iter().map(|s| s.order_id).collect();
    let users: Vec<String> = new.iter().map(|s| s.user_id.to_owned()).collect();
    let skus: Vec<String> = new.iter().map(|s| s.sku.to_owned()).collect();
    let quantities: Vec<i64> = new.iter().map(|s| s.quantity).collect();
    let policies: Vec<String> = new.iter().map(|s| s.policy.as_db().to_owned()).collect();
    let payments: Vec<String> = new.iter().map(|s| s.payment_id.to_owned()).collect();
    c.execute_raw(stmt(
        "INSERT INTO shipments (shipment_id, order_id, user_id, sku, quantity, policy, payment_id, status, next_attempt_at) \
         SELECT *, 'PICKING', $8 FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[]) \
         ON CONFLICT (order_id) DO NOTHING",
        [
            ids.into(),
            orders.clone().into(),
            users.into(),
            skus.into(),
            quantities.into(),
            policies.into(),
            payments.into(),
            retry_at.into(),
        ],
    ))
    .await?;
    let sql = format!("{SELECT} WHERE order_id = ANY($1)");
    Row::find_by_statement(stmt(&sql, [orders.into()]))
        .all(c)
        .await?
        .into_iter()
        .map(Shipment::try_from)
        .collect()
}

/// The shipments of `ids` no other worker holds, locked for this transaction, taken in the
/// order of their ids.
pub async fn lock_many<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<Shipment>, OutboundError> {
    let sql =
        format!("{SELECT} WHERE shipment_id = ANY($1) ORDER BY shipment_id FOR UPDATE SKIP LOCKED");
    Row::find_by_statement(stmt(&sql, [ids.to_vec().into()]))
        .all(c)
        .await?
        .into_iter()
        .map(Shipment::try_from)
        .collect()
}

/// Ships every shipment of `ids` still PICKING at its first attempt, recording that attempt's
/// steps (`steps`: `(shipment, step)` rows, all OK) and, for RESERVE_THEN_COMMIT, that its stock
/// was committed, in one statement; how many were shipped.
pub async fn ship_first_attempts<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
    steps: &[(Uuid, &str)],
) -> Result<u64, OutboundError> {
    #[derive(FromQueryResult)]
    struct N {
        n: i64,
    }
    let step_ids: Vec<Uuid> = steps.iter().map(|(id, _)| *id).collect();
    let step_names: Vec<String> = steps.iter().map(|(_, s)| (*s).to_owned()).collect();
    // Stamped with the clock, not the transaction's start: the transaction has waited on the
    // deduction and the warehouse since it began.
    let sql = "WITH shipped AS ( \
            UPDATE shipments SET status = 'SHIPPED', attempts = 1, updated_at = clock_timestamp(), \
                stock_committed = (policy = 'RESERVE_THEN_COMMIT') \
            WHERE shipment_id = ANY($1) AND status = 'PICKING' AND attempts = 0 RETURNING shipment_id \
        ), steps AS ( \
            INSERT INTO shipment_attempts (shipment_id, attempt, step, outcome, detail, at) \
            SELECT s.id, 1, s.step, 'OK', '', clock_timestamp() \
            FROM unnest($2::uuid[], $3::text[]) AS s(id, step) \
        ) \
        SELECT count(*) AS n FROM shipped";
    let n = N::find_by_statement(stmt(
        sql,
        [ids.to_vec().into(), step_ids.into(), step_names.into()],
    ))
    .one(c)
    .await?
    .map_or(0, |r| r.n);
    Ok(u64::try_from(n).unwrap_or(0))
}

pub async fn by_order<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
) -> Result<Option<Shipment>, OutboundError> {
    let sql = format!("{SELECT} WHERE order_id = $1");
    Row::find_by_statement(stmt(&sql, [order_id.into()]))
        .one(c)
        .await?
        .map(Shipment::try_from)
        .transpose()
}

/// The shipment, locked for this transaction, or `None` when another worker holds it.
pub async fn lock<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
) -> Result<Option<Shipment>, OutboundError> {
    let sql = format!("{SELECT} WHERE shipment_id = $1 FOR UPDATE SKIP LOCKED");
    Row::find_by_statement(stmt(&sql, [shipment_id.into()]))
        .one(c)
        .await?
        .map(Shipment::try_from)
        .transpose()
}

/// Counts one more attempt and records how its step went.
pub async fn attempt<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
    attempt: i32,
    step: &str,
    outcome: &str,
    detail: &str,
) -> Result<(), OutboundError> {
    c.execute_raw(stmt(
        "INSERT INTO shipment_attempts (shipment_id, attempt, step, outcome, detail, at) \
         VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
        [shipment_id.into(), attempt.into(), step.into(), outcome.into(), detail.into()],
    ))
    .await?;
    Ok(())
}

pub async fn set_attempts<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
    attempts: i32,
) -> Result<(), OutboundError> {
    c.execute_raw(stmt(
        "UPDATE shipments SET attempts = $2, updated_at = clock_timestamp() WHERE shipment_id = $1",
        [shipment_id.into(), attempts.into()],
    ))
    .await?;
    Ok(())
}

/// Records that product-stock deducted the shipment's units.
pub async fn mark_committed<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
) -> Result<(), OutboundError> {
    c.execute_raw(stmt(
        "UPDATE shipments SET stock_committed = true, updated_at = clock_timestamp() WHERE shipment_id = $1",
        [shipment_id.into()],
    ))
    .await?;
    Ok(())
}

/// A delayed attempt: why, and when the shipment is tried again.
pub async fn delay<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
    error: &str,
    retry_at: DateTime<Utc>,
) -> Result<(), OutboundError> {
    c.execute_raw(stmt(
        "UPDATE shipments SET last_error = $2, next_attempt_at = $3, updated_at = clock_timestamp() \
         WHERE shipment_id = $1",
        [shipment_id.into(), error.into(), retry_at.into()],
    ))
    .await?;
    Ok(())
}

/// PICKING → `to` (compare-and-set); returns whether it was still PICKING.
pub async fn finish<C: ConnectionTrait>(
    c: &C,
    shipment_id: Uuid,
    to: ShipmentStatus,
    reason: Option<&str>,
) -> Result<bool, OutboundError> {
    let res = c
        .execute_raw(stmt(
            "UPDATE shipments SET status = $2, failure_reason = $3, updated_at = clock_timestamp() \
             WHERE shipment_id = $1 AND status = 'PICKING'",
            [
                shipment_id.into(),
                to.as_db().into(),
                reason.map(str::to_owned).into(),
            ],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}

/// Shipments still PICKING whose next attempt is due, longest due first.
pub async fn due<C: ConnectionTrait>(
    c: &C,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<Uuid>, OutboundError> {
    #[derive(FromQueryResult)]
    struct Id {
        shipment_id: Uuid,
    }
    Ok(Id::find_by_statement(stmt(
        "SELECT shipment_id FROM shipments WHERE status = 'PICKING' AND next_attempt_at <= $1 \
         ORDER BY next_attempt_at LIMIT $2",
        [now.into(), limit.into()],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(|r| r.shipment_id)
    .collect())
}

/// How many shipments are still PICKING though created before `before`, and the oldest one's
/// order and creation time.
pub async fn overdue<C: ConnectionTrait>(
    c: &C,
    before: DateTime<Utc>,
) -> Result<(i64, Option<(Uuid, DateTime<Utc>)>), OutboundError> {
    #[derive(FromQueryResult)]
    struct Overdue {
        n: i64,
        order_id: Option<Uuid>,
        created_at: Option<DateTime<Utc>>,
    }
    let r = Overdue::find_by_statement(stmt(
        "SELECT (SELECT count(*) FROM shipments WHERE status = 'PICKING' AND created_at < $1) AS n, \
                o.order_id, o.created_at \
         FROM (SELECT 1) AS one LEFT JOIN LATERAL ( \
             SELECT order_id, created_at FROM shipments WHERE status = 'PICKING' AND created_at < $1 \
             ORDER BY created_at LIMIT 1) AS o ON true",
        [before.into()],
    ))
    .one(c)
    .await?;
    Ok(r.map_or((0, None), |r| (r.n, r.order_id.zip(r.created_at))))
}

/// A page of shipments, newest first, after the `(created_at, shipment_id)` cursor, created
/// before `created_before` when given.
pub async fn list<C: ConnectionTrait>(
    c: &C,
    status: Option<ShipmentStatus>,
    created_before: Option<DateTime<Utc>>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<Shipment>, OutboundError> {
    let (at, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "{SELECT} WHERE ($1::text IS NULL OR status = $1) AND ($2::timestamptz IS NULL OR (created_at, shipment_id) < ($2, $3)) \
         AND ($5::timestamptz IS NULL OR created_at < $5) \
         ORDER BY created_at DESC, shipment_id DESC LIMIT $4"
    );
    Row::find_by_statement(stmt(
        &sql,
        [
            status.map(ShipmentStatus::as_db).into(),
            at.into(),
            id.into(),
            limit.into(),
            created_before.into(),
        ],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(Shipment::try_from)
    .collect()
}
