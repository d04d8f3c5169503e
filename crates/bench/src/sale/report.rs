//! Phase (f), the report: what the flood measured, what became of every order, and the
//! invariant checks (docs/invariants.md) on figures read back over gRPC — as text or one JSON
//! object.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use flashsale_proto::{
    order::v1::{CancelReason, Order, OrderStatus, RefundStatus},
    outbound::v1::{Shipment, ShipmentStatus},
    product::v1::Product,
};
use serde_json::{Value, json};

use super::{
    Args, Ctx, Shares,
    checks::{self, Check, Line, status_is},
    flood::Flood,
    follow::{Outcome, Plan, Run},
    read,
};
use crate::procstat::{self, Memory};

/// Quantiles reported, with their labels.
const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

pub(crate) struct Report {
    head: Value,
    lines: Vec<Line>,
    /// Each product of the sale as read back: `(sku, product, drift)`.
    products: Vec<(String, Option<Product>, Option<i64>)>,
    checks: Vec<Check>,
    bound_hits: Vec<String>,
    /// The services' resident memory during the sale.
    memory: Vec<Memory>,
    elapsed: Duration,
}

/// Reads everything back (bounded by the hard deadline) and checks the invariants.
pub(crate) async fn build(
    ctx: &std::sync::Arc<Ctx>,
    args: &Args,
    shares: Shares,
    flood: &Flood,
    mut run: Run,
    memory: Vec<Memory>,
    started: Instant,
) -> Report {
    let hard = ctx.hard_deadline;
    let ids = run.tracked.iter().map(|t| t.order_id.clone()).collect();
    match tokio::time::timeout_at(hard, read::orders(ctx, ids)).await {
        Ok(read) => {
            for (t, o) in run.tracked.iter_mut().zip(read) {
                t.order = o;
            }
        }
        Err(_) => run
            .bound_hits
            .push("the orders could not be read back before the time bound".into()),
    }
    let mut products = Vec::with_capacity(ctx.skus.len());
    for sku in &ctx.skus {
        let p = tokio::time::timeout_at(hard, read::product(ctx, sku))
            .await
            .ok()
            .flatten();
        products.push((sku.clone(), p));
    }
    let drifts = tokio::time::timeout_at(hard, read::drift(ctx))
        .await
        .unwrap_or_default();
    let products: Vec<(String, Option<Product>, Option<i64>)> = products
        .into_iter()
        .map(|(sku, p)| {
            let d = drifts.get(&sku).copied();
            (sku, p, d)
        })
        .collect();
    let shipments = tokio::time::timeout_at(hard, read::shipments(ctx, &run))
        .await
        .unwrap_or_else(|_| vec![None; run.tracked.len()]);
    if tokio::time::Instant::now() >= hard {
        run.bound_hits
            .push("the read-back for the report ran into the time bound".into());
    }

    let lines: Vec<Line> = run
        .tracked
        .into_iter()
        .zip(shipments)
        .map(|(t, shipment)| Line {
            buyer: ctx.buyers[t.buyer].clone(),
            order_id: t.order_id,
            plan: t.plan,
            outcome: t.outcome,
            order: t.order,
            shipment,
            pay_timing: t.pay_timing,
        })
        .collect();
    let late = checks::late_by_sale(&lines);
    let checks = vec![
        checks::per_product(&products, &lines, |lines, sku, _, _| {
            checks::sold(lines, ctx.stock_of(sku))
        }),
        checks::terminal(&lines, run.unlisted_buyers),
        checks::per_product(&products, &lines, |lines, sku, p, _| {
            checks::conserved(lines, p, ctx.stock_of(sku))
        }),
        checks::refunds(&lines),
        checks::per_product(&products, &lines, |_, _, p, d| checks::gate(p, d)),
        checks::paid_settled(&lines),
        checks::payers_in_time(&late),
    ];
    let mut checks = checks;
    if ctx.opening_ms.is_some() {
        checks.push(checks::opened_on_time(&flood.early));
    }
    // Refusals reach the report within a second or so (each replica writes its counts once a
    // second): it is read until it has them all, or for a few seconds.
    let mut refused = flood.refused.clone();
    if flood.early.refused > 0 {
        *refused.entry("SALE_NOT_STARTED".to_owned()).or_default() += flood.early.refused;
    }
    let want: i64 = refused
        .values()
        .map(|n| i64::try_from(*n).unwrap_or(i64::MAX))
        .sum();
    let until = (tokio::time::Instant::now() + std::time::Duration::from_secs(5)).min(hard);
    let sale_reports = loop {
        let mut got = Vec::with_capacity(ctx.skus.len());
        for sku in &ctx.skus {
            got.push(
                tokio::time::timeout_at(hard, read::sale_report(ctx, sku))
                    .await
                    .ok()
                    .flatten(),
            );
        }
        let counted: i64 = got.iter().flatten().flat_map(|r| r.refused.values()).sum();
        if counted >= want || tokio::time::Instant::now() >= until {
            break got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    checks.push(checks::report_agrees(
        &sale_reports,
        &refused,
        flood.accepted.len(),
        &lines,
    ));
    let payments = payments_json(&lines, &late, args.pay_concurrency, run.act_elapsed);

    let latency: serde_json::Map<String, Value> = QUANTILES
        .iter()
        .map(|(k, q)| ((*k).to_owned(), json!(flood.latency.value_at_quantile(*q))))
        .chain([("max".to_owned(), json!(flood.latency.max()))])
        .collect();
    let head = json!({
        "sku": ctx.skus.first(),
        "skus": ctx.skus,
        "policy": args.policy.name(),
        // Each product's own (`--product`); the first product's below, as before.
        "offers": ctx.offers.iter().map(|o| json!({
            "sku": o.sku,
            "stock": o.stock,
            "perUserLimit": o.per_user_limit.unwrap_or(args.per_user_limit),
        })).collect::<Vec<_>>(),
        "stock": ctx.offers.first().map_or(args.stock, |o| o.stock),
        "perUserLimit": ctx.offers.first().and_then(|o| o.per_user_limit).unwrap_or(args.per_user_limit),
        "priceCents": args.price_cents,
        "buyers": args.buyers,
        "requestsPerBuyer": args.requests_per_buyer,
        "concurrency": args.concurrency,
        "shares": {"pay": shares.pay, "neverPay": shares.never_pay, "payLate": shares.pay_late},
        "requests": flood.requests,
        "plannedRequests": flood.planned,
        // What ended the flood: every planned call made, or --duration-secs.
        "floodEnded": if flood.stopped_by_duration { "duration" } else { "requests" },
        "accepted": flood.accepted.len(),
        "refused": flood.refused,
        "errors": flood.errors,
        "floodSecs": flood.elapsed.as_secs_f64(),
        "throughputRps": flood.throughput(),
        "latencyUs": latency,
        "confirmationMs": run.confirmation.map(|d| d.as_secs_f64() * 1000.0),
        "salePriceCents": args.sale_price_cents,
        "beforeOpening": ctx.opening_ms.map(|_| early_json(&flood.early)),
        "payments": payments,
    });
    Report {
        head,
        lines,
        products,
        checks,
        bound_hits: run.bound_hits,
        memory,
        elapsed: started.elapsed(),
    }
}

/// The calls made before the opening: how many were refused, how many from memory, how fast.
fn early_json(e: &super::flood::Early) -> Value {
    let latency: serde_json::Map<String, Value> = QUANTILES
        .iter()
        .map(|(k, q)| ((*k).to_owned(), json!(e.latency.value_at_quantile(*q))))
        .chain([("max".to_owned(), json!(e.latency.max()))])
        .collect();
    json!({
        "refusedNotStarted": e.refused,
        "fromMemory": e.remembered,
        "otherAnswers": e.other_before_opening,
        "notStartedAfterOpening": e.after_opening,
        "latencyUs": latency,
    })
}

/// What the sale's payments of the winners who pay at once did: how many, how fast, how long
/// they queued in the sale, and how many it made too late.
fn payments_json(
    lines: &[Line],
    late: &checks::LateBySale,
    pay_concurrency: u32,
    act: Option<Duration>,
) -> Value {
    let mut queued: Vec<f64> = lines
        .iter()
        .filter(|l| l.plan == Plan::Pay)
        .filter_map(|l| l.pay_timing)
        .map(|t| t.queued.as_secs_f64() * 1000.0)
        .collect();
    queued.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((queued.len() as f64 - 1.0) * q).round().max(0.0) as usize;
        queued.get(i).copied()
    };
    let paid = lines
        .iter()
        .filter(|l| l.plan == Plan::Pay && l.outcome.took_money())
        .count();
    let secs = act.map_or(0.0, |d| d.as_secs_f64());
    json!({
        "payConcurrency": pay_concurrency,
        "payers": late.payers,
        "paid": paid,
        "actSecs": secs,
        "paidPerSec": if secs > 0.0 { paid as f64 / secs } else { 0.0 },
        "queuedMs": {"p50": at(0.5), "p99": at(0.99), "max": queued.last()},
        "lateBySale": {
            "total": late.total(),
            "startedLate": late.started_late,
            "refusedLate": late.refused_late,
            "paidLate": late.paid_late,
            "deliberate": late.deliberate,
        },
    })
}

// === impl Report ===

impl Report {
    pub fn passed(&self) -> bool {
        self.bound_hits.is_empty() && self.checks.iter().all(|c| c.pass)
    }

    fn totals(&self) -> Value {
        let mut by_status = BTreeMap::new();
        let mut by_reason = BTreeMap::new();
        let (mut shipped_units, mut refunds, mut refunded_cents) = (0, 0, 0);
        for o in self.lines.iter().filter_map(|l| l.order.as_ref()) {
            *by_status.entry(order_status(o)).or_insert(0u64) += 1;
            if status_is(o, OrderStatus::Cancelled) {
                *by_reason.entry(cancel_reason(o)).or_insert(0u64) += 1;
            }
            if status_is(o, OrderStatus::Shipped) {
                shipped_units += o.quantity;
            }
            if o.refund_cents > 0 {
                refunds += 1;
                refunded_cents += o.refund_cents;
            }
        }
        let mut shipments = BTreeMap::new();
        for s in self.lines.iter().filter_map(|l| l.shipment.as_ref()) {
            *shipments.entry(shipment_status(s)).or_insert(0u64) += 1;
        }
        let mut plans = BTreeMap::new();
        for l in &self.lines {
            *plans.entry(plan_name(l.plan)).or_insert(0u64) += 1;
        }
        json!({
            "byStatus": by_status,
            "byCancelReason": by_reason,
            "byPlan": plans,
            "shipments": shipments,
            "shippedUnits": shipped_units,
            "refunds": refunds,
            "refundedCents": refunded_cents,
        })
    }

    pub fn to_json(&self, quiet: bool) -> Value {
        let mut v = self.head.clone();
        v["totals"] = self.totals();
        let products: Vec<Value> = self
            .products
            .iter()
            .map(|(sku, p, drift)| {
                let p = p.as_ref();
                json!({
                    "sku": sku,
                    "onHand": p.map(|p| p.on_hand),
                    "reserved": p.map(|p| p.reserved),
                    "available": p.map(|p| p.available),
                    "gateAvailable": p.map(|p| p.gate_available),
                    "drift": drift,
                })
            })
            .collect();
        // `product` is the first (the only one unless --products).
        v["product"] = products.first().cloned().unwrap_or(Value::Null);
        v["products"] = json!(products);
        v["invariants"] = self
            .checks
            .iter()
            .map(|c| json!({"name": c.name, "pass": c.pass, "detail": c.detail}))
            .collect();
        v["memory"] = self.memory.iter().map(Memory::to_json).collect();
        v["memoryLimitMib"] = json!(procstat::MEMORY_LIMIT_MIB);
        v["timeBoundHit"] = json!(!self.bound_hits.is_empty());
        v["timeBound"] = json!(self.bound_hits);
        v["elapsedSecs"] = json!(self.elapsed.as_secs_f64());
        v["pass"] = json!(self.passed());
        if !quiet {
            v["orders"] = self.lines.iter().map(Line::to_json).collect();
        }
        v
    }

    pub fn print_text(&self, quiet: bool) {
        let h = &self.head;
        let t = self.totals();
        let offers: Vec<String> = h["offers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|o| {
                        format!(
                            "{} ({} units, per-user limit {})",
                            text(&o["sku"]),
                            o["stock"],
                            o["perUserLimit"]
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "flash sale {} at {} cents, {}",
            offers.join(", "),
            h["priceCents"],
            text(&h["policy"])
        );
        let ended = if h["floodEnded"] == "duration" {
            format!(
                " (stopped by --duration-secs, {} planned)",
                h["plannedRequests"]
            )
        } else {
            String::new()
        };
        println!(
            "flood       {} requests from {} buyers ({} each), {} in flight: {:.2} s, {:.1} requests/s{ended}",
            h["requests"],
            h["buyers"],
            h["requestsPerBuyer"],
            h["concurrency"],
            h["floodSecs"].as_f64().unwrap_or(0.0),
            h["throughputRps"].as_f64().unwrap_or(0.0)
        );
        if let Some(e) = h["beforeOpening"].as_object() {
            let lat = &e["latencyUs"];
            let ms = |k: &str| lat[k].as_f64().unwrap_or(0.0) / 1000.0;
            println!(
                "before the opening {} calls refused SALE_NOT_STARTED ({} from the order service's memory): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                e["refusedNotStarted"],
                e["fromMemory"],
                ms("p50"),
                ms("p99"),
                ms("max")
            );
        }
        println!("accepted    {}", h["accepted"]);
        println!("refused     {}", map_text(&h["refused"]));
        println!("errors      {}", map_text(&h["errors"]));
        let lat = &h["latencyUs"];
        let ms = |k: &str| lat[k].as_f64().unwrap_or(0.0) / 1000.0;
        println!(
            "latency     p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            ms("p50"),
            ms("p90"),
            ms("p99"),
            ms("p99.9"),
            ms("max")
        );
        match h["confirmationMs"].as_f64() {
            Some(c) => {
                println!("confirmed   every accepted order within {c:.0} ms of the last accept")
            }
            None if h["accepted"] == 0 => println!("confirmed   no order to confirm"),
            None => println!("confirmed   not every accepted order (see the time bound)"),
        }
        println!(
            "memory      peak VmRSS during the sale: {}",
            procstat::memory_line(&self.memory)
        );
        println!("plan        {}", map_text(&t["byPlan"]));
        let p = &h["payments"];
        println!(
            "payments    {} paid of {} paying at once, {} in flight, {:.1} paid/s over {:.1} s; queued in the sale p50 {:.0} ms, max {:.0} ms",
            p["paid"],
            p["payers"],
            p["payConcurrency"],
            p["paidPerSec"].as_f64().unwrap_or(0.0),
            p["actSecs"].as_f64().unwrap_or(0.0),
            p["queuedMs"]["p50"].as_f64().unwrap_or(0.0),
            p["queuedMs"]["max"].as_f64().unwrap_or(0.0),
        );
        println!(
            "late        {} by the sale itself (PayOrder after the deadline {}, refused {}, paid after it {}); {} on purpose (--pay-late)",
            p["lateBySale"]["total"],
            p["lateBySale"]["startedLate"],
            p["lateBySale"]["refusedLate"],
            p["lateBySale"]["paidLate"],
            p["lateBySale"]["deliberate"],
        );
        if !quiet {
            println!();
            println!(
                "  {:<8}  {:<11}  {:<14}  {:<16}  {:<15}  {:<14}  {:<8}  note",
                "order", "buyer", "plan", "status", "cancel reason", "refund", "shipment"
            );
            for l in &self.lines {
                l.print();
            }
            println!();
        }
        println!("orders      {}", map_text(&t["byStatus"]));
        println!("cancelled   {}", map_text(&t["byCancelReason"]));
        println!("shipments   {}", map_text(&t["shipments"]));
        println!(
            "shipped     {} units; refunds {} ({} cents)",
            t["shippedUnits"], t["refunds"], t["refundedCents"]
        );
        for (sku, p, drift) in &self.products {
            match p {
                Some(p) => println!(
                    "product     {sku}: on hand {}, reserved {}, available {}, gate {}, drift {}",
                    p.on_hand,
                    p.reserved,
                    p.available,
                    p.gate_available,
                    drift.map_or("?".into(), |d| d.to_string())
                ),
                None => println!("product     {sku}: could not be read back"),
            }
        }
        println!();
        println!("invariants");
        for c in &self.checks {
            let mark = if c.pass { "PASS" } else { "FAIL" };
            println!("  {mark}  {:<22}  {}", c.name, c.detail);
        }
        if self.bound_hits.is_empty() {
            println!(
                "  PASS  {:<22}  finished by itself",
                "within the time bound"
            );
        } else {
            println!(
                "  FAIL  {:<22}  {}",
                "within the time bound",
                self.bound_hits.join("; ")
            );
        }
        println!(
            "result      {} in {:.1} s",
            if self.passed() { "PASS" } else { "FAIL" },
            self.elapsed.as_secs_f64()
        );
    }
}

// === impl Line ===

impl Line {
    fn to_json(&self) -> Value {
        let o = self.order.as_ref();
        json!({
            "orderId": self.order_id,
            "sku": o.map(|o| o.sku.as_str()),
            "buyer": self.buyer,
            "plan": plan_name(self.plan),
            "status": o.map(order_status),
            "cancelReason": o.filter(|o| o.cancel_reason != CancelReason::Unspecified as i32).map(cancel_reason),
            "refundStatus": o.map(refund_status),
            "refundCents": o.map(|o| o.refund_cents),
            "totalCents": o.map(|o| o.total_cents),
            "shipment": self.shipment.as_ref().map(shipment_status),
            "outcome": (self.outcome != Outcome::None).then(|| outcome_text(&self.outcome)),
        })
    }

    fn print(&self) {
        let o = self.order.as_ref();
        let refund = o
            .filter(|o| o.refund_cents > 0)
            .map_or("-".to_owned(), |o| {
                format!("{} {}", refund_status(o), o.refund_cents)
            });
        let line = format!(
            "  {:<8}  {:<11}  {:<14}  {:<16}  {:<15}  {:<14}  {:<8}  {}",
            short(&self.order_id),
            self.buyer,
            plan_name(self.plan),
            o.map_or("?".into(), order_status),
            o.map(cancel_reason).unwrap_or_default(),
            refund,
            self.shipment.as_ref().map_or("-".into(), shipment_status),
            outcome_text(&self.outcome)
        );
        println!("{}", line.trim_end());
    }
}

// === names ===

pub(super) fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

pub(super) fn order_status(o: &Order) -> String {
    OrderStatus::try_from(o.status).map_or("?".into(), |s| {
        s.as_str_name().trim_start_matches("ORDER_STATUS_").into()
    })
}

pub(super) fn cancel_reason(o: &Order) -> String {
    match CancelReason::try_from(o.cancel_reason) {
        Ok(CancelReason::Unspecified) => "-".into(),
        Ok(r) => r.as_str_name().trim_start_matches("CANCEL_REASON_").into(),
        Err(_) => "?".into(),
    }
}

pub(super) fn refund_status(o: &Order) -> String {
    RefundStatus::try_from(o.refund_status).map_or("?".into(), |s| {
        s.as_str_name().trim_start_matches("REFUND_STATUS_").into()
    })
}

pub(super) fn shipment_status(s: &Shipment) -> String {
    ShipmentStatus::try_from(s.status).map_or("?".into(), |s| {
        s.as_str_name()
            .trim_start_matches("SHIPMENT_STATUS_")
            .into()
    })
}

fn plan_name(p: Plan) -> &'static str {
    match p {
        Plan::Pay => "pay",
        Plan::NeverPay => "never-pay",
        Plan::PayLate => "pay-late",
        Plan::Cancel => "cancel",
        Plan::NoWinner => "no-winner",
        Plan::Unacknowledged => "unacknowledged",
    }
}

fn outcome_text(o: &Outcome) -> String {
    match o {
        Outcome::None => String::new(),
        Outcome::Paid => "paid".into(),
        Outcome::PayRefused(r) => format!("payment refused: {r}"),
        Outcome::PayFailed(c) => format!("payment failed: {c}"),
        Outcome::Cancelled => "cancelled".into(),
        Outcome::CancelFailed(c) => format!("cancel failed: {c}"),
        Outcome::Skipped(why) => format!("skipped: {why}"),
    }
}

pub(super) fn counts(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn map_text(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "none".into(),
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}
