//! GetSaleReport: one product's sale in figures, from this service's database (its orders and
//! the refusals counted per second, [`super::RefusalTally`]) and product-stock's answer for
//! the product (its window, prices and stock).

use std::{collections::BTreeMap, sync::Arc};

use sea_orm::DatabaseConnection;

use crate::{
    domain::OrderError,
    infra::{
        db::{self, SaleOrders},
        stock::{ProductFacts, StockPort},
    },
};

/// Most seconds a report lists (the first ones).
pub const MAX_REPORT_SECONDS: usize = 3_600;

/// One product's sale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaleReport {
    pub sku: String,
    pub product: ProductFacts,
    pub orders: SaleOrders,
    /// Calls refused, by reason.
    pub refused: BTreeMap<String, i64>,
    /// When it sold out (ms since the Unix epoch), and how long after the opening.
    pub sold_out_ms: Option<i64>,
    pub opening_to_sold_out_ms: Option<i64>,
    pub seconds: Vec<SaleSecond>,
}

/// The calls of one second.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaleSecond {
    /// Its start, in ms since the Unix epoch.
    pub second_ms: i64,
    pub accepted: i64,
    pub refused: BTreeMap<String, i64>,
}

/// The sale report's use case. Cheap to clone.
#[derive(Clone)]
pub struct Reports {
    db: DatabaseConnection,
    stock: Arc<dyn StockPort>,
}

impl Reports {
    pub fn new(db: DatabaseConnection, stock: Arc<dyn StockPort>) -> Self {
        Self { db, stock }
    }

    /// The report of `sku` (a valid sku); `UnknownProduct` when product-stock has none.
    pub async fn sale(&self, sku: &str) -> Result<SaleReport, OrderError> {
        let product = self.stock.product(sku).await?;
        let orders = db::sale_orders(&self.db, sku).await?;
        let refusals = db::sale_refusals(&self.db, sku).await?;
        let accepted = db::accepted_per_second(&self.db, sku).await?;
        let mut refused: BTreeMap<String, i64> = BTreeMap::new();
        let mut seconds: BTreeMap<i64, SaleSecond> = BTreeMap::new();
        for (second_ms, n) in accepted {
            seconds.entry(second_ms).or_default().accepted += n;
        }
        let mut first_sold_out: Option<i64> = None;
        for (second_ms, reason, n) in refusals {
            *refused.entry(reason.clone()).or_default() += n;
            if reason == "SOLD_OUT" {
                first_sold_out = Some(first_sold_out.map_or(second_ms, |f| f.min(second_ms)));
            }
            *seconds
                .entry(second_ms)
                .or_default()
                .refused
                .entry(reason)
                .or_default() += n;
        }
        let sold_out_ms = match first_sold_out {
            Some(second) => db::last_accepted_before(&self.db, sku, second + 1_000).await?,
            None => None,
        };
        let opened_ms = product.sale_start_ms.or(orders.first_accepted_ms);
        let opening_to_sold_out_ms = sold_out_ms
            .zip(opened_ms)
            .map(|(sold, opened)| (sold - opened).max(0));
        Ok(SaleReport {
            sku: sku.to_owned(),
            product,
            orders,
            refused,
            sold_out_ms,
            opening_to_sold_out_ms,
            seconds: seconds
                .into_iter()
                .take(MAX_REPORT_SECONDS)
                .map(|(second_ms, s)| SaleSecond { second_ms, ..s })
                .collect(),
        })
    }
}
