//! Several replicas over one database: migrations applied once under the service's migration
//! lock, and a [`Singleton`] job that never runs on two of them at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_platform::{lease::Singleton, settings::DatabaseSettings};
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};
use sea_orm_migration::{
    MigrationName, MigrationTrait, MigratorTrait, SchemaManager, async_trait, sea_orm::DbErr,
};

/// A fresh database (dropped by [`drop_database`]) and its settings.
fn fresh_settings() -> DatabaseSettings {
    let base = std::env::var("FLASHSALE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let name = format!("platform_replicas_{}", uuid::Uuid::new_v4().simple());
    DatabaseSettings {
        url: format!("{}/{name}", base.trim_end_matches('/')),
        max_connections: 8,
        migrate_on_start: true,
    }
}

async fn drop_database(settings: &DatabaseSettings) {
    let url = url::Url::parse(&settings.url).unwrap();
    let name = url.path().trim_start_matches('/').to_owned();
    let mut admin = url.clone();
    admin.set_path("/postgres");
    let admin = sea_orm::Database::connect(admin.as_str()).await.unwrap();
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await
        .unwrap();
    admin.close().await.ok();
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "n")
        .unwrap()
}

/// Creates a table (which fails if it exists) and, slowly, so that replicas starting together
/// would overlap, records that it ran.
struct CreateMarker;

impl MigrationName for CreateMarker {
    fn name(&self) -> &str {
        "m20260101_000000_replicas_create_marker"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateMarker {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let c = manager.get_connection();
        c.execute_unprepared("CREATE TABLE marker (ran_at timestamptz NOT NULL DEFAULT now())")
            .await?;
        c.execute_unprepared("SELECT pg_sleep(0.3)").await?;
        c.execute_unprepared("INSERT INTO marker DEFAULT VALUES")
            .await?;
        Ok(())
    }
}

/// A second migration, so the test also sees the migrator's own table filled once.
struct AddColumn;

impl MigrationName for AddColumn {
    fn name(&self) -> &str {
        "m20260102_000000_replicas_add_column"
    }
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for AddColumn {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("ALTER TABLE marker ADD COLUMN note text")
            .await?;
        Ok(())
    }
}

struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(CreateMarker), Box::new(AddColumn)]
    }
}

#[tokio::test]
async fn replicas_migrating_one_fresh_database_together_all_succeed_and_apply_it_once() {
    let settings = fresh_settings();
    let replicas = 4;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..replicas {
        let settings = settings.clone();
        tasks.spawn(async move {
            let db = flashsale_platform::db::connect(&settings).await?;
            let applied = flashsale_platform::db::migrate::<Migrator>(&db, "demo").await;
            db.close().await.ok();
            applied
        });
    }
    let mut applied = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        applied.push(joined.unwrap().expect("every replica's migration succeeds"));
    }
    applied.sort_unstable();
    assert_eq!(
        applied,
        [0, 0, 0, 2],
        "one replica applies both migrations, the others find nothing pending"
    );

    let db = flashsale_platform::db::connect(&settings).await.unwrap();
    assert_eq!(count(&db, "SELECT count(*) AS n FROM marker").await, 1);
    assert_eq!(
        count(&db, "SELECT count(*) AS n FROM seaql_migrations").await,
        2
    );
    // The lock went with its session: one more replica takes it at once.
    assert_eq!(
        flashsale_platform::db::migrate::<Migrator>(&db, "demo")
            .await
            .unwrap(),
        0
    );
    let held = count(
        &db,
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .await;
    assert_eq!(held, 0, "no migration lock is left behind");
    db.close().await.ok();
    drop_database(&settings).await;
}

#[tokio::test]
async fn a_replica_that_does_not_migrate_refuses_a_database_with_pending_migrations() {
    let settings = fresh_settings();
    let db = flashsale_platform::db::connect(&settings).await.unwrap();
    let refused = flashsale_platform::db::check_migrated::<Migrator>(&db, "demo")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("2 migration(s) not applied")
            && refused.contains("flashsale-demo migrate"),
        "{refused}"
    );
    // Nothing was applied by the check.
    assert_eq!(
        flashsale_platform::db::migrate::<Migrator>(&db, "demo")
            .await
            .unwrap(),
        2
    );
    flashsale_platform::db::check_migrated::<Migrator>(&db, "demo")
        .await
        .unwrap();
    db.close().await.ok();
    drop_database(&settings).await;
}

/// Whether any two runs of a job overlapped, counted from inside the job.
#[derive(Default)]
struct Overlap {
    inside: AtomicUsize,
    most: AtomicUsize,
    runs: AtomicUsize,
}

impl Overlap {
    async fn job(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        // Long enough that another replica's tick lands while this one runs.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn two_replicas_of_a_singleton_job_never_run_it_at_once() {
    let settings = fresh_settings();
    let overlap = Arc::new(Overlap::default());
    let mut replicas = tokio::task::JoinSet::new();
    for _ in 0..2 {
        // Each replica has its own pool, as separate processes would.
        let db = flashsale_platform::db::connect(&settings).await.unwrap();
        let job = Singleton::new(db, "demo/sweep");
        let overlap = overlap.clone();
        replicas.spawn(async move {
            let mut ran = 0;
            for _ in 0..100 {
                if job.run(|| overlap.job()).await.unwrap().is_some() {
                    ran += 1;
                }
            }
            ran
        });
    }
    let mut total = 0;
    while let Some(ran) = replicas.join_next().await {
        total += ran.unwrap();
    }
    assert_eq!(overlap.runs.load(Ordering::SeqCst), total);
    assert!(total > 0, "the job ran");
    assert_eq!(
        overlap.most.load(Ordering::SeqCst),
        1,
        "two replicas were inside the job at once"
    );
    drop_database(&settings).await;
}

#[tokio::test]
async fn a_singleton_held_by_one_replica_is_skipped_by_another_until_it_is_released() {
    let settings = fresh_settings();
    let db_a = flashsale_platform::db::connect(&settings).await.unwrap();
    let db_b = flashsale_platform::db::connect(&settings).await.unwrap();
    let (a, b) = (
        Singleton::new(db_a.clone(), "demo/sweep"),
        Singleton::new(db_b.clone(), "demo/sweep"),
    );
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        a.run(|| async move {
            entered_tx.send(()).unwrap();
            release_rx.await.ok();
            "a ran"
        })
        .await
    });
    entered_rx.await.unwrap();
    let skipped = b.run(|| async { "b ran" }).await.unwrap();
    assert_eq!(skipped, None, "b skips while a runs");
    let other = Singleton::new(db_b.clone(), "demo/other");
    assert_eq!(
        other.run(|| async { "other ran" }).await.unwrap(),
        Some("other ran"),
        "another job is not held back"
    );
    release_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), Some("a ran"));
    assert_eq!(b.run(|| async { "b ran" }).await.unwrap(), Some("b ran"));

    // A replica that dies mid-job (here: its job is dropped, its transaction with it) leaves
    // nothing held.
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let a = Singleton::new(db_a.clone(), "demo/sweep");
    let dying = tokio::spawn(async move {
        a.run(|| async move {
            entered_tx.send(()).unwrap();
            std::future::pending::<()>().await;
        })
        .await
    });
    entered_rx.await.unwrap();
    dying.abort();
    let _ = dying.await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let taken = loop {
        if let Some(v) = b.run(|| async { "b ran" }).await.unwrap() {
            break Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(taken, Some("b ran"));
    db_a.close().await.ok();
    db_b.close().await.ok();
    drop_database(&settings).await;
}
