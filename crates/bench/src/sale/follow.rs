//! Phases (c) to (e): follow the accepted orders until the saga confirms them, have the winners
//! pay, never pay, pay late or cancel, then wait for quiescence — each wait bounded by the run's
//! work deadline.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use flashsale_proto::{
    order::v1::{CancelOrderRequest, Order, OrderStatus, PayOrderRequest, RefundStatus},
    payment::v1::PayCheckoutRequest,
    product::v1::Product,
};
use tokio::{
    sync::Semaphore,
    task::JoinSet,
    time::{Instant, sleep_until},
};

use super::{
    Ctx, Shares,
    flood::Flood,
    progress,
    read::{READ_CONCURRENCY, bounded, list_of, orders, product, request, retrying},
};

/// How often an order is looked at while waiting.
const POLL: Duration = Duration::from_millis(50);
/// Orders read at a time while waiting; a chunk of which none got further ends the pass.
const PASS_CHUNK: usize = 512;
/// A late payer pays this long after its deadline …
const LATE_MARGIN: Duration = Duration::from_millis(250);
/// … once the service has cancelled the order, or at the latest this long after that.
const LATE_PATIENCE: Duration = Duration::from_secs(30);

/// What the sale does with an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Pay,
    NeverPay,
    PayLate,
    Cancel,
    /// Acknowledged, but cancelled (or never confirmed) before it could be paid.
    NoWinner,
    /// Found for a buyer whose call failed: the buyer never learnt of it and never pays.
    Unacknowledged,
}

/// What came of the sale's action on an order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    None,
    Paid,
    PayRefused(String),
    PayFailed(String),
    Cancelled,
    CancelFailed(String),
    Skipped(&'static str),
}

/// One order the sale follows.
pub(crate) struct Tracked {
    pub order_id: String,
    pub buyer: usize,
    pub plan: Plan,
    pub outcome: Outcome,
    /// The order as last read.
    pub order: Option<Order>,
    pub confirmed_at: Option<Instant>,
    /// When the sale's payment of a winner who pays at once: started (PayOrder sent) and
    /// finished at the provider (checkout answered), against the order's payment deadline.
    pub pay_timing: Option<PayTiming>,
    acknowledged: bool,
}

/// When the sale paid an order, against the order's payment deadline (this machine's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PayTiming {
    /// Since the order was confirmed (AWAITING_PAYMENT seen) until PayOrder was sent: the
    /// driver's own queueing.
    pub queued: Duration,
    /// PayOrder was sent before the deadline.
    pub started_in_time: bool,
    /// The buyer's checkout answered before the deadline (`None`: no checkout).
    pub paid_in_time: Option<bool>,
}

/// The orders of a sale and what happened to them.
pub(crate) struct Run {
    ctx: Arc<Ctx>,
    pub tracked: Vec<Tracked>,
    /// From the last accept until every acknowledged order was confirmed.
    pub confirmation: Option<Duration>,
    /// The phases that hit the time bound, with why.
    pub bound_hits: Vec<String>,
    /// Buyers whose orders could not be listed: an order may be missing from the checks.
    pub unlisted_buyers: usize,
    /// PayOrder + checkout calls in flight at once (`--pay-concurrency`).
    pay_concurrency: usize,
    /// How long the winners' actions took (phase (d)).
    pub act_elapsed: Option<Duration>,
}

impl Run {
    /// The acknowledged orders, and any order of a buyer whose call failed.
    pub async fn new(ctx: Arc<Ctx>, flood: &Flood, pay_concurrency: usize) -> Self {
        let mut run = Self {
            tracked: flood
                .accepted
                .iter()
                .map(|a| Tracked::new(a.order_id.clone(), a.buyer, true))
                .collect(),
            ctx,
            confirmation: None,
            bound_hits: Vec::new(),
            unlisted_buyers: 0,
            pay_concurrency: pay_concurrency.max(1),
            act_elapsed: None,
        };
        if flood.cut_short {
            run.bound_hits
                .push("the flood was cut short by the time bound".into());
        }
        run.discover(flood.unsure.iter().copied().collect()).await;
        run
    }

    /// Finds orders of `buyers` (admin ListOrders) that CreateOrder never acknowledged.
    async fn discover(&mut self, buyers: Vec<usize>) {
        if buyers.is_empty() {
            return;
        }
        let ctx = self.ctx.clone();
        let found = bounded(buyers.clone(), READ_CONCURRENCY, move |b| {
            let ctx = ctx.clone();
            async move { list_of(&ctx, b).await.map(|ids| (b, ids)) }
        })
        .await;
        let mut known: HashSet<String> = self.tracked.iter().map(|t| t.order_id.clone()).collect();
        for got in found {
            match got {
                Some(Ok((buyer, ids))) => {
                    for id in ids {
                        if known.insert(id.clone()) {
                            self.tracked.push(Tracked::new(id, buyer, false));
                        }
                    }
                }
                _ => self.unlisted_buyers += 1,
            }
        }
        let extra = self.tracked.iter().filter(|t| !t.acknowledged).count();
        progress(&format!(
            "{} buyers had failed calls: {extra} orders found that were never acknowledged",
            buyers.len()
        ));
    }

    /// Phase (c): waits until no order is PENDING.
    pub async fn confirm(&mut self, last_accept: Option<Instant>) {
        progress("waiting until the saga confirms every accepted order");
        let until = self.ctx.work_deadline;
        if self
            .poll_until(
                |o| o.status != OrderStatus::Pending as i32,
                |_| false,
                until,
            )
            .await
        {
            let last_confirmed = self
                .tracked
                .iter()
                .filter(|t| t.acknowledged)
                .filter_map(|t| t.confirmed_at)
                .max();
            self.confirmation = match (last_accept, last_confirmed) {
                (Some(a), Some(c)) => Some(c.saturating_duration_since(a)),
                _ => None,
            };
        } else {
            self.bound_hits
                .push("some orders were still PENDING at the time bound".into());
        }
    }

    /// Phase (d), first half: which winner (an acknowledged order awaiting payment) does what,
    /// in the order they were accepted.
    pub fn assign(&mut self, shares: Shares) {
        let winners: Vec<usize> = (0..self.tracked.len())
            .filter(|&i| {
                let t = &self.tracked[i];
                t.acknowledged
                    && t.order
                        .as_ref()
                        .is_some_and(|o| o.status == OrderStatus::AwaitingPayment as i32)
            })
            .collect();
        let n = winners.len();
        let [pay, never, late] = split(n, shares);
        for t in &mut self.tracked {
            if t.acknowledged {
                t.plan = Plan::NoWinner;
            }
        }
        for (k, &i) in winners.iter().enumerate() {
            self.tracked[i].plan = match k {
                k if k < pay => Plan::Pay,
                k if k < never => Plan::NeverPay,
                k if k < late => Plan::PayLate,
                _ => Plan::Cancel,
            };
        }
        let next_deadline = winners
            .iter()
            .filter_map(|&i| self.tracked[i].order.as_ref().and_then(deadline_of))
            .min()
            .map(|d| d.saturating_duration_since(Instant::now()));
        progress(&format!(
            "{n} winners: {pay} pay now, {} never pay, {} pay late, {} cancel{}",
            never - pay,
            late - never,
            n - late,
            next_deadline.map_or(String::new(), |d| format!(
                "; payment deadlines in {:.1} s",
                d.as_secs_f64()
            ))
        ));
    }

    /// Phase (d), second half: pays, cancels and pays late, all at once. Payments (PayOrder,
    /// then the checkout) run `--pay-concurrency` at a time, in the order the orders were
    /// accepted; cancels and reads share the read bound.
    pub async fn act(&mut self) {
        let began = Instant::now();
        let gate = Arc::new(Semaphore::new(READ_CONCURRENCY));
        let payers = Arc::new(Semaphore::new(self.pay_concurrency));
        let mut tasks = JoinSet::new();
        for (i, t) in self.tracked.iter().enumerate() {
            let acts = matches!(t.plan, Plan::Pay | Plan::Cancel | Plan::PayLate);
            let Some(order) = t.order.clone().filter(|_| acts) else {
                continue;
            };
            let (ctx, gate, payers, buyer, plan) = (
                self.ctx.clone(),
                gate.clone(),
                payers.clone(),
                t.buyer,
                t.plan,
            );
            let confirmed = t.confirmed_at.unwrap_or_else(Instant::now);
            tasks.spawn(async move {
                let (outcome, timing) = match plan {
                    Plan::Pay => {
                        let _permit = payers.acquire().await;
                        pay_timed(&ctx, buyer, &order, confirmed).await
                    }
                    Plan::Cancel => {
                        let _permit = gate.acquire().await;
                        (cancel(&ctx, buyer, &order).await, None)
                    }
                    Plan::PayLate => (pay_late(&ctx, buyer, &order, &gate).await, None),
                    _ => (Outcome::None, None),
                };
                (i, outcome, timing)
            });
        }
        let hard = self.ctx.hard_deadline;
        while let Ok(Some(done)) = tokio::time::timeout_at(hard, tasks.join_next()).await {
            if let Ok((i, outcome, timing)) = done {
                self.tracked[i].outcome = outcome;
                self.tracked[i].pay_timing = timing;
            }
        }
        self.act_elapsed = Some(began.elapsed());
        if !tasks.is_empty() {
            tasks.abort_all();
            self.bound_hits
                .push("the winners' actions did not finish before the time bound".into());
        }
    }

    /// Phase (e): waits until every order is SHIPPED or CANCELLED and the product's stock has
    /// settled: nothing reserved, the gate equal to the database, and every unit of its stock
    /// either shipped or available again (a cancelled order's unit comes back only once
    /// product-stock has consumed its `order.cancelled`; under COMMIT_AT_ORDER nothing else
    /// shows that it is still on its way).
    pub async fn quiesce(&mut self) {
        progress("waiting for quiescence: every order SHIPPED or CANCELLED");
        let until = self.ctx.work_deadline;
        let terminal = |o: &Order| {
            o.status == OrderStatus::Shipped as i32 || o.status == OrderStatus::Cancelled as i32
        };
        // An order whose payment deadline lies beyond the bound cannot end in time: waiting for
        // it would only burn the rest of the bound.
        let hopeless = move |o: &Order| {
            o.status == OrderStatus::AwaitingPayment as i32
                && deadline_of(o).is_some_and(|d| d + LATE_MARGIN >= until)
        };
        let settled = self.poll_until(terminal, hopeless, until).await;
        let stuck = self
            .tracked
            .iter()
            .filter(|t| t.order.as_ref().is_some_and(hopeless))
            .count();
        if stuck > 0 {
            progress(&format!(
                "{stuck} order(s) await payment past the time bound: raise --max-duration-secs or \
                 shorten the order service's payment timeout (FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS)"
            ));
            self.bound_hits.push(format!(
                "the payment deadlines of {stuck} order(s) lie beyond the time bound"
            ));
            return;
        }
        if !settled {
            self.bound_hits
                .push("some orders were not SHIPPED or CANCELLED at the time bound".into());
            return;
        }
        // A payment made after its order was cancelled reaches the order service as the
        // provider's notification, a moment after the buyer saw it paid: its refund is recorded
        // then. Until it is, the sale is not over.
        let paid: HashSet<String> = self
            .tracked
            .iter()
            .filter(|t| t.outcome.took_money())
            .map(|t| t.order_id.clone())
            .collect();
        let refund_known = |o: &Order| {
            o.status == OrderStatus::Shipped as i32
                || !paid.contains(&o.order_id)
                || o.refund_status != RefundStatus::None as i32
        };
        if !self.poll_until(refund_known, |_| false, until).await {
            self.bound_hits.push(
                "some payments made after their order was cancelled had no refund at the time bound"
                    .into(),
            );
            return;
        }
        let ctx = self.ctx.clone();
        let mut shipped: std::collections::BTreeMap<String, i64> =
            std::collections::BTreeMap::new();
        for o in self.tracked.iter().filter_map(|t| t.order.as_ref()) {
            if o.status == OrderStatus::Shipped as i32 {
                *shipped.entry(o.sku.clone()).or_default() += o.quantity;
            }
        }
        let settled = |p: &Product| {
            p.reserved == 0
                && p.gate_available == p.available
                && p.available + shipped.get(&p.sku).copied().unwrap_or(0) == ctx.stock_of(&p.sku)
        };
        loop {
            let mut all = true;
            for sku in &ctx.skus {
                if !product(&ctx, sku).await.as_ref().is_some_and(settled) {
                    all = false;
                    break;
                }
            }
            if all {
                return;
            }
            if Instant::now() >= until {
                self.bound_hits.push(
                    "the product's stock had not settled (reserved 0, gate = database, shipped + available = stock) at the time bound"
                        .into(),
                );
                return;
            }
            sleep_until((Instant::now() + POLL).min(until)).await;
        }
    }

    /// Reads the orders not yet `done` until every one is (true), or every one left can no
    /// longer get there in time (`give_up`), or `until` passes (false). `done` must hold for
    /// good once it holds: those orders are not read again.
    async fn poll_until(
        &mut self,
        done: impl Fn(&Order) -> bool,
        give_up: impl Fn(&Order) -> bool,
        until: Instant,
    ) -> bool {
        loop {
            let open: Vec<usize> = (0..self.tracked.len())
                .filter(|&i| !self.tracked[i].order.as_ref().is_some_and(&done))
                .collect();
            if open.is_empty() {
                return true;
            }
            // Read in chunks, in the order the orders were accepted (the order the saga, the
            // payments and the shipping roughly follow); a chunk in which nothing was done yet
            // ends the pass, so waiting on thousands of orders does not read each of them
            // again and again while the platform works on the first ones.
            for chunk in open.chunks(PASS_CHUNK) {
                let ids = chunk
                    .iter()
                    .map(|&i| self.tracked[i].order_id.clone())
                    .collect();
                let read = orders(&self.ctx, ids).await;
                let now = Instant::now();
                let (mut progressed, mut waiting) = (false, false);
                for (&i, got) in chunk.iter().zip(read) {
                    if let Some(o) = got {
                        let t = &mut self.tracked[i];
                        if o.status != OrderStatus::Pending as i32 && t.confirmed_at.is_none() {
                            t.confirmed_at = Some(now);
                        }
                        let first = t.order.is_none();
                        progressed |= first || done(&o);
                        waiting |= !done(&o) && !give_up(&o);
                        t.order = Some(o);
                    }
                }
                // Orders that can no longer get there in time do not hold the pass up.
                if !progressed && waiting {
                    break;
                }
            }
            let now = Instant::now();
            let left: Vec<&Order> = open
                .iter()
                .filter_map(|&i| self.tracked[i].order.as_ref())
                .filter(|o| !done(o))
                .collect();
            let unread = open.iter().any(|&i| self.tracked[i].order.is_none());
            if left.is_empty() && !unread {
                return true;
            }
            if (!unread && left.iter().all(|o| give_up(o))) || now >= until {
                return false;
            }
            sleep_until((Instant::now() + POLL).min(until)).await;
        }
    }
}

/// Where the winners' plans change, as cumulative counts: `[..pay)` pay, `[pay..never)` never
/// pay, `[never..late)` pay late, `[late..n)` cancel. Cumulative rounding keeps the counts
/// summing to `n` and each within one of its share.
fn split(n: usize, s: Shares) -> [usize; 3] {
    let cut = |x: f64| ((x * n as f64).round() as usize).min(n);
    let pay = cut(s.pay);
    let never = cut(s.pay + s.never_pay).max(pay);
    let late = cut(s.pay + s.never_pay + s.pay_late).max(never);
    [pay, never, late]
}

// === impl Tracked ===

impl Tracked {
    fn new(order_id: String, buyer: usize, acknowledged: bool) -> Self {
        Self {
            order_id,
            buyer,
            plan: if acknowledged {
                Plan::NoWinner
            } else {
                Plan::Unacknowledged
            },
            outcome: Outcome::None,
            order: None,
            confirmed_at: None,
            pay_timing: None,
            acknowledged,
        }
    }
}

impl Outcome {
    /// Whether the sale's payment took money: the buyer paid at the provider (a refused
    /// PayOrder started no payment, so it took nothing).
    pub fn took_money(&self) -> bool {
        matches!(self, Outcome::Paid)
    }
}

/// Starts paying `order` as its buyer (PayOrder, idempotent per order, so retried on transient
/// errors): the provider's payment id, or what came of it.
async fn start(ctx: &Ctx, buyer: usize, order: &Order) -> Result<String, Outcome> {
    let answer = retrying(|| {
        let mut client = ctx.orders.clone();
        let req = PayOrderRequest {
            order_id: order.order_id.clone(),
            ..Default::default()
        };
        let req = request(req, &ctx.tokens[buyer]);
        async move { client.pay_order(req?).await }
    })
    .await;
    match answer {
        Ok(r) => r
            .into_inner()
            .checkout
            .map(|c| c.provider_payment_id)
            .ok_or_else(|| Outcome::PayFailed("PayOrder answered no checkout".into())),
        Err(s) => Err(match flashsale_platform::error::reason_of(&s) {
            Some(r) if s.code() == tonic::Code::FailedPrecondition => Outcome::PayRefused(r),
            _ => Outcome::PayFailed(format!("{:?}", s.code())),
        }),
    }
}

/// The buyer pays `payment_id` on the provider's checkout; the provider then notifies the
/// order service.
async fn checkout(ctx: &Ctx, payment_id: &str) -> Outcome {
    let answer = retrying(|| {
        let mut provider = ctx.provider.clone();
        let req = PayCheckoutRequest {
            payment_id: payment_id.to_owned(),
        };
        async move { provider.pay_checkout(req).await }
    })
    .await;
    match answer {
        Ok(_) => Outcome::Paid,
        Err(s) => Outcome::PayFailed(format!("checkout: {:?}", s.code())),
    }
}

/// Pays `order` in full as its buyer, through the provider.
async fn pay(ctx: &Ctx, buyer: usize, order: &Order) -> Outcome {
    match start(ctx, buyer, order).await {
        Ok(payment_id) => checkout(ctx, &payment_id).await,
        Err(outcome) => outcome,
    }
}

/// [`pay`], timed against the order's payment deadline: how long the payment queued in the
/// sale after the order was confirmed, and whether it started and finished in time.
async fn pay_timed(
    ctx: &Ctx,
    buyer: usize,
    order: &Order,
    confirmed: Instant,
) -> (Outcome, Option<PayTiming>) {
    let deadline = deadline_of(order);
    let started = Instant::now();
    let outcome = pay(ctx, buyer, order).await;
    let finished = Instant::now();
    let before = |at: Instant| deadline.is_none_or(|d| at < d);
    let timing = PayTiming {
        queued: started.saturating_duration_since(confirmed),
        started_in_time: before(started),
        paid_in_time: (outcome == Outcome::Paid).then(|| before(finished)),
    };
    (outcome, Some(timing))
}

/// Starts paying in time, then pays at the provider after the order's payment deadline, once
/// the service has cancelled the order: the payment is refunded.
async fn pay_late(ctx: &Arc<Ctx>, buyer: usize, order: &Order, gate: &Semaphore) -> Outcome {
    let Some(deadline) = deadline_of(order) else {
        return Outcome::Skipped("the order has no payment deadline");
    };
    let target = deadline + LATE_MARGIN;
    if target >= ctx.work_deadline {
        return Outcome::Skipped("its payment deadline lies beyond the time bound");
    }
    let started = {
        let _permit = gate.acquire().await;
        start(ctx, buyer, order).await
    };
    let payment_id = match started {
        Ok(id) => id,
        Err(outcome) => return outcome,
    };
    sleep_until(target).await;
    let give_up = (target + LATE_PATIENCE).min(ctx.work_deadline);
    let _permit = gate.acquire().await;
    loop {
        let now = orders(ctx, vec![order.order_id.clone()]).await;
        let cancelled = now
            .first()
            .and_then(Option::as_ref)
            .is_some_and(|o| o.status == OrderStatus::Cancelled as i32);
        if cancelled || Instant::now() >= give_up {
            break;
        }
        sleep_until((Instant::now() + POLL).min(give_up)).await;
    }
    checkout(ctx, &payment_id).await
}

/// Cancels `order` as its buyer (idempotent, so retried on transient errors).
async fn cancel(ctx: &Ctx, buyer: usize, order: &Order) -> Outcome {
    let answer = retrying(|| {
        let mut client = ctx.orders.clone();
        let req = CancelOrderRequest {
            order_id: order.order_id.clone(),
        };
        let req = request(req, &ctx.tokens[buyer]);
        async move { client.cancel_order(req?).await }
    })
    .await;
    match answer {
        Ok(_) => Outcome::Cancelled,
        Err(s) => Outcome::CancelFailed(
            flashsale_platform::error::reason_of(&s).unwrap_or_else(|| format!("{:?}", s.code())),
        ),
    }
}

/// The instant of the order's payment deadline on this machine's clock.
fn deadline_of(order: &Order) -> Option<Instant> {
    let ts = order.payment_deadline.as_ref()?;
    let at = UNIX_EPOCH
        + Duration::new(
            u64::try_from(ts.seconds).ok()?,
            u32::try_from(ts.nanos).ok()?,
        );
    let now = Instant::now();
    Some(match at.duration_since(SystemTime::now()) {
        Ok(ahead) => now + ahead,
        Err(_) => now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(pay: f64, never_pay: f64, pay_late: f64) -> Shares {
        Shares {
            pay,
            never_pay,
            pay_late,
        }
    }

    #[test]
    fn winners_split_by_their_shares_and_the_rest_cancel() {
        assert_eq!(split(100, shares(0.7, 0.2, 0.1)), [70, 90, 100]);
        assert_eq!(split(20, shares(0.5, 0.25, 0.25)), [10, 15, 20]);
        assert_eq!(split(10, shares(0.5, 0.0, 0.0)), [5, 5, 5]);
        assert_eq!(split(3, shares(1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)), [1, 2, 3]);
        assert_eq!(split(0, shares(0.7, 0.2, 0.1)), [0, 0, 0]);
        assert_eq!(split(7, shares(0.0, 0.0, 0.0)), [0, 0, 0]);
    }
}
