//! The invariant checks of a sale (docs/invariants.md) on the orders, shipments and product as
//! read back over gRPC at the end of the run.

use std::collections::BTreeMap;

use flashsale_proto::{
    order::v1::{CancelReason, Order, OrderStatus, RefundStatus, SaleReport},
    outbound::v1::{Shipment, ShipmentStatus},
    product::v1::Product,
};

use super::{
    follow::{Outcome, PayTiming, Plan},
    report::{cancel_reason, counts, order_status, refund_status, short},
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
    /// When the sale paid it (winners who pay at once).
    pub pay_timing: Option<PayTiming>,
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

/// Every order whose buyer paid at the provider before the payment deadline ended SHIPPED, or
/// CANCELLED with a reason and its refund recorded (or paid back). Anything else — still PAID,
/// cancelled without a refund or without a reason, not read back — is money taken for nothing.
pub(super) fn paid_settled(lines: &[Line]) -> Check {
    let (mut shipped, mut refunded, mut wrong) = (0, 0, Vec::new());
    for l in lines {
        let in_time = l.outcome.took_money()
            && l.pay_timing.is_none_or(|t| t.paid_in_time != Some(false))
            && l.plan != Plan::PayLate;
        if !in_time {
            continue;
        }
        match &l.order {
            Some(o) if status_is(o, OrderStatus::Shipped) => shipped += 1,
            Some(o)
                if status_is(o, OrderStatus::Cancelled)
                    && o.cancel_reason != CancelReason::Unspecified as i32
                    && (o.refund_status == RefundStatus::Recorded as i32
                        || o.refund_status == RefundStatus::Completed as i32) =>
            {
                refunded += 1
            }
            Some(o) => wrong.push(format!(
                "{} ({}, refund {})",
                short(&l.order_id),
                order_status(o),
                refund_status(o)
            )),
            None => wrong.push(format!("{} (not read back)", short(&l.order_id))),
        }
    }
    let detail = if wrong.is_empty() {
        format!(
            "{} paid in time: {shipped} shipped, {refunded} cancelled with a reason and refunded",
            shipped + refunded
        )
    } else {
        format!(
            "{} paid in time but neither shipped nor refunded: {}",
            wrong.len(),
            wrong.join(", ")
        )
    };
    Check {
        name: "paid orders shipped",
        pass: wrong.is_empty(),
        detail,
    }
}

/// Payments of the winners who pay at once that came too late because of the sale itself:
/// PayOrder sent after the deadline, refused ORDER_NOT_PAYABLE (the deadline passed while the
/// payment queued in the sale), or paid at the provider after the deadline (the order was then
/// cancelled and refunded). The deliberate late payers (`--pay-late`) are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct LateBySale {
    pub payers: usize,
    pub started_late: usize,
    pub refused_late: usize,
    pub paid_late: usize,
    pub deliberate: usize,
}

impl LateBySale {
    pub fn total(&self) -> usize {
        self.started_late + self.refused_late + self.paid_late
    }
}

pub(super) fn late_by_sale(lines: &[Line]) -> LateBySale {
    let mut late = LateBySale::default();
    for l in lines {
        match l.plan {
            Plan::PayLate => late.deliberate += 1,
            Plan::Pay => {}
            _ => continue,
        }
        if l.plan != Plan::Pay {
            continue;
        }
        late.payers += 1;
        let timing = l.pay_timing;
        if timing.is_some_and(|t| !t.started_in_time) {
            late.started_late += 1;
        } else if matches!(&l.outcome, Outcome::PayRefused(r) if r == "ORDER_NOT_PAYABLE") {
            late.refused_late += 1;
        } else if timing.is_some_and(|t| t.paid_in_time == Some(false)) {
            late.paid_late += 1;
        }
    }
    late
}

/// Fails when the sale itself made winners who pay at once miss their deadline: the run then
/// measured the sale's own pace, not the platform's.
pub(super) fn payers_in_time(late: &LateBySale) -> Check {
    let detail = format!(
        "{} of {} payers late because of the sale (PayOrder after the deadline {}, refused \
         ORDER_NOT_PAYABLE {}, paid at the provider after the deadline {}); {} late on purpose",
        late.total(),
        late.payers,
        late.started_late,
        late.refused_late,
        late.paid_late,
        late.deliberate
    );
    let hint = if late.total() > 0 {
        " — raise --pay-concurrency or the payment timeout"
    } else {
        ""
    };
    Check {
        name: "payers paid in time",
        pass: late.total() == 0,
        detail: format!("{detail}{hint}"),
    }
}

/// The sale opened on time, by this machine's clock: no order was accepted (nor any other
/// answer but `SALE_NOT_STARTED` given) before the opening, and no call sent after it was
/// refused `SALE_NOT_STARTED`.
pub(super) fn opened_on_time(e: &super::flood::Early) -> Check {
    let pass = e.other_before_opening.is_empty() && e.after_opening == 0;
    Check {
        name: "the sale opened on time",
        pass,
        detail: format!(
            "{} refused SALE_NOT_STARTED before the opening ({} from memory); other answers before it: {:?}; refused SALE_NOT_STARTED though sent after it: {}",
            e.refused, e.remembered, e.other_before_opening, e.after_opening
        ),
    }
}

/// The order service's sale report (GetSaleReport) tells what the sale saw: the orders
/// accepted, the calls refused by reason (before the opening too), and the orders paid,
/// shipped and cancelled by reason, with the revenue at their accepted prices.
pub(super) fn report_agrees(
    reports: &[Option<SaleReport>],
    refused: &BTreeMap<String, u64>,
    accepted: usize,
    lines: &[Line],
) -> Check {
    let name = "the sale report agrees";
    let Some(reports) = reports.iter().cloned().collect::<Option<Vec<_>>>() else {
        return Check {
            name,
            pass: false,
            detail: "the order service answered no report for a product".into(),
        };
    };
    let mut theirs = SaleFigures::default();
    for r in &reports {
        theirs.accepted += r.accepted;
        theirs.paid += r.paid;
        theirs.shipped += r.shipped;
        theirs.revenue_cents += r.revenue_cents;
        for (k, n) in &r.refused {
            *theirs.refused.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &r.cancelled {
            *theirs.cancelled.entry(k.clone()).or_default() += n;
        }
    }
    let mut ours = SaleFigures {
        accepted: i64::try_from(accepted).unwrap_or(i64::MAX),
        refused: refused
            .iter()
            .map(|(k, n)| (k.clone(), i64::try_from(*n).unwrap_or(i64::MAX)))
            .collect(),
        ..SaleFigures::default()
    };
    for o in lines.iter().filter_map(|l| l.order.as_ref()) {
        if status_is(o, OrderStatus::Paid) || status_is(o, OrderStatus::Shipped) {
            ours.paid += 1;
            ours.revenue_cents += o.total_cents;
        }
        if status_is(o, OrderStatus::Shipped) {
            ours.shipped += 1;
        }
        if status_is(o, OrderStatus::Cancelled) {
            *ours.cancelled.entry(cancel_reason(o)).or_default() += 1;
            if o.refund_cents > 0 {
                ours.paid += 1;
            }
        }
    }
    Check {
        name,
        pass: ours == theirs,
        detail: if ours == theirs {
            format!("{ours:?}")
        } else {
            format!("the sale saw {ours:?}; the report says {theirs:?}")
        },
    }
}

/// What the sale saw, and what the report says.
#[derive(Debug, Default, PartialEq, Eq)]
struct SaleFigures {
    accepted: i64,
    refused: BTreeMap<String, i64>,
    paid: i64,
    shipped: i64,
    cancelled: BTreeMap<String, i64>,
    revenue_cents: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(plan: Plan, outcome: Outcome, order: Option<Order>, t: Option<PayTiming>) -> Line {
        Line {
            order_id: "0123456789".into(),
            buyer: "buyer-0001".into(),
            plan,
            outcome,
            order,
            shipment: None,
            pay_timing: t,
        }
    }

    fn order(status: OrderStatus, reason: CancelReason, refund: RefundStatus) -> Option<Order> {
        Some(Order {
            status: status as i32,
            cancel_reason: reason as i32,
            refund_status: refund as i32,
            ..Order::default()
        })
    }

    fn timing(started: bool, paid: Option<bool>) -> Option<PayTiming> {
        Some(PayTiming {
            queued: std::time::Duration::ZERO,
            started_in_time: started,
            paid_in_time: paid,
        })
    }

    #[test]
    fn a_timely_payment_must_end_shipped_or_refunded_with_a_reason() {
        use CancelReason as C;
        use OrderStatus as S;
        use RefundStatus as R;
        let ok = [
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Shipped, C::Unspecified, R::None),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Cancelled, C::OutboundFailed, R::Recorded),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Cancelled, C::PaymentTimeout, R::Completed),
                timing(true, Some(true)),
            ),
            // Not paid in time, late on purpose, or never paid: not this check's business.
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Paid, C::Unspecified, R::None),
                timing(true, Some(false)),
            ),
            line(
                Plan::PayLate,
                Outcome::Paid,
                order(S::Paid, C::Unspecified, R::None),
                None,
            ),
            line(
                Plan::Pay,
                Outcome::PayRefused("ORDER_NOT_PAYABLE".into()),
                order(S::Cancelled, C::PaymentTimeout, R::None),
                timing(true, None),
            ),
        ];
        let c = paid_settled(&ok);
        assert!(c.pass, "{}", c.detail);
        assert!(
            c.detail.contains("3 paid in time: 1 shipped, 2"),
            "{}",
            c.detail
        );

        for bad in [
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Paid, C::Unspecified, R::None),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Cancelled, C::PaymentTimeout, R::None),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Cancelled, C::Unspecified, R::Recorded),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::AwaitingPayment, C::Unspecified, R::None),
                None,
            ),
            line(Plan::Pay, Outcome::Paid, None, timing(true, Some(true))),
        ] {
            let c = paid_settled(std::slice::from_ref(&bad));
            assert!(!c.pass, "passed: {}", c.detail);
            assert!(
                c.detail.contains("neither shipped nor refunded"),
                "{}",
                c.detail
            );
        }
    }

    #[test]
    fn payments_the_sale_made_too_late_are_counted_apart_from_deliberate_ones() {
        use CancelReason as C;
        use OrderStatus as S;
        use RefundStatus as R;
        let lines = [
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Shipped, C::Unspecified, R::None),
                timing(true, Some(true)),
            ),
            line(
                Plan::Pay,
                Outcome::PayRefused("ORDER_NOT_PAYABLE".into()),
                None,
                timing(false, None),
            ),
            line(
                Plan::Pay,
                Outcome::PayRefused("ORDER_NOT_PAYABLE".into()),
                None,
                timing(true, None),
            ),
            line(
                Plan::Pay,
                Outcome::Paid,
                order(S::Cancelled, C::PaymentTimeout, R::Recorded),
                timing(true, Some(false)),
            ),
            line(
                Plan::PayLate,
                Outcome::Paid,
                order(S::Cancelled, C::PaymentTimeout, R::Recorded),
                None,
            ),
            line(Plan::NeverPay, Outcome::None, None, None),
        ];
        let late = late_by_sale(&lines);
        assert_eq!(
            late,
            LateBySale {
                payers: 4,
                started_late: 1,
                refused_late: 1,
                paid_late: 1,
                deliberate: 1,
            }
        );
        let c = payers_in_time(&late);
        assert!(!c.pass);
        assert!(
            c.detail.contains("3 of 4 payers late") && c.detail.contains("--pay-concurrency"),
            "{}",
            c.detail
        );
        let c = payers_in_time(&late_by_sale(&lines[..1]));
        assert!(c.pass, "{}", c.detail);
    }
}
