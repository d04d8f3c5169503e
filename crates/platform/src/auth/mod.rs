//! Caller identity from a verified bearer token (JWT, claims `sub`, `role`, `exp`, `iss`,
//! `aud`; which keys sign which tokens: [`keys`]). The [`AuthInterceptor`] rejects requests
//! without a valid token (`UNAUTHENTICATED`) and puts the [`Caller`] into the request's
//! extensions; handlers then ask for a role with [`authorize`] (`PERMISSION_DENIED`), which also
//! writes the audit line of every admin call. Identity never comes from a plain header.

mod jwks;
pub mod keys;

use serde::{Deserialize, Serialize};
use tonic::{Request, Status, service::Interceptor};

pub use keys::{DEFAULT_AUDIENCE, DEFAULT_SERVICE_ISSUER, DEFAULT_USER_ISSUER, JwtKeys, Verifier};

use crate::error::ApiError;

/// The public development secret: accepted only with `auth.allow_development_secret = true`.
/// Public on purpose: it only suits a laptop.
pub const DEV_SECRET: &str = "flashsale-development-secret-do-not-use-in-production";

/// The `tracing` target of the admin audit lines.
pub const AUDIT_TARGET: &str = "flashsale::audit";

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

/// The claims of a token this platform mints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub role: Role,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    pub iss: String,
    pub aud: String,
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

/// The bearer token a service sends when it calls another service (role `service`), minted
/// with its service key and re-minted before it expires.
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
    /// The token the service `service` presents to the others, with keys from its `auth`
    /// settings.
    pub fn for_service(
        auth: &crate::settings::AuthSettings,
        service: &str,
    ) -> anyhow::Result<std::sync::Arc<Self>> {
        let keys = JwtKeys::from_settings(auth, service)?;
        let token =
            Self::new(keys, service).map_err(|e| anyhow::anyhow!("mint service token: {e}"))?;
        Ok(std::sync::Arc::new(token))
    }

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

/// The caller of `request`, if it may call it with one of `roles`; the name of the call is the
/// request message's type less `Request` (`AdjustStockRequest` → `AdjustStock`).
///
/// Every call by an admin is logged at info level on [`AUDIT_TARGET`] with the caller (subject,
/// role), the action and its arguments (the request message), and every refused attempt at an
/// admin-only call at warn level: one place, so no admin action goes unrecorded.
pub fn authorize<T: std::fmt::Debug>(
    request: &Request<T>,
    roles: &[Role],
) -> Result<Caller, ApiError> {
    let caller = Caller::of(request)?;
    let action = action_name::<T>();
    if let Err(e) = caller.require(roles) {
        if roles == [Role::Admin] {
            tracing::warn!(
                target: AUDIT_TARGET,
                action,
                subject = %caller.subject,
                role = %caller.role,
                "admin action refused"
            );
        }
        return Err(e);
    }
    if caller.role == Role::Admin {
        tracing::info!(
            target: AUDIT_TARGET,
            action,
            subject = %caller.subject,
            role = %caller.role,
            args = ?request.get_ref(),
            "admin action"
        );
    }
    Ok(caller)
}

/// `flashsale_proto::product::v1::AdjustStockRequest` → `AdjustStock`.
fn action_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let name = full.rsplit("::").next().unwrap_or(full);
    name.strip_suffix("Request").unwrap_or(name)
}

/// Tonic interceptor: verifies `authorization: Bearer <jwt>`.
#[derive(Clone, Debug)]
pub struct AuthInterceptor {
    verifier: Verifier,
}

impl AuthInterceptor {
    pub fn new(verifier: Verifier) -> Self {
        Self { verifier }
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
        let caller = self.verifier.verify(token.trim())?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}
