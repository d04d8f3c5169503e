//! Coalescing concurrent calls into batches: under load, many requests wait on the same slow
//! resource (a PostgreSQL round trip or commit), so they are gathered and served by one call of
//! the batch function. At most `parallel` batches run at once; calls that arrive while they run
//! form the next batch (up to `max_batch`, optionally waiting `max_wait` for more, else for one
//! turn of the scheduler), so batches grow with the load and a lone call under no load runs at
//! once. The services' batchers and why each is sized as it is: docs/architecture.md#batchers.
//!
//! Each batch runs in a span of its own, `batch <name>`, linked to the span of every call it
//! serves (OpenTelemetry span links): a request's trace shows which batch did its work, and
//! the batch's span which requests it served. What a batch writes on behalf of one call (its
//! events) carries that call's own trace context, captured by the caller into its key.

use std::{future::Future, sync::Arc, time::Duration};

use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use tokio::{
    sync::{Semaphore, mpsc, oneshot},
    time::Instant,
};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The metric names of one kind of [`together_or_each`] batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchMetrics {
    /// Histogram of the sizes of batches applied together.
    pub size: &'static str,
    /// Counter of batches that fell back to one by one.
    pub fallbacks: &'static str,
}

/// Applies `items` (several at once) with `together` — `Ok(true)` when it applied them all,
/// `Ok(false)` or `Err` when it applied none and each must go on its own — else with `each`
/// per item, at most [`EACH_CONCURRENCY`] at a time. A single item goes straight to `each`.
/// One answer per item, in order.
///
/// The bound matters: a batch of a hundred deliveries the database cannot take together (say,
/// for products this database has never seen) would otherwise ask for a hundred connections
/// at once, drain the service's pool and stall its request path behind them.
pub async fn together_or_each<'a, T, E, TF, TFut, EF, EFut>(
    items: &'a [T],
    metrics: BatchMetrics,
    together: TF,
    each: EF,
) -> Vec<Result<(), E>>
where
    TF: FnOnce(&'a [T]) -> TFut,
    TFut: Future<Output = Result<bool, E>>,
    EF: FnMut(&'a T) -> EFut,
    EFut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let n = items.len();
    let together = |all| async move { Ok(together(all).await?.then(|| vec![(); n])) };
    answered_together_or_each(items, metrics, together, each).await
}

/// [`together_or_each`] for steps that answer each item: `together` gives `Ok(Some(answers))`,
/// one per item in order, when it applied them all, and `Ok(None)` or `Err` when it applied
/// none.
pub async fn answered_together_or_each<'a, T, A, E, TF, TFut, EF, EFut>(
    items: &'a [T],
    metrics: BatchMetrics,
    together: TF,
    each: EF,
) -> Vec<Result<A, E>>
where
    TF: FnOnce(&'a [T]) -> TFut,
    TFut: Future<Output = Result<Option<Vec<A>>, E>>,
    EF: FnMut(&'a T) -> EFut,
    EFut: Future<Output = Result<A, E>>,
    E: std::fmt::Display,
{
    if items.len() > 1 {
        metrics::describe_histogram!(metrics.size, "Items applied together in one statement.");
        metrics::describe_counter!(
            metrics.fallbacks,
            "Batches that could not be applied together and were applied item by item."
        );
        match together(items).await {
            Ok(Some(answers)) => {
                metrics::histogram!(metrics.size).record(items.len() as f64);
                return answers.into_iter().map(Ok).collect();
            }
            Ok(None) => metrics::counter!(metrics.fallbacks).increment(1),
            Err(e) => {
                tracing::debug!(error = %e, size = items.len(), batch = metrics.size, "batch failed; one by one");
                metrics::counter!(metrics.fallbacks).increment(1);
            }
        }
    }
    let permits = Semaphore::new(EACH_CONCURRENCY);
    let permits = &permits;
    let mut each = each;
    let runs: Vec<_> = items
        .iter()
        .map(|item| {
            let run = each(item);
            async move {
                // Never closed, so a permit always comes.
                let _permit = permits.acquire().await.ok();
                run.await
            }
        })
        .collect();
    futures_util::future::join_all(runs).await
}

/// Items [`together_or_each`] applies one by one at the same time.
pub const EACH_CONCURRENCY: usize = 4;

/// Why a batched call got no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// The batch function failed (its error, as text, shared by every call of the batch).
    #[error("{0}")]
    Failed(String),
    /// The batcher is gone (shutting down).
    #[error("batcher stopped")]
    Stopped,
}

/// One call waiting for its batch: its key, where its answer goes, when it was queued, and
/// the caller's span (to link the batch's span to).
type Job<K, V> = (
    K,
    oneshot::Sender<Result<V, BatchError>>,
    Instant,
    SpanContext,
);

/// The span a batch runs in: named `batch <name>`, linked to each valid caller span.
fn batch_span(name: &'static str, callers: &[SpanContext]) -> tracing::Span {
    let span = tracing::info_span!(
        "batch",
        otel.name = %format_args!("batch {name}"),
        otel.kind = "internal",
        batch.name = name,
        batch.size = callers.len(),
    );
    for caller in callers.iter().filter(|c| c.is_valid()) {
        span.add_link(caller.clone());
    }
    span
}

/// The current span's context, to link a batch to its caller.
fn caller_context() -> SpanContext {
    crate::trace::current_context()
        .span()
        .span_context()
        .clone()
}

/// The metrics every [`Batcher`] records per batch, labelled `batch` with its name: how many
/// calls it served, how long its oldest call had waited for it to start, and how long it ran.
/// A call's time in the batcher is at most the wait plus the run of its batch, so the two say
/// whether callers wait for a slot (raise the batches in flight, or make each cheaper) or for
/// the work itself.
pub const BATCH_SIZE: &str = "flashsale_batch_size";
/// See [`BATCH_SIZE`]: seconds from the oldest call's arrival to its batch's start.
pub const BATCH_WAIT_SECONDS: &str = "flashsale_batch_wait_seconds";
/// See [`BATCH_SIZE`]: seconds the batch function ran.
pub const BATCH_RUN_SECONDS: &str = "flashsale_batch_run_seconds";

/// Moves the calls already queued into `jobs`, up to `max_batch` in all.
fn drain<K, V>(rx: &mut mpsc::Receiver<Job<K, V>>, jobs: &mut Vec<Job<K, V>>, max_batch: usize) {
    while jobs.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// A handle to a batching worker. Cheap to clone.
pub struct Batcher<K, V> {
    tx: mpsc::Sender<Job<K, V>>,
}

impl<K, V> Clone for Batcher<K, V> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<K, V> std::fmt::Debug for Batcher<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Batcher")
    }
}

impl<K: Send + 'static, V: Send + 'static> Batcher<K, V> {
    /// [`Self::spawn`] for a batch that always answers: each batch is `run(state, keys)`, with a
    /// clone of `state` (a use case's handle, cheap to clone). The batchers of the services are
    /// built this way, so the function a batch runs is named at the place that builds it.
    pub fn serving<S, F, Fut>(
        name: &'static str,
        max_batch: usize,
        max_wait: Duration,
        parallel: usize,
        state: S,
        run: F,
    ) -> Self
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(S, Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<V>> + Send + 'static,
    {
        Self::spawn(name, max_batch, max_wait, parallel, move |keys| {
            let batch = run(state.clone(), keys);
            async move { Ok::<_, std::convert::Infallible>(batch.await) }
        })
    }

    /// Starts the worker. `run` gets the keys of one batch and must answer one value per key,
    /// in the same order. At most `parallel` batches run at once. `name` labels the batch
    /// metrics ([`BATCH_SIZE`], [`BATCH_WAIT_SECONDS`], [`BATCH_RUN_SECONDS`]).
    pub fn spawn<F, Fut, E>(
        name: &'static str,
        max_batch: usize,
        max_wait: Duration,
        parallel: usize,
        run: F,
    ) -> Self
    where
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<V>, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let (tx, mut rx) = mpsc::channel::<Job<K, V>>(max_batch.max(1) * 8);
        let run = Arc::new(run);
        let permits = Arc::new(Semaphore::new(parallel.max(1)));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Wait for a free slot first: what queues up meanwhile joins this batch, so
                // batches grow with the load and a lone call is not delayed.
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let mut jobs = vec![first];
                drain(&mut rx, &mut jobs, max_batch);
                if max_wait.is_zero() {
                    // Callers woken by one event (the answers of the batch before, say) queue
                    // one task after another, on the runtime's worker threads: one turn of the
                    // scheduler lets the rest of them join this batch rather than start a
                    // small one of their own: larger batches, less database work per order
                    // (docs/architecture.md#batchers).
                    if jobs.len() < max_batch {
                        tokio::task::yield_now().await;
                        drain(&mut rx, &mut jobs, max_batch);
                    }
                } else {
                    let deadline = Instant::now() + max_wait;
                    while jobs.len() < max_batch {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some(job)) => jobs.push(job),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
                let run = run.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let oldest = jobs.iter().map(|j| j.2).min().unwrap_or(started);
                    let callers: Vec<SpanContext> = jobs.iter().map(|j| j.3.clone()).collect();
                    let (keys, replies): (Vec<K>, Vec<_>) =
                        jobs.into_iter().map(|(k, r, _, _)| (k, r)).unzip();
                    let n = keys.len();
                    let out = run(keys).instrument(batch_span(name, &callers)).await;
                    let ran = started.elapsed();
                    match out {
                        Ok(values) if values.len() == n => {
                            for (reply, v) in replies.into_iter().zip(values) {
                                let _ = reply.send(Ok(v));
                            }
                        }
                        Ok(values) => {
                            let e = BatchError::Failed(format!(
                                "batch answered {} values for {n} keys",
                                values.len()
                            ));
                            replies
                                .into_iter()
                                .for_each(|r| drop(r.send(Err(e.clone()))));
                        }
                        Err(e) => {
                            let e = BatchError::Failed(e.to_string());
                            replies
                                .into_iter()
                                .for_each(|r| drop(r.send(Err(e.clone()))));
                        }
                    }
                    drop(permit);
                    // Recorded once the callers have their answers, off their path.
                    metrics::histogram!(BATCH_SIZE, "batch" => name).record(n as f64);
                    metrics::histogram!(BATCH_WAIT_SECONDS, "batch" => name)
                        .record(started.duration_since(oldest).as_secs_f64());
                    metrics::histogram!(BATCH_RUN_SECONDS, "batch" => name)
                        .record(ran.as_secs_f64());
                });
            }
        });
        Self { tx }
    }

    /// Queues `key` and waits for its value.
    pub async fn call(&self, key: K) -> Result<V, BatchError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((key, reply, Instant::now(), caller_context()))
            .await
            .map_err(|_| BatchError::Stopped)?;
        answer.await.map_err(|_| BatchError::Stopped)?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
        let batches = Arc::new(AtomicUsize::new(0));
        let b = {
            let batches = batches.clone();
            Batcher::spawn(
                "test_shared",
                64,
                Duration::from_millis(20),
                2,
                move |keys: Vec<u32>| {
                    batches.fetch_add(1, Ordering::SeqCst);
                    async move { Ok::<_, String>(keys.into_iter().map(|k| k * 2).collect()) }
                },
            )
        };
        let calls: Vec<_> = (0..200u32)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.call(i).await) })
            })
            .collect();
        for c in calls {
            let (i, v) = c.await.unwrap();
            assert_eq!(v.unwrap(), i * 2);
        }
        let n = batches.load(Ordering::SeqCst);
        assert!((4..200).contains(&n), "{n} batches for 200 calls");
    }

    #[tokio::test]
    async fn a_caller_that_queues_while_a_batch_forms_joins_it() {
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = {
            let batches = batches.clone();
            Batcher::spawn("test_turn", 8, Duration::ZERO, 1, move |keys: Vec<u32>| {
                if let Ok(mut seen) = batches.lock() {
                    seen.push(keys.clone());
                }
                async move { Ok::<_, String>(keys) }
            })
        };
        // One runtime thread: the worker takes call 1 before the task of call 2 has run, so
        // only the scheduler turn lets call 2 join call 1's batch.
        let (reply, first) = oneshot::channel();
        b.tx.send((1, reply, Instant::now(), SpanContext::empty_context()))
            .await
            .unwrap();
        let second = tokio::spawn({
            let b = b.clone();
            async move { b.call(2).await }
        });
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second.await.unwrap().unwrap(), 2);
        assert_eq!(*batches.lock().unwrap(), vec![vec![1, 2]]);
    }

    /// The value of the Prometheus line `{metric}{batch="{batch}"}` in `text`.
    fn scraped(text: &str, metric: &str, batch: &str) -> Option<f64> {
        let prefix = format!("{metric}{{batch=\"{batch}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }

    #[tokio::test]
    async fn each_batch_records_its_size_its_oldest_calls_wait_and_its_run_time() {
        let handle = crate::metrics::handle().unwrap();
        // The first batch (one call) is held until released; three calls queue meanwhile and
        // form the second batch, whose oldest call has waited at least the hold.
        let (release, held) = tokio::sync::watch::channel(false);
        let (began, mut first_began) = mpsc::channel::<()>(1);
        let b = Batcher::spawn(
            "test_metrics",
            8,
            Duration::ZERO,
            1,
            move |keys: Vec<u32>| {
                let (mut held, began) = (held.clone(), began.clone());
                async move {
                    if keys == [0] {
                        began.send(()).await.map_err(|e| e.to_string())?;
                        held.wait_for(|r| *r).await.map_err(|e| e.to_string())?;
                    }
                    Ok::<_, String>(keys)
                }
            },
        );
        let first = tokio::spawn({
            let b = b.clone();
            async move { b.call(0).await }
        });
        first_began.recv().await.unwrap();
        // Queued here, as `call` would, so that all three are surely in before the release.
        // The oldest of them is queued 40 ms before the others: the wait is timed from it.
        let mut rest = Vec::new();
        for i in 1..=3u32 {
            let (reply, answer) = oneshot::channel();
            b.tx.send((i, reply, Instant::now(), SpanContext::empty_context()))
                .await
                .unwrap();
            rest.push(answer);
            if i == 1 {
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(80)).await;
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 0);
        for (i, answer) in (1..=3u32).zip(rest) {
            assert_eq!(answer.await.unwrap().unwrap(), i);
        }
        let text = handle.render();
        let get = |metric: &str| {
            scraped(&text, metric, "test_metrics")
                .unwrap_or_else(|| panic!("no {metric} for the batch in:\n{text}"))
        };
        assert_eq!(get("flashsale_batch_size_count"), 2.0);
        assert_eq!(get("flashsale_batch_size_sum"), 4.0);
        assert_eq!(get("flashsale_batch_wait_seconds_count"), 2.0);
        // The second batch's oldest call waited for the whole hold (~120 ms), its newest ~80.
        assert!(get("flashsale_batch_wait_seconds_sum") >= 0.11, "{text}");
        assert!(get("flashsale_batch_run_seconds_sum") >= 0.11, "{text}");
    }

    #[tokio::test]
    async fn a_batch_runs_in_a_span_of_its_own_linked_to_each_of_its_callers() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;

        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        // One runtime thread: the worker's tasks see this thread's subscriber.
        let _default = tracing::subscriber::set_default(subscriber);
        let b = Batcher::spawn(
            "test_linked",
            3,
            Duration::from_secs(5),
            1,
            |keys: Vec<u32>| async move { Ok::<_, String>(keys) },
        );
        let calls = (0..3u32).map(|i| {
            let b = b.clone();
            async move { b.call(i).await }.instrument(tracing::info_span!("caller", i))
        });
        for (i, answer) in futures_util::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(answer.unwrap() as usize, i);
        }
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let callers: std::collections::HashSet<_> = spans
            .iter()
            .filter(|s| s.name == "caller")
            .map(|s| (s.span_context.trace_id(), s.span_context.span_id()))
            .collect();
        assert_eq!(callers.len(), 3, "{spans:#?}");
        let batches: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "batch test_linked")
            .collect();
        assert_eq!(
            batches.len(),
            1,
            "one batch for the three calls: {spans:#?}"
        );
        let linked: std::collections::HashSet<_> = batches[0]
            .links
            .links
            .iter()
            .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
            .collect();
        assert_eq!(linked, callers);
        // A trace of its own: no caller's trace is the batch's.
        let batch_trace = batches[0].span_context.trace_id();
        assert!(callers.iter().all(|(trace, _)| *trace != batch_trace));
    }

    #[tokio::test]
    async fn a_failed_batch_fails_each_of_its_calls() {
        let b = Batcher::spawn(
            "test_failed",
            8,
            Duration::from_millis(1),
            1,
            |_: Vec<u8>| async { Err::<Vec<u8>, _>("db down") },
        );
        assert!(matches!(b.call(1).await, Err(BatchError::Failed(e)) if e == "db down"));
        let short = Batcher::spawn(
            "test_short",
            8,
            Duration::from_millis(1),
            1,
            |_: Vec<u8>| async { Ok::<Vec<u8>, String>(vec![]) },
        );
        assert!(matches!(short.call(1).await, Err(BatchError::Failed(_))));
    }

    #[tokio::test]
    async fn a_batch_that_falls_back_runs_at_most_a_few_items_at_once_and_answers_in_order() {
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let items: Vec<u32> = (0..50).collect();
        let metrics = BatchMetrics {
            size: "test_batch_size",
            fallbacks: "test_batch_fallbacks_total",
        };
        let answers = together_or_each(
            &items,
            metrics,
            |_| async { Ok::<bool, String>(false) },
            |i| {
                let (running, peak) = (running.clone(), peak.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    // Later items finish sooner: the answers must still come back in order.
                    tokio::time::sleep(Duration::from_millis(u64::from(50 - *i))).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    if *i % 7 == 0 {
                        Err(format!("item {i}"))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await;
        assert_eq!(answers.len(), 50);
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(a.is_err(), i % 7 == 0, "answer {i}: {a:?}");
        }
        assert_eq!(answers[14], Err("item 14".to_owned()));
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= EACH_CONCURRENCY && peak > 1, "{peak} at once");
    }
}
