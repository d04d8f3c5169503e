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
async fn token_signs_user_tokens_with_the_user_secret_and_admin_tokens_with_the_service_secret() {
    use flashsale_platform::{
        auth::{Role, Verifier},
        settings::AuthSettings,
    };
    let (user_secret, service_secret) = ("u".repeat(40), "s".repeat(40));
    let verifier = Verifier::from_settings(
        &AuthSettings {
            user_secrets: vec![user_secret.clone()],
            service_secrets: vec![service_secret.clone()],
            ..AuthSettings::default()
        },
        "test",
    )
    .unwrap();
    let mint = |role: &'static str| {
        let args = [
            "token",
            "--sub",
            "alice",
            "--role",
            role,
            "--user-secret",
            &user_secret,
            "--service-secret",
            &service_secret,
        ]
        .map(str::to_owned);
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let run = flashsale(&refs, "http://127.0.0.1:1").await;
            assert!(run.ok, "{}", run.stderr);
            run.stdout.trim().to_owned()
        }
    };
    assert_eq!(
        verifier.verify(&mint("user").await).unwrap().role,
        Role::User
    );
    assert_eq!(
        verifier.verify(&mint("admin").await).unwrap().role,
        Role::Admin
    );
    // The development secret is no key of these services.
    let dev = flashsale(
        &["token", "--sub", "alice", "--role", "admin"],
        "http://127.0.0.1:1",
    )
    .await;
    assert!(verifier.verify(dev.stdout.trim()).is_err());
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
