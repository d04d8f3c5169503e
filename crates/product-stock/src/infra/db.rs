//! The product database: products, stock, reservations, ledger and adjustments, in SQL through
//! sea-orm. Every function takes a connection or an open transaction, so use cases decide what
//! commits together. Stock changes are conditional updates: at READ COMMITTED a blocked
//! `UPDATE … WHERE on_hand - reserved >= q` re-checks on the new row version, and the CHECK
//! constraint refuses anything that slips through.

use flashsale_platform::db::MultiRow;
use sea_orm::{ConnectionTrait, DbBackend, FromQueryResult, Statement, Value};
use uuid::Uuid;

use crate::domain::{
    Adjustment, DeductionPolicy, NewTerms, Product, ProductDraft, ProductTerms, Reservation,
    ReservationState, Sale, Sku, StockError,
};

pub(crate) fn stmt(sql: &str, values: impl IntoIterator<Item = Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
}

#[derive(FromQueryResult)]
struct ProductRow {
    sku: String,
    name: String,
    price_cents: i64,
    per_user_limit: i32,
    deduction_policy: String,
    on_hand: i64,
    reserved: i64,
    stock_buckets: i32,
    sale_start: Option<chrono::DateTime<chrono::Utc>>,
    sale_end: Option<chrono::DateTime<chrono::Utc>>,
    sale_price_cents: Option<i64>,
    version: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
}

impl TryFrom<ProductRow> for Product {
    type Error = StockError;
    fn try_from(r: ProductRow) -> Result<Self, StockError> {
        Ok(Product {
            sku: Sku::parse(&r.sku).map_err(|_| corrupt("products.sku", &r.sku))?,
            name: r.name,
            price_cents: r.price_cents,
            per_user_limit: u32::try_from(r.per_user_limit)
                .map_err(|_| corrupt("per_user_limit", &r.sku))?,
            policy: DeductionPolicy::from_db(&r.deduction_policy)
                .ok_or_else(|| corrupt("deduction_policy", &r.deduction_policy))?,
            on_hand: r.on_hand,
            reserved: r.reserved,
            stock_buckets: u32::try_from(r.stock_buckets)
                .ok()
                .filter(|n| (1..=crate::domain::MAX_STOCK_BUCKETS).contains(n))
                .ok_or_else(|| corrupt("stock_buckets", &r.sku))?,
            sale: Sale {
                start_ms: r.sale_start.map(|t| t.timestamp_millis()),
                end_ms: r.sale_end.map(|t| t.timestamp_millis()),
                price_cents: r.sale_price_cents,
            },
            version: r.version,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

fn corrupt(what: &str, value: &str) -> StockError {
    StockError::Internal(anyhow::anyhow!(
        "unexpected {what} in the database: `{value}`"
    ))
}

const PRODUCT_SELECT: &str = "SELECT p.sku, p.name, p.price_cents, p.per_user_limit, p.deduction_policy, \
     s.on_hand, s.reserved, p.stock_buckets, p.sale_start, p.sale_end, p.sale_price_cents, \
     p.version, p.created_at, s.updated_at FROM products p JOIN stock s USING (sku)";

fn is_unique_violation(e: &sea_orm::DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}

/// Inserts a product, its stock row and the INITIAL ledger entry.
pub async fn insert_product<C: ConnectionTrait>(c: &C, d: &ProductDraft) -> Result<(), StockError> {
    let sku = d.sku.as_str();
    let inserted = c
        .execute_raw(stmt(
            "INSERT INTO products (sku, name, price_cents, per_user_limit, deduction_policy, stock_buckets, \
             sale_start, sale_end, sale_price_cents) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            [
                sku.into(),
                d.name.clone().into(),
                d.price_cents.into(),
                i64::from(d.per_user_limit).into(),
                d.policy.as_db().into(),
                i64::from(d.stock_buckets).into(),
                instant(d.sale.start_ms),
                instant(d.sale.end_ms),
                d.sale.price_cents.into(),
            ],
        ))
        .await;
    match inserted {
        Err(e) if is_unique_violation(&e) => return Err(StockError::DuplicateSku(sku.to_owned())),
        other => other?,
    };
    c.execute_raw(stmt(
        "INSERT INTO stock (sku, on_hand) VALUES ($1, $2)",
        [sku.into(), d.initial_stock.into()],
    ))
    .await?;
    ledger(c, &d.sku, "INITIAL", d.initial_stock, 0, "CreateProduct").await
}

/// An instant in milliseconds as a nullable `timestamptz`.
fn instant(ms: Option<i64>) -> Value {
    ms.and_then(chrono::DateTime::from_timestamp_millis).into()
}

/// One product with its stock; `lock` takes the stock row's lock until the transaction ends.
pub async fn product<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
    lock: bool,
) -> Result<Option<Product>, StockError> {
    let sql = format!(
        "{PRODUCT_SELECT} WHERE p.sku = $1{}",
        if lock { " FOR UPDATE OF s" } else { "" }
    );
    let row = ProductRow::find_by_statement(stmt(&sql, [sku.as_str().into()]))
        .one(c)
        .await?;
    row.map(Product::try_from).transpose()
}

/// One product with its stock, its `products` row locked until the transaction ends (an
/// UpdateProduct's; the saga's stock row locks are not taken).
pub async fn product_for_update<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
) -> Result<Option<Product>, StockError> {
    let sql = format!("{PRODUCT_SELECT} WHERE p.sku = $1 FOR UPDATE OF p");
    let row = ProductRow::find_by_statement(stmt(&sql, [sku.as_str().into()]))
        .one(c)
        .await?;
    row.map(Product::try_from).transpose()
}

/// Writes a product's new terms and bumps its version; the version now.
pub async fn update_terms<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
    t: &NewTerms,
) -> Result<i64, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        version: i64,
    }
    Row::find_by_statement(stmt(
        "UPDATE products SET name = $2, price_cents = $3, per_user_limit = $4, sale_start = $5, \
         sale_end = $6, sale_price_cents = $7, version = version + 1 WHERE sku = $1 RETURNING version",
        [
            sku.as_str().into(),
            t.name.clone().into(),
            t.price_cents.into(),
            i64::from(t.per_user_limit).into(),
            instant(t.sale.start_ms),
            instant(t.sale.end_ms),
            t.sale.price_cents.into(),
        ],
    ))
    .one(c)
    .await?
    .map(|r| r.version)
    .ok_or_else(|| StockError::UnknownProduct(sku.to_string()))
}

/// The update applied under `request_id` before: its product and digest.
pub async fn product_update<C: ConnectionTrait>(
    c: &C,
    request_id: &str,
) -> Result<Option<(String, String)>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        sku: String,
        digest: String,
    }
    Ok(Row::find_by_statement(stmt(
        "SELECT sku, digest FROM product_updates WHERE request_id = $1",
        [request_id.into()],
    ))
    .one(c)
    .await?
    .map(|r| (r.sku, r.digest)))
}

/// Records an applied update; `false` when its request id was recorded meanwhile.
pub async fn insert_product_update<C: ConnectionTrait>(
    c: &C,
    request_id: &str,
    sku: &Sku,
    digest: &str,
    version: i64,
) -> Result<bool, StockError> {
    let done = c
        .execute_raw(stmt(
            "INSERT INTO product_updates (request_id, sku, digest, version) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (request_id) DO NOTHING",
            [
                request_id.into(),
                sku.as_str().into(),
                digest.into(),
                version.into(),
            ],
        ))
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Up to `limit` products with a sku greater than `after`, by sku.
pub async fn list_products<C: ConnectionTrait>(
    c: &C,
    after: &str,
    limit: u64,
) -> Result<Vec<Product>, StockError> {
    let sql = format!("{PRODUCT_SELECT} WHERE p.sku > $1 ORDER BY p.sku LIMIT $2");
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    ProductRow::find_by_statement(stmt(&sql, [after.into(), limit.into()]))
        .all(c)
        .await?
        .into_iter()
        .map(Product::try_from)
        .collect()
}

/// Every sku (for the sweeper and the reconciler).
pub async fn all_skus<C: ConnectionTrait>(c: &C) -> Result<Vec<Sku>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        sku: String,
    }
    Row::find_by_statement(stmt("SELECT sku FROM products ORDER BY sku", []))
        .all(c)
        .await?
        .into_iter()
        .map(|r| Sku::parse(&r.sku).map_err(|_| corrupt("products.sku", &r.sku)))
        .collect()
}

/// The terms of a product the gate sells it by.
pub async fn terms<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
) -> Result<Option<ProductTerms>, StockError> {
    Ok(product(c, sku, false).await?.map(|p| ProductTerms {
        sku: p.sku,
        price_cents: p.price_cents,
        per_user_limit: p.per_user_limit,
        policy: p.policy,
        stock_buckets: p.stock_buckets,
        sale: p.sale,
    }))
}

/// Units each user holds of `sku` through live (RESERVED or COMMITTED) reservations.
pub async fn units_by_user<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
) -> Result<Vec<(String, i64)>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        user_id: String,
        units: i64,
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT user_id, SUM(quantity)::bigint AS units FROM reservations \
         WHERE sku = $1 AND state IN ('RESERVED', 'COMMITTED') GROUP BY user_id",
        [sku.as_str().into()],
    ))
    .all(c)
    .await?;
    Ok(rows.into_iter().map(|r| (r.user_id, r.units)).collect())
}

/// The orders among `ids` that have a reservation row (in any state, tombstones included).
pub async fn reservations_known<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<std::collections::HashSet<Uuid>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        order_id: Uuid,
    }
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let rows = Row::find_by_statement(stmt(
        "SELECT order_id FROM reservations WHERE order_id = ANY($1)",
        [ids.to_vec().into()],
    ))
    .all(c)
    .await?;
    Ok(rows.into_iter().map(|r| r.order_id).collect())
}

/// Appends a ledger entry.
pub async fn ledger<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
    kind: &str,
    on_hand_delta: i64,
    reserved_delta: i64,
    cause: &str,
) -> Result<(), StockError> {
    c.execute_raw(stmt(
        "INSERT INTO stock_ledger (sku, kind, on_hand_delta, reserved_delta, cause) VALUES ($1, $2, $3, $4, $5)",
        [
            sku.as_str().into(),
            kind.into(),
            on_hand_delta.into(),
            reserved_delta.into(),
            cause.into(),
        ],
    ))
    .await?;
    Ok(())
}

/// Moves stock: `on_hand += on_hand_delta`, `reserved += reserved_delta`, only if the result
/// keeps `on_hand - reserved >= 0` and `reserved >= 0`. Returns whether it applied.
pub async fn move_stock<C: ConnectionTrait>(
    c: &C,
    sku: &Sku,
    on_hand_delta: i64,
    reserved_delta: i64,
) -> Result<bool, StockError> {
    let res = c
        .execute_raw(stmt(
            "UPDATE stock SET on_hand = on_hand + $2, reserved = reserved + $3, version = version + 1, \
             updated_at = now() WHERE sku = $1 AND (on_hand + $2) - (reserved + $3) >= 0 AND reserved + $3 >= 0",
            [sku.as_str().into(), on_hand_delta.into(), reserved_delta.into()],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}

#[derive(FromQueryResult)]
struct ReservationRow {
    order_id: Uuid,
    sku: String,
    user_id: String,
    quantity: i64,
    state: String,
    policy: String,
}

/// One order's reservation; `lock` takes its row lock.
pub async fn reservation<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
    lock: bool,
) -> Result<Option<Reservation>, StockError> {
    let sql = format!(
        "SELECT order_id, sku, user_id, quantity, state, policy FROM reservations WHERE order_id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    ReservationRow::find_by_statement(stmt(&sql, [order_id.into()]))
        .one(c)
        .await?
        .map(reservation_of)
        .transpose()
}

/// When `order_id`'s reservation row was first written (ms since the epoch), if it exists.
pub async fn reservation_written_ms<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
) -> Result<Option<i64>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        ms: i64,
    }
    Ok(Row::find_by_statement(stmt(
        "SELECT (extract(epoch FROM created_at) * 1000)::bigint AS ms FROM reservations \
         WHERE order_id = $1",
        [order_id.into()],
    ))
    .one(c)
    .await?
    .map(|r| r.ms))
}

/// The reservations of `ids` that exist, each row locked, taken in order id order so that
/// concurrent callers lock them in the same order.
pub async fn reservations_locked<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
) -> Result<Vec<Reservation>, StockError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = ReservationRow::find_by_statement(stmt(
        "SELECT order_id, sku, user_id, quantity, state, policy FROM reservations \
         WHERE order_id = ANY($1) ORDER BY order_id FOR UPDATE",
        [ids.to_vec().into()],
    ))
    .all(c)
    .await?;
    rows.into_iter().map(reservation_of).collect()
}

fn reservation_of(r: ReservationRow) -> Result<Reservation, StockError> {
    Ok(Reservation {
        order_id: r.order_id,
        sku: Sku::parse(&r.sku).map_err(|_| corrupt("reservations.sku", &r.sku))?,
        user_id: r.user_id,
        quantity: r.quantity,
        state: ReservationState::from_db(&r.state)
            .ok_or_else(|| corrupt("reservations.state", &r.state))?,
        policy: DeductionPolicy::from_db(&r.policy)
            .ok_or_else(|| corrupt("reservations.policy", &r.policy))?,
    })
}

/// Moves the reservations of `ids` from `from` to `to`; returns how many were in `from`.
pub async fn set_reservation_states<C: ConnectionTrait>(
    c: &C,
    ids: &[Uuid],
    from: ReservationState,
    to: ReservationState,
    cause: &str,
) -> Result<usize, StockError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let res = c
        .execute_raw(stmt(
            "UPDATE reservations SET state = $3, cause = $4, updated_at = now() \
             WHERE order_id = ANY($1) AND state = $2",
            [
                ids.to_vec().into(),
                from.as_db().into(),
                to.as_db().into(),
                cause.into(),
            ],
        ))
        .await?;
    Ok(usize::try_from(res.rows_affected()).unwrap_or(usize::MAX))
}

/// Inserts a reservation row unless one exists for the order; returns whether it inserted.
pub async fn insert_reservation<C: ConnectionTrait>(
    c: &C,
    r: &Reservation,
    cause: &str,
) -> Result<bool, StockError> {
    let res = c
        .execute_raw(stmt(
            "INSERT INTO reservations (order_id, sku, user_id, quantity, state, policy, cause) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (order_id) DO NOTHING",
            [
                r.order_id.into(),
                r.sku.as_str().into(),
                r.user_id.clone().into(),
                r.quantity.into(),
                r.state.as_db().into(),
                r.policy.as_db().into(),
                cause.into(),
            ],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}

/// Inserts many reservation rows (`cause` for all), skipping orders that have one; returns how
/// many it inserted.
pub async fn insert_reservations<C: ConnectionTrait>(
    c: &C,
    rows: &[Reservation],
    cause: &str,
) -> Result<usize, StockError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut insert = MultiRow::new(
        "INSERT INTO reservations (order_id, sku, user_id, quantity, state, policy, cause) VALUES",
    );
    for r in rows {
        insert.row([
            r.order_id.into(),
            r.sku.as_str().into(),
            r.user_id.clone().into(),
            r.quantity.into(),
            r.state.as_db().into(),
            r.policy.as_db().into(),
            cause.into(),
        ]);
    }
    let res = c
        .execute_raw(insert.finish("ON CONFLICT (order_id) DO NOTHING"))
        .await?;
    Ok(usize::try_from(res.rows_affected()).unwrap_or(usize::MAX))
}

/// Many ledger rows of one kind: `(sku, on_hand_delta, reserved_delta, cause)` each.
pub async fn ledger_many<C: ConnectionTrait>(
    c: &C,
    kind: &str,
    rows: &[(&Sku, i64, i64, &str)],
) -> Result<(), StockError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut insert = MultiRow::new(
        "INSERT INTO stock_ledger (sku, kind, on_hand_delta, reserved_delta, cause) VALUES",
    );
    for (sku, on_hand, reserved, cause) in rows {
        insert.row([
            sku.as_str().into(),
            kind.into(),
            (*on_hand).into(),
            (*reserved).into(),
            (*cause).into(),
        ]);
    }
    c.execute_raw(insert.finish("")).await?;
    Ok(())
}

/// Moves a reservation from `from` to `to`; returns whether it was in `from`.
pub async fn set_reservation_state<C: ConnectionTrait>(
    c: &C,
    order_id: Uuid,
    from: ReservationState,
    to: ReservationState,
    cause: &str,
) -> Result<bool, StockError> {
    let res = c
        .execute_raw(stmt(
            "UPDATE reservations SET state = $3, cause = $4, updated_at = now() WHERE order_id = $1 AND state = $2",
            [order_id.into(), from.as_db().into(), to.as_db().into(), cause.into()],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}

/// The first answer of an adjustment request, if it was seen: `(sku, delta, reason)`.
pub async fn adjustment<C: ConnectionTrait>(
    c: &C,
    request_id: &str,
) -> Result<Option<(String, i64, String)>, StockError> {
    #[derive(FromQueryResult)]
    struct Row {
        sku: String,
        delta: i64,
        reason: String,
    }
    let row = Row::find_by_statement(stmt(
        "SELECT sku, delta, reason FROM stock_adjustments WHERE request_id = $1",
        [request_id.into()],
    ))
    .one(c)
    .await?;
    Ok(row.map(|r| (r.sku, r.delta, r.reason)))
}

/// Records an adjustment request; false when the request id exists already (a concurrent twin).
pub async fn insert_adjustment<C: ConnectionTrait>(
    c: &C,
    a: &Adjustment,
) -> Result<bool, StockError> {
    let res = c
        .execute_raw(stmt(
            "INSERT INTO stock_adjustments (request_id, sku, delta, reason) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (request_id) DO NOTHING",
            [
                a.request_id.clone().into(),
                a.sku.as_str().into(),
                a.delta.into(),
                a.reason.clone().into(),
            ],
        ))
        .await?;
    Ok(res.rows_affected() == 1)
}

impl From<sea_orm::DbErr> for StockError {
    fn from(e: sea_orm::DbErr) -> Self {
        if flashsale_platform::db::unreachable(&e) {
            return Self::DatabaseUnavailable(e.to_string());
        }
        Self::Internal(anyhow::Error::new(e))
    }
}
