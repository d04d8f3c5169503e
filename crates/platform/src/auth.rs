//! Caller identity from a verified bearer token (JWT, HS256, claims `sub`, `role`, `exp`).
//! The [`AuthInterceptor`] rejects requests without a valid token (`UNAUTHENTICATED`) and puts
//! the [`Caller`] into the request's extensions; handlers then ask for a role with
//! [`Caller::require`] (`PERMISSION_DENIED`). Identity never comes from a plain header.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tonic::{Request, Status, service::Interceptor};

use crate::{error::ApiError, settings::AuthSettings};

/// Used when `auth.jwt_secret` is empty. Public on purpose: it only suits a laptop.
pub const DEV_SECRET: &str = "flashsale-development-secret-do-not-use-in-production";

/// The longest `sub` a token may carry.
pub const MAX_SUBJECT_LEN: usize = 128;

/// What a caller may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A buyer, acting on their own orders.
    User,
    /// An operator.
    Admin,
    /// Another flashsale service.
    Service,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "user" => Ok(Self::User),
            "admin" => Ok(Self::Admin),
            "service" => Ok(Self::Service),
            other => Err(format!("unknown role `{other}` (user, admin, service)")),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::User => "user",
            Self::Admin => "admin",
            Self::Service => "service",
        })
    }
}

/// The token's claims.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub role: Role,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
}

/// The verified caller of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub role: Role,
}

impl Caller {
    /// The caller put into `request` by the [`AuthInterceptor`].
    pub fn of<T>(request: &Request<T>) -> Result<Self, ApiError> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::Unauthenticated("no verified caller".into()))
    }

    /// Fails with `PERMISSION_DENIED` unless the caller has one of `roles`.
    pub fn require(&self, roles: &[Role]) -> Result<(), ApiError> {
        if roles.contains(&self.role) {
            Ok(())
        } else {
            Err(ApiError::PermissionDenied(format!(
                "role `{}` may not call this; needs one of {}",
                self.role,
                roles
                    .iter()
                    .map(Role::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

/// Signs and verifies tokens with one HS256 secret.
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JwtKeys(<redacted>)")
    }
}

impl JwtKeys {
    /// Keys for `secret` (fails only for a secret the crypto backend refuses, e.g. empty).
    pub fn new(secret: &[u8]) -> anyhow::Result<Self> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Ok(Self {
            encoding: EncodingKey::from_secret(secret)
                .map_err(|e| anyhow::anyhow!("jwt encoding key: {e}"))?,
            decoding: DecodingKey::from_secret(secret)
                .map_err(|e| anyhow::anyhow!("jwt decoding key: {e}"))?,
            validation,
        })
    }

    /// Keys from settings; an empty secret means [`DEV_SECRET`] and a loud warning.
    pub fn from_settings(settings: &AuthSettings, service: &str) -> anyhow::Result<Self> {
        if settings.jwt_secret.is_empty() {
            tracing::warn!(
                service,
                "!!! auth.jwt_secret is not set: using the PUBLIC development secret; anyone can \
                 mint tokens. Set FLASHSALE_<SERVICE>__AUTH__JWT_SECRET in production !!!"
            );
            Self::new(DEV_SECRET.as_bytes())
        } else {
            Self::new(settings.jwt_secret.as_bytes())
        }
    }

    /// Mints a token for `subject` with `role`, valid for `ttl`.
    pub fn mint(
        &self,
        subject: &str,
        role: Role,
        ttl: std::time::Duration,
    ) -> Result<String, ApiError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| ApiError::internal(anyhow::anyhow!("clock before epoch: {e}")))?;
        let claims = Claims {
            sub: subject.to_owned(),
            role,
            exp: (now + ttl).as_secs(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| ApiError::internal(anyhow::anyhow!("sign token: {e}")))
    }

    /// Verifies signature, algorithm and expiry; returns the caller.
    pub fn verify(&self, token: &str) -> Result<Caller, ApiError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| ApiError::Unauthenticated(format!("invalid bearer token: {e}")))?;
        let sub = data.claims.sub;
        // The subject becomes a user id in every store: no control character, NUL included.
        if sub.len() > MAX_SUBJECT_LEN
            || flashsale_contract::check_text("sub", &sub, MAX_SUBJECT_LEN).is_err()
        {
            return Err(ApiError::Unauthenticated(format!(
                "token subject `sub` must be 1..={MAX_SUBJECT_LEN} bytes without control characters"
            )));
        }
        Ok(Caller {
            subject: sub,
            role: data.claims.role,
        })
    }
}

/// The bearer token a service sends when it calls another service (role `service`), minted
/// from the shared secret and re-minted before it expires.
pub struct ServiceToken {
    keys: JwtKeys,
    subject: String,
    cached: std::sync::RwLock<(String, std::time::Instant)>,
}

impl std::fmt::Debug for ServiceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceToken")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

const SERVICE_TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
const SERVICE_TOKEN_REFRESH: std::time::Duration = std::time::Duration::from_secs(600);

impl ServiceToken {
    pub fn new(keys: JwtKeys, subject: &str) -> Result<Self, ApiError> {
        let token = keys.mint(subject, Role::Service, SERVICE_TOKEN_TTL)?;
        Ok(Self {
            keys,
            subject: subject.to_owned(),
            cached: std::sync::RwLock::new((token, std::time::Instant::now() + SERVICE_TOKEN_TTL)),
        })
    }

    /// The current token (re-minted when less than ten minutes are left).
    pub fn get(&self) -> Result<String, ApiError> {
        let now = std::time::Instant::now();
        if let Ok(c) = self.cached.read()
            && c.1 > now + SERVICE_TOKEN_REFRESH
        {
            return Ok(c.0.clone());
        }
        let token = self
            .keys
            .mint(&self.subject, Role::Service, SERVICE_TOKEN_TTL)?;
        if let Ok(mut c) = self.cached.write() {
            *c = (token.clone(), now + SERVICE_TOKEN_TTL);
        }
        Ok(token)
    }
}

/// Tonic interceptor: verifies `authorization: Bearer <jwt>`.
#[derive(Clone, Debug)]
pub struct AuthInterceptor {
    keys: JwtKeys,
}

impl AuthInterceptor {
    pub fn new(keys: JwtKeys) -> Self {
        Self { keys }
    }
}

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request.metadata().get("authorization").ok_or_else(|| {
            ApiError::Unauthenticated("missing authorization bearer token".into())
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| {
                ApiError::Unauthenticated("authorization must be `Bearer <token>`".into())
            })?;
        let caller = self.keys.verify(token.trim())?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn req_with(value: &str) -> Request<()> {
        let mut r = Request::new(());
        r.metadata_mut()
            .insert("authorization", value.parse().unwrap());
        r
    }

    #[test]
    fn valid_token_yields_its_caller() {
        let keys = JwtKeys::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let token = keys
            .mint("alice", Role::User, Duration::from_secs(60))
            .unwrap();
        let mut i = AuthInterceptor::new(keys);
        let r = i.call(req_with(&format!("Bearer {token}"))).unwrap();
        let caller = Caller::of(&r).unwrap();
        assert_eq!(caller.subject, "alice");
        assert_eq!(caller.role, Role::User);
    }

    #[test]
    fn missing_wrong_secret_and_expired_tokens_are_unauthenticated() {
        let keys = JwtKeys::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let other = JwtKeys::new(b"another-secret-another-secret-xx").unwrap();
        let mut i = AuthInterceptor::new(keys.clone());
        assert_eq!(
            i.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let forged = other
            .mint("mallory", Role::Admin, Duration::from_secs(60))
            .unwrap();
        let err = i.call(req_with(&format!("Bearer {forged}"))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let expired = Claims {
            sub: "bob".into(),
            role: Role::User,
            exp: 1_000,
        };
        let expired =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &expired, &keys.encoding).unwrap();
        let err = i.call(req_with(&format!("Bearer {expired}"))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let err = i.call(req_with("Basic abc")).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_subject_with_a_control_character_is_unauthenticated() {
        let keys = JwtKeys::new(b"0123456789abcdef0123456789abcdef").unwrap();
        let mut i = AuthInterceptor::new(keys.clone());
        for bad in ["a\0", "\0", "bob\n", "x\u{7f}", ""] {
            let token = keys.mint(bad, Role::User, Duration::from_secs(60)).unwrap();
            let err = i.call(req_with(&format!("Bearer {token}"))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(err.message().contains("sub"), "{}", err.message());
        }
    }

    #[test]
    fn wrong_role_is_permission_denied() {
        let caller = Caller {
            subject: "alice".into(),
            role: Role::User,
        };
        assert!(caller.require(&[Role::User, Role::Admin]).is_ok());
        let status: Status = caller.require(&[Role::Admin]).unwrap_err().into();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
    }
}
