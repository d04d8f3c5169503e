//! What a sustained sale sold, read from the order database after the drain, and the checks
//! on it: units within each product's stock, the per-user limit held, the gate equal to the
//! database.

use std::collections::BTreeMap;

use flashsale_proto::product::v1::Product;

use super::{
    Offer,
    checks::{self, Check},
};

/// What the order database holds of one product after the drain.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sold {
    /// Units of the orders not cancelled.
    pub units: i64,
    /// The most of those units one buyer holds.
    pub most_per_buyer: i64,
}

/// Units sold within each product's stock, the per-user limit held, and the gate equal to the
/// database; a product nothing was read of fails each check it cannot make.
pub(super) fn stock_checks(
    offers: &[Offer],
    sold: Option<&BTreeMap<String, Sold>>,
    products: &[(String, Option<Product>, Option<i64>)],
) -> Vec<Check> {
    let fold = |name: &'static str, each: &dyn Fn(&Offer) -> (bool, String)| {
        let (mut pass, mut details) = (true, Vec::new());
        for o in offers {
            let (ok, detail) = each(o);
            pass &= ok;
            details.push(format!("{}: {detail}", o.sku));
        }
        Check {
            name,
            pass,
            detail: details.join("; "),
        }
    };
    // A product with no order at all has no row: nothing sold.
    let sold_of = |sku: &str| sold.map(|m| m.get(sku).copied().unwrap_or_default());
    let within = fold("units sold <= stock", &|o| match sold_of(&o.sku) {
        Some(s) => (
            s.units <= o.stock,
            format!("{} sold of {}", s.units, o.stock),
        ),
        None => (false, "the order database could not be read".into()),
    });
    let limit = fold("per-user limit held", &|o| {
        let limit = i64::from(o.per_user_limit.unwrap_or(0));
        match sold_of(&o.sku) {
            Some(s) => (
                limit == 0 || s.most_per_buyer <= limit,
                format!(
                    "at most {} units per buyer (limit {limit})",
                    s.most_per_buyer
                ),
            ),
            None => (false, "the order database could not be read".into()),
        }
    });
    let gate = fold("gate equals database", &|o| {
        let read = products.iter().find(|(sku, _, _)| *sku == o.sku);
        let c = checks::gate(
            read.and_then(|(_, p, _)| p.as_ref()),
            read.and_then(|(_, _, d)| *d),
        );
        (c.pass, c.detail)
    });
    vec![within, limit, gate]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(sku: &str, stock: i64, limit: u32) -> Offer {
        Offer {
            sku: sku.into(),
            stock,
            per_user_limit: Some(limit),
        }
    }

    fn product(available: i64, gate_available: i64) -> Option<Product> {
        Some(Product {
            available,
            gate_available,
            ..Product::default()
        })
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks.iter().filter(|c| !c.pass).map(|c| c.name).collect()
    }

    #[test]
    fn oversold_stock_a_greedy_buyer_a_drifting_gate_or_an_unread_database_fail_the_run() {
        let offers = [offer("A", 10, 2), offer("B", 5, 0)];
        let sold = |a: (i64, i64), b: (i64, i64)| {
            BTreeMap::from([
                (
                    "A".to_owned(),
                    Sold {
                        units: a.0,
                        most_per_buyer: a.1,
                    },
                ),
                (
                    "B".to_owned(),
                    Sold {
                        units: b.0,
                        most_per_buyer: b.1,
                    },
                ),
            ])
        };
        let gates = |drift| {
            vec![
                ("A".to_owned(), product(0, 0), Some(0)),
                ("B".to_owned(), product(1, 1), Some(drift)),
            ]
        };
        let ok = stock_checks(&offers, Some(&sold((10, 2), (4, 4))), &gates(0));
        assert!(failed(&ok).is_empty(), "B has no limit");

        let over = stock_checks(&offers, Some(&sold((11, 2), (4, 1))), &gates(0));
        assert_eq!(failed(&over), vec!["units sold <= stock"]);
        let greedy = stock_checks(&offers, Some(&sold((10, 3), (4, 1))), &gates(0));
        assert_eq!(failed(&greedy), vec!["per-user limit held"]);
        let drift = stock_checks(&offers, Some(&sold((10, 2), (4, 1))), &gates(1));
        assert_eq!(failed(&drift), vec!["gate equals database"]);
        let unread = stock_checks(&offers, None, &[]);
        assert_eq!(
            failed(&unread),
            vec![
                "units sold <= stock",
                "per-user limit held",
                "gate equals database"
            ]
        );
        // A product nobody bought has no row: nothing sold.
        let none = stock_checks(&offers, Some(&BTreeMap::new()), &gates(0));
        assert!(failed(&none).is_empty());
    }
}
