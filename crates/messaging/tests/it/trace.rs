use flashsale_messaging::{Consumer, Incoming, OutboxRelay, Publisher, keys, outbox};
use flashsale_test_support::eventually;
use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider};
use sea_orm::TransactionTrait as _;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::helpers::{Amqp, Recorder, Running, WAIT, config, database, order_created};

fn trace_id_of(span: &tracing::Span) -> TraceId {
    span.context().span().span_context().trace_id()
}

// A current-thread runtime (the default): the thread-local subscriber below sees every task.
#[tokio::test]
async fn traceparent_travels_from_publisher_and_outbox_to_the_handler_span() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("it")));
    let _guard = tracing::subscriber::set_default(subscriber);

    let (_tdb, db) = database().await;
    let amqp = Amqp::new(config()).await;
    let t = amqp.topology("traced", &[keys::ORDER_CREATED]).await;
    let seen = Recorder::default();
    let rec = seen.clone();
    let consumer = Consumer::new(&amqp.broker, t, move |m: Incoming| {
        rec.push((
            m.envelope.correlation_id.clone(),
            trace_id_of(&tracing::Span::current()),
        ));
        async { Ok(()) }
    });
    let consumer = Running::spawn(|s| consumer.run(s));

    // Published directly inside a request span.
    let publisher = Publisher::new(&amqp.broker);
    let direct_span = tracing::info_span!("request.direct");
    let direct_trace = trace_id_of(&direct_span);
    assert_ne!(direct_trace, TraceId::INVALID);
    publisher
        .publish_envelope(&order_created("direct"))
        .instrument(direct_span)
        .await
        .unwrap();

    // Enqueued to the outbox inside another request span, published later by the relay.
    let outbox_span = tracing::info_span!("request.outbox");
    let outbox_trace = trace_id_of(&outbox_span);
    async {
        let txn = db.begin().await.unwrap();
        outbox::enqueue(&txn, &order_created("outbox"))
            .await
            .unwrap();
        txn.commit().await.unwrap();
    }
    .instrument(outbox_span)
    .await;
    let relay = OutboxRelay::new(&db, publisher.clone()).unwrap();
    let relay = Running::spawn(|s| relay.run(s));

    eventually(WAIT, "both messages handled", || async {
        (seen.len() == 2).then_some(())
    })
    .await
    .unwrap();
    relay.stop().await;
    consumer.stop().await;

    let mut got = seen.all();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("direct".to_owned(), direct_trace),
            ("outbox".to_owned(), outbox_trace)
        ]
    );
}
