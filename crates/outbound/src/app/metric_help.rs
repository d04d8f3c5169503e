//! The help text of every metric family outbound exports ([`describe`], once at start).

use metrics::{describe_counter, describe_gauge, describe_histogram};

/// Describes outbound's metric families to the process's recorder.
pub fn describe() {
    describe_counter!(
        "flashsale_shipments_total",
        "Shipments that reached a status, by status."
    );
    describe_counter!(
        "flashsale_shipment_delays_total",
        "Shipment attempts delayed because a dependency did not answer, by step."
    );
    describe_histogram!(
        "flashsale_order_paid_batch_size",
        "order.paid events handled together in one transaction."
    );
    describe_counter!(
        "flashsale_order_paid_batch_fallbacks_total",
        "Batches of order.paid events that fell back to one event at a time."
    );
    describe_gauge!(
        "flashsale_shipments_overdue",
        "Paid shipments not shipped shipping.alert_after_ms after payment (a shared database: take max)."
    );
}
