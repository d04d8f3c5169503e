//! Graceful shutdown: resolves on SIGTERM (Kubernetes) or SIGINT (Ctrl-C), and a token that
//! background loops (outbox relay, consumers, sweepers) watch.

use tokio::sync::watch;

/// Resolves when the process is asked to stop.
pub async fn signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}

/// A stop flag shared by a service's tasks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self {
            tx: std::sync::Arc::new(watch::channel(false).0),
        }
    }

    /// Asks every task to stop.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once [`Shutdown::trigger`] was called (at once if it already was).
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// A receiver for APIs that take a `watch::Receiver<bool>`.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

/// Runs `job` every `period` until `shutdown`; a failing run is logged as `what` and retried
/// at the next tick (a sweeper must outlive a database hiccup).
pub async fn every<F, Fut, T, E>(
    period: std::time::Duration,
    shutdown: Shutdown,
    what: &str,
    mut job: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.wait() => return Ok(()),
            _ = tick.tick() => {
                if let Err(e) = job().await {
                    tracing::warn!(error = %e, "{what} failed; retrying next tick");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_resolves_after_trigger_even_for_late_waiters() {
        let s = Shutdown::new();
        assert!(!s.is_triggered());
        let early = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        s.trigger();
        let early = tokio::time::timeout(std::time::Duration::from_secs(5), early).await;
        assert!(matches!(early, Ok(Ok(()))), "early waiter did not resolve");
        let late = tokio::time::timeout(std::time::Duration::from_secs(5), s.wait()).await;
        assert!(late.is_ok(), "late waiter did not resolve");
        assert!(s.is_triggered());
    }

    #[tokio::test(start_paused = true)]
    async fn every_runs_the_job_each_period_through_failures_until_shutdown() {
        let s = Shutdown::new();
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let task = tokio::spawn(every(
            std::time::Duration::from_secs(1),
            s.clone(),
            "job",
            {
                let runs = runs.clone();
                move || {
                    let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move {
                        if n.is_multiple_of(2) {
                            Err("odd failure")
                        } else {
                            Ok(())
                        }
                    }
                }
            },
        ));
        tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
        s.trigger();
        assert!(task.await.unwrap().is_ok());
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            5,
            "runs at 0 s, 1 s, 2 s, 3 s and 4 s"
        );
    }
}
