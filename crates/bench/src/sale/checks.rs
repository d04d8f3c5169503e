//! The invariant checks of a sale (docs/invariants.md) on the orders, shipments and product as
//! read back over gRPC at the end of the run.

use std::collections::BTreeMap;

use flashsale_proto::{
    order::v1::{CancelReason, Order, OrderStatus, RefundStatus},
    outbound::v1::{Shipment, ShipmentStatus},
    product::v1::Product,
};

use super::{
    follow::{Outcome, Plan},
    report::{counts, order_status, refund_status, short},
};

/// One order in the report.
#[derive(Clone)]
pub(super) struct Line {
    pub order_id: String,
    pub buyer: String,
    pub plan: Plan,
    pub outcome: Outcome,
    pub order: Option<Order>,
    pub shipment: Option<Shipment>,
}

/// One invariant check.
pub(super) struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

pub(super) fn status_is(o: &Order, s: OrderStatus) -> bool {
    o.status == s as i32
}

/// Runs a per-product check for each product on that product's orders; one product's check is
/// returned as is, several are folded into one that passes when all pass.
pub(super) fn per_product(
    products: &[(String, Option<Product>, Option<i64>)],
    lines: &[Line],
    check: impl Fn(&[Line], &str, Option<&Product>, Option<i64>) -> Check,
) -> Check {
    if let [(sku, p, d)] = products {
        return check(lines, sku, p.as_ref(), *d);
    }
    let mut name = "";
    let mut pass = true;
    let mut details = Vec::with_capacity(products.len());
    for (sku, p, d) in products {
        // An order not read back may be of any product: each counts it (as sold, say).
        let mine: Vec<Line> = lines
            .iter()
            .filter(|l| l.order.as_ref().is_none_or(|o| &o.sku == sku))
            .cloned()
            .collect();
        let c = check(&mine, sku, p.as_ref(), *d);
        name = c.name;
        pass &= c.pass;
        details.push(format!("{sku}: {}", c.detail));
    }
    Check {
        name,
        pass,
        detail: details.join("; "),
    }
}

/// Units sold (orders not cancelled) ≤ stock; an order not read back counts as sold.
pub(super) fn sold(lines: &[Line], stock: i64) -> Check {
    let sold: i64 = lines
        .iter()
        .map(|l| match &l.order {
            Some(o) if status_is(o, OrderStatus::Cancelled) => 0,
            Some(o) => o.quantity,
            None => 1,
        })
        .sum();
    Check {
        name: "units sold <= stock",
        pass: sold <= stock,
        detail: format!("{sold} sold of {stock}"),
    }
}

/// Every order exists and is SHIPPED or CANCELLED.
pub(super) fn terminal(lines: &[Line], unlisted_buyers: usize) -> Check {
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    for l in lines {
        let name = match &l.order {
            Some(o)
                if status_is(o, OrderStatus::Shipped) || status_is(o, OrderStatus::Cancelled) =>
            {
                continue;
            }
            Some(o) => order_status(o),
            None => "NOT READ BACK".to_owned(),
        };
        *open.entry(name).or_default() += 1;
    }
    let mut detail = if open.is_empty() {
        format!("all {} orders SHIPPED or CANCELLED", lines.len())
    } else {
        format!("not terminal: {}", counts(&open))
    };
    if unlisted_buyers > 0 {
        detail.push_str(&format!(
            "; orders of {unlisted_buyers} buyers with failed calls could not be listed"
        ));
    }
    Check {
        name: "every order terminal",
        pass: open.is_empty() && unlisted_buyers == 0,
        detail,
    }
}

/// Shipped units + available = stock, with nothing reserved; outbound and order agree on
/// what shipped.
pub(super) fn conserved(lines: &[Line], product: Option<&Product>, stock: i64) -> Check {
    let name = "stock conserved";
    let Some(p) = product else {
        return Check {
            name,
            pass: false,
            detail: "the product could not be read back".into(),
        };
    };
    let by_shipments: i64 = lines
        .iter()
        .filter_map(|l| l.shipment.as_ref())
        .filter(|s| s.status == ShipmentStatus::Shipped as i32)
        .map(|s| s.quantity)
        .sum();
    let by_orders: i64 = lines
        .iter()
        .filter_map(|l| l.order.as_ref())
        .filter(|o| status_is(o, OrderStatus::Shipped))
        .map(|o| o.quantity)
        .sum();
    let mut detail = format!(
        "shipped {by_shipments} + available {} = {} of stock {stock} (reserved {})",
        p.available,
        by_shipments + p.available,
        p.reserved
    );
    if by_orders != by_shipments {
        detail.push_str(&format!(
            "; but orders say {by_orders} units shipped, shipments {by_shipments}"
        ));
    }
    Check {
        name,
        pass: p.reserved == 0 && by_shipments + p.available == stock && by_orders == by_shipments,
        detail,
    }
}

/// Every order the sale paid that ended cancelled (failed shipment, late payment) has its
/// refund recorded once, for its total (requested from the provider or paid back; one the
/// provider kept refusing, parked FAILED, fails the check); no other order has a refund.
pub(super) fn refunds(lines: &[Line]) -> Check {
    let (mut failed_shipments, mut late, mut wrong) = (0, 0, Vec::new());
    let mut paid_back = 0;
    for l in lines {
        let Some(o) = &l.order else { continue };
        let cancelled = status_is(o, OrderStatus::Cancelled);
        let failed = l
            .shipment
            .as_ref()
            .is_some_and(|s| s.status == ShipmentStatus::Failed as i32);
        let expected = (l.outcome.took_money() && cancelled) || failed;
        let recorded = o.refund_status == RefundStatus::Recorded as i32
            || o.refund_status == RefundStatus::Completed as i32;
        if o.refund_status == RefundStatus::Completed as i32 {
            paid_back += 1;
        }
        if failed {
            failed_shipments += 1;
        } else if expected {
            late += 1;
        }
        let once = recorded && o.refund_cents == o.total_cents;
        let failed_right =
            !failed || (cancelled && o.cancel_reason == CancelReason::OutboundFailed as i32);
        if expected != recorded || (expected && !once) || !failed_right {
            wrong.push(format!(
                "{} ({}, refund {} {})",
                short(&l.order_id),
                order_status(o),
                refund_status(o),
                o.refund_cents
            ));
        }
    }
    let detail = if wrong.is_empty() {
        format!(
            "{} refunds, each recorded once ({paid_back} paid back by the provider so far): \
             {failed_shipments} failed shipments, {late} payments after cancellation",
            failed_shipments + late
        )
    } else {
        format!("wrong: {}", wrong.join(", "))
    };
    Check {
        name: "refunds exactly once",
        pass: wrong.is_empty(),
        detail,
    }
}

/// The gate equals the database, and ReconcileStock reports no drift.
pub(super) fn gate(product: Option<&Product>, drift: Option<i64>) -> Check {
    let (pass, detail) = match (product, drift) {
        (Some(p), Some(d)) => (
            p.gate_available == p.available && d == 0,
            format!(
                "gate {} vs available {}, reconcile drift {d}",
                p.gate_available, p.available
            ),
        ),
        _ => (
            false,
            "the product or its reconcile report could not be read back".into(),
        ),
    };
    Check {
        name: "gate equals database",
        pass,
        detail,
    }
}
