//! The life of one service process: bind the gRPC and metrics listeners, serve until shutdown,
//! then stop background tasks. Services build their [`ServerRoutes`] and background tasks and
//! hand them to [`Runner`]; tests read the bound ports before running it. A service describes
//! itself as a [`Service`], and its binary's `main` is one call to [`main`].

use anyhow::Context as _;
use tokio::{net::TcpListener, task::JoinSet};

use crate::{
    cli::{ServiceArgs, ServiceCommand},
    grpc::{self, ServerRoutes},
    limit::UserRateLimiter,
    metrics,
    settings::{AuthSettings, DatabaseSettings, GrpcSettings, MetricsSettings, TelemetrySettings},
    shutdown::Shutdown,
};

/// How often a service's rate limiters forget the users whose counts are back to full.
pub const FORGET_IDLE_USERS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A service as its binary runs it: its name, settings and migrations, and how it is built.
pub trait Service {
    /// The service's name: its tracing name, its migration lock and the subject of its tokens.
    const NAME: &'static str;
    type Settings: Send + 'static;
    type Migrator: sea_orm_migration::MigratorTrait;

    /// Loads the settings from defaults, files and the environment, and validates them.
    fn load() -> anyhow::Result<Self::Settings>;

    /// The settings every service has.
    fn common(settings: &Self::Settings) -> Common<'_>;

    /// Connects and wires everything, ready to serve.
    fn build(
        settings: Self::Settings,
    ) -> impl std::future::Future<Output = anyhow::Result<Application>>;
}

/// The settings every service has, borrowed from its own.
#[derive(Clone, Copy)]
pub struct Common<'a> {
    pub grpc: &'a GrpcSettings,
    pub metrics: &'a MetricsSettings,
    pub database: &'a DatabaseSettings,
    pub auth: &'a AuthSettings,
    pub telemetry: &'a TelemetrySettings,
}

impl Common<'_> {
    /// Validates each, naming a bad key under `prefix` (`order.grpc.addr`, say).
    pub fn validate(&self, prefix: &str) -> Result<(), crate::config::ConfigError> {
        crate::settings::validate_common(
            prefix,
            self.grpc,
            self.metrics,
            self.database,
            self.auth,
            self.telemetry,
        )
    }
}

/// Gives a service's settings struct, which has the fields `grpc`, `metrics`, `database`,
/// `auth` and `telemetry`, its `common()`: those settings borrowed as one [`Common`].
#[macro_export]
macro_rules! common_settings {
    ($settings:ty) => {
        impl $settings {
            /// The settings every service has.
            pub fn common(&self) -> $crate::app::Common<'_> {
                $crate::app::Common {
                    grpc: &self.grpc,
                    metrics: &self.metrics,
                    database: &self.database,
                    auth: &self.auth,
                    telemetry: &self.telemetry,
                }
            }
        }
    };
}

/// A service binary's whole `main`: parses the command line (`serve`, the default, or
/// `migrate`), loads the settings, starts telemetry, then serves until SIGTERM/SIGINT or applies
/// the migrations and exits. `name`, `about` and `version` are the binary's own
/// (`env!("CARGO_BIN_NAME")`, `env!("CARGO_PKG_DESCRIPTION")`, `env!("CARGO_PKG_VERSION")`).
pub async fn main<S: Service>(
    name: &'static str,
    about: &'static str,
    version: &'static str,
) -> anyhow::Result<()> {
    let args = ServiceArgs::parse_for(name, about, version);
    let settings = S::load()?;
    let _telemetry = crate::telemetry::init(S::common(&settings).telemetry, S::NAME)?;
    match args.command() {
        ServiceCommand::Serve => S::build(settings).await?.run_until_signalled().await,
        ServiceCommand::Migrate => {
            crate::cli::migrate::<S::Migrator>(S::NAME, S::common(&settings).database).await
        }
    }
}

/// How long the consumers get, once a stop is asked, to finish the messages in hand (their own
/// drain gives up a little earlier, so they close their channels themselves).
pub const CONSUMERS_GRACE: std::time::Duration = std::time::Duration::from_secs(20);
/// How long the gRPC server then gets to answer the calls in flight.
pub const SERVER_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the tasks that stop last (the relay's last pass, closing the broker connection)
/// get before they are dropped. With the two above and a 5 s `preStop`, a stop fits the
/// manifests' 60 s grace period.
pub const LAST_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Bound listeners and the tasks that run beside the gRPC server.
///
/// A stop (SIGTERM, [`Runner::shutdown`] triggered, a background task failing) goes in order,
/// so that what the process holds is finished, not redelivered: first the consumers stop
/// taking messages and finish, acknowledge, those in hand (they and most tasks watch
/// [`Runner::shutdown`]); then the gRPC server stops taking calls and answers those in flight;
/// last the tasks that must outlive both ([`Runner::last_to_stop`]: the outbox relay, which
/// publishes what those messages and calls wrote, and the broker connection) stop.
pub struct Runner {
    grpc: TcpListener,
    metrics: TcpListener,
    grpc_settings: GrpcSettings,
    shutdown: Shutdown,
    last: Shutdown,
    tasks: JoinSet<anyhow::Result<()>>,
    consumers: JoinSet<anyhow::Result<()>>,
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
            last: Shutdown::new(),
            tasks: JoinSet::new(),
            consumers: JoinSet::new(),
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

    /// The flag the tasks that must stop last watch: set once the consumers have finished and
    /// the gRPC server has stopped (the outbox relay, the broker connection).
    pub fn last_to_stop(&self) -> Shutdown {
        self.last.clone()
    }

    /// Runs `task` beside the server; it should return once the shutdown flag (or, for a task
    /// that must outlive the others, [`Runner::last_to_stop`]) is set. A task that fails stops
    /// the whole service (a relay or consumer that cannot run is not a healthy pod).
    pub fn spawn<F>(&mut self, task: F)
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.tasks.spawn(task);
    }

    /// Runs a message consumer beside the server: it should stop taking messages once the
    /// shutdown flag is set, finish those in hand, and return. A stop waits for it (at most
    /// [`CONSUMERS_GRACE`]) before the server stops.
    pub fn spawn_consumer<F>(&mut self, task: F)
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.consumers.spawn(task);
    }

    /// Serves until the shutdown flag is set or a background task fails, then stops in order
    /// (see [`Runner`]).
    pub async fn run(mut self, routes: ServerRoutes) -> anyhow::Result<()> {
        let shutdown = self.shutdown.clone();
        let last = self.last.clone();
        let metrics_task = tokio::spawn(metrics::serve(self.metrics, {
            let s = last.clone();
            async move { s.wait().await }
        }));
        let serving = Shutdown::new();
        let stop_serving = serving.clone();
        let server = grpc::serve(self.grpc, &self.grpc_settings, routes, async move {
            stop_serving.wait().await;
        });
        tokio::pin!(server);
        let mut failure: Option<anyhow::Error> = None;
        let mut served = false;
        let failed = |joined: Result<anyhow::Result<()>, tokio::task::JoinError>| match joined {
            Ok(Ok(())) if shutdown.is_triggered() => None,
            Ok(Ok(())) => Some(anyhow::anyhow!("a background task ended before shutdown")),
            Ok(Err(e)) => Some(e),
            Err(e) => Some(anyhow::Error::new(e).context("background task panicked")),
        };
        while !shutdown.is_triggered() {
            tokio::select! {
                res = &mut server => {
                    if let Err(e) = res { failure.get_or_insert(e); }
                    served = true;
                    break;
                }
                () = shutdown.wait() => {}
                Some(joined) = self.tasks.join_next() => {
                    if let Some(err) = failed(joined) {
                        tracing::error!(error = ?err, "background task failed; stopping");
                        failure.get_or_insert(err);
                        shutdown.trigger();
                    }
                }
                Some(joined) = self.consumers.join_next() => {
                    if let Some(err) = failed(joined) {
                        tracing::error!(error = ?err, "consumer failed; stopping");
                        failure.get_or_insert(err);
                        shutdown.trigger();
                    }
                }
            }
        }
        shutdown.trigger();
        // 1. The consumers stop taking messages and finish those in hand, while the server
        //    goes on serving (its future accepts new connections: it must keep being polled).
        let consumers = async {
            while let Some(joined) = self.consumers.join_next().await {
                if let Ok(Err(e)) = joined {
                    tracing::warn!(error = ?e, "consumer failed while stopping");
                }
            }
        };
        let drained = {
            let draining = tokio::time::timeout(CONSUMERS_GRACE, consumers);
            tokio::pin!(draining);
            if served {
                draining.await
            } else {
                tokio::select! {
                    drained = &mut draining => drained,
                    res = &mut server => {
                        if let Err(e) = res { failure.get_or_insert(e); }
                        served = true;
                        draining.await
                    }
                }
            }
        };
        if drained.is_err() {
            tracing::warn!("consumers still busy after {CONSUMERS_GRACE:?}; stopping them");
            self.consumers.abort_all();
        }
        // 2. The server stops taking calls and answers those in flight.
        serving.trigger();
        if !served {
            match tokio::time::timeout(SERVER_GRACE, &mut server).await {
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Ok(Ok(())) => {}
                Err(_) => {
                    tracing::warn!("calls still in flight after {SERVER_GRACE:?}; dropping them")
                }
            }
        }
        // 3. What must outlive both: the relay publishes what they wrote.
        last.trigger();
        let rest = async {
            while let Some(joined) = self.tasks.join_next().await {
                if let Ok(Err(e)) = joined {
                    tracing::warn!(error = ?e, "background task failed while stopping");
                }
            }
        };
        if tokio::time::timeout(LAST_GRACE, rest).await.is_err() {
            tracing::warn!("background tasks still running after {LAST_GRACE:?}; dropping them");
            self.tasks.abort_all();
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
    /// [`Foundation::build`] from the settings of the service `S`.
    pub async fn of<S: Service>(settings: &S::Settings) -> anyhow::Result<Self> {
        let c = S::common(settings);
        Self::build::<S::Migrator>(S::NAME, c.grpc, c.metrics, c.database, c.auth).await
    }

    /// Forgets, every [`FORGET_IDLE_USERS_EVERY`] until shutdown, the users of `limiters`
    /// whose counts are back to full.
    pub fn forget_idle_users(&mut self, limiters: Vec<UserRateLimiter>) {
        let shutdown = self.runner.shutdown();
        self.runner.spawn(crate::limit::forget_idle_users(
            limiters,
            FORGET_IDLE_USERS_EVERY,
            async move { shutdown.wait().await },
        ));
    }

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
        if database.migrate_on_start {
            crate::db::migrate::<M>(&db, service).await?;
        } else {
            crate::db::check_migrated::<M>(&db, service).await?;
        }
        let mut runner = Runner::bind(grpc, metrics).await?;
        crate::metrics::record_build_info(service);
        runner.spawn(crate::pools::watch_db(
            service,
            db.clone(),
            runner.shutdown(),
        ));
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
