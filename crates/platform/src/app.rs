//! The life of one service process: bind the gRPC and metrics listeners, serve until shutdown,
//! then stop background tasks. Services build their [`ServerRoutes`] and background tasks and
//! hand them to [`Runner`]; tests read the bound ports before running it.

use anyhow::Context as _;
use tokio::{net::TcpListener, task::JoinSet};

use crate::{
    grpc::{self, ServerRoutes},
    metrics,
    settings::{GrpcSettings, MetricsSettings},
    shutdown::Shutdown,
};

/// Bound listeners and the tasks that run beside the gRPC server.
pub struct Runner {
    grpc: TcpListener,
    metrics: TcpListener,
    grpc_settings: GrpcSettings,
    shutdown: Shutdown,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Runner {
    /// Binds both listeners (port 0 picks free ports).
    pub async fn bind(
        grpc: &GrpcSettings,
        metrics_settings: &MetricsSettings,
    ) -> anyhow::Result<Self> {
        metrics::handle()?;
        Ok(Self {
            grpc: grpc::bind(grpc).await?,
            metrics: metrics::bind(&metrics_settings.addr).await?,
            grpc_settings: grpc.clone(),
            shutdown: Shutdown::new(),
            tasks: JoinSet::new(),
        })
    }

    pub fn grpc_port(&self) -> u16 {
        self.grpc.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub fn metrics_port(&self) -> u16 {
        self.metrics.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// The flag that stops this service; trigger it to stop [`Runner::run`].
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Runs `task` beside the server; it should return once the shutdown flag is set. A task that
    /// fails stops the whole service (a relay or consumer that cannot run is not a healthy pod).
    pub fn spawn<F>(&mut self, task: F)
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Serves until the shutdown flag is set or a background task fails.
    pub async fn run(mut self, routes: ServerRoutes) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let metrics_task = tokio::spawn(metrics::serve(self.metrics, {
            let s = shutdown.clone();
            async move { s.wait().await }
        }));
        let grpc_shutdown = shutdown.clone();
        let server = grpc::serve(self.grpc, &self.grpc_settings, routes, async move {
            grpc_shutdown.wait().await;
        });
        tokio::pin!(server);
        let mut failure: Option<anyhow::Error> = None;
        loop {
            tokio::select! {
                res = &mut server => {
                    if let Err(e) = res { failure.get_or_insert(e); }
                    break;
                }
                Some(joined) = self.tasks.join_next() => {
                    let err = match joined {
                        Ok(Ok(())) if shutdown.is_triggered() => continue,
                        Ok(Ok(())) => anyhow::anyhow!("a background task ended before shutdown"),
                        Ok(Err(e)) => e,
                        Err(e) => anyhow::Error::new(e).context("background task panicked"),
                    };
                    tracing::error!(error = ?err, "background task failed; stopping");
                    failure.get_or_insert(err);
                    shutdown.trigger();
                }
            }
        }
        shutdown.trigger();
        while let Some(joined) = self.tasks.join_next().await {
            if let Ok(Err(e)) = joined {
                tracing::warn!(error = ?e, "background task failed while stopping");
            }
        }
        metrics_task.await.context("join metrics server")??;
        match failure {
            Some(e) => Err(e),
            None => {
                tracing::info!("stopped");
                Ok(())
            }
        }
    }
}

/// What every service builds first: its database (created if missing, migrated under the
/// service's migration lock, so replicas starting together never race), the auth
/// interceptor, and the bound listeners.
pub struct Foundation {
    pub db: sea_orm::DatabaseConnection,
    pub auth: crate::auth::AuthInterceptor,
    pub runner: Runner,
}

impl Foundation {
    pub async fn build<M: sea_orm_migration::MigratorTrait>(
        service: &'static str,
        grpc: &GrpcSettings,
        metrics: &MetricsSettings,
        database: &crate::settings::DatabaseSettings,
        auth: &crate::settings::AuthSettings,
    ) -> anyhow::Result<Self> {
        // Keys first: a service that would refuse every token must not start at all.
        let verifier = crate::auth::Verifier::from_settings(auth, service)?;
        let db = crate::db::connect(database).await?;
        crate::db::migrate::<M>(&db, service).await?;
        let runner = Runner::bind(grpc, metrics).await?;
        Ok(Self {
            db,
            auth: crate::auth::AuthInterceptor::new(verifier),
            runner,
        })
    }
}

/// A service ready to run: its foundation and routes.
pub struct Application {
    foundation: Foundation,
    routes: ServerRoutes,
}

impl Application {
    pub fn new(foundation: Foundation, routes: ServerRoutes) -> Self {
        Self { foundation, routes }
    }

    pub fn grpc_port(&self) -> u16 {
        self.foundation.runner.grpc_port()
    }

    pub fn metrics_port(&self) -> u16 {
        self.foundation.runner.metrics_port()
    }

    /// The flag that stops [`Application::run_until_stopped`].
    pub fn shutdown(&self) -> Shutdown {
        self.foundation.runner.shutdown()
    }

    pub fn db(&self) -> &sea_orm::DatabaseConnection {
        &self.foundation.db
    }

    /// Serves until shutdown, then closes the database pool.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = self.foundation.runner.run(self.routes).await;
        self.foundation.db.close().await.ok();
        result
    }

    /// Serves until SIGTERM/SIGINT (what `main` does).
    pub async fn run_until_signalled(self) -> anyhow::Result<()> {
        let stop = self.shutdown();
        tokio::spawn(async move {
            crate::shutdown::signal().await;
            stop.trigger();
        });
        self.run_until_stopped().await
    }
}
