//! Printing answers: a protobuf message as canonical protobuf JSON.

use anyhow::Context as _;
use prost_reflect::{DescriptorPool, DynamicMessage};

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
