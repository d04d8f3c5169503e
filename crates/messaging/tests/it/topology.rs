//! Re-declaring a consumer's queues after a configuration change.

use flashsale_messaging::{QueueTopology, keys};

use crate::helpers::{Amqp, config};

#[tokio::test]
async fn a_new_retry_delay_declares_new_retry_queues_instead_of_failing() {
    let amqp = Amqp::new(config()).await;
    let before = amqp.topology("retry-change", &[keys::ORDER_CREATED]).await;
    let mut changed = amqp.config.clone();
    changed.retry_base_ms += 15;
    changed.max_attempts += 1;
    let after = QueueTopology::new(&changed, "retry-change", &[keys::ORDER_CREATED]);
    amqp.delete_later(&after);
    // The broker refuses a queue re-declared with another x-message-ttl (PRECONDITION_FAILED,
    // and the channel is closed); the retry queues of the new delays have names of their own.
    after
        .declare(&amqp.admin)
        .await
        .expect("re-declared with the new retry delays");
    assert_eq!(before.queue(), after.queue(), "the same work queue");
    for i in 1..=before.retries() {
        assert_ne!(before.retry_queue(i), after.retry_queue(i));
    }
    // Both ladders exist: messages waiting in the old one still return to the work queue.
    for t in [&before, &after] {
        for i in 1..=t.retries() {
            assert_eq!(
                amqp.count(&t.retry_queue(i)).await,
                0,
                "{}",
                t.retry_queue(i)
            );
        }
    }
}
