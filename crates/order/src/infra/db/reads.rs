//! The order database's reads for listings and operations: pages of orders, the overdue and
//! the stuck, the events still waiting in the outbox, the pending orders of a product.

use super::*;

/// A page of orders, newest first, after the `(created_at, order_id)` cursor.
pub async fn list<C: ConnectionTrait>(
    c: &C,
    user: Option<&str>,
    status: Option<Status>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u64,
) -> Result<Vec<Order>, OrderError> {
    let (at, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let sql = format!(
        "{ORDER_SELECT} WHERE ($1::text IS NULL OR o.user_id = $1) AND ($2::text IS NULL OR o.status = $2) \
         AND ($3::timestamptz IS NULL OR (o.created_at, o.order_id) < ($3, $4)) \
         ORDER BY o.created_at DESC, o.order_id DESC LIMIT $5"
    );
    OrderRow::find_by_statement(stmt(
        &sql,
        [
            user.map(str::to_owned).into(),
            status.map(Status::as_db).into(),
            at.into(),
            id.into(),
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
        ],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(Order::try_from)
    .collect()
}

/// Ids of orders awaiting payment past their deadline, locked for this transaction (other
/// replicas' sweepers skip them).
pub async fn overdue<C: ConnectionTrait>(c: &C, limit: u64) -> Result<Vec<Uuid>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        order_id: Uuid,
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT order_id FROM orders WHERE status = 'AWAITING_PAYMENT' AND payment_deadline <= now() \
         ORDER BY payment_deadline LIMIT $1 FOR UPDATE SKIP LOCKED",
        [i64::try_from(limit).unwrap_or(i64::MAX).into()],
    ))
    .all(c)
    .await?;
    Ok(rows.into_iter().map(|r| r.order_id).collect())
}

/// An order that has not moved for too long (see [`stuck`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StuckRow {
    pub order_id: Uuid,
    pub user_id: String,
    pub sku: String,
    pub status: Status,
    /// Its last change, or its payment deadline when awaiting payment.
    pub since: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The stuck orders in each PENDING, AWAITING_PAYMENT or PAID order unchanged for longer than
/// `older_than` (AWAITING_PAYMENT: that long past its deadline), read through the partial
/// indexes `orders_unsettled` and `orders_due`.
pub async fn count_stuck<C: ConnectionTrait>(
    c: &C,
    older_than: std::time::Duration,
) -> Result<Vec<(Status, i64)>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        status: String,
        n: i64,
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT status, count(*) AS n FROM orders \
         WHERE status IN ('PENDING', 'PAID') AND updated_at < now() - make_interval(secs => $1) \
         GROUP BY status \
         UNION ALL \
         SELECT 'AWAITING_PAYMENT', count(*) FROM orders \
         WHERE status = 'AWAITING_PAYMENT' AND payment_deadline < now() - make_interval(secs => $1)",
        [older_than.as_secs_f64().into()],
    ))
    .all(c)
    .await?;
    rows.into_iter()
        .map(|r| {
            let s = Status::from_db(&r.status).ok_or_else(|| corrupt("status", &r.status))?;
            Ok((s, r.n))
        })
        .collect()
}

/// The orders waiting for the saga (PENDING) and the paid orders waiting to ship (PAID), each
/// counted up to its `cap` (a count that reached its cap reads the cap): the `orders_unsettled`
/// index holds exactly these rows, and the caps bound what one count reads.
pub async fn count_backlog<C: ConnectionTrait>(
    c: &C,
    pending_cap: u64,
    paid_cap: u64,
) -> Result<(u64, u64), OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        pending: i64,
        paid: i64,
    }
    let cap = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let row = Row::find_by_statement(stmt(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM orders WHERE status = 'PENDING' LIMIT $1) p)                 AS pending,                 (SELECT count(*) FROM (SELECT 1 FROM orders WHERE status = 'PAID' LIMIT $2) q)                 AS paid",
        [cap(pending_cap).into(), cap(paid_cap).into()],
    ))
    .one(c)
    .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(row.map_or((0, 0), |r| (n(r.pending), n(r.paid))))
}

/// Which of `ids` are orders (in the connection's snapshot: admission control asks it in the
/// transaction that counted the backlog, for the orders written while the count ran).
pub async fn existing_orders<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        order_id: Uuid,
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT order_id FROM orders WHERE order_id = ANY($1)",
        [ids.to_vec().into()],
    ))
    .all(c)
    .await?;
    Ok(rows.into_iter().map(|r| r.order_id).collect())
}

/// Up to `limit` stuck orders (as [`count_stuck`] counts them) after the `(since, order_id)`
/// cursor, longest stuck first.
pub async fn stuck<C: ConnectionTrait>(
    c: &C,
    older_than: std::time::Duration,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: u64,
) -> Result<Vec<StuckRow>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        order_id: Uuid,
        user_id: String,
        sku: String,
        status: String,
        since: DateTime<Utc>,
        updated_at: DateTime<Utc>,
    }
    let (at, id) = after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
    let rows = Row::find_by_statement(stmt(
        "SELECT order_id, user_id, sku, status, since, updated_at FROM ( \
             SELECT order_id, user_id, sku, status, updated_at AS since, updated_at FROM orders \
             WHERE status IN ('PENDING', 'PAID') AND updated_at < now() - make_interval(secs => $1) \
             UNION ALL \
             SELECT order_id, user_id, sku, status, payment_deadline AS since, updated_at FROM orders \
             WHERE status = 'AWAITING_PAYMENT' AND payment_deadline < now() - make_interval(secs => $1) \
         ) s \
         WHERE ($2::timestamptz IS NULL OR (since, order_id) > ($2, $3)) \
         ORDER BY since, order_id LIMIT $4",
        [
            older_than.as_secs_f64().into(),
            at.into(),
            id.into(),
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
        ],
    ))
    .all(c)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(StuckRow {
                status: Status::from_db(&r.status).ok_or_else(|| corrupt("status", &r.status))?,
                order_id: r.order_id,
                user_id: r.user_id,
                sku: r.sku,
                since: r.since,
                updated_at: r.updated_at,
            })
        })
        .collect()
}

/// The messages this service holds for `orders`: unpublished outbox rows and parked dead
/// letters whose correlation id is the order's id.
pub async fn waiting_events<C: ConnectionTrait>(
    c: &C,
    orders: &[Uuid],
) -> Result<Vec<flashsale_messaging::waiting::Waiting>, OrderError> {
    let ids: Vec<String> = orders.iter().map(Uuid::to_string).collect();
    Ok(flashsale_messaging::waiting::for_correlations(c, &ids).await?)
}

/// A page of `sku`'s PENDING orders by order id, after `after` (served by the partial index
/// `orders_pending_by_sku`).
pub async fn pending_by_sku<C: ConnectionTrait>(
    c: &C,
    sku: &str,
    after: Option<Uuid>,
    limit: u64,
) -> Result<Vec<Order>, OrderError> {
    let sql = format!(
        "{ORDER_SELECT} WHERE o.sku = $1 AND o.status = 'PENDING' \
         AND ($2::uuid IS NULL OR o.order_id > $2) ORDER BY o.order_id LIMIT $3"
    );
    OrderRow::find_by_statement(stmt(
        &sql,
        [
            sku.into(),
            after.into(),
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
        ],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(Order::try_from)
    .collect()
}
