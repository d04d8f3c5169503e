//! Which tokens the services accept: key sets, issuer, audience, JWKS keys by `kid`, rotation,
//! the development secret and the `auth.*` settings' bad values.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write as _, time::Duration};

use flashsale_platform::{
    auth::{
        AuthInterceptor, Caller, DEV_SECRET, JwtKeys, Role, Verifier,
        keys::{DEFAULT_AUDIENCE, DEFAULT_SERVICE_ISSUER, DEFAULT_USER_ISSUER},
    },
    config::Validate,
    settings::AuthSettings,
};
use jsonwebtoken::{Algorithm, EncodingKey, jwk::Jwk};
use tonic::{Code, Request, Status, service::Interceptor};

const USER_SECRET: &str = "user-secret-user-secret-user-secret-0001";
const SERVICE_SECRET: &str = "service-secret-service-secret-service-01";
const HOUR: Duration = Duration::from_secs(3600);

/// A PKCS#1 RSA key made for these tests only.
const RSA_KEY: &[u8] = include_bytes!("fixtures/rs256-test-key.der");

fn settings() -> AuthSettings {
    AuthSettings {
        user_secrets: vec![USER_SECRET.to_owned()],
        service_secrets: vec![SERVICE_SECRET.to_owned()],
        ..AuthSettings::default()
    }
}

fn verifier(s: &AuthSettings) -> Verifier {
    s.validate("order.auth").expect("valid settings");
    Verifier::from_settings(s, "test").expect("verifier")
}

fn hs(secret: &str) -> JwtKeys {
    JwtKeys::new(secret.as_bytes()).unwrap()
}

fn code(v: &Verifier, token: &str) -> Result<Caller, Code> {
    v.verify(token).map_err(|e| Status::from(e).code())
}

fn mint(keys: &JwtKeys, sub: &str, role: Role) -> String {
    keys.mint(sub, role, HOUR).unwrap()
}

/// A temporary file holding `text`, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("fs-jwks-{}.json", uuid::Uuid::new_v4()));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap();
        Self(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn user_and_service_tokens_are_accepted_with_their_own_keys() {
    let v = verifier(&settings());
    let alice = code(&v, &mint(&hs(USER_SECRET), "alice", Role::User)).unwrap();
    assert_eq!((alice.subject.as_str(), alice.role), ("alice", Role::User));
    let ops = code(&v, &mint(&hs(SERVICE_SECRET), "ops", Role::Admin)).unwrap();
    assert_eq!(ops.role, Role::Admin);
    let order = code(&v, &mint(&hs(SERVICE_SECRET), "order", Role::Service)).unwrap();
    assert_eq!(order.role, Role::Service);
}

#[test]
fn a_user_key_cannot_sign_admin_or_service_tokens() {
    let v = verifier(&settings());
    for role in [Role::Admin, Role::Service] {
        let forged = hs(USER_SECRET)
            .with_issuer(DEFAULT_SERVICE_ISSUER)
            .mint("mallory", role, HOUR)
            .unwrap();
        assert_eq!(
            code(&v, &forged).unwrap_err(),
            Code::Unauthenticated,
            "{role}"
        );
    }
}

#[test]
fn a_service_key_cannot_sign_user_tokens() {
    let v = verifier(&settings());
    let forged = hs(SERVICE_SECRET)
        .with_issuer(DEFAULT_USER_ISSUER)
        .mint("alice", Role::User, HOUR)
        .unwrap();
    let err = v.verify(&forged).unwrap_err();
    let message = err.to_string();
    assert_eq!(Status::from(err).code(), Code::Unauthenticated);
    assert!(message.contains("not signed by a user key"), "{message}");
}

#[test]
fn a_wrong_issuer_or_audience_is_refused() {
    let v = verifier(&settings());
    let cases = [
        hs(USER_SECRET).with_issuer("someone-else"),
        hs(USER_SECRET).with_audience("another-platform"),
        hs(USER_SECRET).with_issuer(DEFAULT_SERVICE_ISSUER),
    ];
    for keys in cases {
        let token = mint(&keys, "alice", Role::User);
        assert_eq!(code(&v, &token).unwrap_err(), Code::Unauthenticated);
    }
    let token = hs(SERVICE_SECRET)
        .with_issuer(DEFAULT_USER_ISSUER)
        .mint("ops", Role::Admin, HOUR)
        .unwrap();
    assert_eq!(code(&v, &token).unwrap_err(), Code::Unauthenticated);

    // Configured values are the expected ones.
    let custom = AuthSettings {
        audience: "shop".into(),
        user_issuer: "https://idp.example".into(),
        ..settings()
    };
    let v = verifier(&custom);
    let ok = hs(USER_SECRET)
        .with_issuer("https://idp.example")
        .with_audience("shop")
        .mint("alice", Role::User, HOUR)
        .unwrap();
    assert!(code(&v, &ok).is_ok());
    let default_aud = hs(USER_SECRET)
        .with_issuer("https://idp.example")
        .mint("alice", Role::User, HOUR)
        .unwrap();
    assert_eq!(code(&v, &default_aud).unwrap_err(), Code::Unauthenticated);
}

#[test]
fn expired_malformed_and_unknown_algorithm_tokens_are_refused() {
    let v = verifier(&settings());
    let expired = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &serde_json::json!({"sub": "bob", "role": "user", "exp": 1000, "iss": DEFAULT_USER_ISSUER, "aud": DEFAULT_AUDIENCE}),
        &EncodingKey::from_secret(USER_SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    let hs512 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS512),
        &serde_json::json!({"sub": "bob", "role": "user", "exp": 4_000_000_000u64, "iss": DEFAULT_USER_ISSUER, "aud": DEFAULT_AUDIENCE}),
        &EncodingKey::from_secret(USER_SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    for token in [expired.as_str(), hs512.as_str(), "a.b.c", "", "not-a-token"] {
        assert_eq!(
            code(&v, token).unwrap_err(),
            Code::Unauthenticated,
            "{token}"
        );
    }
}

#[test]
fn every_secret_of_a_list_is_accepted_during_a_rotation() {
    let old = "user-secret-old-old-old-old-old-old-old-0";
    let rotating = AuthSettings {
        user_secrets: vec![USER_SECRET.to_owned(), old.to_owned()],
        ..settings()
    };
    let v = verifier(&rotating);
    assert!(code(&v, &mint(&hs(old), "alice", Role::User)).is_ok());
    assert!(code(&v, &mint(&hs(USER_SECRET), "alice", Role::User)).is_ok());
    // Once the old secret is dropped, its tokens are refused.
    let v = verifier(&settings());
    assert_eq!(
        code(&v, &mint(&hs(old), "alice", Role::User)).unwrap_err(),
        Code::Unauthenticated
    );
}

/// The JWKS of an identity provider with one RS256 and one ES256 key, and their signers.
fn provider() -> (String, JwtKeys, JwtKeys, Vec<u8>) {
    let rsa = EncodingKey::from_rsa_der(RSA_KEY);
    let ec_pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ec_der = ec_pair.serialize_der();
    let ec = EncodingKey::from_ec_der(&ec_der);
    let mut rsa_jwk = Jwk::from_encoding_key(&rsa, Algorithm::RS256).unwrap();
    rsa_jwk.common.key_id = Some("rsa-2026".into());
    let mut ec_jwk = Jwk::from_encoding_key(&ec, Algorithm::ES256).unwrap();
    ec_jwk.common.key_id = Some("ec-2026".into());
    let jwks = serde_json::json!({"keys": [rsa_jwk, ec_jwk]}).to_string();
    (
        jwks,
        JwtKeys::asymmetric(rsa, Algorithm::RS256, "rsa-2026"),
        JwtKeys::asymmetric(ec, Algorithm::ES256, "ec-2026"),
        ec_der,
    )
}

#[test]
fn jwks_rs256_and_es256_user_tokens_are_accepted_by_kid() {
    let (jwks, rs, es, ec_der) = provider();
    let file = TempFile::new(&jwks);
    let s = AuthSettings {
        user_secrets: vec![],
        user_jwks_file: file.path(),
        ..settings()
    };
    let v = verifier(&s);
    let alice = code(&v, &mint(&rs, "alice", Role::User)).unwrap();
    assert_eq!((alice.subject.as_str(), alice.role), ("alice", Role::User));
    assert!(code(&v, &mint(&es, "bob", Role::User)).is_ok());

    // A token without a role claim from the identity provider is a user's.
    let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
    header.kid = Some("ec-2026".into());
    let claims = serde_json::json!({"sub": "carol", "exp": 4_000_000_000u64, "iss": DEFAULT_USER_ISSUER, "aud": DEFAULT_AUDIENCE});
    let no_role =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ec_der(&ec_der)).unwrap();
    let carol = code(&v, &no_role).unwrap();
    assert_eq!((carol.subject.as_str(), carol.role), ("carol", Role::User));
    // The same claims signed by another key under the provider's kid are refused.
    let other = rcgen::KeyPair::generate().unwrap().serialize_der();
    let forged = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ec_der(&other)).unwrap();
    assert_eq!(code(&v, &forged).unwrap_err(), Code::Unauthenticated);

    // The provider's keys cannot sign admin tokens.
    let admin = rs
        .clone()
        .with_issuer(DEFAULT_SERVICE_ISSUER)
        .mint("mallory", Role::Admin, HOUR)
        .unwrap();
    assert_eq!(code(&v, &admin).unwrap_err(), Code::Unauthenticated);
}

#[test]
fn a_token_naming_an_unknown_kid_or_the_wrong_algorithm_is_refused() {
    let (jwks, _, es, _) = provider();
    let file = TempFile::new(&jwks);
    let s = AuthSettings {
        user_jwks_file: file.path(),
        ..settings()
    };
    let v = verifier(&s);
    let stranger = JwtKeys::asymmetric(
        EncodingKey::from_ec_der(&rcgen::KeyPair::generate().unwrap().serialize_der()),
        Algorithm::ES256,
        "ec-2025",
    );
    let err = v.verify(&mint(&stranger, "alice", Role::User)).unwrap_err();
    assert!(
        err.to_string().contains("unknown user key id `ec-2025`"),
        "{err}"
    );
    // A known kid with another key (the provider's kid, a stranger's signature).
    let impostor = JwtKeys::asymmetric(
        EncodingKey::from_ec_der(&rcgen::KeyPair::generate().unwrap().serialize_der()),
        Algorithm::ES256,
        "ec-2026",
    );
    assert_eq!(
        code(&v, &mint(&impostor, "alice", Role::User)).unwrap_err(),
        Code::Unauthenticated
    );
    // The RSA key's kid on an ES256 token.
    let mislabelled = JwtKeys::asymmetric(
        EncodingKey::from_ec_der(&rcgen::KeyPair::generate().unwrap().serialize_der()),
        Algorithm::ES256,
        "rsa-2026",
    );
    let err = v
        .verify(&mint(&mislabelled, "alice", Role::User))
        .unwrap_err();
    assert!(err.to_string().contains("key `rsa-2026` is RS256"), "{err}");
    assert!(code(&v, &mint(&es, "alice", Role::User)).is_ok());
}

#[test]
fn the_development_secret_is_refused_unless_allowed() {
    // Nothing configured: no keys, and no silent fallback.
    let err = Verifier::from_settings(&AuthSettings::default(), "order")
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth.allow_development_secret"), "{err}");
    let err = JwtKeys::from_settings(&AuthSettings::default(), "order")
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth.service_secrets"), "{err}");

    // The development secret written into a list.
    let pasted = AuthSettings {
        service_secrets: vec![DEV_SECRET.to_owned()],
        ..settings()
    };
    let err = pasted.validate("order.auth").unwrap_err().to_string();
    assert!(err.contains("order.auth.service_secrets"), "{err}");
    assert!(Verifier::from_settings(&pasted, "order").is_err());

    // Allowed: both sets fall back to it, and the test tokens pass.
    let dev = AuthSettings {
        allow_development_secret: true,
        ..AuthSettings::default()
    };
    let v = Verifier::from_settings(&dev, "order").unwrap();
    let keys = JwtKeys::from_settings(&dev, "order").unwrap();
    assert_eq!(
        code(&v, &mint(&keys, "order", Role::Service)).unwrap().role,
        Role::Service
    );
    let dev_keys = hs(DEV_SECRET);
    assert!(code(&v, &mint(&dev_keys, "alice", Role::User)).is_ok());
    assert!(code(&v, &mint(&dev_keys, "ops", Role::Admin)).is_ok());
}

#[test]
fn bad_auth_settings_are_refused_naming_the_key() {
    let jwks_missing = "/nonexistent/flashsale/jwks.json".to_owned();
    let malformed = TempFile::new("{\"keys\": [{\"kty\": \"RSA\", \"kid\": \"x\"}]}");
    let empty = TempFile::new("{\"keys\": []}");
    let not_json = TempFile::new("<html>");
    type Case = (&'static str, &'static str, Box<dyn Fn(&mut AuthSettings)>);
    let cases: Vec<Case> = vec![
        (
            "order.auth.user_secrets",
            "at least 32 bytes",
            Box::new(|s| s.user_secrets = vec!["short".into()]),
        ),
        (
            "order.auth.service_secrets",
            "at least 32 bytes",
            Box::new(|s| s.service_secrets.push("short".into())),
        ),
        (
            "order.auth.service_secrets",
            "must not share",
            Box::new(|s| s.service_secrets.push(USER_SECRET.into())),
        ),
        (
            "order.auth.jwt_secret",
            "replaced by auth.user_secrets",
            Box::new(|s| s.jwt_secret = USER_SECRET.into()),
        ),
        (
            "order.auth.audience",
            "1..=256",
            Box::new(|s| s.audience = String::new()),
        ),
        (
            "order.auth.user_issuer",
            "control",
            Box::new(|s| s.user_issuer = "a\nb".into()),
        ),
        (
            "order.auth.service_issuer",
            "1..=256",
            Box::new(|s| s.service_issuer = "x".repeat(257)),
        ),
        ("order.auth.user_jwks_file", "cannot read", {
            let p = jwks_missing.clone();
            Box::new(move |s| s.user_jwks_file = p.clone())
        }),
        ("order.auth.user_jwks_file", "not a valid JWK", {
            let p = malformed.path();
            Box::new(move |s| s.user_jwks_file = p.clone())
        }),
        ("order.auth.user_jwks_file", "no signing key", {
            let p = empty.path();
            Box::new(move |s| s.user_jwks_file = p.clone())
        }),
        ("order.auth.user_jwks_file", "not JSON", {
            let p = not_json.path();
            Box::new(move |s| s.user_jwks_file = p.clone())
        }),
    ];
    for (key, reason, mutate) in cases {
        let mut s = settings();
        mutate(&mut s);
        let err = s.validate("order.auth").unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(reason),
            "`{err}` should name {key}: {reason}"
        );
    }
    // The start-up check says the same about the JWKS file.
    let s = AuthSettings {
        user_jwks_file: malformed.path(),
        ..settings()
    };
    let err = Verifier::from_settings(&s, "order")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("auth.user_jwks_file") && err.contains("not a valid JWK"),
        "{err}"
    );
}

#[test]
fn secret_lists_load_from_an_array_or_a_comma_separated_variable() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Svc {
        auth: AuthSettings,
    }
    impl Validate for Svc {
        fn validate(&self, p: &str) -> Result<(), flashsale_platform::config::ConfigError> {
            self.auth.validate(&format!("{p}.auth"))
        }
    }
    let dir = std::env::temp_dir().join(format!("fs-auth-config-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("default.toml"),
        format!(
            "[order.auth]\nuser_secrets = [\"{USER_SECRET}\", \"{}\"]\n",
            "u".repeat(40)
        ),
    )
    .unwrap();
    let env = |vars: &[(&str, &str)]| {
        config::Environment::with_prefix("FLASHSALE")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(
                vars.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ))
    };
    let defaults = Svc {
        auth: AuthSettings::default(),
    };
    let loaded: Svc =
        flashsale_platform::config::load_from("order", &defaults, &dir, None, env(&[])).unwrap();
    assert_eq!(loaded.auth.user_secrets.len(), 2);
    let value = format!("{SERVICE_SECRET}, {}", "s".repeat(40));
    let loaded: Svc = flashsale_platform::config::load_from(
        "order",
        &defaults,
        &dir,
        None,
        env(&[("FLASHSALE_ORDER__AUTH__SERVICE_SECRETS", &value)]),
    )
    .unwrap();
    assert_eq!(
        loaded.auth.service_secrets,
        vec![SERVICE_SECRET.to_owned(), "s".repeat(40)]
    );
    let err = flashsale_platform::config::load_from(
        "order",
        &defaults,
        &dir,
        None,
        env(&[("FLASHSALE_ORDER__AUTH__SERVICE_SECRETS", "too-short")]),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("order.auth.service_secrets"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_interceptor_wants_a_bearer_token() {
    let mut i = AuthInterceptor::new(verifier(&settings()));
    let with = |value: &str| {
        let mut r = Request::new(());
        r.metadata_mut()
            .insert("authorization", value.parse().unwrap());
        r
    };
    assert_eq!(
        i.call(Request::new(())).unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        i.call(with("Basic abc")).unwrap_err().code(),
        Code::Unauthenticated
    );
    let token = mint(&hs(USER_SECRET), "alice", Role::User);
    let r = i.call(with(&format!("Bearer {token}"))).unwrap();
    assert_eq!(Caller::of(&r).unwrap().subject, "alice");
}

#[test]
fn a_subject_with_a_control_character_is_unauthenticated() {
    let v = verifier(&settings());
    for bad in ["a\0", "\0", "bob\n", "x\u{7f}", ""] {
        let err = v
            .verify(&mint(&hs(USER_SECRET), bad, Role::User))
            .expect_err("a bad subject");
        let status = Status::from(err);
        assert_eq!(status.code(), Code::Unauthenticated, "{bad:?}");
        assert!(status.message().contains("sub"), "{}", status.message());
    }
    assert!(code(&v, &mint(&hs(USER_SECRET), "alice", Role::User)).is_ok());
}
