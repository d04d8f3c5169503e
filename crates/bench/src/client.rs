//! What every client of the services shares — the load generators here and the operator's
//! commands alike: connecting, minting the bearer token, authorising a request, and reading a
//! failed call.

use std::time::Duration;

use anyhow::Context as _;
use flashsale_platform::auth::{DEV_SECRET, JwtKeys, MAX_SUBJECT_LEN, Role};
use tonic::transport::Channel;

/// A channel to `url`.
pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Channel> {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("parse URL `{url}`"))?
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

/// Where tokens come from: the HS256 secret shared with the services.
#[derive(clap::Args, Clone)]
pub struct Secret {
    /// HS256 secret; the services' development secret when unset.
    #[arg(
        long = "secret",
        env = "FLASHSALE_JWT_SECRET",
        hide_env_values = true,
        global = true
    )]
    value: Option<String>,
}

impl Secret {
    /// A token for `sub` with `role`, valid for `ttl`.
    pub fn mint(&self, sub: &str, role: Role, ttl: Duration) -> anyhow::Result<String> {
        anyhow::ensure!(
            !sub.is_empty() && sub.len() <= MAX_SUBJECT_LEN,
            "--sub must be 1..={MAX_SUBJECT_LEN} bytes"
        );
        let secret = self
            .value
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEV_SECRET.to_owned());
        JwtKeys::new(secret.as_bytes())?
            .mint(sub, role, ttl)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}
