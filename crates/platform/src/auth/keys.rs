//! Which keys sign and verify which tokens (docs/security.md#tokens-and-keys).
//!
//! Two key sets, never sharing a key:
//! - **user tokens** come from the gateway's identity provider: HS256 with one of
//!   `auth.user_secrets`, or RS256/ES256 with a key of the JWKS `auth.user_jwks_file` chosen by
//!   the token's `kid`; issuer `auth.user_issuer`; role `user` (or no role claim);
//! - **service and admin tokens**: HS256 with one of `auth.service_secrets` (the first signs this
//!   service's own calls); issuer `auth.service_issuer`; role `service` or `admin`.
//!
//! Every token must name `auth.audience` in `aud`. The role a token claims picks the set that
//! must have signed it, so a user key cannot sign an admin token and a service key cannot sign a
//! user token. Each list accepts several keys, which is how keys rotate.

use std::{collections::HashSet, sync::Arc};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Deserialize;

use super::{Caller, Claims, DEV_SECRET, MAX_SUBJECT_LEN, Role, jwks};
use crate::{error::ApiError, settings::AuthSettings};

/// `iss` of user tokens unless `auth.user_issuer` says otherwise.
pub const DEFAULT_USER_ISSUER: &str = "flashsale-gateway";
/// `iss` of service and admin tokens unless `auth.service_issuer` says otherwise.
pub const DEFAULT_SERVICE_ISSUER: &str = "flashsale";
/// `aud` every token must carry unless `auth.audience` says otherwise.
pub const DEFAULT_AUDIENCE: &str = "flashsale";

/// Clock skew tolerated on `exp`, in seconds.
const LEEWAY_SECS: u64 = 5;

/// Signs tokens with one key (HS256 secret, or an RS256/ES256 private key with its `kid`).
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    algorithm: Algorithm,
    kid: Option<String>,
    /// `None`: the default issuer of the role minted.
    issuer: Option<String>,
    audience: String,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JwtKeys(<redacted>)")
    }
}

impl JwtKeys {
    /// HS256 keys for `secret`, with the default issuer of each role and the default audience.
    pub fn new(secret: &[u8]) -> anyhow::Result<Self> {
        Ok(Self {
            encoding: EncodingKey::from_secret(secret)
                .map_err(|e| anyhow::anyhow!("jwt encoding key: {e}"))?,
            algorithm: Algorithm::HS256,
            kid: None,
            issuer: None,
            audience: DEFAULT_AUDIENCE.to_owned(),
        })
    }

    /// Keys signing with a private key (`RS256` or `ES256`) whose public half a JWKS lists as
    /// `kid` — what an identity provider does.
    pub fn asymmetric(encoding: EncodingKey, algorithm: Algorithm, kid: &str) -> Self {
        Self {
            encoding,
            algorithm,
            kid: Some(kid.to_owned()),
            issuer: None,
            audience: DEFAULT_AUDIENCE.to_owned(),
        }
    }

    /// Tokens carry `iss = issuer` whatever their role.
    pub fn with_issuer(mut self, issuer: &str) -> Self {
        self.issuer = Some(issuer.to_owned());
        self
    }

    /// Tokens carry `aud = audience`.
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.audience = audience.to_owned();
        self
    }

    /// The keys this service signs its own calls to other services with: the first of
    /// `auth.service_secrets` (or the development secret where allowed), its issuer and audience.
    pub fn from_settings(settings: &AuthSettings, service: &str) -> anyhow::Result<Self> {
        let secrets = secrets_in_force(settings, Set::Service, service)?;
        let first = secrets
            .first()
            .ok_or_else(|| anyhow::anyhow!("auth.service_secrets is empty"))?;
        Ok(Self::new(first.as_bytes())?
            .with_issuer(&settings.service_issuer)
            .with_audience(&settings.audience))
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
        let issuer = self.issuer.clone().unwrap_or_else(|| {
            match role {
                Role::User => DEFAULT_USER_ISSUER,
                Role::Admin | Role::Service => DEFAULT_SERVICE_ISSUER,
            }
            .to_owned()
        });
        let claims = Claims {
            sub: subject.to_owned(),
            role,
            exp: (now + ttl).as_secs(),
            iat: now.as_secs(),
            iss: issuer,
            aud: self.audience.clone(),
        };
        let mut header = Header::new(self.algorithm);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, &claims, &self.encoding)
            .map_err(|e| ApiError::internal(anyhow::anyhow!("sign token: {e}")))
    }
}

/// The two key sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    User,
    Service,
}

impl Set {
    fn key(self) -> &'static str {
        match self {
            Self::User => "auth.user_secrets",
            Self::Service => "auth.service_secrets",
        }
    }
}

/// The HS256 secrets of `set` in force: the configured ones, else the development secret when
/// `auth.allow_development_secret` is set. A user set with a JWKS file needs no secret.
fn secrets_in_force(
    settings: &AuthSettings,
    set: Set,
    service: &str,
) -> anyhow::Result<Vec<String>> {
    let configured = match set {
        Set::User => &settings.user_secrets,
        Set::Service => &settings.service_secrets,
    };
    if configured.iter().any(|s| s == DEV_SECRET) && !settings.allow_development_secret {
        anyhow::bail!(
            "{} holds the public development secret: refused unless \
             auth.allow_development_secret = true (never in production)",
            set.key()
        );
    }
    if !configured.is_empty() || (set == Set::User && !settings.user_jwks_file.is_empty()) {
        return Ok(configured.clone());
    }
    if !settings.allow_development_secret {
        anyhow::bail!(
            "no key for {} tokens: set {}{}; only a development machine may set \
             auth.allow_development_secret = true to use the public development secret",
            match set {
                Set::User => "user",
                Set::Service => "service and admin",
            },
            set.key(),
            match set {
                Set::User => " or auth.user_jwks_file",
                Set::Service => "",
            },
        );
    }
    tracing::warn!(
        service,
        setting = set.key(),
        "!!! using the PUBLIC development secret (auth.allow_development_secret = true): anyone \
         can mint tokens. Never run like this in production !!!"
    );
    Ok(vec![DEV_SECRET.to_owned()])
}

/// The keys of one set and what its tokens must say.
struct KeySet {
    secrets: Vec<DecodingKey>,
    jwks: jwks::Keys,
    issuer: String,
    /// `Validation` by algorithm (HS256, RS256, ES256).
    validations: Vec<(Algorithm, Validation)>,
}

impl KeySet {
    fn new(
        secrets: &[String],
        jwks: jwks::Keys,
        issuer: &str,
        audience: &str,
    ) -> anyhow::Result<Self> {
        let secrets = secrets
            .iter()
            .map(|s| DecodingKey::from_secret(s.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("jwt decoding key: {e}"))?;
        let validations = [Algorithm::HS256, Algorithm::RS256, Algorithm::ES256]
            .into_iter()
            .map(|alg| {
                let mut v = Validation::new(alg);
                v.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
                v.set_issuer(&[issuer]);
                v.set_audience(&[audience]);
                v.leeway = LEEWAY_SECS;
                (alg, v)
            })
            .collect();
        Ok(Self {
            secrets,
            jwks,
            issuer: issuer.to_owned(),
            validations,
        })
    }

    fn validation(&self, alg: Algorithm) -> Option<&Validation> {
        self.validations
            .iter()
            .find_map(|(a, v)| (*a == alg).then_some(v))
    }

    /// Verifies `token` (whose header is `header`) with this set's keys.
    fn verify(&self, token: &str, header: &Header, what: &str) -> Result<Verified, ApiError> {
        let unauthenticated =
            |reason: String| ApiError::Unauthenticated(format!("invalid bearer token: {reason}"));
        let validation = self.validation(header.alg).ok_or_else(|| {
            unauthenticated(format!("algorithm {:?} is not accepted", header.alg))
        })?;
        match header.alg {
            Algorithm::HS256 => {
                let mut last = None;
                for key in &self.secrets {
                    match jsonwebtoken::decode::<Verified>(token, key, validation) {
                        Ok(data) => return Ok(data.claims),
                        Err(e) => {
                            let bad_signature = matches!(
                                e.kind(),
                                jsonwebtoken::errors::ErrorKind::InvalidSignature
                            );
                            last = Some(e);
                            // Only a wrong signature means another key may fit.
                            if !bad_signature {
                                break;
                            }
                        }
                    }
                }
                Err(match last {
                    Some(e)
                        if matches!(
                            e.kind(),
                            jsonwebtoken::errors::ErrorKind::InvalidSignature
                        ) =>
                    {
                        unauthenticated(format!("not signed by a {what} key"))
                    }
                    Some(e) => unauthenticated(e.to_string()),
                    None => unauthenticated(format!("{what} tokens are not accepted with HS256")),
                })
            }
            _ => {
                let kid = header
                    .kid
                    .as_deref()
                    .ok_or_else(|| unauthenticated("no `kid` in the token header".to_owned()))?;
                let key = self
                    .jwks
                    .get(kid)
                    .ok_or_else(|| unauthenticated(format!("unknown {what} key id `{kid}`")))?;
                if key.algorithm != header.alg {
                    return Err(unauthenticated(format!(
                        "key `{kid}` is {:?}, the token says {:?}",
                        key.algorithm, header.alg
                    )));
                }
                jsonwebtoken::decode::<Verified>(token, &key.key, validation)
                    .map(|d| d.claims)
                    .map_err(|e| unauthenticated(e.to_string()))
            }
        }
    }
}

/// The claims a verified token hands on.
#[derive(Deserialize)]
struct Verified {
    sub: String,
    #[serde(default)]
    role: Option<Role>,
}

/// Just the role, read before verification to pick the key set.
#[derive(Deserialize)]
struct RoleOnly {
    #[serde(default)]
    role: Option<Role>,
}

/// Verifies bearer tokens against the two key sets.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<(KeySet, KeySet)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("user_issuer", &self.inner.0.issuer)
            .field("user_secrets", &self.inner.0.secrets.len())
            .field("user_jwks_keys", &self.inner.0.jwks.len())
            .field("service_issuer", &self.inner.1.issuer)
            .field("service_secrets", &self.inner.1.secrets.len())
            .finish()
    }
}

impl Verifier {
    /// The verifier `settings` describe. Fails without a key for either set (unless the
    /// development secret is allowed), on the development secret where it is not allowed, and
    /// on a JWKS file that cannot be read or holds no usable key.
    pub fn from_settings(settings: &AuthSettings, service: &str) -> anyhow::Result<Self> {
        let user_secrets = secrets_in_force(settings, Set::User, service)?;
        let service_secrets = secrets_in_force(settings, Set::Service, service)?;
        let shared: HashSet<&String> = user_secrets.iter().collect();
        if service_secrets
            .iter()
            .any(|s| s != DEV_SECRET && shared.contains(s))
        {
            anyhow::bail!("auth.service_secrets must not share a secret with auth.user_secrets");
        }
        let jwks = if settings.user_jwks_file.is_empty() {
            jwks::Keys::new()
        } else {
            jwks::load(&settings.user_jwks_file)
                .map_err(|e| anyhow::anyhow!("auth.user_jwks_file: {e}"))?
        };
        let user = KeySet::new(
            &user_secrets,
            jwks,
            &settings.user_issuer,
            &settings.audience,
        )?;
        let service = KeySet::new(
            &service_secrets,
            jwks::Keys::new(),
            &settings.service_issuer,
            &settings.audience,
        )?;
        Ok(Self {
            inner: Arc::new((user, service)),
        })
    }

    /// Both sets on the development secret, default issuers and audience (tests).
    pub fn development() -> Self {
        let settings = AuthSettings {
            allow_development_secret: true,
            ..AuthSettings::default()
        };
        match Self::from_settings(&settings, "test") {
            Ok(v) => v,
            // Unreachable: the development settings need no file and hold valid secrets.
            Err(e) => panic!("development verifier: {e}"),
        }
    }

    /// Checks signature, algorithm, key set, issuer, audience and expiry; returns the caller.
    pub fn verify(&self, token: &str) -> Result<Caller, ApiError> {
        let malformed = |e: jsonwebtoken::errors::Error| {
            ApiError::Unauthenticated(format!("invalid bearer token: {e}"))
        };
        let header = jsonwebtoken::decode_header(token).map_err(malformed)?;
        let claimed = jsonwebtoken::dangerous::insecure_decode_claims::<RoleOnly>(token)
            .map_err(malformed)?
            .role;
        let (set, what) = match claimed {
            None | Some(Role::User) => (&self.inner.0, "user"),
            Some(Role::Admin | Role::Service) => (&self.inner.1, "service"),
        };
        let verified = set.verify(token, &header, what)?;
        let sub = verified.sub;
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
            role: verified.role.unwrap_or(Role::User),
        })
    }
}

/// Whether the JWKS at `path` can be read and holds a usable key (config validation).
pub fn check_jwks_file(path: &str) -> Result<(), String> {
    jwks::load(path).map(drop)
}
