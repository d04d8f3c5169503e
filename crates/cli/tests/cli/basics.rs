//! Commands that need no service: token minting, and health against nothing.

use crate::helpers::flashsale;

#[tokio::test]
async fn token_prints_a_jwt_and_refuses_bad_roles() {
    let run = flashsale(
        &["token", "--sub", "alice", "--role", "admin"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        run.stdout.trim().split('.').count(),
        3,
        "not a JWT: {}",
        run.stdout
    );
    let bad = flashsale(
        &["token", "--sub", "alice", "--role", "root"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!bad.ok);
    assert!(bad.stderr.contains("root"), "{}", bad.stderr);
    let empty = flashsale(
        &["token", "--sub", "", "--role", "user"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!empty.ok);
}

#[tokio::test]
async fn health_fails_when_services_are_down() {
    let run = flashsale(
        &[
            "health",
            "--product-stock-url",
            "http://127.0.0.1:1",
            "--order-url",
            "http://127.0.0.1:1",
            "--outbound-url",
            "http://127.0.0.1:1",
            "--timeout-ms",
            "300",
        ],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(!run.ok);
    assert_eq!(run.stdout.matches("DOWN").count(), 3, "{}", run.stdout);
}
