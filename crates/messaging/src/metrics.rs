//! The help text of every metric family the messaging layer exports; each service describes
//! them once at start ([`describe`]).

use metrics::{describe_counter, describe_gauge, describe_histogram};

/// Describes the messaging layer's metric families to the process's recorder.
pub fn describe() {
    describe_counter!(
        "flashsale_messages_consumed_total",
        "Messages a consumer handled and acked, by queue."
    );
    describe_counter!(
        "flashsale_bundles_consumed_total",
        "Bundles (several events in one message) a consumer handled, by queue."
    );
    describe_histogram!(
        crate::consumer::CONSUMER_LAG_SECONDS,
        "From an event's writing by its producer to the start of its first handling, seconds, by queue (events from a delay or retry queue left out)."
    );
    describe_counter!(
        crate::consumer::REDELIVERED_TOTAL,
        "Messages the broker delivered again (a consumer died or did not ack before), by queue."
    );
    describe_counter!(
        "flashsale_messages_retried_total",
        "Messages whose handler failed and that were sent to wait and retry, by queue."
    );
    describe_counter!(
        "flashsale_messages_waiting_total",
        "Messages put on a delay queue to be delivered later, by queue."
    );
    describe_counter!(
        "flashsale_messages_parked_total",
        "Messages that failed every retry and were parked as dead letters, by queue."
    );
    describe_counter!(
        crate::inbox::PURGED_TOTAL,
        "Inbox rows purged after their retention."
    );
    describe_gauge!(
        crate::dead_letter::PARKED_GAUGE,
        "Dead letters parked and not yet replayed or discarded, by queue (a shared database: take max)."
    );
    describe_gauge!(
        crate::dead_letter::QUEUE_READY,
        "Messages waiting for a consumer in a work queue, by queue, read every stats interval (every replica reads the same queue: take max)."
    );
    describe_counter!(
        crate::dead_letter::STORED_TOTAL,
        "Dead letters moved from the broker into the service's database, by queue."
    );
    describe_counter!(
        crate::dead_letter::REPLAYED_TOTAL,
        "Dead letters put back on their queue by an admin, by queue."
    );
    describe_counter!(
        crate::dead_letter::DISCARDED_TOTAL,
        "Dead letters discarded for good by an admin, by queue."
    );
    describe_counter!(
        "flashsale_outbox_published_total",
        "Outbox rows the broker confirmed."
    );
    describe_counter!(
        "flashsale_outbox_bundles_total",
        "Messages that carried several outbox rows of one routing key."
    );
    describe_counter!(
        "flashsale_outbox_refused_total",
        "Outbox rows the broker refused (unroutable, nacked); they are retried with backoff."
    );
    describe_counter!(
        "flashsale_outbox_unsubscribed_total",
        "Notification rows published to no subscriber, by routing key."
    );
    describe_counter!(
        "flashsale_outbox_yielded_ms_total",
        "Milliseconds the outbox relay held back to leave the database to the intake."
    );
    describe_gauge!(
        crate::outbox::BACKLOG_ROWS,
        "Unpublished rows of this service's outbox (a shared database: take max over replicas)."
    );
    describe_gauge!(
        crate::outbox::OLDEST_AGE_SECONDS,
        "How long the oldest unpublished row of this service's outbox has waited, seconds."
    );
    describe_histogram!(
        crate::outbox::PUBLISH_DELAY_SECONDS,
        "From an event's commit to the broker's confirm of it, seconds."
    );
}
