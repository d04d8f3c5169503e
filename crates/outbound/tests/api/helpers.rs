//! `spawn_app`: the outbound service in-process on free ports with its own database.

use flashsale_outbound::config::Settings;
use flashsale_platform::shutdown::Shutdown;
use flashsale_test_support::{TestDatabase, amqp_url, unique_name};

pub struct TestApp {
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub shutdown: Shutdown,
    pub task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub db: TestDatabase,
    pub settings: Settings,
}

pub fn test_settings(db: &TestDatabase) -> Settings {
    let mut s = Settings::default();
    s.auth.allow_development_secret = true;
    s.grpc.addr = "127.0.0.1:0".into();
    s.metrics.addr = "127.0.0.1:0".into();
    s.database.url = db.url.clone();
    s.database.max_connections = 5;
    s.amqp.url = amqp_url();
    s.amqp.exchange = unique_name("fs_test_ex");
    s.amqp.queue_prefix = format!("{}.", unique_name("fs_test_q"));
    s.amqp.queue_expires_ms = 60_000;
    // The tests read what the service sent from its outbox.
    s.amqp.outbox_keep_published_hours = 24;
    s.amqp.queue_type = flashsale_messaging::QueueType::Classic;
    s.amqp.retry_base_ms = 50;
    s.amqp.max_attempts = 3;
    // The tests read as one buyer as often as they like: the read limit is off here and has its
    // own test (limits.rs).
    s.limits.read_per_sec = 0;
    s
}

pub async fn spawn_app() -> TestApp {
    spawn_with(|_| {}).await
}

/// The service with `tune` applied to the test settings.
pub async fn spawn_with(tune: impl FnOnce(&mut Settings)) -> TestApp {
    let db = TestDatabase::create().await.expect("create test database");
    let mut settings = test_settings(&db);
    tune(&mut settings);
    let app = flashsale_outbound::startup::build(settings.clone())
        .await
        .expect("build app");
    let (grpc_port, metrics_port, shutdown) = (app.grpc_port(), app.metrics_port(), app.shutdown());
    let task = tokio::spawn(app.run_until_stopped());
    TestApp {
        grpc_port,
        metrics_port,
        shutdown,
        task: Some(task),
        db,
        settings,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}
