//! What every command shares: connecting, authorising, and printing messages as JSON.

use std::time::Duration;

use anyhow::Context as _;
use prost_reflect::{DescriptorPool, DynamicMessage};
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

/// `message` (of protobuf type `full_name`) as canonical protobuf JSON.
pub fn to_json<M: prost::Message>(
    message: &M,
    full_name: &str,
) -> anyhow::Result<serde_json::Value> {
    let pool = DescriptorPool::decode(flashsale_proto::FILE_DESCRIPTOR_SET)
        .context("decode descriptors")?;
    let desc = pool
        .get_message_by_name(full_name)
        .with_context(|| format!("no descriptor for {full_name}"))?;
    let dynamic = DynamicMessage::decode(desc, message.encode_to_vec().as_slice())?;
    Ok(serde_json::to_value(&dynamic)?)
}

/// Prints `message` as pretty JSON.
pub fn print<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(&to_json(message, full_name)?)?
    );
    Ok(())
}
