//! What every client of the services shares — the load generators here and the operator's
//! commands alike: connecting, minting the bearer token, authorising a request, and reading a
//! failed call.

use std::time::Duration;

use anyhow::Context as _;
use flashsale_platform::auth::{
    DEFAULT_AUDIENCE, DEFAULT_SERVICE_ISSUER, DEFAULT_USER_ISSUER, DEV_SECRET, JwtKeys,
    MAX_SUBJECT_LEN, Role,
};
use tonic::transport::Channel;

/// A channel to `url`. An `https://` URL is TLS, with the CA in `$FLASHSALE_TLS_CA_FILE` (else
/// the system's roots) and, for a mutual-TLS service, the client certificate and key in
/// `$FLASHSALE_TLS_CERT_FILE` and `$FLASHSALE_TLS_KEY_FILE`.
pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Channel> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let tls = flashsale_platform::tls::GrpcTlsSettings {
        ca_file: var("FLASHSALE_TLS_CA_FILE"),
        client_cert_file: var("FLASHSALE_TLS_CERT_FILE"),
        client_key_file: var("FLASHSALE_TLS_KEY_FILE"),
        ..Default::default()
    };
    flashsale_platform::grpc::endpoint(url, &tls)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .with_context(|| format!("connect to {url}"))
}

/// `message` with `authorization: Bearer <token>`.
pub fn authorized<T>(message: T, token: &str) -> anyhow::Result<tonic::Request<T>> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .context("token is not valid metadata")?,
    );
    Ok(req)
}

/// A failed call as a readable error: code, message and `ErrorInfo` reason or bad fields.
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    let mut text = format!("{:?}: {}", s.code(), s.message());
    if let Some(reason) = flashsale_platform::error::reason_of(&s) {
        text.push_str(&format!(" [{reason}]"));
    }
    anyhow::anyhow!(text)
}

/// Where the three services answer: each one's gRPC URL, from its option or environment
/// variable (default: the ports `scripts/up.sh` starts them on).
#[derive(clap::Args, Clone, Debug)]
pub struct ServiceUrls {
    /// The product-stock gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_PRODUCT_STOCK_URL",
        default_value = "http://127.0.0.1:50051"
    )]
    pub product_stock_url: String,
    /// The order gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_ORDER_URL",
        default_value = "http://127.0.0.1:50052"
    )]
    pub order_url: String,
    /// The outbound gRPC endpoint.
    #[arg(
        long,
        env = "FLASHSALE_OUTBOUND_URL",
        default_value = "http://127.0.0.1:50053"
    )]
    pub outbound_url: String,
}

/// Where tokens come from: user tokens are signed with a user secret (what the gateway's
/// identity provider does in development), admin and service tokens with a service secret — the
/// services' `auth.user_secrets` and `auth.service_secrets` (docs/security.md).
#[derive(clap::Args, Clone)]
pub struct Secret {
    /// HS256 secret of user tokens; the public development secret when unset.
    #[arg(
        long = "user-secret",
        env = "FLASHSALE_USER_SECRET",
        hide_env_values = true,
        global = true
    )]
    user_secret: Option<String>,
    /// HS256 secret of admin and service tokens; the public development secret when unset.
    #[arg(
        long = "service-secret",
        env = "FLASHSALE_SERVICE_SECRET",
        hide_env_values = true,
        global = true
    )]
    service_secret: Option<String>,
    /// `iss` of user tokens (the services' `auth.user_issuer`).
    #[arg(long, env = "FLASHSALE_USER_ISSUER", default_value = DEFAULT_USER_ISSUER, global = true)]
    user_issuer: String,
    /// `iss` of admin and service tokens (the services' `auth.service_issuer`).
    #[arg(long, env = "FLASHSALE_SERVICE_ISSUER", default_value = DEFAULT_SERVICE_ISSUER, global = true)]
    service_issuer: String,
    /// `aud` of every token (the services' `auth.audience`).
    #[arg(long, env = "FLASHSALE_AUDIENCE", default_value = DEFAULT_AUDIENCE, global = true)]
    audience: String,
}

impl Secret {
    /// A token for `sub` with `role`, valid for `ttl`.
    pub fn mint(&self, sub: &str, role: Role, ttl: Duration) -> anyhow::Result<String> {
        anyhow::ensure!(
            !sub.is_empty() && sub.len() <= MAX_SUBJECT_LEN,
            "--sub must be 1..={MAX_SUBJECT_LEN} bytes"
        );
        let (secret, issuer) = match role {
            Role::User => (&self.user_secret, &self.user_issuer),
            Role::Admin | Role::Service => (&self.service_secret, &self.service_issuer),
        };
        let secret = secret
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEV_SECRET.to_owned());
        JwtKeys::new(secret.as_bytes())?
            .with_issuer(issuer)
            .with_audience(&self.audience)
            .mint(sub, role, ttl)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// How one `CreateOrder` ended.
#[derive(Clone, Debug)]
pub enum Placed {
    /// Accepted, with the order as the service answered it.
    Accepted(Box<flashsale_proto::order::v1::Order>),
    /// Refused with `FAILED_PRECONDITION`, and its reason.
    Refused(String),
    /// Refused with `RESOURCE_EXHAUSTED`, reason `OVERLOADED`: the platform's backlog is at its
    /// bound (admission control).
    Overloaded,
    /// Anything else: the status code, or what went wrong before the call.
    Error(String),
}

/// One `CreateOrder` of one unit of `sku` by the buyer of `token`.
pub async fn place_order(
    client: &mut flashsale_proto::order::v1::order_service_client::OrderServiceClient<Channel>,
    token: &str,
    sku: String,
    request_id: String,
) -> Placed {
    let req = flashsale_proto::order::v1::CreateOrderRequest {
        request_id,
        sku,
        quantity: 1,
    };
    let Ok(req) = authorized(req, token) else {
        return Placed::Error("token".into());
    };
    match client.create_order(req).await {
        Ok(resp) => match resp.into_inner().order {
            Some(order) => Placed::Accepted(Box::new(order)),
            None => Placed::Error("no order in the answer".into()),
        },
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            Placed::Refused(flashsale_platform::error::reason_of(&s).unwrap_or_default())
        }
        Err(s)
            if s.code() == tonic::Code::ResourceExhausted
                && flashsale_platform::error::reason_of(&s).as_deref()
                    == Some(flashsale_contract::reason::OVERLOADED) =>
        {
            Placed::Overloaded
        }
        Err(s) => Placed::Error(format!("{:?}", s.code())),
    }
}
