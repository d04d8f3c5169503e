//! The invariants every mode is checked against when it ends (docs/invariants.md): units sold
//! stay within the stock, the stock is conserved, the Redis gate equals the database, every
//! accepted order is confirmed, and no call ended in an error. A mode with a failed check
//! fails the run: `flashsale bench` exits non-zero, whatever its figures.

use std::time::Duration;

use anyhow::Context as _;
use flashsale_proto::product::v1::{
    GetProductRequest, Product, ReconcileStockRequest,
    product_stock_service_client::ProductStockServiceClient,
};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde_json::{Value, json};

use super::{measure::Measurement, saga::Saga};
use crate::client::{authorized, connect, status_error};

/// One invariant as checked after a mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, pass: bool, detail: String) -> Self {
        Self { name, pass, detail }
    }

    pub fn to_json(&self) -> Value {
        json!({ "name": self.name, "pass": self.pass, "detail": self.detail })
    }

    /// A check that could not be made fails: an invariant nobody could read is not known to
    /// hold.
    pub fn unreadable(name: &'static str, e: &anyhow::Error) -> Self {
        Self::new(name, false, format!("could not be read: {e:#}"))
    }
}

/// Every call answered (accepted or refused): an error is a failure of the run.
pub fn no_errors(m: &Measurement) -> Check {
    let errored = m.errored();
    Check::new(
        "no call ended in an error",
        errored == 0,
        if errored == 0 {
            format!("{} calls, none errored", m.requests)
        } else {
            format!("{errored} of {} calls errored: {:?}", m.requests, m.errors)
        },
    )
}

/// Accepted units within the stock.
pub fn sold_within_stock(accepted: usize, stock: i64) -> Check {
    let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
    Check::new(
        "units sold <= stock",
        accepted <= stock,
        format!("{accepted} sold of {stock}"),
    )
}

/// The naive design's database after its run: the hot row and the orders add up to the stock,
/// every accepted call wrote one order (an `unanswered` call, an error or one still running,
/// may have written one too), and no buyer holds more than the per-user limit.
pub async fn naive_database(
    db: &DatabaseConnection,
    sku: &str,
    stock: i64,
    (accepted, unanswered): (usize, usize),
    per_user_limit: u32,
) -> Vec<Check> {
    let read = async {
        let row = db
            .query_one_raw(pg(
                "SELECT (SELECT available FROM naive_stock WHERE sku = $1) AS available, \
                   (SELECT count(*) FROM orders WHERE sku = $1)::bigint AS orders, \
                   (SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM orders \
                      WHERE sku = $1 GROUP BY user_id) per_buyer)::bigint AS most",
                [sku.into()],
            ))
            .await?
            .context("no row")?;
        let available: Option<i64> = row.try_get("", "available")?;
        let orders: i64 = row.try_get("", "orders")?;
        let most: i64 = row.try_get("", "most")?;
        anyhow::Ok((available.context("the hot row is missing")?, orders, most))
    };
    match read.await {
        Ok((available, orders, most)) => naive_checks(
            NaiveState {
                available,
                orders,
                most_per_buyer: most,
            },
            stock,
            (accepted, unanswered),
            per_user_limit,
        ),
        Err(e) => vec![Check::unreadable("naive database consistent", &e)],
    }
}

/// What the naive design's tables hold after a run.
#[derive(Clone, Copy, Debug)]
pub struct NaiveState {
    pub available: i64,
    pub orders: i64,
    pub most_per_buyer: i64,
}

pub fn naive_checks(
    s: NaiveState,
    stock: i64,
    (accepted, unanswered): (usize, usize),
    per_user_limit: u32,
) -> Vec<Check> {
    let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
    let unanswered = i64::try_from(unanswered).unwrap_or(i64::MAX);
    let limit = i64::from(per_user_limit);
    vec![
        Check::new(
            "units sold <= stock",
            s.orders <= stock,
            format!("{} orders of {stock} units", s.orders),
        ),
        Check::new(
            "stock conserved",
            s.available + s.orders == stock && s.available >= 0,
            format!(
                "available {} + ordered {} = {} of stock {stock}",
                s.available,
                s.orders,
                s.available + s.orders
            ),
        ),
        Check::new(
            "every accepted call wrote its order",
            accepted <= s.orders && s.orders <= accepted.saturating_add(unanswered),
            format!(
                "{accepted} accepted ({unanswered} unanswered), {} orders written",
                s.orders
            ),
        ),
        Check::new(
            "per-user limit held",
            limit == 0 || s.most_per_buyer <= limit,
            format!(
                "at most {} orders per buyer (limit {})",
                s.most_per_buyer,
                if limit == 0 {
                    "none".to_owned()
                } else {
                    limit.to_string()
                }
            ),
        ),
    ]
}

/// The raw insert's database: one order row per accepted call.
pub async fn insert_database(db: &DatabaseConnection, sku: &str, accepted: usize) -> Check {
    let read = async {
        let row = db
            .query_one_raw(pg(
                "SELECT count(*)::bigint AS n FROM orders WHERE sku = $1",
                [sku.into()],
            ))
            .await?
            .context("no row")?;
        anyhow::Ok(row.try_get::<i64>("", "n")?)
    };
    match read.await {
        Ok(rows) => {
            let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
            Check::new(
                "every accepted call wrote its order",
                rows == accepted,
                format!("{accepted} accepted, {rows} orders written"),
            )
        }
        Err(e) => Check::unreadable("every accepted call wrote its order", &e),
    }
}

/// What the platform's product looks like after its run, read over gRPC.
#[derive(Clone, Copy, Debug)]
pub struct PlatformState {
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
    pub gate_available: i64,
    pub drift: i64,
}

/// The platform after its run and its saga: the product and its reconcile report (without
/// repair) read back as an admin.
pub async fn platform(
    product_stock_url: &str,
    admin: &str,
    sku: &str,
    stock: i64,
    accepted: usize,
    saga: &Saga,
) -> Vec<Check> {
    match platform_state(product_stock_url, admin, sku).await {
        Ok(s) => platform_checks(s, stock, accepted, saga),
        Err(e) => vec![Check::unreadable("platform product consistent", &e)],
    }
}

pub async fn platform_state(url: &str, admin: &str, sku: &str) -> anyhow::Result<PlatformState> {
    let mut client = ProductStockServiceClient::new(connect(url, Duration::from_secs(10)).await?);
    let product: Product = client
        .get_product(authorized(
            GetProductRequest {
                sku: sku.to_owned(),
            },
            admin,
        )?)
        .await
        .map_err(status_error)?
        .into_inner()
        .product
        .context("GetProduct answered no product")?;
    let drift = client
        .reconcile_stock(authorized(
            ReconcileStockRequest {
                skus: vec![sku.to_owned()],
                repair: false,
            },
            admin,
        )?)
        .await
        .map_err(status_error)?
        .into_inner()
        .reports
        .into_iter()
        .find(|r| r.sku == sku)
        .context("ReconcileStock reported nothing for the product")?
        .drift;
    Ok(PlatformState {
        on_hand: product.on_hand,
        reserved: product.reserved,
        available: product.available,
        gate_available: product.gate_available,
        drift,
    })
}

/// Both policies: the units out of stock (committed, `stock - on_hand`) plus those reserved
/// are the units of the confirmed orders (one each); the gate equals the database with no
/// drift; every accepted call got an order of its own (`saga.followed` counts distinct order
/// ids) and every one was confirmed (none cancelled, none left pending). `stock` is what the
/// product was created with, `accepted` every call it accepted.
pub fn platform_checks(s: PlatformState, stock: i64, accepted: usize, saga: &Saga) -> Vec<Check> {
    let accepted_i = i64::try_from(accepted).unwrap_or(i64::MAX);
    let confirmed = i64::try_from(saga.confirmed).unwrap_or(i64::MAX);
    let taken = stock - s.on_hand + s.reserved;
    vec![
        Check::new(
            "units sold <= stock",
            accepted_i <= stock && taken <= stock,
            format!("{accepted} accepted, {taken} units taken of {stock}"),
        ),
        Check::new(
            "stock conserved",
            taken == confirmed,
            format!(
                "committed {} + reserved {} = {taken} for {confirmed} confirmed orders",
                stock - s.on_hand,
                s.reserved,
            ),
        ),
        Check::new(
            "gate equals database",
            s.gate_available == s.available && s.drift == 0,
            format!(
                "gate {} vs available {}, reconcile drift {}",
                s.gate_available, s.available, s.drift
            ),
        ),
        Check::new(
            "every accepted order confirmed",
            saga.followed == accepted
                && saga.confirmed == accepted
                && saga.cancelled == 0
                && saga.unconfirmed == 0,
            format!(
                "{} confirmed, {} cancelled, {} unconfirmed of {accepted} accepted ({} distinct orders)",
                saga.confirmed, saga.cancelled, saga.unconfirmed, saga.followed
            ),
        ),
    ]
}

/// How long an open-loop point's product may take to settle (every hold persisted, no drift)
/// before its checks read it as it is.
const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// An open-loop point of the platform on its product of `stock` units, one call per buyer:
/// read once the saga has persisted every hold (the gate equal to the database and no drift),
/// or at [`SETTLE_BOUND`] as it is. `unanswered` calls (errors, or still running at the drain
/// bound) may or may not have taken their unit.
pub async fn open_loop_platform(
    product_stock_url: &str,
    admin: &str,
    sku: &str,
    stock: i64,
    accepted: usize,
    unanswered: usize,
) -> Vec<Check> {
    let until = tokio::time::Instant::now() + SETTLE_BOUND;
    let mut last = platform_state(product_stock_url, admin, sku).await;
    while tokio::time::Instant::now() < until
        && !matches!(&last, Ok(s) if s.gate_available == s.available && s.drift == 0)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = platform_state(product_stock_url, admin, sku).await;
    }
    match last {
        Ok(s) => open_loop_platform_checks(s, stock, accepted, unanswered),
        Err(e) => vec![Check::unreadable("open-loop product consistent", &e)],
    }
}

/// Every accepted call took one unit from the gate and no refused call took any (`stock −
/// gate available` is the accepted calls, plus at most the unanswered ones, within the stock),
/// and the gate equals the database.
pub fn open_loop_platform_checks(
    s: PlatformState,
    stock: i64,
    accepted: usize,
    unanswered: usize,
) -> Vec<Check> {
    let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
    let unanswered = i64::try_from(unanswered).unwrap_or(i64::MAX);
    let taken = stock - s.gate_available;
    vec![
        Check::new(
            "units sold <= stock",
            taken <= stock && s.reserved <= s.on_hand,
            format!(
                "{taken} units out of the gate of {stock}; reserved {} of on hand {}",
                s.reserved, s.on_hand
            ),
        ),
        Check::new(
            "one unit per accepted call",
            accepted <= taken && taken <= accepted.saturating_add(unanswered),
            format!(
                "{taken} units out of the gate for {accepted} accepted calls and {unanswered} unanswered"
            ),
        ),
        Check::new(
            "gate equals database",
            s.gate_available == s.available && s.drift == 0,
            format!(
                "gate {} vs available {}, reconcile drift {}",
                s.gate_available, s.available, s.drift
            ),
        ),
    ]
}

fn pg<const N: usize>(sql: &str, values: [sea_orm::Value; N]) -> sea_orm::Statement {
    sea_orm::Statement::from_sql_and_values(sea_orm::DatabaseBackend::Postgres, sql, values)
}

/// True when every check of every mode passed.
pub fn all_pass<'a>(checks: impl IntoIterator<Item = &'a Check>) -> bool {
    checks.into_iter().all(|c| c.pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saga(accepted: usize) -> Saga {
        Saga {
            followed: accepted,
            confirmed: accepted,
            ..Saga::default()
        }
    }

    fn state(on_hand: i64, reserved: i64, gate: i64, drift: i64) -> PlatformState {
        PlatformState {
            on_hand,
            reserved,
            available: on_hand - reserved,
            gate_available: gate,
            drift,
        }
    }

    #[test]
    fn a_consistent_platform_passes_under_both_policies() {
        // Reserve then commit: 60 reserved of 100 on hand.
        let checks = platform_checks(state(100, 60, 40, 0), 100, 60, &saga(60));
        assert!(all_pass(&checks), "{checks:?}");
        // Commit at order: 60 committed, nothing reserved.
        let checks = platform_checks(state(40, 0, 40, 0), 100, 60, &saga(60));
        assert!(all_pass(&checks), "{checks:?}");
    }

    #[test]
    fn an_oversold_drifting_or_unconfirmed_platform_fails_the_check_that_says_so() {
        let failed = |checks: Vec<Check>| -> Vec<&'static str> {
            checks
                .into_iter()
                .filter(|c| !c.pass)
                .map(|c| c.name)
                .collect()
        };
        // 101 accepted of 100.
        assert_eq!(
            failed(platform_checks(
                state(100, 101, -1, 0),
                100,
                101,
                &saga(101)
            )),
            vec!["units sold <= stock"]
        );
        // The gate holds one unit more than the database.
        assert_eq!(
            failed(platform_checks(state(100, 60, 41, 1), 100, 60, &saga(60))),
            vec!["gate equals database"]
        );
        // One accepted order was cancelled by the saga.
        let mut s = saga(60);
        s.confirmed = 59;
        s.cancelled = 1;
        assert_eq!(
            failed(platform_checks(state(100, 59, 41, 0), 100, 60, &s)),
            vec!["every accepted order confirmed"]
        );
        // A unit lost: reserved for no confirmed order.
        assert_eq!(
            failed(platform_checks(state(100, 61, 39, 0), 100, 60, &saga(60))),
            vec!["stock conserved"]
        );
    }

    #[test]
    fn a_call_accepted_past_a_sold_out_product_fails_the_stock_and_confirmation_checks() {
        // The refusals mode: 200 units sold out and confirmed, then one more call accepted.
        let failed: Vec<_> = platform_checks(state(200, 200, 0, 0), 200, 201, &saga(200))
            .into_iter()
            .filter(|c| !c.pass)
            .map(|c| c.name)
            .collect();
        assert_eq!(
            failed,
            vec!["units sold <= stock", "every accepted order confirmed"]
        );
    }

    #[test]
    fn two_accepted_calls_answered_with_one_order_fail_the_confirmation_check() {
        let mut s = saga(60);
        s.followed = 59;
        let c = platform_checks(state(100, 60, 40, 0), 100, 60, &s);
        let failed: Vec<_> = c.iter().filter(|c| !c.pass).map(|c| c.name).collect();
        assert_eq!(failed, vec!["every accepted order confirmed"], "{c:?}");
    }

    #[test]
    fn an_open_loop_point_that_lost_or_gave_away_a_unit_or_drifted_fails() {
        let failed = |s, accepted| -> Vec<&'static str> {
            open_loop_platform_checks(s, 100, accepted, 0)
                .into_iter()
                .filter(|c| !c.pass)
                .map(|c| c.name)
                .collect()
        };
        // 60 accepted, each holding its unit, persisted.
        assert!(failed(state(100, 60, 40, 0), 60).is_empty());
        // A refused call took a unit (or an accepted one took two).
        assert_eq!(
            failed(state(100, 61, 39, 0), 60),
            vec!["one unit per accepted call"]
        );
        // An accepted call took none.
        assert_eq!(
            failed(state(100, 59, 41, 0), 60),
            vec!["one unit per accepted call"]
        );
        // Two calls whose answer was lost: either may have taken its unit, no more.
        let unanswered = |s, n| open_loop_platform_checks(s, 100, 60, n)[1].pass;
        assert!(unanswered(state(100, 61, 39, 0), 2));
        assert!(!unanswered(state(100, 63, 37, 0), 2));
        // The gate sold a unit the database does not have.
        assert_eq!(
            failed(state(100, 101, -1, 0), 101),
            vec!["units sold <= stock"]
        );
        // Never settled: a hold the database never got.
        let mut s = state(100, 59, 40, 1);
        s.available = 41;
        assert_eq!(failed(s, 60), vec!["gate equals database"]);
    }

    #[test]
    fn the_naive_checks_catch_lost_units_missing_orders_and_a_broken_limit() {
        let ok = NaiveState {
            available: 40,
            orders: 60,
            most_per_buyer: 1,
        };
        assert!(all_pass(&naive_checks(ok, 100, (60, 0), 1)));
        let lost = NaiveState {
            available: 39,
            ..ok
        };
        let c = naive_checks(lost, 100, (60, 0), 1);
        assert_eq!(
            c.iter()
                .filter(|c| !c.pass)
                .map(|c| c.name)
                .collect::<Vec<_>>(),
            vec!["stock conserved"]
        );
        let c = naive_checks(ok, 100, (61, 0), 1);
        assert!(!c[2].pass, "{c:?}");
        // Two calls unanswered: 60 orders for 59 accepted is possible, 62 is not.
        assert!(naive_checks(ok, 100, (59, 2), 1)[2].pass);
        assert!(!naive_checks(ok, 100, (57, 2), 1)[2].pass);
        let greedy = NaiveState {
            most_per_buyer: 2,
            ..ok
        };
        assert!(!naive_checks(greedy, 100, (60, 0), 1)[3].pass);
        assert!(all_pass(&naive_checks(greedy, 100, (60, 0), 0)));
    }

    #[test]
    fn selling_more_than_the_stock_fails() {
        assert!(sold_within_stock(100, 100).pass);
        assert!(!sold_within_stock(101, 100).pass);
    }
}
