//! The gate's connection pool (`flashsale_platform::redis`): a connection in steady use serves
//! again without a round trip of its own, one that sat idle is checked first, and one whose
//! command lost the connection is replaced rather than handed out again; a new connection runs
//! the pool's hook first. What a connection did last is read from another connection with
//! `CLIENT LIST ID`.

use std::time::Duration;

use deadpool_redis::redis;
use flashsale_platform::{
    redis::{Connection, Pool},
    settings::RedisSettings,
};

fn settings() -> RedisSettings {
    RedisSettings {
        url: flashsale_test_support::redis_url(),
        key_prefix: format!("{}:", flashsale_test_support::unique_name("pool_test")),
        pool_size: 1,
        ..Default::default()
    }
}

async fn client_id(conn: &mut Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut **conn)
        .await
        .unwrap()
}

/// The last command the client `id` ran, as `CLIENT LIST` names it (`ping`, `client|id`, …),
/// read over a connection of its own.
async fn last_command(id: i64) -> String {
    let client = redis::Client::open(flashsale_test_support::redis_url()).unwrap();
    let mut other = client.get_multiplexed_async_connection().await.unwrap();
    let line: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("ID")
        .arg(id)
        .query_async(&mut other)
        .await
        .unwrap();
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("cmd="))
        .unwrap_or_else(|| panic!("no cmd= in {line:?}"))
        .to_owned()
}

/// Takes the pool's one connection, learns its client id and gives it back.
async fn use_once(pool: &Pool) -> i64 {
    let mut conn = pool.get().await.unwrap();
    client_id(&mut conn).await
}

/// A window no test outlasts: what happens within it does not depend on the machine's speed.
const LONG: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_connection_in_steady_use_serves_again_without_a_ping() {
    let pool = flashsale_platform::redis::pool_with(&settings(), LONG).unwrap();
    let id = use_once(&pool).await;
    let _again = pool.get().await.unwrap();
    assert_eq!(last_command(id).await, "client|id");
}

#[tokio::test]
async fn a_pool_told_to_check_every_time_pings_at_every_hand_out() {
    // What deadpool-redis does on its own, and what the test above would see without the
    // steady-use window.
    let pool = flashsale_platform::redis::pool_with(&settings(), Duration::ZERO).unwrap();
    let id = use_once(&pool).await;
    let _again = pool.get().await.unwrap();
    assert_eq!(last_command(id).await, "ping");
}

#[tokio::test]
async fn a_connection_idle_past_the_window_is_checked_before_it_serves() {
    let window = Duration::from_millis(50);
    let pool = flashsale_platform::redis::pool_with(&settings(), window).unwrap();
    let id = use_once(&pool).await;
    // The window is what is under test: let it pass.
    tokio::time::sleep(window * 3).await;
    let mut again = pool.get().await.unwrap();
    assert_eq!(last_command(id).await, "ping");
    assert_eq!(
        client_id(&mut again).await,
        id,
        "the checked connection serves"
    );
}

#[tokio::test]
async fn a_connection_that_lost_its_server_is_replaced_not_handed_out_again() {
    let pool = flashsale_platform::redis::pool_with(&settings(), LONG).unwrap();
    let mut conn = pool.get().await.unwrap();
    let id = client_id(&mut conn).await;
    let client = redis::Client::open(flashsale_test_support::redis_url()).unwrap();
    let mut other = client.get_multiplexed_async_connection().await.unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut other)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let lost: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut *conn).await;
    assert!(lost.is_err(), "a killed connection answered: {lost:?}");
    assert!(conn.is_broken());
    drop(conn);
    // Within the steady-use window, yet the pool opens a new connection.
    let mut fresh = pool.get().await.unwrap();
    let fresh_id = client_id(&mut fresh).await;
    assert_ne!(fresh_id, id);
    assert!(!fresh.is_broken());
}

#[tokio::test]
async fn a_server_error_leaves_the_connection_in_service() {
    let pool = flashsale_platform::redis::pool_with(&settings(), LONG).unwrap();
    let mut conn = pool.get().await.unwrap();
    let id = client_id(&mut conn).await;
    let unknown: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
        .arg("0000000000000000000000000000000000000000")
        .arg(0)
        .query_async(&mut *conn)
        .await;
    assert!(unknown.is_err(), "{unknown:?}");
    let wrong: redis::RedisResult<i64> =
        redis::cmd("NO-SUCH-COMMAND").query_async(&mut *conn).await;
    assert!(wrong.is_err(), "{wrong:?}");
    assert!(!conn.is_broken());
    drop(conn);
    let mut again = pool.get().await.unwrap();
    assert_eq!(client_id(&mut again).await, id);
}

#[tokio::test]
async fn a_connection_whose_command_was_cut_off_is_checked_before_it_serves() {
    let pool = flashsale_platform::redis::pool_with(&settings(), LONG).unwrap();
    let mut conn = pool.get().await.unwrap();
    let id = client_id(&mut conn).await;
    // The caller gives up on a command the server is still working on (it blocks for 2 s):
    // the connection is busy, and nothing told it so.
    let key = format!("{}blocked", settings().key_prefix);
    let mut blpop = redis::cmd("BLPOP");
    blpop.arg(&key).arg(2);
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        blpop.query_async::<redis::Value>(&mut *conn),
    )
    .await;
    assert!(cut.is_err(), "the command answered: {cut:?}");
    drop(conn);
    // Within the window, yet checked: its PING waits behind the blocked command past the
    // response timeout, so the pool opens a new connection.
    let mut next = pool.get().await.unwrap();
    assert_ne!(client_id(&mut next).await, id);
}

#[tokio::test]
async fn the_new_connection_hook_runs_once_per_connection_before_it_serves() {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let hook: flashsale_platform::redis::OnConnect = Arc::new(move |conn| {
        let counted = counted.clone();
        Box::pin(async move {
            let _: String = redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg("hooked")
                .query_async(conn)
                .await?;
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    });
    let pool = flashsale_platform::redis::pool_with_hook(&settings(), LONG, Some(hook)).unwrap();
    for _ in 0..3 {
        let mut conn = pool.get().await.unwrap();
        let name: Option<String> = redis::cmd("CLIENT")
            .arg("GETNAME")
            .query_async(&mut *conn)
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("hooked"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one connection, one run");
}

#[tokio::test]
async fn a_failing_new_connection_hook_fails_the_hand_out_and_keeps_no_connection() {
    let hook: flashsale_platform::redis::OnConnect = std::sync::Arc::new(|conn| {
        Box::pin(async move {
            let _: () = redis::cmd("NO-SUCH-COMMAND").query_async(conn).await?;
            Ok(())
        })
    });
    let pool = flashsale_platform::redis::pool_with_hook(&settings(), LONG, Some(hook)).unwrap();
    assert!(pool.get().await.is_err());
    assert_eq!(pool.status().size, 0);
}
