//! The help text of every metric family the order service exports ([`describe`], once at
//! start).

use metrics::{describe_counter, describe_gauge, describe_histogram};

/// Describes the order service's metric families to the process's recorder.
pub fn describe() {
    describe_counter!("flashsale_orders_accepted_total", "Orders accepted at CreateOrder.");
    describe_counter!(
        "flashsale_orders_refused_total",
        "Buyers refused at CreateOrder, by reason (SOLD_OUT, SOLD_OUT_CACHED, USER_LIMIT_EXCEEDED, OVERLOADED, …)."
    );
    describe_counter!("flashsale_orders_paid_total", "Orders that became PAID.");
    describe_histogram!(
        super::saga::SAGA_SECONDS,
        "Seconds from an order's acceptance to a step of its saga, by stage (confirmed, paid, shipped, cancelled)."
    );
    describe_counter!(
        "flashsale_orders_cancelled_total",
        "Orders cancelled, by reason."
    );
    describe_counter!(
        "flashsale_orders_swept_total",
        "Unpaid orders cancelled at their payment deadline by the sweeper."
    );
    describe_counter!("flashsale_refunds_total", "Refunds requested from the provider.");
    describe_counter!(
        "flashsale_refund_attempts_total",
        "Refund attempts at the provider, by result (succeeded, retried, parked)."
    );
    describe_counter!(
        "flashsale_payment_notifications_total",
        "Payment provider notifications, by result (paid, refunded, duplicate, attempt_failed, refused)."
    );
    describe_counter!(
        "flashsale_sold_out_list_reads_total",
        "Reads of a sold-out product's buyer list for the sold-out memory, by kind of read."
    );
    describe_counter!(
        super::RECONCILED_TOTAL,
        "Payments reconciled with the provider, by result."
    );
    describe_counter!(
        super::WRITES_EXPIRED,
        "Accepted orders whose write missed its deadline (the buyer got DATABASE_UNAVAILABLE)."
    );
    describe_counter!(
        super::WRITE_FALLBACKS,
        "Order write batches that fell back to one order at a time."
    );
    describe_gauge!(
        super::BACKLOG_GAUGE,
        "Orders waiting for the saga (unconfirmed) and paid orders waiting to ship, as admission control last counted them (a shared database: take max)."
    );
    describe_gauge!(
        super::REFUNDS_GAUGE,
        "Refunds REQUESTED from the provider and FAILED ones parked for a person, by status (a shared database: take max)."
    );
    describe_gauge!(
        super::STUCK_GAUGE,
        "Orders stuck in PENDING or PAID longer than the saga allows, by status (a shared database: take max)."
    );
}
