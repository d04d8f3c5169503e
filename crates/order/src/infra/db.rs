//! The order database in SQL through sea-orm. Every status change is a compare-and-set
//! (`UPDATE … WHERE status = $from`) with a history row, so concurrent actors (a payment and
//! the timeout, two replicas' consumers) have exactly one winner.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, FromQueryResult, Statement, Value};
use uuid::Uuid;

use super::payment_store::{self, StoredPayment};
use crate::domain::{
    CancelReason, Order, OrderError, PlaceOrder, Policy, ProviderPayment, Refund, RefundState,
    Status,
};

mod reads;

pub use reads::{
    StuckRow, count_backlog, count_stuck, existing_orders, list, overdue, pending_by_sku, stuck,
    waiting_events,
};

pub(crate) fn stmt(sql: &str, values: impl IntoIterator<Item = Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
}

impl From<sea_orm::DbErr> for OrderError {
    fn from(e: sea_orm::DbErr) -> Self {
        if flashsale_platform::db::unreachable(&e) {
            return Self::DatabaseUnavailable(e.to_string());
        }
        Self::Internal(anyhow::Error::new(e))
    }
}

/// The SQLSTATE of an internal error that is a statement the database gave up for a passing
/// reason (see [`flashsale_platform::db::transient`]; `"unreachable"` when it was out of reach),
/// which a plain retry may well get past; `None` for any other error, including a statement the
/// database refused for what it says.
pub(crate) fn passing_failure(e: &OrderError) -> Option<String> {
    let OrderError::Internal(a) = e else {
        return None;
    };
    let db = a.downcast_ref::<sea_orm::DbErr>()?;
    flashsale_platform::db::transient(db)
        .then(|| flashsale_platform::db::sqlstate(db).unwrap_or_else(|| "unreachable".to_owned()))
}

pub(crate) fn corrupt(what: &str, value: &str) -> OrderError {
    OrderError::Internal(anyhow::anyhow!(
        "unexpected {what} in the database: `{value}`"
    ))
}

#[derive(FromQueryResult)]
struct OrderRow {
    order_id: Uuid,
    user_id: String,
    request_id: String,
    sku: String,
    quantity: i64,
    unit_price_cents: i64,
    total_cents: i64,
    deduction_policy: String,
    status: String,
    cancel_reason: Option<String>,
    payment_deadline: Option<DateTime<Utc>>,
    payment_id: Option<String>,
    refund_payment_id: Option<String>,
    refund_cents: Option<i64>,
    refund_status: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<OrderRow> for Order {
    type Error = OrderError;
    fn try_from(r: OrderRow) -> Result<Self, OrderError> {
        let cancel_reason = match r.cancel_reason.as_deref() {
            None => None,
            Some(s) => Some(CancelReason::from_db(s).ok_or_else(|| corrupt("cancel_reason", s))?),
        };
        let refund = match (r.refund_payment_id, r.refund_cents, r.refund_status) {
            (Some(payment_id), Some(amount_cents), Some(status)) => Some(Refund {
                payment_id,
                amount_cents,
                state: RefundState::from_db(&status)
                    .ok_or_else(|| corrupt("refund status", &status))?,
            }),
            _ => None,
        };
        Ok(Order {
            order_id: r.order_id,
            status: Status::from_db(&r.status).ok_or_else(|| corrupt("status", &r.status))?,
            policy: Policy::from_db(&r.deduction_policy)
                .ok_or_else(|| corrupt("policy", &r.deduction_policy))?,
            user_id: r.user_id,
            request_id: r.request_id,
            sku: r.sku,
            quantity: r.quantity,
            unit_price_cents: r.unit_price_cents,
            total_cents: r.total_cents,
            cancel_reason,
            payment_deadline: r.payment_deadline,
            payment_id: r.payment_id,
            refund,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

/// The columns of an [`OrderRow`], from `orders o` and `refunds r`.
macro_rules! order_columns {
    () => {
        "o.order_id, o.user_id, o.request_id, o.sku, o.quantity, o.unit_price_cents, \
         o.total_cents, o.deduction_policy, o.status, o.cancel_reason, o.payment_deadline, \
         o.payment_id, r.payment_id AS refund_payment_id, r.amount_cents AS refund_cents, \
         r.status AS refund_status, o.created_at, o.updated_at"
    };
}

const ORDER_SELECT: &str = concat!(
    "SELECT ",
    order_columns!(),
    " FROM orders o LEFT JOIN refunds r USING (order_id)"
);

/// An order and the payment started for it (`p_`-prefixed columns), in one read.
const ORDER_WITH_PAYMENT_SELECT: &str = concat!(
    "SELECT ",
    order_columns!(),
    ", p.provider_payment_id AS p_provider_payment_id, p.order_id AS p_order_id, \
     p.amount_cents AS p_amount_cents, p.currency AS p_currency, \
     p.checkout_url AS p_checkout_url, p.status AS p_status \
     FROM orders o LEFT JOIN refunds r USING (order_id) \
     LEFT JOIN provider_payments p ON p.order_id = o.order_id"
);

/// An order and its payment, read by [`ORDER_WITH_PAYMENT_SELECT`].
pub type OrderWithPayment = (Order, Option<StoredPayment>);

fn order_with_payment_row(res: &sea_orm::QueryResult) -> Result<OrderWithPayment, OrderError> {
    let order = Order::try_from(OrderRow::from_query_result(res, "")?)?;
    Ok((order, payment_store::stored_payment(res, "p_")?))
}

/// The order `id` with the payment started for it, if any: one statement (PayOrder's read).
pub async fn order_with_payment<C: ConnectionTrait>(
    c: &C,
    id: Uuid,
) -> Result<Option<OrderWithPayment>, OrderError> {
    let sql = format!("{ORDER_WITH_PAYMENT_SELECT} WHERE o.order_id = $1");
    c.query_one_raw(stmt(&sql, [id.into()]))
        .await?
        .as_ref()
        .map(order_with_payment_row)
        .transpose()
}

/// [`order_with_payment`] for many orders at once: those that exist, in any order.
pub async fn orders_with_payments<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<OrderWithPayment>, OrderError> {
    let sql = format!("{ORDER_WITH_PAYMENT_SELECT} WHERE o.order_id = ANY($1::uuid[])");
    c.query_all_raw(stmt(&sql, [ids.to_vec().into()]))
        .await?
        .iter()
        .map(order_with_payment_row)
        .collect()
}

/// Records the payments the provider created, `(order, payment)` (the first one recorded for
/// an order wins: the provider returns the same payment for the same order), and reads each
/// order back with its recorded payment: one statement for them all.
pub async fn record_payments<C: ConnectionTrait>(
    c: &C,
    created: &[(Uuid, ProviderPayment)],
) -> Result<Vec<OrderWithPayment>, OrderError> {
    let sql = concat!(
        "WITH ins AS (INSERT INTO provider_payments \
           (provider_payment_id, order_id, amount_cents, currency, checkout_url) \
         SELECT * FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::text[], $5::text[]) \
         ON CONFLICT DO NOTHING \
         RETURNING provider_payment_id, order_id, amount_cents, currency, checkout_url, status) \
         SELECT ",
        order_columns!(),
        ", COALESCE(i.provider_payment_id, p.provider_payment_id) AS p_provider_payment_id, \
         COALESCE(i.order_id, p.order_id) AS p_order_id, \
         COALESCE(i.amount_cents, p.amount_cents) AS p_amount_cents, \
         COALESCE(i.currency, p.currency) AS p_currency, \
         COALESCE(i.checkout_url, p.checkout_url) AS p_checkout_url, \
         COALESCE(i.status, p.status) AS p_status \
         FROM orders o LEFT JOIN refunds r USING (order_id) \
         LEFT JOIN ins i ON i.order_id = o.order_id \
         LEFT JOIN provider_payments p ON p.order_id = o.order_id \
         WHERE o.order_id = ANY($2::uuid[])"
    );
    let values = [
        Value::from(
            created
                .iter()
                .map(|(_, p)| p.provider_payment_id.clone())
                .collect::<Vec<_>>(),
        ),
        Value::from(created.iter().map(|(o, _)| *o).collect::<Vec<_>>()),
        Value::from(created.iter().map(|(_, p)| p.amount_cents).collect::<Vec<_>>()),
        Value::from(
            created
                .iter()
                .map(|(_, p)| p.currency.clone())
                .collect::<Vec<_>>(),
        ),
        Value::from(
            created
                .iter()
                .map(|(_, p)| p.checkout_url.clone())
                .collect::<Vec<_>>(),
        ),
    ];
    c.query_all_raw(stmt(sql, values))
        .await?
        .iter()
        .map(order_with_payment_row)
        .collect()
}

/// One order; `lock` takes its row lock until the transaction ends.
pub async fn order<C: ConnectionTrait>(
    c: &C,
    id: Uuid,
    lock: bool,
) -> Result<Option<Order>, OrderError> {
    let sql = format!(
        "{ORDER_SELECT} WHERE o.order_id = $1{}",
        if lock { " FOR UPDATE OF o" } else { "" }
    );
    OrderRow::find_by_statement(stmt(&sql, [id.into()]))
        .one(c)
        .await?
        .map(Order::try_from)
        .transpose()
}

/// The orders among `ids` that exist, in the order of `ids` (one round trip for many).
pub async fn orders<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<Option<Order>>, OrderError> {
    let sql = format!("{ORDER_SELECT} WHERE o.order_id = ANY($1::uuid[])");
    let list = format!(
        "{{{}}}",
        ids.iter()
            .map(Uuid::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let found: Vec<Order> = OrderRow::find_by_statement(stmt(&sql, [list.into()]))
        .all(c)
        .await?
        .into_iter()
        .map(Order::try_from)
        .collect::<Result<_, _>>()?;
    Ok(ids
        .iter()
        .map(|id| found.iter().find(|o| o.order_id == *id).cloned())
        .collect())
}

/// The orders among `ids` that exist, locked until the transaction ends, taken in the order of
/// their ids (so two batches never wait on each other in a circle).
pub async fn orders_locked<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<Order>, OrderError> {
    let sql =
        format!("{ORDER_SELECT} WHERE o.order_id = ANY($1) ORDER BY o.order_id FOR UPDATE OF o");
    OrderRow::find_by_statement(stmt(&sql, [ids.to_vec().into()]))
        .all(c)
        .await?
        .into_iter()
        .map(Order::try_from)
        .collect()
}

/// Every user with an order (in any state) for `sku`.
pub async fn users_with_orders<C: ConnectionTrait>(
    c: &C,
    sku: &str,
) -> Result<std::collections::HashSet<String>, OrderError> {
    #[derive(sea_orm::FromQueryResult)]
    struct Row {
        user_id: String,
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT DISTINCT user_id FROM orders WHERE sku = $1",
        [sku.into()],
    ))
    .all(c)
    .await?;
    Ok(rows.into_iter().map(|r| r.user_id).collect())
}

/// The order a user placed under `request_id`, whatever its payload.
pub async fn order_by_key<C: ConnectionTrait>(
    c: &C,
    user: &str,
    request_id: &str,
) -> Result<Option<Order>, OrderError> {
    let sql = format!("{ORDER_SELECT} WHERE o.user_id = $1 AND o.request_id = $2");
    OrderRow::find_by_statement(stmt(&sql, [user.into(), request_id.into()]))
        .one(c)
        .await?
        .map(Order::try_from)
        .transpose()
}

/// What inserting a new order found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    New,
    /// The same order exists already (same id: same key and payload).
    SameOrder,
    /// The key is taken by an order with another payload.
    KeyTaken,
    /// Not known: the batch was written but reading back the orders it skipped failed. Whether
    /// this one exists is unknown, so nothing may be released for it (the hold sweeper frees a
    /// hold nobody wrote); a retry with the same request id tells.
    Unknown,
}

/// A product's orders in figures (the sale report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaleOrders {
    pub accepted: i64,
    pub accepted_units: i64,
    /// All but the orders still PENDING and those cancelled OUT_OF_STOCK or HOLD_EXPIRED.
    pub confirmed: i64,
    /// PAID or SHIPPED now, or paid and refunded.
    pub paid: i64,
    pub shipped: i64,
    /// Cancelled orders by cancel reason.
    pub cancelled: std::collections::BTreeMap<String, i64>,
    pub refunds: i64,
    pub refunded_cents: i64,
    /// Σ total_cents of the orders PAID or SHIPPED.
    pub revenue_cents: i64,
    /// The first order's acceptance (the gate's clock, else its creation), ms since the epoch.
    pub first_accepted_ms: Option<i64>,
}

/// A product's orders in figures (the sale report): two statements.
pub async fn sale_orders<C: ConnectionTrait>(c: &C, sku: &str) -> Result<SaleOrders, OrderError> {
    #[derive(FromQueryResult)]
    struct Group {
        status: String,
        cancel_reason: Option<String>,
        orders: i64,
        units: i64,
        cents: i64,
        first_ms: Option<i64>,
    }
    #[derive(FromQueryResult)]
    struct Refunded {
        n: i64,
        cents: i64,
    }
    let groups = Group::find_by_statement(stmt(
        "SELECT status, cancel_reason, count(*)::int8 AS orders, sum(quantity)::int8 AS units, \
         sum(total_cents)::int8 AS cents, \
         (extract(epoch FROM min(coalesce(accepted_at, created_at))) * 1000)::int8 AS first_ms \
         FROM orders WHERE sku = $1 GROUP BY status, cancel_reason",
        [sku.into()],
    ))
    .all(c)
    .await?;
    let refunded = Refunded::find_by_statement(stmt(
        "SELECT count(*)::int8 AS n, coalesce(sum(r.amount_cents), 0)::int8 AS cents \
         FROM refunds r JOIN orders o USING (order_id) WHERE o.sku = $1",
        [sku.into()],
    ))
    .one(c)
    .await?;
    let mut s = SaleOrders::default();
    for g in groups {
        s.accepted += g.orders;
        s.accepted_units += g.units;
        s.first_accepted_ms = match (s.first_accepted_ms, g.first_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let never_reserved = matches!(
            g.cancel_reason.as_deref(),
            Some("OUT_OF_STOCK" | "HOLD_EXPIRED")
        );
        if g.status != "PENDING" && !never_reserved {
            s.confirmed += g.orders;
        }
        match g.status.as_str() {
            "PAID" | "SHIPPED" => {
                s.paid += g.orders;
                s.revenue_cents += g.cents;
                if g.status == "SHIPPED" {
                    s.shipped += g.orders;
                }
            }
            "CANCELLED" => {
                *s.cancelled
                    .entry(g.cancel_reason.unwrap_or_default())
                    .or_default() += g.orders;
            }
            _ => {}
        }
    }
    if let Some(r) = refunded {
        s.refunds = r.n;
        s.refunded_cents = r.cents;
        s.paid += r.n;
    }
    Ok(s)
}

/// Orders of `sku` accepted per second (the gate's clock, else their creation): `(second in ms
/// since the Unix epoch, orders)`, in order.
pub async fn accepted_per_second<C: ConnectionTrait>(
    c: &C,
    sku: &str,
) -> Result<Vec<(i64, i64)>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        second_ms: i64,
        n: i64,
    }
    Ok(Row::find_by_statement(stmt(
        "SELECT (extract(epoch FROM date_trunc('second', coalesce(accepted_at, created_at))) * 1000)::int8 \
         AS second_ms, count(*)::int8 AS n FROM orders WHERE sku = $1 GROUP BY 1 ORDER BY 1 LIMIT 100000",
        [sku.into()],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(|r| (r.second_ms, r.n))
    .collect())
}

/// The refusals of `sku` counted per second and reason: `(second in ms, reason, calls)`.
pub async fn sale_refusals<C: ConnectionTrait>(
    c: &C,
    sku: &str,
) -> Result<Vec<(i64, String, i64)>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        second_ms: i64,
        reason: String,
        refused: i64,
    }
    Ok(Row::find_by_statement(stmt(
        "SELECT (extract(epoch FROM second) * 1000)::int8 AS second_ms, reason, refused \
         FROM sale_refusals WHERE sku = $1 ORDER BY second, reason LIMIT 100000",
        [sku.into()],
    ))
    .all(c)
    .await?
    .into_iter()
    .map(|r| (r.second_ms, r.reason, r.refused))
    .collect())
}

/// The last acceptance (ms) of an order of `sku` before `before_ms`, if any.
pub async fn last_accepted_before<C: ConnectionTrait>(
    c: &C,
    sku: &str,
    before_ms: i64,
) -> Result<Option<i64>, OrderError> {
    #[derive(FromQueryResult)]
    struct Row {
        ms: Option<i64>,
    }
    Ok(Row::find_by_statement(stmt(
        "SELECT (extract(epoch FROM max(coalesce(accepted_at, created_at))) * 1000)::int8 AS ms \
         FROM orders WHERE sku = $1 AND coalesce(accepted_at, created_at) < to_timestamp($2 / 1000.0)",
        [sku.into(), before_ms.into()],
    ))
    .one(c)
    .await?
    .and_then(|r| r.ms))
}

/// One order to write PENDING: its id, request, unit price, policy and when the gate accepted
/// it (by the gate's clock, where known).
pub type NewOrderRow<'a> = (Uuid, &'a PlaceOrder, i64, Policy, Option<DateTime<Utc>>);

/// Adds refusal counts to `sale_refusals`: `(sku, second in ms since the Unix epoch, reason,
/// count)` each.
pub async fn add_refusals<C: ConnectionTrait>(
    c: &C,
    rows: &[(String, i64, &'static str, i64)],
) -> Result<(), OrderError> {
    let skus: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let seconds: Vec<i64> = rows.iter().map(|r| r.1 / 1_000).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.2.to_owned()).collect();
    let counts: Vec<i64> = rows.iter().map(|r| r.3).collect();
    c.execute_raw(stmt(
        "INSERT INTO sale_refusals (sku, second, reason, refused) \
         SELECT sku, to_timestamp(second), reason, refused \
         FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[]) AS r(sku, second, reason, refused) \
         ON CONFLICT (sku, second, reason) DO UPDATE SET refused = sale_refusals.refused + EXCLUDED.refused",
        [skus.into(), seconds.into(), reasons.into(), counts.into()],
    ))
    .await?;
    Ok(())
}

/// Inserts a PENDING order with its first history row.
pub async fn insert_order<C: ConnectionTrait>(
    c: &C,
    id: Uuid,
    p: &PlaceOrder,
    unit_price_cents: i64,
    policy: Policy,
) -> Result<Inserted, OrderError> {
    let res = c
        .execute_raw(stmt(
            "INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, total_cents, \
             deduction_policy, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'PENDING') ON CONFLICT DO NOTHING",
            [
                id.into(),
                p.user_id.clone().into(),
                p.request_id.clone().into(),
                p.sku.clone().into(),
                p.quantity.into(),
                unit_price_cents.into(),
                (unit_price_cents * p.quantity).into(),
                policy.as_db().into(),
            ],
        ))
        .await?;
    if res.rows_affected() == 1 {
        history(c, id, None, Status::Pending, "CreateOrder").await?;
        return Ok(Inserted::New);
    }
    let same = order(c, id, false).await?.is_some();
    Ok(if same {
        Inserted::SameOrder
    } else {
        Inserted::KeyTaken
    })
}

/// Writes PENDING orders, their history rows and — for each order actually inserted — its
/// event, in one statement (rows in (user, request id) order, so two batches with common keys
/// take their locks in the same order and cannot deadlock; within a batch the first write of a
/// key wins) (one round trip, one implicit transaction; constant text, so it is
/// prepared once per connection). `events` are aligned with `event_orders`, the order each
/// reports. Returns the orders inserted, with their creation time; an order whose id or
/// (user, request) key already existed is skipped, with its event.
pub async fn insert_orders_with_events<C: ConnectionTrait>(
    c: &C,
    rows: &[NewOrderRow<'_>],
    event_orders: &[Uuid],
    events: flashsale_messaging::outbox::EventColumns,
) -> Result<Vec<(Uuid, DateTime<Utc>)>, OrderError> {
    #[derive(FromQueryResult)]
    struct Id {
        order_id: Uuid,
        created_at: DateTime<Utc>,
    }
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH ins AS ( \
                INSERT INTO orders (order_id, user_id, request_id, sku, quantity, unit_price_cents, \
                    total_cents, deduction_policy, status, accepted_at) \
                SELECT i.order_id, i.user_id, i.request_id, i.sku, i.quantity, i.unit_price_cents, \
                    i.quantity * i.unit_price_cents, i.deduction_policy, 'PENDING', \
                    CASE WHEN i.accepted_ms > 0 THEN to_timestamp(i.accepted_ms / 1000.0) END \
                FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], \
                    $7::text[], $8::int8[]) \
                    WITH ORDINALITY AS i(order_id, user_id, request_id, sku, quantity, \
                        unit_price_cents, deduction_policy, accepted_ms, n) \
                ORDER BY i.user_id, i.request_id, i.n \
                ON CONFLICT DO NOTHING \
                RETURNING order_id, created_at \
            ), hist AS ( \
                INSERT INTO order_status_history (order_id, from_status, to_status, reason) \
                SELECT order_id, NULL, 'PENDING', 'CreateOrder' FROM ins \
            ), events AS ({}) \
            SELECT order_id, created_at FROM ins",
            flashsale_messaging::outbox::insert_keyed_sql(9, "ins", "order_id")
        )
    });
    let mut ids = Vec::with_capacity(rows.len());
    let (mut users, mut requests, mut skus) = (Vec::new(), Vec::new(), Vec::new());
    let (mut quantities, mut prices, mut policies) = (Vec::new(), Vec::new(), Vec::new());
    // Milliseconds since the Unix epoch; 0 where not known.
    let mut accepted: Vec<i64> = Vec::new();
    for (id, p, price, policy, at) in rows {
        accepted.push(at.map_or(0, |t| t.timestamp_millis()));
        ids.push(*id);
        users.push(p.user_id.clone());
        requests.push(p.request_id.clone());
        skus.push(p.sku.clone());
        quantities.push(p.quantity);
        prices.push(*price);
        policies.push(policy.as_db().to_owned());
    }
    let mut values: Vec<Value> = vec![
        ids.into(),
        users.into(),
        requests.into(),
        skus.into(),
        quantities.into(),
        prices.into(),
        policies.into(),
        accepted.into(),
    ];
    values.extend(events.bind(event_orders.to_vec()));
    Ok(Id::find_by_statement(stmt(&SQL, values))
        .all(c)
        .await?
        .into_iter()
        .map(|r| (r.order_id, r.created_at))
        .collect())
}

async fn history<C: ConnectionTrait>(
    c: &C,
    id: Uuid,
    from: Option<Status>,
    to: Status,
    reason: &str,
) -> Result<(), OrderError> {
    c.execute_raw(stmt(
        "INSERT INTO order_status_history (order_id, from_status, to_status, reason) VALUES ($1, $2, $3, $4)",
        [id.into(), from.map(Status::as_db).into(), to.as_db().into(), reason.into()],
    ))
    .await?;
    Ok(())
}

/// Compare-and-set of the status, with the extra columns a transition sets; returns whether
/// the order was in `from`.
pub async fn transition<C: ConnectionTrait>(
    c: &C,
    id: Uuid,
    from: Status,
    to: Status,
    change: Change<'_>,
) -> Result<bool, OrderError> {
    debug_assert!(from.can_become(to));
    let res = c
        .execute_raw(stmt(
            "UPDATE orders SET status = $3, cancel_reason = $4, payment_deadline = COALESCE($5, payment_deadline), \
             payment_id = COALESCE($6, payment_id), updated_at = now() WHERE order_id = $1 AND status = $2",
            [
                id.into(),
                from.as_db().into(),
                to.as_db().into(),
                change.cancel_reason.map(CancelReason::as_db).into(),
                change.payment_deadline.into(),
                change.payment_id.map(str::to_owned).into(),
            ],
        ))
        .await?;
    if res.rows_affected() != 1 {
        return Ok(false);
    }
    let reason: &str = match change.cancel_reason {
        Some(r) => r.as_db(),
        None => change.note,
    };
    history(c, id, Some(from), to, reason).await?;
    Ok(true)
}

/// An order a statement moved, and when it was accepted.
#[derive(Clone, Copy, Debug, FromQueryResult)]
pub struct Moved {
    pub order_id: Uuid,
    pub created_at: DateTime<Utc>,
}

/// PENDING → AWAITING_PAYMENT with `deadline` for many orders at once, with their history rows
/// (`note` as reason); returns the orders that were PENDING and moved.
pub async fn await_payment_many<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
    deadline: DateTime<Utc>,
    note: &str,
) -> Result<Vec<Moved>, OrderError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // One statement with its history rows, constant text (an array, not a list of
    // placeholders): one round trip, prepared once per connection.
    let sql = "WITH moved AS ( \
            UPDATE orders SET status = 'AWAITING_PAYMENT', payment_deadline = $1, updated_at = now() \
            WHERE status = 'PENDING' AND order_id = ANY($2) RETURNING order_id, created_at \
        ), hist AS ( \
            INSERT INTO order_status_history (order_id, from_status, to_status, reason) \
            SELECT order_id, 'PENDING', 'AWAITING_PAYMENT', $3 FROM moved \
        ) \
        SELECT order_id, created_at FROM moved";
    let values: Vec<Value> = vec![deadline.into(), ids.to_vec().into(), note.into()];
    Ok(Moved::find_by_statement(stmt(sql, values)).all(c).await?)
}

/// PAID → SHIPPED for every order of `ids` that is PAID, with their history rows, in one
/// statement; the orders moved.
pub async fn ship_many<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
    note: &str,
) -> Result<Vec<Moved>, OrderError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = "WITH moved AS ( \
            UPDATE orders SET status = 'SHIPPED', updated_at = now() \
            WHERE status = 'PAID' AND order_id = ANY($1) RETURNING order_id, created_at \
        ), hist AS ( \
            INSERT INTO order_status_history (order_id, from_status, to_status, reason) \
            SELECT order_id, 'PAID', 'SHIPPED', $2 FROM moved \
        ) \
        SELECT order_id, created_at FROM moved";
    let values: Vec<Value> = vec![ids.to_vec().into(), note.into()];
    Ok(Moved::find_by_statement(stmt(sql, values)).all(c).await?)
}

/// AWAITING_PAYMENT → PAID for every `(order, provider payment)` whose order is still awaiting
/// payment, with their history rows, in one statement; the ids moved.
pub async fn pay_many<C: ConnectionTrait>(
    c: &C,
    paid: &[(Uuid, String)],
    note: &str,
) -> Result<Vec<Uuid>, OrderError> {
    #[derive(FromQueryResult)]
    struct Id {
        order_id: Uuid,
    }
    if paid.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = paid.iter().map(|(o, _)| *o).collect();
    let payments: Vec<String> = paid.iter().map(|(_, p)| p.clone()).collect();
    let sql = "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::text[]) AS v(order_id, payment_id)), \
        moved AS ( \
            UPDATE orders o SET status = 'PAID', payment_id = v.payment_id, updated_at = now() \
            FROM v WHERE o.order_id = v.order_id AND o.status = 'AWAITING_PAYMENT' \
            RETURNING o.order_id \
        ), hist AS ( \
            INSERT INTO order_status_history (order_id, from_status, to_status, reason) \
            SELECT order_id, 'AWAITING_PAYMENT', 'PAID', $3 FROM moved \
        ) \
        SELECT order_id FROM moved";
    let values: Vec<Value> = vec![ids.into(), payments.into(), note.into()];
    Ok(Id::find_by_statement(stmt(sql, values))
        .all(c)
        .await?
        .into_iter()
        .map(|r| r.order_id)
        .collect())
}

/// What a transition sets besides the status.
#[derive(Clone, Copy, Debug, Default)]
pub struct Change<'a> {
    pub cancel_reason: Option<CancelReason>,
    pub payment_deadline: Option<DateTime<Utc>>,
    pub payment_id: Option<&'a str>,
    pub note: &'a str,
}

/// Records the order's refund (REQUESTED: the refund worker asks the provider) unless it has
/// one; returns whether it recorded it.
pub async fn record_refund<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
    payment_id: &str,
    amount: i64,
    reason: &str,
) -> Result<bool, OrderError> {
    let res = c
        .execute_raw(stmt(
            "INSERT INTO refunds (order_id, payment_id, amount_cents, reason, currency, status) \
             SELECT $1, $2, $3, $4, COALESCE((SELECT currency FROM provider_payments \
                 WHERE provider_payment_id = $2), ''), 'REQUESTED' \
             ON CONFLICT (order_id) DO NOTHING",
            [
                order_id.into(),
                payment_id.into(),
                amount.into(),
                reason.into(),
            ],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}
